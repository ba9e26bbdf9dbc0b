//! `cargo xtask bench`: boots the lab in bench mode, where `tests/vm/bench-run.sh` runs every
//! program in `/p2pbuf/bench` (built from `tests/bench/*.c`, copied from `tests/bench/*.sh`),
//! collects their lines, and writes per benchmark a Markdown table and an SVG plot under the
//! results directory, each comparing the dma-buf path with its baseline measured in the same
//! run (median, IQR and min-max over the repetitions, and ratios), plus an index `README.md`.
//!
//! The line protocol (docs/bench.md):
//!
//! ```text
//! BENCHINFO <bench> baseline=<kind> title=<words_with_underscores> x=<key>
//! BENCHMETRIC <bench> <metric> unit=<unit> better=lower|higher
//! BENCH <bench> kind=<kind> <x-key>=<value> rep=<i> <metric>=<value> ...
//! ```
//!
//! `BENCHINFO` and `BENCHMETRIC` are optional: without them the baseline, the sweep key and
//! the metrics' units are inferred (see [`Bench::finish`]).
//!
//! Every table and the index say which kernel produced the figures (the bench kernel: the
//! lab's configuration without its debug block, `xtask/src/build/kernel/config.rs`);
//! `raw.txt` records it in its first line, `# kernel ...`, so that `--from-raw` says it again.

use anyhow::{bail, Context, Result};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::fs;
use std::path::Path;

mod plots;
mod protocol;
pub mod run;
mod stats;
mod tables;

pub use plots::*;
pub use protocol::*;
pub use stats::*;
pub use tables::*;

/// The line of `raw.txt` that records the kernel of the run (before the protocol lines).
pub(crate) const KERNEL_LINE: &str = "# kernel ";

/// The line of `raw.txt` that starts the lines of one VM run of `cargo xtask bench --runs N`:
/// `# run N`, nothing after the number.
pub(crate) const RUN_LINE: &str = "# run ";

/// Whether `line` is a `# run N` marker (a program's own `# run 3: ...` line is not).
fn is_run_marker(line: &str) -> bool {
    line.trim()
        .strip_prefix(RUN_LINE)
        .is_some_and(|n| n.parse::<u32>().is_ok())
}

/// What the results say about a kernel that no `# kernel` line recorded.
pub(crate) const KERNEL_UNKNOWN: &str =
    "not recorded (raw lines from before xtask recorded the kernel)";

/// The kernel a run's lines (a `raw.txt`) record, if any.
pub fn recorded_kernel(lines: &[String]) -> Option<String> {
    lines
        .iter()
        .find_map(|l| l.trim().strip_prefix(KERNEL_LINE))
        .map(|k| k.trim().to_string())
        .filter(|k| !k.is_empty())
}

/// What `# bench <program> exit <status>` lines of bench-run.sh said.
#[derive(Debug, PartialEq)]
pub struct Program {
    pub name: String,
    /// `None`: started, never finished (the VM stopped or hung).
    pub exit: Option<i32>,
}

pub fn programs(lines: &[String]) -> Vec<Program> {
    let mut out: Vec<Program> = vec![];
    for l in lines {
        let Some(rest) = l.trim().strip_prefix("# bench ") else {
            continue;
        };
        let w: Vec<&str> = rest.split_whitespace().collect();
        match w.as_slice() {
            [name] => out.push(Program {
                name: name.to_string(),
                exit: None,
            }),
            [name, "exit", code] => {
                let code = code.parse().ok();
                match out.iter_mut().rev().find(|p| p.name == *name) {
                    Some(p) => p.exit = code,
                    None => out.push(Program {
                        name: name.to_string(),
                        exit: code,
                    }),
                }
            }
            _ => {}
        }
    }
    out
}

/// The lines of each VM run, split at the `# run N` lines that `--runs N` writes; only parts
/// with samples count (lines before the first marker are a run of their own if they have
/// some).
pub fn runs(lines: &[String]) -> Vec<&[String]> {
    let mut start = 0;
    let mut parts: Vec<&[String]> = vec![];
    for (i, l) in lines.iter().enumerate() {
        if is_run_marker(l) {
            parts.push(&lines[start..i]);
            start = i + 1;
        }
    }
    parts.push(&lines[start..]);
    parts.into_iter().filter(|run| has_samples(run)).collect()
}

