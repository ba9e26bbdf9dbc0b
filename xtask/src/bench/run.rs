//! The `cargo xtask bench` command itself: boot the bench kernel `--runs` times, pool the
//! programs' lines, write the results and say what went wrong; or, with `--from-raw`, only
//! write the results of an earlier run again.

use super::{has_samples, summary_lines, write_results, Report, RUN_LINE};
use crate::qemu::{VmConfig, VmFiles};
use crate::util::{heading, Ctx};
use crate::vmrun;
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// What `cargo xtask bench` was asked for (its flags, less the build's and the VM's).
pub struct BenchOpts {
    /// Repetitions per point (`p2pbuf.reps=`).
    pub reps: u32,
    /// VM runs (boots), each measuring every kind.
    pub runs: u32,
    /// Where the results go.
    pub out: PathBuf,
    /// How long one VM run may take.
    pub timeout: Duration,
    /// Only the benchmark programs whose file name contains this (`p2pbuf.bench=`).
    pub filter: Option<String>,
}

impl BenchOpts {
    /// Refuses a `--filter` the guest's command line could not carry, before anything is built.
    pub fn check(&self) -> Result<()> {
        if let Some(f) = &self.filter {
            if f.is_empty() || f.contains(char::is_whitespace) {
                bail!("--filter takes one word (a part of a benchmark's file name)");
            }
        }
        Ok(())
    }
}

/// `--from-raw`: the results of an earlier run's raw.txt, written again; nothing boots.
pub fn from_raw(raw: &Path, out: &Path) -> Result<()> {
    let text =
        std::fs::read_to_string(raw).with_context(|| format!("reading {}", raw.display()))?;
    let lines: Vec<String> = text.lines().map(str::to_string).collect();
    let rep = write_results(&lines, out, 0, None)?;
    summary(&rep, out);
    Ok(())
}

/// Boots the bench kernel `kernel` (already built into `files`) `o.runs` times, writes the
/// results under `o.out` and the programs' whole output to `serial.txt`; an error when a run
/// did not boot, had no samples, hit a kernel problem or a hang, or a program failed (the
/// results of the runs before are written first).
pub fn bench(
    ctx: &Ctx,
    files: &VmFiles,
    kernel: &str,
    mut cfg: VmConfig,
    o: &BenchOpts,
) -> Result<()> {
    println!("    kernel: {kernel}");
    let (reps, runs) = (o.reps, o.runs);
    // tests/bench/rdma.sh pins 1 GiB of host memory (and touches 1 GiB more) for the
    // registration benchmark.
    cfg.mem_mib = cfg.mem_mib.max(4096);
    cfg.append.push(format!("p2pbuf.reps={reps}"));
    if let Some(f) = &o.filter {
        cfg.append.push(format!("p2pbuf.bench={f}"));
    }
    // Every run's lines, each run's after a `# run N` line; the programs' whole output
    // (diagnostics, progress, trace-* call graphs) of every run, for serial.txt.
    let (mut lines, mut serial_text, mut trouble) = (vec![], String::new(), vec![]);
    let mut console_log = None;
    for run in 1..=runs {
        heading(&format!(
            "bench: booting the lab ({reps} repetitions per size{})",
            if runs > 1 {
                format!(", run {run} of {runs}")
            } else {
                String::new()
            }
        ));
        // A console log per run (logs/console-bench-runN.log with several).
        let label = if runs > 1 {
            format!("bench-run{run}")
        } else {
            "bench".to_string()
        };
        let w = vmrun::Watch::new(label, o.timeout, vmrun::Show::Progress);
        let out = match vmrun::boot_and_watch(ctx, &cfg, files, &w) {
            Ok(out) => out,
            // The runs before keep their results: written below, then the error.
            Err(e) if run > 1 => {
                trouble.push(format!("run {run} did not boot: {e:#}"));
                break;
            }
            Err(e) => return Err(e),
        };
        println!(
            "    boot to init: {}; whole run: {:.1}s",
            out.boot_to_init
                .map(|b| format!("{:.1}s", b.as_secs_f64()))
                .unwrap_or_else(|| "not seen".into()),
            out.wall.as_secs_f64()
        );
        if runs > 1 {
            lines.push(format!("{RUN_LINE}{run}"));
            serial_text.push_str(&format!("{RUN_LINE}{run}\n"));
        }
        if !has_samples(&out.parser.lines) {
            trouble.push(format!("run {run}: no samples"));
        }
        lines.extend(out.parser.lines);
        serial_text.push_str(
            &std::fs::read_to_string(&files.results)
                .with_context(|| format!("reading the VM's output {}", files.results.display()))?,
        );
        if !serial_text.ends_with('\n') {
            serial_text.push('\n');
        }
        if !out.problems.is_empty() || out.timed_out {
            trouble.push(format!(
                "run {run}: kernel problems or a hang, see {}",
                out.console_log.display()
            ));
        }
        console_log = Some(out.console_log);
    }
    let rep =
        write_results(&lines, &o.out, reps, Some(kernel)).with_context(|| match &console_log {
            Some(l) => format!("console log of the last run: {}", l.display()),
            None => "no run".to_string(),
        })?;
    summary(&rep, &o.out);
    let serial = o.out.join("serial.txt");
    std::fs::write(&serial, serial_text)
        .with_context(|| format!("writing the VMs' output to {}", serial.display()))?;
    println!("    the programs' whole output: {}", serial.display());
    let failed: Vec<String> = rep.failed().iter().map(|p| p.name.clone()).collect();
    if !trouble.is_empty() || !failed.is_empty() {
        let mut what = trouble;
        if !failed.is_empty() {
            what.push(format!(
                "{} failed (see raw.txt and serial.txt)",
                failed.join(", ")
            ));
        }
        bail!("the bench run hit trouble: {}", what.join("; "));
    }
    Ok(())
}

/// The terminal summary of a bench run.
fn summary(rep: &Report, out: &Path) {
    heading("bench: summary (median of the kind / median of the baseline)");
    println!("    kernel: {}", rep.kernel);
    for l in summary_lines(&rep.benches) {
        println!("    {l}");
    }
    if !rep.spread.is_empty() {
        println!(
            "    ratio of each VM run (bench | metric | ratio | x | each run | median | range):"
        );
        for row in &rep.spread {
            println!("    {row}");
        }
    }
    for p in rep.failed() {
        println!(
            "    program {} {}",
            p.name,
            match p.exit {
                Some(c) => format!("exited {c}"),
                None => "did not finish".into(),
            }
        );
    }
    println!(
        "    results: {}/README.md ({} files: a table and a plot per benchmark)",
        out.display(),
        rep.files.len()
    );
}
