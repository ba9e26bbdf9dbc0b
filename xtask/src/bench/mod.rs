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
//! lab's configuration without its debug block, `xtask/src/kernel/config.rs`); `raw.txt` records it
//! in its first line, `# kernel ...`, so that `--from-raw` says it again.

use anyhow::{bail, Context, Result};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::fs;
use std::path::Path;

mod plots;
mod protocol;
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
mod tests {
    use super::*;

    fn benches(lines: &[&str]) -> Vec<Bench> {
        let parsed: Vec<Line> = lines.iter().filter_map(|l| parse_line(l)).collect();
        aggregate(&parsed)
    }

    #[test]
    fn parses_the_three_line_kinds() {
        assert_eq!(
            parse_line("BENCHINFO nvme baseline=bounce title=NVMe_read_into_device_memory x=size"),
            Some(Line::Info {
                bench: "nvme".into(),
                baseline: Some("bounce".into()),
                title: Some("NVMe read into device memory".into()),
                x: Some("size".into()),
            })
        );
        assert_eq!(
            parse_line("# BENCHMETRIC nvme bw_mbps unit=MB/s better=higher"),
            Some(Line::Metric {
                bench: "nvme".into(),
                metric: "bw_mbps".into(),
                unit: Some("MB/s".into()),
                better: Some(Better::Higher),
            })
        );
        let Some(Line::Sample(s)) =
            parse_line("BENCH export_map kind=p2pbuf size=4096 rep=0 export_us=12.5")
        else {
            panic!("not a sample");
        };
        assert_eq!(s.bench, "export_map");
        assert_eq!(s.get("kind"), Some("p2pbuf"));
        assert_eq!(s.get("export_us"), Some("12.5"));
    }

    #[test]
    fn ignores_what_is_not_protocol() {
        for l in [
            "ok 1 x",
            "# bench export_map exit 0",
            "BENCHMARK x",
            "BENCH",
            "BENCHMETRIC b",
            "BENCHMETRIC b unit=us",
            "",
            "   ",
        ] {
            assert_eq!(parse_line(l), None, "{l:?}");
        }
        // A bad better= is ignored, the metric is still declared.
        assert!(matches!(
            parse_line("BENCHMETRIC b t_us better=sideways"),
            Some(Line::Metric { better: None, .. })
        ));
    }

    #[test]
    fn stats_are_quartiles_and_extremes() {
        let s = Stats::of(&[5.0, 1.0, 3.0, 2.0, 4.0]).unwrap();
        assert_eq!(
            (s.n, s.min, s.q1, s.median, s.q3, s.max),
            (5, 1.0, 2.0, 3.0, 4.0, 5.0)
        );
        let s = Stats::of(&[4.0, 1.0, 2.0, 3.0]).unwrap();
        assert_eq!((s.q1, s.median, s.q3), (1.75, 2.5, 3.25));
        assert_eq!(Stats::of(&[]), None);
        assert_eq!(Stats::of(&[f64::NAN]), None);
        assert_eq!(Stats::of(&[7.0]).unwrap().median, 7.0);
    }

    #[test]
    fn declared_bench_compares_with_its_baseline() {
        let b = benches(&[
            "BENCHINFO reg baseline=host title=MR_registration x=len",
            "BENCHMETRIC reg reg_us unit=us better=lower",
            "BENCHMETRIC reg bw unit=MB/s better=higher",
            "BENCH reg kind=dmabuf len=65536 rep=0 reg_us=10 bw=200 dev=rxe0",
            "BENCH reg kind=dmabuf len=65536 rep=1 reg_us=30 bw=400",
            "BENCH reg kind=host len=65536 rep=0 reg_us=40 bw=100",
            "BENCH reg kind=host len=65536 rep=1 reg_us=40 bw=100",
            "BENCH reg kind=host len=4096 rep=0 reg_us=4 bw=10",
        ]);
        assert_eq!(b.len(), 1);
        let b = &b[0];
        assert_eq!(b.baseline.as_deref(), Some("host"));
        assert!(b.baseline_declared);
        assert_eq!(b.title, "MR registration");
        assert_eq!(b.xs, vec!["4096", "65536"]);
        assert_eq!(b.compared(), vec!["dmabuf"]);
        // dev=rxe0 is a label, not a metric.
        let names: Vec<&str> = b.metrics.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(names, vec!["reg_us", "bw"]);
        assert_eq!(b.ratio("dmabuf", "65536", "reg_us"), Some(0.5));
        assert_eq!(b.ratio("dmabuf", "65536", "bw"), Some(3.0));
        assert_eq!(b.ratio("dmabuf", "4096", "reg_us"), None);
        let md = markdown(b, "Linux 7.2.13 + test");
        assert!(md.contains("## reg_us (us, lower is better)"), "{md}");
        assert!(
            md.contains("| 64 KiB |") || md.contains("| 65536 |"),
            "len is not a size key: {md}"
        );
        assert!(
            md.contains(
                "| 65536 | 20 [15–25] (10–30) | 40 [40–40] (40–40) | 0.500 (2.0x better) |"
            ),
            "{md}"
        );
        assert!(md.contains("| 3 (3.0x better) |"), "{md}");
        assert!(md.contains("| 4096 | – |"), "{md}");
        let svg = svg(b);
        assert!(svg.contains("stroke-dasharray"), "baseline dashed");
        assert_eq!(
            svg.matches("<polyline").count(),
            2,
            "one line per kind with 2 points: host"
        );
        let sum = summary_lines(std::slice::from_ref(b));
        assert_eq!(
            sum,
            vec![
                "reg reg_us: dmabuf/host = 65536 0.500 (lower is better)",
                "reg bw: dmabuf/host = 65536 3 (higher is better)"
            ]
        );
    }

