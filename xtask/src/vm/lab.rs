//! The `vm` and `run` commands on one VM: a shell in the guest, or the guest's narrated walk
//! through the stack, judged by its console.

use crate::qemu::{self, VmConfig, VmFiles};
use crate::util::{heading, Ctx};
use crate::vmrun;
use anyhow::{bail, Result};
use std::process::Command;
use std::time::Duration;

/// `cargo xtask vm`: QEMU on this terminal (the console is the guest's serial port).
pub fn interactive(cfg: &VmConfig, files: &VmFiles) -> Result<()> {
    files.prepare(cfg)?;
    heading("vm: booting (Ctrl-A X quits)");
    let st = Command::new(vmrun::QEMU)
        .args(qemu::qemu_args(cfg, files, true))
        .status()?;
    if !st.success() {
        bail!("QEMU exited with {st}");
    }
    Ok(())
}

/// `cargo xtask run`: boots the lab, shows the guest's narration, and fails on any kernel
/// report in the console or a hang (not on a FAIL row of the guest's table).
pub fn narrate(ctx: &Ctx, cfg: &VmConfig, files: &VmFiles, timeout: u64) -> Result<()> {
    heading("run: booting the lab (TCG); the guest narrates from here");
    let t = Duration::from_secs(timeout);
    let w = vmrun::Watch::new("run", t, vmrun::Show::Console);
    let o = vmrun::boot_and_watch(ctx, cfg, files, &w)?;
    println!("    console log: {}", o.console_log.display());
    let mut bad: Vec<String> = o
        .problems
        .iter()
        .map(|p| format!("kernel {}: {}", p.kind, p.line))
        .collect();
    if o.hung_before_init {
        bad.push("hang: the kernel never reached /init (see the console log)".into());
    } else if o.timed_out {
        bad.push(format!("hang: no power-off within {timeout}s"));
    }
    if !bad.is_empty() {
        bail!("the run hit trouble: {}", bad.join("; "));
    }
    Ok(())
}
