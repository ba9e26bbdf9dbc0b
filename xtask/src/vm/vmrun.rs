//! Boots a VM and watches it: the console (kernel log) is logged and scanned for oopses,
//! WARNs and leaks; the second serial port carries the in-VM suite's KTAP, parsed and printed
//! as results arrive; a hang ends in a stated timeout.

use crate::kcsan::{KcsanReport, KcsanScan};
use crate::ktap::{
    dma_api_lost, is_forced_failure, scan_console, Parser, Problem, Status, TestResult,
};
use crate::qemu::{qemu_args, VmConfig, VmFiles};
use crate::util::Ctx;
use anyhow::{Context, Result};
use std::fs;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

pub const QEMU: &str = "qemu-system-x86_64";

/// Marker /init prints first (boot time is measured to it).
const INIT_MARKER: &str = "p2pbuf-init: started";

/// How long a boot may take to reach /init before it counts as hung. Every boot reaches it
/// in 10 to 45 s of guest time (the slowest, p2pbuf-dma-icount, in about 40 s); a kernel that
/// wedges before init (a report storm from every timer interrupt, as the CI run of 9ececf6
/// showed) is stopped here instead of at the run's whole timeout (30 min for large-bar).
const INIT_DEADLINE: Duration = Duration::from_secs(600);

/// How a VM run ended.
pub struct Outcome {
    pub parser: Parser,
    pub problems: Vec<Problem>,
    /// Failures that fault injection forced and reported (`FAULT_INJECTION: forcing a
    /// failure.`: the fail-nth test's, on purpose; see `ktap::is_forced_failure`).
    pub forced_failures: usize,
    /// Every KCSAN report of the run (the KCSAN kernel's), in order: those of ours are also
    /// in `problems`; the others are listed in the run's summary
    /// (`kcsan::kcsan_not_ours_note`), not failed.
    pub kcsan: Vec<KcsanReport>,
    pub timed_out: bool,
    /// The run was stopped because the kernel never reached /init within [`INIT_DEADLINE`]
    /// (`timed_out` is set too).
    pub hung_before_init: bool,
    pub exit_ok: bool,
    pub boot_to_init: Option<Duration>,
    pub wall: Duration,
    pub console_log: PathBuf,
}

pub struct Watch {
    pub timeout: Duration,
    /// Copy the console to stdout.
    pub echo_console: bool,
    /// Print KTAP results as they arrive.
    pub print_results: bool,
    /// Print the second serial port's progress lines as they arrive (`cargo xtask bench`:
    /// see [`is_progress`]).
    pub print_progress: bool,
    pub label: String,
}

/// What a watched run prints as it goes (besides its log files).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Show {
    /// Nothing.
    Nothing,
    /// The console.
    Console,
    /// The KTAP results.
    Results,
    /// The progress lines of the second serial port.
    Progress,
}

impl Watch {
    /// A run named `label` (its console log's name) that may take `timeout`.
    pub fn new(label: impl Into<String>, timeout: Duration, show: Show) -> Self {
        Watch {
            timeout,
            echo_console: show == Show::Console,
            print_results: show == Show::Results,
            print_progress: show == Show::Progress,
            label: label.into(),
        }
    }
}

fn spawn(cfg: &VmConfig, files: &VmFiles) -> Result<(Child, mpsc::Receiver<String>)> {
    let (reader, writer) = std::io::pipe()?;
    let mut cmd = Command::new(QEMU);
    cmd.args(qemu_args(cfg, files, false))
        .stdin(Stdio::null())
        .stdout(writer.try_clone()?)
        .stderr(writer);
    let child = cmd.spawn().with_context(|| {
        format!("cannot start {QEMU}: run `cargo xtask setup` (Debian package qemu-system-x86)")
    })?;
    drop(cmd);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut r = BufReader::new(reader);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            match r.read_until(b'\n', &mut buf) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    if tx
                        .send(String::from_utf8_lossy(&buf).trim_end().to_string())
                        .is_err()
                    {
                        break;
                    }
                }
            }
        }
    });
    Ok((child, rx))
}

/// Prints one result line, indented by nesting.
pub fn print_result(r: &TestResult) {
    println!("{}", result_line(r));
}