    #[test]
    fn undeclared_export_map_infers_udmabuf_size_and_units() {
        let b = benches(&[
            "BENCH export_map kind=p2pbuf size=1048576 rep=0 export_us=10 import_us=20 ranges=1",
            "BENCH export_map kind=udmabuf size=1048576 rep=0 export_us=30 import_us=40 ranges=256",
            "BENCH export_map kind=p2pbuf size=4096 rep=0 export_us=1 import_us=2 ranges=1",
            "BENCH export_map kind=udmabuf size=4096 rep=0 export_us=1 import_us=2 ranges=1",
        ]);
        let b = &b[0];
        assert_eq!(b.baseline.as_deref(), Some("udmabuf"));
        assert!(!b.baseline_declared);
        assert_eq!(b.x_key.as_deref(), Some("size"));
        assert_eq!(b.xs, vec!["4096", "1048576"]);
        assert_eq!(b.metrics[0].unit, "us");
        assert_eq!(b.metrics[2].name, "ranges");
        let md = markdown(b, "Linux 7.2.13 + test");
        assert!(
            md.contains("| size | p2pbuf | udmabuf (baseline) | p2pbuf / udmabuf |"),
            "{md}"
        );
        assert!(
            md.contains(
                "| 1 MiB | 20 [20–20] (20–20) n=1 | 40 [40–40] (40–40) n=1 | 0.500 (2.0x better) |"
            ),
            "{md}"
        );
        assert!(
            md.contains("| 4 KiB | 1 [1–1] (1–1) n=1 | 1 [1–1] (1–1) n=1 | 1 (same) |"),
            "{md}"
        );
        assert!(md.contains("no BENCHINFO: inferred"));
    }

    #[test]
    fn no_known_baseline_takes_the_first_kind() {
        let b = benches(&[
            "BENCH t kind=fast rep=0 lat_us=1",
            "BENCH t kind=slow rep=0 lat_us=4",
        ]);
        assert_eq!(b[0].baseline.as_deref(), Some("fast"));
        assert_eq!(b[0].x_key, None);
        assert_eq!(b[0].xs, vec!["-"]);
        assert_eq!(b[0].ratio("slow", "-", "lat_us"), Some(4.0));
        assert_eq!(
            summary_lines(&b),
            vec!["t lat_us: slow/fast = 4 (lower is better)"]
        );
    }

    #[test]
    fn missing_baseline_and_bad_lines_are_reported() {
        let b = benches(&[
            "BENCHINFO w baseline=host x=size",
            "BENCHMETRIC w lat_us unit=us better=lower",
            "BENCH w kind=dmabuf size=4096 rep=0 lat_us=fail",
            "BENCH w kind=dmabuf size=4096 rep=1 lat_us=3",
            "BENCH w size=4096 rep=2 lat_us=3",
            "BENCH w kind=dmabuf rep=3 lat_us=3",
        ]);
        let b = &b[0];
        assert!(!b.has_baseline());
        assert_eq!(b.problems.len(), 3, "{:?}", b.problems);
        assert!(b.problems[0].contains("lat_us=fail is not a number"));
        assert!(b.problems[1].contains("no kind="));
        assert!(b.problems[2].contains("no size="));
        let md = markdown(b, "Linux 7.2.13 + test");
        assert!(md.contains("has no samples in this run: no ratios"), "{md}");
        assert!(md.contains("## Problems in the output"));
        assert_eq!(b.stats("dmabuf", "4096", "lat_us").unwrap().n, 1);
        assert!(summary_lines(std::slice::from_ref(b))[0].contains("not measured"));
    }

