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
//! lab's configuration without its debug block, `xtask/src/kernel.rs`); `raw.txt` records it
//! in its first line, `# kernel ...`, so that `--from-raw` says it again.

use anyhow::{bail, Context, Result};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::fs;
use std::path::Path;

/// Which way a metric improves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Better {
    Lower,
    Higher,
}

impl Better {
    fn words(self) -> &'static str {
        match self {
            Better::Lower => "lower is better",
            Better::Higher => "higher is better",
        }
    }
}

/// One parsed protocol line.
#[derive(Debug, PartialEq)]
pub enum Line {
    /// `BENCHINFO <bench> baseline=<kind> title=<words> x=<key>`.
    Info {
        bench: String,
        baseline: Option<String>,
        title: Option<String>,
        x: Option<String>,
    },
    /// `BENCHMETRIC <bench> <metric> unit=<unit> better=lower|higher`.
    Metric {
        bench: String,
        metric: String,
        unit: Option<String>,
        better: Option<Better>,
    },
    /// `BENCH <bench> key=value ...`.
    Sample(Sample),
}

/// One `BENCH <name> key=value ...` line.
#[derive(Debug, PartialEq)]
pub struct Sample {
    pub bench: String,
    /// In the order of the line.
    pub fields: Vec<(String, String)>,
}

impl Sample {
    fn get(&self, k: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.as_str())
    }
}

fn kv(words: &mut std::str::SplitWhitespace<'_>) -> Vec<(String, String)> {
    words
        .filter_map(|w| w.split_once('='))
        .filter(|(k, _)| !k.is_empty())
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Parses one console line; `None` for anything that is not a protocol line. A leading `# `
/// (a TAP diagnostic) is allowed.
pub fn parse_line(line: &str) -> Option<Line> {
    let s = line.trim().trim_start_matches(['#', ' ']);
    let (tag, rest) = s.split_once(char::is_whitespace)?;
    let mut words = rest.split_whitespace();
    let bench = words.next()?.to_string();
    match tag {
        "BENCH" => Some(Line::Sample(Sample {
            bench,
            fields: kv(&mut words),
        })),
        "BENCHINFO" => {
            let f: BTreeMap<_, _> = kv(&mut words).into_iter().collect();
            Some(Line::Info {
                bench,
                baseline: f.get("baseline").cloned(),
                title: f.get("title").map(|t| t.replace('_', " ")),
                x: f.get("x").cloned(),
            })
        }
        "BENCHMETRIC" => {
            let metric = words.next()?.to_string();
            if metric.contains('=') {
                return None;
            }
            let f: BTreeMap<_, _> = kv(&mut words).into_iter().collect();
            Some(Line::Metric {
                bench,
                metric,
                unit: f.get("unit").cloned(),
                better: match f.get("better").map(|s| s.as_str()) {
                    Some("lower") => Some(Better::Lower),
                    Some("higher") => Some(Better::Higher),
                    _ => None,
                },
            })
        }
        _ => None,
    }
}

/// Median, quartiles (linear interpolation), extremes and count of a set of samples.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Stats {
    pub n: usize,
    pub min: f64,
    pub q1: f64,
    pub median: f64,
    pub q3: f64,
    pub max: f64,
}

impl Stats {
    pub fn of(v: &[f64]) -> Option<Stats> {
        let mut v: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(|a, b| a.total_cmp(b));
        let q = |p: f64| {
            let h = (v.len() - 1) as f64 * p;
            let (lo, hi) = (h.floor() as usize, h.ceil() as usize);
            v[lo] + (h - lo as f64) * (v[hi] - v[lo])
        };
        Some(Stats {
            n: v.len(),
            min: v[0],
            q1: q(0.25),
            median: q(0.5),
            q3: q(0.75),
            max: v[v.len() - 1],
        })
    }
}

/// A metric of one benchmark.
#[derive(Clone, Debug, PartialEq)]
pub struct Metric {
    pub name: String,
    pub unit: String,
    pub better: Better,
    /// Described by a `BENCHMETRIC` line (otherwise inferred from the name).
    pub declared: bool,
}