/// [`print_result`]'s line.
fn result_line(r: &TestResult) -> String {
    let pad = "  ".repeat(r.depth + 1);
    let (tag, color) = match r.status {
        Status::Pass => ("ok  ", "32"),
        Status::Fail => ("FAIL", "31"),
        Status::Skip => ("skip", "33"),
    };
    let d = if r.directive.is_empty() {
        String::new()
    } else {
        format!("  # {}", r.directive)
    };
    // Nested results stream before their parent names them: show the leaf's own description.
    format!("{pad}\x1b[{color}m{tag}\x1b[0m {}{d}", r.name())
}

pub fn boot_and_watch(ctx: &Ctx, cfg: &VmConfig, files: &VmFiles, w: &Watch) -> Result<Outcome> {
    boot_and_watch_with(ctx, cfg, files, w, &mut |_| {})
}

/// As [`boot_and_watch`], handing every console line to `on_line` as it arrives (the
/// two-node run narrates from it).
///
/// Over 100 lines on purpose: one event loop whose state (the KTAP parser, the problems, the
/// KCSAN scan, the results file's position, the timers) each of its branches updates; split,
/// each piece would take all of it.
pub fn boot_and_watch_with(
    ctx: &Ctx,
    cfg: &VmConfig,
    files: &VmFiles,
    w: &Watch,
    on_line: &mut dyn FnMut(&str),
) -> Result<Outcome> {
    files.prepare(cfg)?;
    let console_log = ctx.log_path(&format!("console-{}", w.label));
    let mut log = fs::File::create(&console_log)?;
    writeln!(log, "# {QEMU} {}", qemu_args(cfg, files, false).join(" "))?;
    let start = Instant::now();
    let (mut child, rx) = spawn(cfg, files)?;
    let mut parser = Parser::new();
    let mut problems = vec![];
    let mut forced_failures = 0;
    let mut kcsan_scan = KcsanScan::default();
    let mut kcsan = vec![];
    let mut kcsan_report = |r: KcsanReport, problems: &mut Vec<Problem>| {
        if !w.echo_console {
            match &r.ours {
                Some(_) => println!("  \x1b[31mconsole: KCSAN\x1b[0m: {}", r.problem().line),
                None => println!("  \x1b[33mconsole: KCSAN (not ours)\x1b[0m: {}", r.title),
            }
        }
        if r.ours.is_some() {
            problems.push(r.problem());
        }
        kcsan.push(r);
    };
    let mut boot_to_init = None;
    let mut res = fs::File::open(&files.results)?;
    let mut pending = String::new();
    let mut pos = 0u64;
    let mut timed_out = false;
    let mut hung_before_init = false;
    let exited;
    let mut drain_results =
        |parser: &mut Parser, pending: &mut String, pos: &mut u64, flush: bool| -> Result<()> {
            res.seek(SeekFrom::Start(*pos))?;
            let mut more = String::new();
            let n = res.read_to_string(&mut more)?;
            *pos += n as u64;
            pending.push_str(&more.replace('\r', ""));
            while let Some(i) = pending.find('\n') {
                let line: String = pending.drain(..=i).collect();
                if w.print_progress && is_progress(line.trim()) {
                    println!(
                        "    [{:>5}s] {}",
                        start.elapsed().as_secs(),
                        line.trim().trim_start_matches("# ")
                    );
                }
                if let Some(r) = parser.feed(line.trim_end()) {
                    if w.print_results {
                        print_result(&r);
                    }
                }
            }
            if flush && !pending.is_empty() {
                let line = std::mem::take(pending);
                if let Some(r) = parser.feed(&line) {
                    if w.print_results {
                        print_result(&r);
                    }
                }
            }
            Ok(())
        };
    loop {
        match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(line) => {
                writeln!(log, "{line}")?;
                on_line(&line);
                if w.echo_console {
                    println!("{line}");
                }
                if boot_to_init.is_none() && line.contains(INIT_MARKER) {
                    boot_to_init = Some(start.elapsed());
                }
                if is_forced_failure(&line) {
                    forced_failures += 1;
                }
                if let Some(r) = kcsan_scan.feed(&line) {
                    kcsan_report(r, &mut problems);
                }
                if forced_failures > 0 && dma_api_lost(&line) {
                    // An injected failure of dma-debug's own allocation (see ktap/console.rs, DMA_API_LOST).
                    println!(
                        "    DMA-API debugging switched itself off after an injected allocation failure: {}",
                        line.trim()
                    );
                } else if let Some(p) = scan_console(&line) {
                    if !w.echo_console {
                        println!("  \x1b[31mconsole: {}\x1b[0m: {}", p.kind, p.line);
                    }
                    problems.push(p);
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                exited = Some(child.wait()?);
                break;
            }
        }
        drain_results(&mut parser, &mut pending, &mut pos, false)?;
        hung_before_init = boot_to_init.is_none() && start.elapsed() > INIT_DEADLINE;
        if start.elapsed() > w.timeout || hung_before_init {
            timed_out = true;
            let _ = child.kill();
            exited = child.wait().ok();
            break;
        }
    }
    drain_results(&mut parser, &mut pending, &mut pos, true)?;
    if let Some(r) = kcsan_scan.finish() {
        kcsan_report(r, &mut problems);
    }
    Ok(Outcome {
        parser,
        problems,
        forced_failures,
        kcsan,
        timed_out,
        hung_before_init,
        exit_ok: exited.map(|s| s.success()).unwrap_or(false),
        boot_to_init,
        wall: start.elapsed(),
        console_log,
    })
}