/// Whether `lines` hold at least one `BENCH` sample line.
pub fn has_samples(lines: &[String]) -> bool {
    lines
        .iter()
        .any(|l| matches!(parse_line(l), Some(Line::Sample(_))))
}

/// With more than one VM run: a Markdown table row per (bench, metric, compared kind, x) with
/// the ratio of each run, their median and range, which says how far the ratio of a single
/// run can be trusted (runs of the same code differ by more than their IQRs show: a boot's
/// placement of memory and code). `pooled`: the benchmarks of all runs together; `per_run`:
/// those of each run ([`per_run_benches`]). Empty for one run.
pub fn run_spread(pooled: &[Bench], per_run: &[Vec<Bench>]) -> Vec<String> {
    if per_run.len() < 2 {
        return vec![];
    }
    let mut out = vec![];
    for b in pooled {
        let Some(base) = b.baseline.as_deref().filter(|_| b.has_baseline()) else {
            continue;
        };
        for m in &b.metrics {
            for k in b.compared() {
                for x in &b.xs {
                    // Each run's ratio against the pooled baseline; `-` where a run has none.
                    let rs: Vec<Option<f64>> = per_run
                        .iter()
                        .map(|bs| {
                            let c = bs.iter().find(|c| c.name == b.name)?;
                            let (kv, bv) = (c.stats(k, x, &m.name)?, c.stats(base, x, &m.name)?);
                            (bv.median != 0.0).then(|| kv.median / bv.median)
                        })
                        .collect();
                    let got: Vec<f64> = rs.iter().flatten().copied().collect();
                    let Some(s) = Stats::of(&got).filter(|s| s.n >= 2) else {
                        continue;
                    };
                    let each: Vec<String> =
                        rs.iter().map(|r| r.map_or("-".to_string(), num)).collect();
                    out.push(format!(
                        "| `{}` | {} | {k}/{base} | {} | {} | {} | {}–{} |",
                        b.name,
                        m.name,
                        b.x_label(x),
                        each.join(", "),
                        num(s.median),
                        num(s.min),
                        num(s.max)
                    ));
                }
            }
        }
    }
    out
}

fn parse_all(lines: &[String]) -> Vec<Line> {
    lines.iter().filter_map(|l| parse_line(l)).collect()
}

/// The benchmarks of each of `runs`, aggregated with the `BENCHINFO` and `BENCHMETRIC` lines
/// of all runs (`parsed`: every protocol line), so that a run that did not print them gets the
/// same baseline, sweep key and metrics.
fn per_run_benches(parsed: &[Line], runs: &[&[String]]) -> Vec<Vec<Bench>> {
    let declared: Vec<&Line> = parsed
        .iter()
        .filter(|l| !matches!(l, Line::Sample(_)))
        .collect();
    runs.iter()
        .map(|r| {
            let mut ls: Vec<Line> = declared.iter().map(|l| (*l).clone()).collect();
            ls.extend(
                parse_all(r)
                    .into_iter()
                    .filter(|l| matches!(l, Line::Sample(_))),
            );
            aggregate(&ls)
        })
        .collect()
}

/// One line per (bench, metric, compared kind): the ratios along the sweep.
pub fn summary_lines(benches: &[Bench]) -> Vec<String> {
    let mut out = vec![];
    for b in benches {
        let base = b.baseline.as_deref().unwrap_or("-");
        if !b.has_baseline() {
            out.push(format!(
                "{}: baseline `{base}` not measured; kinds {}",
                b.name,
                b.kinds.join(", ")
            ));
            continue;
        }
        for m in &b.metrics {
            for k in b.compared() {
                let rs: Vec<String> =
                    b.xs.iter()
                        .filter_map(|x| {
                            b.ratio(k, x, &m.name).map(|r| {
                                if b.x_key.is_some() {
                                    format!("{} {}", b.x_label(x), num(r))
                                } else {
                                    num(r)
                                }
                            })
                        })
                        .collect();
                if rs.is_empty() {
                    continue;
                }
                out.push(format!(
                    "{} {}: {k}/{base} = {} ({})",
                    b.name,
                    m.name,
                    rs.join(", "),
                    m.better.words()
                ));
            }
        }
    }
    out
}