    #[test]
    fn benches_keep_their_order_and_x_can_be_text() {
        let b = benches(&[
            "BENCHINFO z x=mode",
            "BENCH z kind=a mode=write rep=0 t_us=1",
            "BENCH a kind=a rep=0 t_us=1",
            "BENCH z kind=a mode=read rep=0 t_us=1",
        ]);
        assert_eq!(
            b.iter().map(|b| b.name.as_str()).collect::<Vec<_>>(),
            vec!["z", "a"]
        );
        assert_eq!(b[0].xs, vec!["write", "read"], "first-seen order for text");
    }

    #[test]
    fn metric_inference() {
        assert_eq!(infer_metric("reg_us"), ("us".into(), Better::Lower));
        assert_eq!(infer_metric("bw_mbps"), ("mbps".into(), Better::Higher));
        assert_eq!(infer_metric("iops"), ("iops".into(), Better::Higher));
        assert_eq!(infer_metric("ranges"), (String::new(), Better::Lower));
        assert_eq!(verdict(0.5, Better::Lower), "2.0x better");
        assert_eq!(verdict(0.5, Better::Higher), "2.0x worse");
        assert_eq!(verdict(1.02, Better::Higher), "same");
        assert_eq!(verdict(0.0, Better::Lower), "–");
        assert_eq!(verdict(0.01, Better::Lower), "100x better");
    }

