//! The Markdown table of a benchmark, and the numbers and sizes as the tables print them.

use super::*;

pub(crate) fn human(size: u64) -> String {
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

pub(crate) fn cell(s: Option<Stats>) -> String {
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

pub(crate) fn file_stem(name: &str) -> String {
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

pub(crate) fn rep_counts(b: &Bench) -> String {
    let ns: BTreeSet<usize> = b.values.values().map(|v| v.len()).collect();
    match (ns.first(), ns.last()) {
        (Some(a), Some(z)) if a == z => format!("{a}"),
        (Some(a), Some(z)) => format!("{a} to {z}"),
        _ => "0".into(),
    }
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

pub(crate) fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}