/// The index of a results directory. `kernel` says which kernel produced the figures; `runs`
/// is how many VM runs the samples come from, `spread` the rows of [`run_spread`].
///
/// Over 100 lines on purpose: one Markdown document written top to bottom (header, tables,
/// summary, spread, programs, problems), in the order it reads.
pub fn index(
    benches: &[Bench],
    progs: &[Program],
    when: &str,
    reps: u32,
    kernel: &str,
    runs: usize,
    spread: &[String],
) -> String {
    let runs_words = if runs > 1 {
        format!("{runs} VM runs (the tables pool their samples; the ratio of each run is below)")
    } else {
        "one VM run".to_string()
    };
    let mut md = format!(
        "# Benchmark results\n\n`cargo xtask bench`, {when}, {reps} repetitions per point, \
         {runs_words} (QEMU TCG: the numbers compare paths measured side by side, they are not \
         hardware speeds). Method and protocol: `docs/bench.md` in the repository. Raw lines: \
         [raw.txt](raw.txt).\n\nKernel: {kernel}.\n\n## Benchmarks\n\n\
         | bench | what | baseline | compared | metrics | table | plot |\n|---|---|---|---|---|---|---|\n"
    );
    for b in benches {
        let f = file_stem(&b.name);
        let _ = writeln!(
            md,
            "| `{}` | {} | {}{} | {} | {} | [{f}.md]({f}.md) | [{f}.svg]({f}.svg) |",
            b.name,
            b.title,
            b.baseline.as_deref().unwrap_or("–"),
            if b.has_baseline() {
                ""
            } else {
                " (not measured)"
            },
            b.compared().join(", "),
            b.metrics
                .iter()
                .map(|m| m.name.as_str())
                .collect::<Vec<_>>()
                .join(", "),
        );
    }
    md.push_str(if runs > 1 {
        "\n## Ratios (median of the kind / median of the baseline over the pooled samples of \
         all runs, along the sweep; the median of the runs' own ratios is under \"Ratio per VM \
         run\")\n\n"
    } else {
        "\n## Ratios (median of the kind / median of the baseline, along the sweep)\n\n"
    });
    for l in summary_lines(benches) {
        let _ = writeln!(md, "- {l}");
    }
    if !spread.is_empty() {
        md.push_str(
            "\n## Ratio per VM run\n\nEach run measures both kinds side by side; the spread \
             of the runs' ratios is how far the ratio of one run can be trusted.\n\n\
             | bench | metric | ratio | x | each run | median | range |\n|---|---|---|---|---|---|---|\n",
        );
        for row in spread {
            let _ = writeln!(md, "{row}");
        }
    }
    md.push_str("\n## Programs\n\n| program | exit status |\n|---|---|\n");
    let status = |exit: Option<i32>| match exit {
        Some(0) => "0".to_string(),
        Some(124) => "124 (timed out)".to_string(),
        Some(c) => format!("{c} (failed: see raw.txt and the console log)"),
        None => "did not finish".to_string(),
    };
    // With several runs a program is listed once, with the status of each run in order.
    let mut rows: Vec<(&str, Vec<Option<i32>>)> = vec![];
    for p in progs {
        match rows.iter_mut().find(|(n, _)| *n == p.name) {
            Some((_, exits)) if runs > 1 => exits.push(p.exit),
            _ => rows.push((&p.name, vec![p.exit])),
        }
    }
    for (name, exits) in rows {
        let cell = if exits.len() > 1 && exits.iter().all(|e| *e == Some(0)) {
            format!("0 (all {} runs)", exits.len())
        } else if exits.len() > 1 {
            let each: Vec<String> = exits
                .iter()
                .enumerate()
                .map(|(i, e)| format!("run {}: {}", i + 1, status(*e)))
                .collect();
            each.join("; ")
        } else {
            status(exits[0])
        };
        let _ = writeln!(md, "| {name} | {cell} |");
    }
    let with_problems: Vec<&Bench> = benches.iter().filter(|b| !b.problems.is_empty()).collect();
    if !with_problems.is_empty() {
        md.push_str("\n## Problems\n\n");
        for b in with_problems {
            let _ = writeln!(md, "- `{}`: {}", b.name, b.problems.join("; "));
        }
    }
    md
}