    #[test]
    fn program_exit_statuses() {
        let lines: Vec<String> = [
            "# bench export_map",
            "BENCH x kind=a rep=0 t=1",
            "# bench export_map exit 0",
            "# bench rdma.sh",
            "# bench rdma.sh exit 1",
            "# bench nvme",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(
            programs(&lines),
            vec![
                Program {
                    name: "export_map".into(),
                    exit: Some(0)
                },
                Program {
                    name: "rdma.sh".into(),
                    exit: Some(1)
                },
                Program {
                    name: "nvme".into(),
                    exit: None
                },
            ]
        );
        let idx = index(
            &benches(&["BENCH x kind=a rep=0 t=1"]),
            &programs(&lines),
            "now",
            3,
            "Linux 7.2.13 + test",
            1,
            &[],
        );
        assert!(idx.contains("| rdma.sh | 1 (failed"), "{idx}");
        assert!(idx.contains("| nvme | did not finish |"), "{idx}");
        assert!(idx.contains("[x.md](x.md)"), "{idx}");
    }

    /// `run_spread` of a run's lines, as `write_results` computes it.
    fn spread_of(lines: &[String]) -> Vec<String> {
        let parsed = parse_all(lines);
        run_spread(&aggregate(&parsed), &per_run_benches(&parsed, &runs(lines)))
    }

    #[test]
    fn runs_are_split_at_their_markers_and_their_ratios_compared() {
        let lines: Vec<String> = [
            "BENCHINFO m baseline=base x=size",
            "# run 1",
            "BENCH m kind=base size=4096 rep=0 t_us=10",
            "BENCH m kind=new size=4096 rep=0 t_us=12",
            "# run 2",
            "[ 1.0] a console line",
            "BENCH m kind=base size=4096 rep=0 t_us=10",
            "BENCH m kind=new size=4096 rep=0 t_us=11",
            "# run 3",
            "# run 4",
            "BENCH m kind=base size=4096 rep=0 t_us=8",
            "BENCH m kind=new size=4096 rep=0 t_us=12",
        ]
        .map(String::from)
        .to_vec();
        // The BENCHINFO line before the first marker holds no samples: not a run; nor is the
        // empty run 3.
        let rs = runs(&lines);
        assert_eq!(rs.len(), 3);
        assert_eq!(rs[1].len(), 3);
        let spread = spread_of(&lines);
        assert_eq!(
            spread,
            ["| `m` | t_us | new/base | 4 KiB | 1.20, 1.10, 1.50 | 1.20 | 1.10–1.50 |"]
        );
        // One run: nothing to compare.
        assert!(spread_of(&lines[..5]).is_empty());
        // A program's own "# run ..." line is not a marker.
        assert!(!is_run_marker("# run 3: test_x"));
        assert!(is_run_marker("# run 3"));

        // The baseline is not the first kind seen and the sweep key is not `size`, declared
        // once before the first run: every run is read with the declaration.
        let lines: Vec<String> = [
            "BENCHINFO n baseline=zzz x=len",
            "# run 1",
            "BENCH n kind=aaa len=8 rep=0 t_us=6",
            "BENCH n kind=zzz len=8 rep=0 t_us=3",
            "BENCH n kind=aaa len=8 rep=1 t_us=6",
            "BENCH n kind=zzz len=8 rep=1 t_us=3",
            "# run 2",
            "BENCH n kind=aaa len=8 rep=0 t_us=4",
            "BENCH n kind=zzz len=8 rep=0 t_us=4",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(
            spread_of(&lines),
            ["| `n` | t_us | aaa/zzz | 8 | 2, 1 | 1.50 | 1–2 |"]
        );
        // --from-raw: repetitions per point within one run (2), not over all runs (3).
        let out = std::env::temp_dir().join(format!("p2pbuf-bench-runs-{}", std::process::id()));
        let _ = fs::remove_dir_all(&out);
        write_results(&lines, &out, 0, None).unwrap();
        let idx = fs::read_to_string(out.join("README.md")).unwrap();
        assert!(idx.contains("2 repetitions per point, 2 VM runs"), "{idx}");
        let _ = fs::remove_dir_all(&out);
        let idx = index(
            &benches(&["BENCH x kind=a rep=0 t=1"]),
            &[],
            "now",
            1,
            "k",
            3,
            &spread,
        );
        assert!(idx.contains("3 VM runs"), "{idx}");
        let progs = [
            ("p", Some(0)),
            ("p", Some(0)),
            ("q", Some(0)),
            ("q", Some(2)),
        ]
        .map(|(n, e)| Program {
            name: n.into(),
            exit: e,
        });
        let idx = index(
            &benches(&["BENCH x kind=a rep=0 t=1"]),
            &progs,
            "now",
            1,
            "k",
            2,
            &spread,
        );
        assert!(idx.contains("| p | 0 (all 2 runs) |"), "{idx}");
        assert!(idx.contains("| q | run 1: 0; run 2: 2 (failed"), "{idx}");
        assert!(idx.contains("## Ratio per VM run"), "{idx}");
    }

    #[test]
    fn results_say_which_kernel_and_raw_txt_keeps_it() {
        let out = std::env::temp_dir().join(format!("p2pbuf-bench-kernel-{}", std::process::id()));
        let _ = fs::remove_dir_all(&out);
        let kernel = "Linux 7.2.13 + the p2pbuf series (9 patches), bench config (x), .config sha256 0123456789ab";
        let lines: Vec<String> = [
            "# bench export_map",
            "BENCH x kind=a size=4096 rep=0 t_us=1",
            "[   40.1] unrelated console line",
            "# bench export_map exit 0",
        ]
        .map(String::from)
        .to_vec();
        let rep = write_results(&lines, &out, 1, Some(kernel)).unwrap();
        assert_eq!(rep.kernel, kernel);
        for f in ["README.md", "x.md"] {
            let md = fs::read_to_string(out.join(f)).unwrap();
            assert!(md.contains(&format!("Kernel: {kernel}.")), "{f}: {md}");
        }
        let raw = fs::read_to_string(out.join("raw.txt")).unwrap();
        assert_eq!(
            raw.lines().next(),
            Some(format!("# kernel {kernel}").as_str())
        );
        assert!(!raw.contains("unrelated"));
        // Re-rendered from raw.txt (--from-raw): the recorded kernel, written once.
        let raw_lines: Vec<String> = raw.lines().map(String::from).collect();
        let again = out.join("again");
        let rep = write_results(&raw_lines, &again, 0, None).unwrap();
        assert_eq!(rep.kernel, kernel);
        let raw2 = fs::read_to_string(again.join("raw.txt")).unwrap();
        assert_eq!(raw2, raw);
        // Raw lines from before: said so.
        let old = out.join("old");
        let rep = write_results(&lines, &old, 0, None).unwrap();
        assert_eq!(rep.kernel, KERNEL_UNKNOWN);
        assert!(fs::read_to_string(old.join("README.md"))
            .unwrap()
            .contains("Kernel: not recorded"));
        fs::remove_dir_all(&out).unwrap();
    }

    #[test]
    fn human_sizes_and_numbers() {
        assert_eq!(human(4096), "4 KiB");
        assert_eq!(human(1536), "1.5 KiB");
        assert_eq!(human(64 << 20), "64 MiB");
        assert_eq!(human(100), "100 B");
        assert_eq!(num(1234.4), "1234");
        assert_eq!(num(12.34), "12.3");
        assert_eq!(num(0.1234), "0.123");
        assert_eq!(num(0.000244), "0.000244");
        assert_eq!(num(1.0), "1");
        assert_eq!(num(20.0), "20");
        assert_eq!(num(20.5), "20.5");
        assert_eq!(si(10_000_000.0), "10M");
        assert_eq!(si(1500.0), "1.50k");
        assert_eq!(si(0.25), "0.250");
        assert_eq!(file_stem("a/b c"), "a_b_c");
    }

    #[test]
    fn utc_now_is_the_minute_in_utc() {
        let t = utc_now();
        assert_eq!(t.len(), "2026-11-25 04:10 UTC".len(), "{t}");
        assert!(
            t.ends_with(" UTC") && &t[4..5] == "-" && &t[13..14] == ":",
            "{t}"
        );
    }
}