/// A line of the second serial port that says where a long run is: the benchmark programs'
/// framing (`# bench NAME`, `# bench NAME exit STATUS`) and their `# progress: ...` lines.
pub fn is_progress(line: &str) -> bool {
    line.starts_with("# bench ") || line.starts_with("# progress:")
}

/// Everything that makes a run fail, in words.
pub fn failures(o: &Outcome, timeout: Duration) -> Vec<String> {
    let mut f = vec![];
    for r in o
        .parser
        .results
        .iter()
        .filter(|r| r.status == Status::Fail && r.leaf)
    {
        f.push(format!("test failed: {}", r.path));
    }
    if o.parser.plan.is_none() {
        f.push("the in-VM suite never reported a plan (did /init run? see the console log)".into());
    }
    let m = o.parser.missing();
    if m > 0 {
        f.push(format!(
            "{m} planned test(s) never reported (the VM stopped early)"
        ));
    }
    for b in &o.parser.bailed {
        f.push(format!("suite bailed out: {b}"));
    }
    for p in &o.problems {
        f.push(format!("kernel {} in the console log: {}", p.kind, p.line));
    }
    if o.hung_before_init {
        f.push(format!(
            "hang: the kernel did not reach /init within {}s and the VM was killed (see the \
             first report in the console log)",
            INIT_DEADLINE.as_secs()
        ));
    } else if o.timed_out {
        f.push(format!(
            "hang: the VM did not finish within {}s and was killed",
            timeout.as_secs()
        ));
    } else if !o.exit_ok {
        f.push("QEMU exited with an error (see the console log)".into());
    }
    f
}

#[cfg(test)]
mod tests {
    use super::{is_progress, result_line};
    use crate::ktap::Parser;

    /// A nested description with a `/` is printed whole (it was cut to `s)` at the last `/`
    /// of the joined path).
    #[test]
    fn descriptions_are_printed_verbatim() {
        let mut p = Parser::new();
        for l in ["1..1", "    1..1", "    ok 1 copy (3.2 MiB/s)"] {
            p.feed(l);
        }
        let line = result_line(&p.results[0]);
        assert!(line.ends_with(" copy (3.2 MiB/s)"), "{line:?}");
    }

    #[test]
    fn progress_lines_are_the_framing_and_progress_only() {
        assert!(is_progress("# bench export_map"));
        assert!(is_progress("# bench rdma.sh exit 0"));
        assert!(is_progress(
            "# progress: export_map p2pbuf 64 GiB rep 1/3: export, import, free..."
        ));
        assert!(!is_progress(
            "BENCH export_map kind=p2pbuf size=4096 rep=0 export_us=1"
        ));
        assert!(!is_progress("# rdma_reg size=4096: no host buffer"));
        assert!(!is_progress("# benchmark"));
    }
}