/// What a bench run produced.
pub struct Report {
    pub benches: Vec<Bench>,
    pub programs: Vec<Program>,
    pub files: Vec<String>,
    /// The kernel the results say produced them.
    pub kernel: String,
    /// With several VM runs: the rows of [`run_spread`].
    pub spread: Vec<String>,
}

impl Report {
    /// Programs that failed or did not finish.
    pub fn failed(&self) -> Vec<&Program> {
        self.programs.iter().filter(|p| p.exit != Some(0)).collect()
    }
}

pub(crate) fn utc_now() -> String {
    // RFC 3339 `2026-11-25T04:10:00Z` as `2026-11-25 04:10 UTC`.
    let t = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    format!("{} {} UTC", &t[..10], &t[11..16])
}

/// Writes the results of one bench run: per benchmark `<bench>.md` and `<bench>.svg`, the
/// index `README.md` and `raw.txt`. Files a previous run wrote there are removed first.
/// `reps` 0: take the repetition count from the data. `kernel`: the kernel of the run; `None`
/// for the one `lines` record (a `raw.txt`).
pub fn write_results(
    lines: &[String],
    out: &Path,
    reps: u32,
    kernel: Option<&str>,
) -> Result<Report> {
    let kernel = kernel
        .map(str::to_string)
        .or_else(|| recorded_kernel(lines))
        .unwrap_or_else(|| KERNEL_UNKNOWN.to_string());
    let parsed = parse_all(lines);
    let progs = programs(lines);
    if parsed.is_empty() {
        bail!(
            "the VM produced no BENCH lines ({} benchmark programs started; see the console log)",
            progs.len()
        );
    }
    fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    let old_index = fs::read_to_string(out.join("README.md")).unwrap_or_default();
    if old_index.starts_with("# Benchmark results") || !out.join("README.md").exists() {
        for e in fs::read_dir(out)?.flatten() {
            let path = e.path();
            if path
                .extension()
                .is_some_and(|x| x == "md" || x == "svg" || x == "txt")
            {
                fs::remove_file(&path)
                    .with_context(|| format!("removing the old {}", path.display()))?;
            }
        }
    }
    let benches = aggregate(&parsed);
    let per_run = per_run_benches(&parsed, &runs(lines));
    // Re-rendered from raw lines: the most repetitions any point has in one run.
    let reps = if reps == 0 {
        per_run
            .iter()
            .flatten()
            .flat_map(|b| b.values.values().map(|v| v.len() as u32))
            .max()
            .unwrap_or(0)
    } else {
        reps
    };
    let mut files = vec![];
    for b in &benches {
        let f = file_stem(&b.name);
        fs::write(out.join(format!("{f}.md")), markdown(b, &kernel))?;
        fs::write(out.join(format!("{f}.svg")), svg(b))?;
        files.push(format!("{f}.md"));
        files.push(format!("{f}.svg"));
    }
    let spread = run_spread(&benches, &per_run);
    fs::write(
        out.join("README.md"),
        index(
            &benches,
            &progs,
            &utc_now(),
            reps,
            &kernel,
            per_run.len(),
            &spread,
        ),
    )?;
    let mut raw = format!("{KERNEL_LINE}{kernel}\n");
    raw.extend(
        lines
            .iter()
            .filter(|l| {
                let t = l.trim();
                parse_line(t).is_some() || t.starts_with("# bench ") || is_run_marker(t)
            })
            .map(|l| format!("{}\n", l.trim())),
    );
    fs::write(out.join("raw.txt"), raw)?;
    files.push("README.md".into());
    files.push("raw.txt".into());
    Ok(Report {
        benches,
        programs: progs,
        files,
        kernel,
        spread,
    })
}

#[cfg(test)]
mod tests;