/// Unit and direction of an undeclared metric, from its name: `*_us`, `*_ns`, `*_ms`, `*_s`
/// are times (lower is better); names with `bps`, `per_s`, `bw`, `iops` or `ops` are rates
/// (higher is better); anything else is a count, lower is better.
pub fn infer_metric(name: &str) -> (String, Better) {
    let lname = name.to_ascii_lowercase();
    let suffix = lname.rsplit('_').next().unwrap_or("");
    let unit = match suffix {
        "us" | "ns" | "ms" | "s" | "mbps" | "gbps" | "mibs" | "gibs" | "iops" | "pct" => {
            suffix.to_string()
        }
        _ => String::new(),
    };
    let higher = ["bps", "per_s", "bw", "iops", "ops", "mibs", "gibs"]
        .iter()
        .any(|w| lname.contains(w));
    (
        unit,
        if higher {
            Better::Higher
        } else {
            Better::Lower
        },
    )
}

/// Kind names taken as the baseline when a benchmark does not declare one.
pub const BASELINE_NAMES: [&str; 6] = ["udmabuf", "baseline", "host", "bounce", "sysmem", "cpu"];

/// Everything one benchmark printed, aggregated.
#[derive(Debug, Default)]
pub struct Bench {
    pub name: String,
    pub title: String,
    /// The baseline kind, and whether `BENCHINFO` named it.
    pub baseline: Option<String>,
    pub baseline_declared: bool,
    /// The sweep key (`x=`), `None` when samples have no sweep.
    pub x_key: Option<String>,
    pub metrics: Vec<Metric>,
    /// In the order first seen.
    pub kinds: Vec<String>,
    /// Sweep values, sorted (numerically when they all are numbers).
    pub xs: Vec<String>,
    /// (kind, x, metric) -> values over the repetitions.
    pub values: BTreeMap<(String, String, String), Vec<f64>>,
    /// Lines that did not fit (no kind, no x value, a non-numeric declared metric, ...).
    pub problems: Vec<String>,
    samples: Vec<Sample>,
}

impl Bench {
    pub fn stats(&self, kind: &str, x: &str, metric: &str) -> Option<Stats> {
        self.values
            .get(&(kind.to_string(), x.to_string(), metric.to_string()))
            .and_then(|v| Stats::of(v))
    }

    /// Kinds other than the baseline.
    pub fn compared(&self) -> Vec<&str> {
        self.kinds
            .iter()
            .filter(|k| Some(*k) != self.baseline.as_ref())
            .map(|k| k.as_str())
            .collect()
    }

    /// Whether the baseline was measured in this run.
    pub fn has_baseline(&self) -> bool {
        self.baseline
            .as_ref()
            .is_some_and(|b| self.kinds.contains(b))
    }

    /// median(kind) / median(baseline) of `metric` at `x`.
    pub fn ratio(&self, kind: &str, x: &str, metric: &str) -> Option<f64> {
        let b = self.baseline.as_deref()?;
        let (k, b) = (self.stats(kind, x, metric)?, self.stats(b, x, metric)?);
        (b.median != 0.0).then(|| k.median / b.median)
    }

