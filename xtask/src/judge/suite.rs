//! `cargo xtask test`: the host-side unit tests, then the in-VM suite on every boot it
//! selects (and the two-node stage), one summary line per boot; and the build that every
//! VM command starts with.

use crate::qemu::{Mode, Topology, VmFiles};
use crate::util::{file_name, file_stem, heading, Ctx, Flavour};
use crate::{boots, fabric, hostcheck, initramfs, kcsan, kernel, ktap, kunit, modules, nodes};
use crate::{rdma_core, setup, ucx};
use crate::{vmrun, BuildOpts, VmOpts};
use anyhow::{bail, Result};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// The kernel (or, with --skip-kernel, the one built before), the modules, rdma-core,
/// libfabric and the initramfs: what a boot needs.
pub fn build_all(ctx: &Ctx, b: &BuildOpts) -> Result<VmFiles> {
    setup::setup(ctx)?;
    if b.skip_kernel {
        if !kernel::bzimage(ctx).exists() {
            bail!(
                "--skip-kernel: no kernel built yet in {}{}",
                ctx.kbuild().display(),
                match ctx.flavour {
                    Flavour::Debug => "",
                    Flavour::Bench =>
                        " (the bench kernel: run `cargo xtask bench` once without --skip-kernel)",
                    Flavour::Kcsan =>
                        " (the KCSAN kernel: run `cargo xtask test --boot kcsan` once without --skip-kernel)",
                }
            );
        }
    } else {
        kernel::kernel(
            ctx,
            &kernel::KernelOpts {
                keep_tree: b.keep_tree,
            },
        )?;
    }
    modules::modules(ctx, false)?;
    rdma_core::rdma_core(ctx)?;
    fabric::libfabric(ctx)?;
    ucx::ucx(ctx)?;
    let initrd = initramfs::initramfs(ctx)?;
    Ok(VmFiles::new(ctx, kernel::bzimage(ctx), initrd, ""))
}

pub fn host_tests(ctx: &Ctx) -> Result<()> {
    heading("host: cargo test --workspace");
    let mut cargo = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cargo
        .current_dir(&ctx.root)
        .args(["test", "--workspace", "--quiet"]);
    ctx.cargo_env(&mut cargo);
    let st = cargo.status()?;
    if !st.success() {
        bail!("host-side unit tests failed (cargo test --workspace)");
    }
    // Issue 29 item 5: the preload library and the CLI as a cluster node installs them
    // (system rdma-core headers, no lab cache), then the stand-in provider checker on host
    // memory with that library preloaded.
    heading("host: install.sh against the system's rdma-core, stand-in provider checker");
    let mut check = Command::new("bash");
    check
        .current_dir(&ctx.root)
        .arg("userspace/scripts/install-check.sh");
    ctx.cargo_env(&mut check);
    if !check.status()?.success() {
        bail!("userspace/scripts/install-check.sh failed (the preload library built against the system's rdma-core)");
    }
    // Issue 29 item 4's program on this host: UCP put/get between two processes over tcp.
    ucx::host_check(ctx)?;
    Ok(())
}

/// Names of the in-VM tests as run-tests.sh sees them (`basename` of /p2pbuf/tests/*).
pub fn vm_test_names(ctx: &Ctx) -> Vec<String> {
    test_names_in(&ctx.root)
}

/// [`vm_test_names`] of the tree at `root`: every file of `tests/vm/tests` under its own name
/// (the initramfs copies them all: scripts of any language and prebuilt programs alike), and
/// each `tests/selftests/*.c` under its stem (the program it is built into).
fn test_names_in(root: &Path) -> Vec<String> {
    let files = |dir: &str| -> Vec<PathBuf> {
        std::fs::read_dir(root.join(dir))
            .map(|rd| {
                rd.flatten()
                    .map(|e| e.path())
                    .filter(|p| p.is_file())
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut v: Vec<String> = files("tests/vm/tests")
        .iter()
        .map(|p| file_name(p))
        .collect();
    v.extend(
        files("tests/selftests")
            .iter()
            .filter(|p| p.extension().is_some_and(|x| x == "c"))
            .map(|p| file_stem(p)),
    );
    v.sort();
    v
}

/// The kernels a run boots: the lab kernel for every boot but those of another flavour (the
/// KCSAN boot's), each flavour's first in the order of the boots.
fn flavours_of(boots: &[Option<boots::Boot>], two_nodes: bool) -> Vec<Flavour> {
    let mut v = vec![];
    let kernels = boots
        .iter()
        .map(|b| b.as_ref().map_or(Flavour::Debug, |b| b.kernel))
        .chain(two_nodes.then_some(Flavour::Debug));
    for k in kernels {
        if !v.contains(&k) {
            v.push(k);
        }
    }
    v
}

/// Builds what the selected boots need ([`build_all`] for each of their kernels, the lab
/// kernel's first), then runs the in-VM suite on every selected boot; one line per boot at
/// the end.
///
/// Over 100 lines on purpose: the selection of boots, the build of their kernels, each boot and
/// the two-node stage, and the summary share the selection and the per-boot results; split,
/// each piece would take all of them.
#[allow(clippy::too_many_arguments)]
pub fn vm_tests(
    ctx: &Ctx,
    build: &BuildOpts,
    vm: &VmOpts,
    names: &[String],
    timeout: u64,
    filter: Option<&str>,
    inject: Option<&str>,
) -> Result<()> {
    let custom =
        names.is_empty() && (vm.topology != Topology::Switch || vm.iommu || vm.cpu != "max");
    // The two-node stage is a pseudo-boot: last, and by name or when no boot is named.
    let two_nodes = nodes::selected(names, filter, inject.is_some(), custom);
    let single: Vec<String> = names
        .iter()
        .filter(|n| *n != nodes::BOOT_NAME)
        .cloned()
        .collect();
    let boots: Vec<Option<boots::Boot>> = if custom {
        vec![None]
    } else if !names.is_empty() && single.is_empty() {
        vec![]
    } else {
        let b = boots::select(&single, filter, &vm_test_names(ctx))?;
        if b.is_empty() && !two_nodes {
            bail!(
                "--filter {:?} selects no in-VM test on any boot",
                filter.unwrap_or("")
            );
        }
        b.into_iter().map(Some).collect()
    };
    // Each kernel, its modules and initramfs, before any boot (a build error ends the run, as
    // it did when only the lab kernel was built).
    let mut kernels: Vec<(Flavour, Ctx, VmFiles)> = vec![];
    for f in flavours_of(&boots, two_nodes) {
        let fctx = ctx.flavoured(f);
        let files = build_all(&fctx, build)?;
        kernels.push((f, fctx, files));
    }
    let kernel_of = |f: Flavour| {
        kernels
            .iter()
            .find(|(g, _, _)| *g == f)
            .map(|(_, c, v)| (c, v))
            .expect("every selected boot's kernel is built above")
    };
    let mut summary = vec![];
    let mut failed = vec![];
    for b in &boots {
        let label = b.as_ref().map_or("custom", |b| b.name);
        if let Some(b) = b {
            println!("    boot {label}: {}", b.why);
        }
        let t = b.as_ref().map_or(timeout, |b| b.timeout(timeout));
        let (ctx, files) = kernel_of(b.as_ref().map_or(Flavour::Debug, |b| b.kernel));
        // The pyverbs boot's initramfs: the lab's plus Python, pyverbs and rdma-core's tests.
        let py_files;
        let files = if b.as_ref().is_some_and(|b| b.pyverbs) {
            let initrd = rdma_core::pyverbs(ctx)
                .and_then(|()| initramfs::pyverbs_initramfs(ctx, &files.initrd));
            match initrd {
                Ok(i) => {
                    py_files = VmFiles::new(ctx, files.kernel.clone(), i, "");
                    &py_files
                }
                Err(e) => {
                    summary.push(format!("{label}: FAILED ({e:#})"));
                    failed.push(label.to_string());
                    continue;
                }
            }
        } else {
            files
        };
        match vm_test(ctx, files, vm, b.as_ref(), t, filter, inject) {
            Ok(r) => summary.push(format!(
                "{label}: {} passed, {} failed, {} skipped{}",
                r.passed,
                r.failed,
                r.skipped,
                r.notes.iter().map(|n| format!("; {n}")).collect::<String>()
            )),
            Err(e) => {
                summary.push(format!("{label}: FAILED ({e:#})"));
                failed.push(label.to_string());
            }
        }
    }
    if two_nodes {
        println!(
            "    boot {}: two VMs on one network link, node B RDMA-writes into node A's device memory",
            nodes::BOOT_NAME
        );
        let label = nodes::BOOT_NAME;
        let (ctx, files) = kernel_of(Flavour::Debug);
        match nodes::two_nodes(
            ctx,
            &vm.config(Mode::Node),
            &files.kernel,
            &files.initrd,
            Duration::from_secs(timeout),
            false,
        ) {
            Ok((p, f, s)) => summary.push(format!("{label}: {p} passed, {f} failed, {s} skipped")),
            Err(e) => {
                summary.push(format!("{label}: FAILED ({e:#})"));
                failed.push(label.to_string());
            }
        }
    }
    if boots.len() + usize::from(two_nodes) > 1 {
        heading("vm: summary of all boots");
        for l in &summary {
            println!("    {l}");
        }
    }
    if !failed.is_empty() {
        bail!("in-VM suite failed on boot(s): {}", failed.join(", "));
    }
    Ok(())
}

/// What one boot's run counted, and its summary's notes (forced failures, KCSAN reports not
/// ours).
struct BootRun {
    passed: usize,
    failed: usize,
    skipped: usize,
    notes: Vec<String>,
}

fn vm_test(
    ctx: &Ctx,
    files: &VmFiles,
    vm: &VmOpts,
    boot: Option<&boots::Boot>,
    timeout: u64,
    filter: Option<&str>,
    inject: Option<&str>,
) -> Result<BootRun> {
    let mut cfg = vm.config(Mode::Test);
    if let Some(b) = boot {
        b.apply(&mut cfg);
    }
    if let Some(f) = filter {
        cfg.append.push(format!("p2pbuf.filter={f}"));
    }
    if let Some(i) = inject {
        cfg.append.push(format!("p2pbuf.inject={i}"));
    }
    heading(&format!(
        "vm: in-VM suite ({:?} topology{}, cpu {}, TCG; timeout {timeout}s)",
        cfg.topology,
        if cfg.iommu { ", intel-iommu" } else { "" },
        cfg.cpu
    ));
    let t = Duration::from_secs(timeout);
    let label = match boot {
        Some(b) if b.name != "main" => format!("test-{}", b.name),
        _ => "test".into(),
    };
    let w = vmrun::Watch::new(label, t, vmrun::Show::Results);
    let o = vmrun::boot_and_watch(ctx, &cfg, files, &w)?;
    let (mut p, mut f, mut s) = o.parser.counts();
    let mut fails = vmrun::failures(&o, t);
    for (name, status, note) in hostcheck::checks(&o.parser, files) {
        let r = ktap::TestResult::new(name.clone(), status, note.clone());
        vmrun::print_result(&r);
        match status {
            ktap::Status::Pass => p += 1,
            ktap::Status::Fail => {
                f += 1;
                fails.push(format!("{name}: {note}"));
            }
            ktap::Status::Skip => s += 1,
        }
    }
    match kunit::report(ctx, &files.results, &w.label) {
        Ok(d) => fails.extend(d),
        Err(e) => println!("    kunit.py: not run ({e:#})"),
    }
    if let Some(b) = o.boot_to_init {
        println!(
            "    boot to init: {:.1}s; whole run: {:.1}s",
            b.as_secs_f64(),
            o.wall.as_secs_f64()
        );
    }
    println!("    console log: {}", o.console_log.display());
    // Expected (the fail-nth test forces them), and worth seeing: a run that should have
    // injected failures and shows none did not test its error paths.
    let mut notes = vec![];
    if let Some(n) = ktap::forced_failures_note(o.forced_failures) {
        println!("    {n} (expected: tests/selftests/fail_nth.c)");
        notes.push(n);
    }
    // Other code's races: listed, not failed (ours are among `fails`, as console problems).
    if let Some(n) = kcsan::kcsan_not_ours_note(&o.kcsan) {
        println!("    {n}");
        notes.push(n);
    }
    println!("\x1b[1m{p} passed, {f} failed, {s} skipped\x1b[0m");
    if !fails.is_empty() {
        for x in &fails {
            eprintln!("\x1b[31merror\x1b[0m: {x}");
        }
        // The notes too: the summary line of a failed boot is this message.
        bail!(
            "{} problem(s) in the VM run; console log: {}{}",
            fails.len(),
            o.console_log.display(),
            notes.iter().map(|n| format!("; {n}")).collect::<String>()
        );
    }
    Ok(BootRun {
        passed: p,
        failed: f,
        skipped: s,
        notes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each kernel once, the lab kernel's first where a boot or the two-node stage needs it.
    #[test]
    fn each_kernel_is_built_once_for_the_boots_that_need_it() {
        let all = boots::all();
        let by = |n: &str| Some(all.iter().find(|b| b.name == n).unwrap().clone());
        assert_eq!(
            flavours_of(&[by("main"), by("kcsan"), by("large-bar")], true),
            [Flavour::Debug, Flavour::Kcsan]
        );
        assert_eq!(flavours_of(&[by("kcsan")], false), [Flavour::Kcsan]);
        assert_eq!(
            flavours_of(&[by("kcsan")], true),
            [Flavour::Kcsan, Flavour::Debug]
        );
        assert_eq!(flavours_of(&[None], false), [Flavour::Debug]);
        assert_eq!(flavours_of(&[], true), [Flavour::Debug]);
    }

    /// A prebuilt program or a script of another language in tests/vm/tests is a test like the
    /// shell ones (the old listing saw only `*.sh`, so `--filter` could not pick its boot), and
    /// a selftest is named for its program (`exporter`, not `exporter.c`).
    #[test]
    fn every_test_file_is_named() {
        let root = std::env::temp_dir().join(format!("p2pbuf-suite-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        for f in [
            "tests/vm/tests/cli_1_basic.sh",
            "tests/vm/tests/verbs_prebuilt",
            "tests/vm/tests/check.py",
            "tests/selftests/exporter.c",
            "tests/selftests/p2pbuf_test.h",
        ] {
            let p = root.join(f);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, "").unwrap();
        }
        let names = test_names_in(&root);
        std::fs::remove_dir_all(&root).unwrap();
        assert_eq!(
            names,
            ["check.py", "cli_1_basic.sh", "exporter", "verbs_prebuilt"]
        );
        let main = &crate::boots::all()[0];
        assert!(crate::boots::select(&[], Some("verbs_pre"), &names)
            .unwrap()
            .iter()
            .any(|b| b.name == main.name));
    }
}