    /// Resolves the defaults and files the samples. Without `BENCHINFO`: the title is the
    /// bench name, the sweep key is `size` when samples carry one, and the baseline is the
    /// first kind seen whose name is one of [`BASELINE_NAMES`], else the first kind seen.
    /// Metrics are the declared ones, in order, then any other numeric field.
    fn finish(&mut self) {
        if self.title.is_empty() {
            self.title = self.name.clone();
        }
        let samples = std::mem::take(&mut self.samples);
        if self.x_key.is_none() && samples.iter().any(|s| s.get("size").is_some()) {
            self.x_key = Some("size".into());
        }
        let x_key = self.x_key.clone();
        let mut xs: Vec<String> = vec![];
        for (i, s) in samples.iter().enumerate() {
            let Some(kind) = s.get("kind") else {
                self.problems
                    .push(format!("sample {} has no kind=: ignored", i + 1));
                continue;
            };
            let x = match &x_key {
                Some(k) => match s.get(k) {
                    Some(v) => v.to_string(),
                    None => {
                        self.problems
                            .push(format!("sample {} ({kind}) has no {k}=: ignored", i + 1));
                        continue;
                    }
                },
                None => "-".to_string(),
            };
            if !self.kinds.iter().any(|k| k == kind) {
                self.kinds.push(kind.to_string());
            }
            if !xs.contains(&x) {
                xs.push(x.clone());
            }
            for (k, v) in &s.fields {
                if k == "kind" || k == "rep" || Some(k) == x_key.as_ref() {
                    continue;
                }
                let declared = self.metrics.iter().any(|m| &m.name == k);
                match v.parse::<f64>() {
                    Ok(val) if val.is_finite() => {
                        if !declared {
                            let (unit, better) = infer_metric(k);
                            self.metrics.push(Metric {
                                name: k.clone(),
                                unit,
                                better,
                                declared: false,
                            });
                        }
                        self.values
                            .entry((kind.to_string(), x.clone(), k.clone()))
                            .or_default()
                            .push(val);
                    }
                    // Undeclared text fields are labels (e.g. dev=rxe0).
                    _ if declared => self.problems.push(format!(
                        "sample {} ({kind}, {}): {k}={v} is not a number: left out",
                        i + 1,
                        x
                    )),
                    _ => {}
                }
            }
        }
        let numeric: Option<Vec<f64>> = xs.iter().map(|x| x.parse::<f64>().ok()).collect();
        if let Some(n) = numeric {
            let mut pairs: Vec<(f64, String)> = n.into_iter().zip(xs).collect();
            pairs.sort_by(|a, b| a.0.total_cmp(&b.0));
            xs = pairs.into_iter().map(|p| p.1).collect();
        }
        self.xs = xs;
        if self.baseline.is_none() {
            self.baseline = BASELINE_NAMES
                .iter()
                .find_map(|b| self.kinds.iter().find(|k| k == b))
                .or(self.kinds.first())
                .cloned();
        }
        if self.kinds.is_empty() {
            self.problems.push("no samples".into());
        }
    }

    /// A sweep value for display: sizes in binary units.
    pub fn x_label(&self, x: &str) -> String {
        let is_size = self
            .x_key
            .as_deref()
            .is_some_and(|k| k == "size" || k.ends_with("bytes") || k.ends_with("size"));
        match x.parse::<u64>() {
            Ok(v) if is_size => human(v),
            _ => x.to_string(),
        }
    }
}

/// Groups the protocol lines by benchmark, in the order the benchmarks first appear.
pub fn aggregate(lines: &[Line]) -> Vec<Bench> {
    let mut order: Vec<String> = vec![];
    let mut by: BTreeMap<String, Bench> = BTreeMap::new();
    fn get<'a>(
        order: &mut Vec<String>,
        by: &'a mut BTreeMap<String, Bench>,
        name: &str,
    ) -> &'a mut Bench {
        if !order.iter().any(|n| n == name) {
            order.push(name.to_string());
        }
        by.entry(name.to_string()).or_insert_with(|| Bench {
            name: name.to_string(),
            ..Default::default()
        })
    }
    for l in lines {
        match l {
            Line::Info {
                bench,
                baseline,
                title,
                x,
            } => {
                let b = get(&mut order, &mut by, bench);
                if let Some(v) = baseline {
                    b.baseline = Some(v.clone());
                    b.baseline_declared = true;
                }
                if let Some(v) = title {
                    b.title = v.clone();
                }
                if let Some(v) = x {
                    b.x_key = Some(v.clone());
                }
            }
            Line::Metric {
                bench,
                metric,
                unit,
                better,
            } => {
                let b = get(&mut order, &mut by, bench);
                let (iu, ib) = infer_metric(metric);
                let m = Metric {
                    name: metric.clone(),
                    unit: unit.clone().unwrap_or(iu),
                    better: better.unwrap_or(ib),
                    declared: true,
                };
                match b.metrics.iter_mut().find(|x| x.name == *metric) {
                    Some(old) => *old = m,
                    None => b.metrics.push(m),
                }
            }
            Line::Sample(s) => get(&mut order, &mut by, &s.bench).samples.push(Sample {
                bench: s.bench.clone(),
                fields: s.fields.clone(),
            }),
        }
    }
    let mut out = vec![];
    for name in order {
        if let Some(mut b) = by.remove(&name) {
            b.finish();
            out.push(b);
        }
    }
    out
}

fn human(size: u64) -> String {
    let units = [(40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")];
    for (shift, u) in units {
        if size >= 1 << shift {
            let v = size as f64 / (1u64 << shift) as f64;
            return if size & ((1 << shift) - 1) == 0 {
                format!("{} {u}", size >> shift)
            } else {
                format!("{v:.1} {u}")
            };
        }
    }
    format!("{size} B")
}

/// A number with about three significant digits (integers as integers).
pub fn num(v: f64) -> String {
    let a = v.abs();
    if a >= 100.0 || a == 0.0 || (v.fract() == 0.0 && a < 1e15) {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else {
        let decimals = (2 - a.log10().floor() as i32).clamp(3, 9) as usize;
        format!("{v:.decimals$}")
    }
}

fn cell(s: Option<Stats>) -> String {
    match s {
        Some(s) => format!(
            "{} [{}–{}] ({}–{}){}",
            num(s.median),
            num(s.q1),
            num(s.q3),
            num(s.min),
            num(s.max),
            if s.n == 1 { " n=1" } else { "" }
        ),
        None => "–".into(),
    }
}

/// How a ratio reads: by how much the compared kind beats the baseline or loses to it, given
/// the metric's direction (within 5% either way: "same").
pub fn verdict(ratio: f64, better: Better) -> String {
    let gain = match better {
        Better::Lower => 1.0 / ratio,
        Better::Higher => ratio,
    };
    if !gain.is_finite() {
        "–".into()
    } else if gain > 1.05 {
        format!("{}x better", num_short(gain))
    } else if gain < 1.0 / 1.05 {
        format!("{}x worse", num_short(1.0 / gain))
    } else {
        "same".into()
    }
}

/// Axis labels: 1.5k, 10M.
fn si(v: f64) -> String {
    for (f, p) in [(1e9, "G"), (1e6, "M"), (1e3, "k")] {
        if v.abs() >= f {
            return format!("{}{p}", num(v / f));
        }
    }
    num(v)
}

fn num_short(v: f64) -> String {
    if v >= 10.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

fn file_stem(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

fn rep_counts(b: &Bench) -> String {
    let ns: BTreeSet<usize> = b.values.values().map(|v| v.len()).collect();
    match (ns.first(), ns.last()) {
        (Some(a), Some(z)) if a == z => format!("{a}"),
        (Some(a), Some(z)) => format!("{a} to {z}"),
        _ => "0".into(),
    }
}

/// The line of `raw.txt` that records the kernel of the run (before the protocol lines).
const KERNEL_LINE: &str = "# kernel ";

/// What the results say about a kernel that no `# kernel` line recorded.
const KERNEL_UNKNOWN: &str = "not recorded (raw lines from before xtask recorded the kernel)";

/// The kernel a run's lines (a `raw.txt`) record, if any.
pub fn recorded_kernel(lines: &[String]) -> Option<String> {
    lines
        .iter()
        .find_map(|l| l.trim().strip_prefix(KERNEL_LINE))
        .map(|k| k.trim().to_string())
        .filter(|k| !k.is_empty())
}

/// The Markdown report of one benchmark: one table per metric. `kernel` says which kernel
/// produced the figures.
pub fn markdown(b: &Bench, kernel: &str) -> String {
    let mut md = format!("# {} (`{}`)\n\n", b.title, b.name);
    let _ = writeln!(md, "Kernel: {kernel}.\n");
    let base = b.baseline.as_deref().unwrap_or("-");
    let compared = b.compared();
    let _ = writeln!(
        md,
        "Baseline: `{base}` ({}); compared: {}; sweep: `{}`; repetitions per point: {}.\n",
        if b.baseline_declared {
            "named by the benchmark"
        } else {
            "no BENCHINFO: inferred"
        },
        if compared.is_empty() {
            "nothing".into()
        } else {
            compared
                .iter()
                .map(|k| format!("`{k}`"))
                .collect::<Vec<_>>()
                .join(", ")
        },
        b.x_key.as_deref().unwrap_or("none"),
        rep_counts(b),
    );
    md.push_str(
        "Cells: median [interquartile range] (min–max) over the repetitions of one VM run (QEMU \
         TCG). Ratio: median of the kind / median of the baseline, and whether that is better \
         or worse given the metric's direction (within 5% = same).\n\n",
    );
    if !b.has_baseline() {
        let _ = writeln!(
            md,
            "**The baseline `{base}` has no samples in this run: no ratios.**\n"
        );
    }
    let xname = b.x_key.as_deref().unwrap_or("-");
    for m in &b.metrics {
        let _ = writeln!(
            md,
            "## {}{}\n",
            m.name,
            if m.unit.is_empty() {
                format!(" ({})", m.better.words())
            } else {
                format!(" ({}, {})", m.unit, m.better.words())
            }
        );
        let mut head = format!("| {xname} |");
        let mut rule = String::from("|---|");
        let mut kinds: Vec<&str> = compared.clone();
        if b.has_baseline() {
            kinds.push(base);
        }
        for k in &kinds {
            let _ = write!(
                head,
                " {k}{} |",
                if *k == base { " (baseline)" } else { "" }
            );
            rule.push_str("---|");
        }
        if b.has_baseline() {
            for k in &compared {
                let _ = write!(head, " {k} / {base} |");
                rule.push_str("---|");
            }
        }
        let _ = writeln!(md, "{head}\n{rule}");
        for x in &b.xs {
            let mut row = format!("| {} |", b.x_label(x));
            for k in &kinds {
                let _ = write!(row, " {} |", cell(b.stats(k, x, &m.name)));
            }
            if b.has_baseline() {
                for k in &compared {
                    let r = b
                        .ratio(k, x, &m.name)
                        .map(|r| format!("{} ({})", num(r), verdict(r, m.better)))
                        .unwrap_or_else(|| "–".into());
                    let _ = write!(row, " {r} |");
                }
            }
            let _ = writeln!(md, "{row}");
        }
        md.push('\n');
    }
    if !b.problems.is_empty() {
        md.push_str("## Problems in the output\n\n");
        for p in &b.problems {
            let _ = writeln!(md, "- {p}");
        }
        md.push('\n');
    }
    md
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

const COLORS: [&str; 8] = [
    "#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf",
];

/// An SVG plot of one benchmark: a panel per metric, the sweep on the x axis (evenly spaced),
/// per kind the medians joined by a line, the interquartile range as a thick bar and min-max
/// as a thin whisker. The baseline is dashed. The y axis is logarithmic when the values span
/// more than 50x.
pub fn svg(b: &Bench) -> String {
    let (w, ph, l, r, top, gap) = (760.0f64, 230.0f64, 80.0, 170.0, 44.0, 40.0);
    let n = b.metrics.len().max(1) as f64;
    let h = top + n * (ph + gap) + 10.0;
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"{l}\" y=\"24\" font-size=\"15\">{}</text>\n<text x=\"{}\" y=\"24\" font-size=\"10\" fill=\"#555\">dot: median; bar: IQR; whisker: min–max</text>\n",
        esc(&format!("{} ({})", b.title, b.name)),
        w - r - 40.0
    );
    let base = b.baseline.clone().unwrap_or_default();
    let kinds: Vec<&String> = b.kinds.iter().collect();
    let nx = b.xs.len().max(1) as f64;
    let sx = |i: usize| l + (i as f64 + 0.5) / nx * (w - l - r);
    for (mi, m) in b.metrics.iter().enumerate() {
        let y_top = top + mi as f64 * (ph + gap) + 16.0;
        let y_bot = y_top + ph - 40.0;
        let all: Vec<f64> = b
            .values
            .iter()
            .filter(|((_, _, mm), _)| *mm == m.name)
            .flat_map(|(_, v)| v.iter().copied())
            .collect();
        let (lo, hi) = all
            .iter()
            .fold((f64::MAX, f64::MIN), |(a, z), v| (a.min(*v), z.max(*v)));
        let log = !all.is_empty() && lo > 0.0 && hi / lo > 50.0;
        let (y0, y1) = if all.is_empty() {
            (0.0, 1.0)
        } else if log {
            (
                lo.log10().floor(),
                hi.log10().ceil().max(lo.log10().floor() + 1.0),
            )
        } else {
            (lo.min(0.0), if hi > lo.min(0.0) { hi * 1.08 } else { 1.0 })
        };
        let tr = |v: f64| if log { v.log10() } else { v };
        let sy = |v: f64| y_bot - (tr(v) - y0) / (y1 - y0) * (y_bot - y_top);
        let unit = if m.unit.is_empty() {
            String::new()
        } else {
            format!(" {}", m.unit)
        };
        let _ = writeln!(
            s,
            "<text x=\"{l}\" y=\"{}\" font-size=\"13\" font-weight=\"bold\">{}</text>",
            y_top - 6.0,
            esc(&format!(
                "{}{} — {}{}",
                m.name,
                if m.unit.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", m.unit)
                },
                m.better.words(),
                if log { ", log scale" } else { "" }
            ))
        );
        let _ = writeln!(
            s,
            "<line x1=\"{l}\" y1=\"{y_bot}\" x2=\"{}\" y2=\"{y_bot}\" stroke=\"black\"/><line x1=\"{l}\" y1=\"{y_top}\" x2=\"{l}\" y2=\"{y_bot}\" stroke=\"black\"/>",
            w - r
        );
        // y ticks
        let ticks: Vec<f64> = if log {
            (y0 as i32..=y1 as i32).map(|e| 10f64.powi(e)).collect()
        } else {
            (0..=4).map(|i| y0 + (y1 - y0) * i as f64 / 4.0).collect()
        };
        for t in ticks {
            let y = sy(t);
            let _ = writeln!(
                s,
                "<line x1=\"{l}\" y1=\"{y:.1}\" x2=\"{}\" y2=\"{y:.1}\" stroke=\"#e5e5e5\"/><text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
                w - r,
                l - 6.0,
                y + 4.0,
                esc(&format!("{}{unit}", si(t)))
            );
        }
        for (i, x) in b.xs.iter().enumerate() {
            let _ = writeln!(
                s,
                "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
                sx(i),
                y_bot + 16.0,
                esc(&b.x_label(x))
            );
        }
        if let Some(k) = &b.x_key {
            let _ = writeln!(
                s,
                "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\" fill=\"#555\">{}</text>",
                (l + w - r) / 2.0,
                y_bot + 32.0,
                esc(k)
            );
        }
        for (ki, kind) in kinds.iter().enumerate() {
            let c = COLORS[ki % COLORS.len()];
            let dash = if **kind == base {
                " stroke-dasharray=\"6,4\""
            } else {
                ""
            };
            // Small offsets keep the whiskers of different kinds apart.
            let off = (ki as f64 - (kinds.len() as f64 - 1.0) / 2.0) * 6.0;
            let mut pts = vec![];
            for (i, x) in b.xs.iter().enumerate() {
                if let Some(st) = b.stats(kind, x, &m.name) {
                    let px = sx(i) + off;
                    let _ = writeln!(
                        s,
                        "<line x1=\"{px:.1}\" y1=\"{:.1}\" x2=\"{px:.1}\" y2=\"{:.1}\" stroke=\"{c}\" stroke-width=\"1\"/><line x1=\"{px:.1}\" y1=\"{:.1}\" x2=\"{px:.1}\" y2=\"{:.1}\" stroke=\"{c}\" stroke-width=\"5\" opacity=\"0.5\"/><circle cx=\"{px:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"{c}\"/>",
                        sy(st.min),
                        sy(st.max),
                        sy(st.q1),
                        sy(st.q3),
                        sy(st.median)
                    );
                    pts.push(format!("{px:.1},{:.1}", sy(st.median)));
                }
            }
            if pts.len() > 1 {
                let _ = writeln!(
                    s,
                    "<polyline fill=\"none\" stroke=\"{c}\" stroke-width=\"2\"{dash} points=\"{}\"/>",
                    pts.join(" ")
                );
            }
            let ly = y_top + 16.0 * ki as f64;
            let _ = writeln!(
                s,
                "<line x1=\"{}\" y1=\"{ly}\" x2=\"{}\" y2=\"{ly}\" stroke=\"{c}\" stroke-width=\"3\"{dash}/><text x=\"{}\" y=\"{}\">{}</text>",
                w - r + 10.0,
                w - r + 34.0,
                w - r + 40.0,
                ly + 4.0,
                esc(&format!(
                    "{kind}{}",
                    if **kind == base { " (baseline)" } else { "" }
                ))
            );
        }
    }
    s.push_str("</svg>\n");
    s
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

/// The index of a results directory. `kernel` says which kernel produced the figures.
pub fn index(benches: &[Bench], progs: &[Program], when: &str, reps: u32, kernel: &str) -> String {
    let mut md = format!(
        "# Benchmark results\n\n`cargo xtask bench`, {when}, {reps} repetitions per point, one VM \
         run (QEMU TCG: the numbers compare paths measured side by side, they are not hardware \
         speeds). Method and protocol: `docs/bench.md` in the repository. Raw lines: \
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
    md.push_str("\n## Ratios (median of the kind / median of the baseline, along the sweep)\n\n");
    for l in summary_lines(benches) {
        let _ = writeln!(md, "- {l}");
    }
    md.push_str("\n## Programs\n\n| program | exit status |\n|---|---|\n");
    for p in progs {
        let _ = writeln!(
            md,
            "| {} | {} |",
            p.name,
            match p.exit {
                Some(0) => "0".to_string(),
                Some(124) => "124 (timed out)".to_string(),
                Some(c) => format!("{c} (failed: see raw.txt and the console log)"),
                None => "did not finish".to_string(),
            }
        );
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
}

impl Report {
    /// Programs that failed or did not finish.
    pub fn failed(&self) -> Vec<&Program> {
        self.programs.iter().filter(|p| p.exit != Some(0)).collect()
    }
}

fn utc_now() -> String {
    std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|| "(date unknown)".into())
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
    let parsed: Vec<Line> = lines.iter().filter_map(|l| parse_line(l)).collect();
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
    // Re-rendered from raw lines: the most repetitions any point has.
    let reps = if reps == 0 {
        benches
            .iter()
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
    fs::write(
        out.join("README.md"),
        index(&benches, &progs, &utc_now(), reps, &kernel),
    )?;
    let mut raw = format!("{KERNEL_LINE}{kernel}\n");
    raw.extend(
        lines
            .iter()
            .filter(|l| {
                let t = l.trim();
                parse_line(t).is_some() || t.starts_with("# bench ")
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
        );
        assert!(idx.contains("| rdma.sh | 1 (failed"), "{idx}");
        assert!(idx.contains("| nvme | did not finish |"), "{idx}");
        assert!(idx.contains("[x.md](x.md)"), "{idx}");
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
}
