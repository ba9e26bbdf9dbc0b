//! `cargo xtask bench`: boots the lab in bench mode, collects the `BENCH ...` lines of the
//! programs in `tests/bench/`, and writes a Markdown table and an SVG plot per benchmark under
//! `results/`, each comparing the dma-buf path with its baseline measured in the same run, with
//! medians and spread over the repetitions.

use crate::ktap::Parser;
use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs;
use std::path::Path;

/// One `BENCH <name> key=value ...` line.
#[derive(Debug, PartialEq)]
pub struct Sample {
    pub bench: String,
    pub fields: BTreeMap<String, String>,
}

pub fn parse_sample(line: &str) -> Option<Sample> {
    let rest = line.trim_start_matches(['#', ' ']).strip_prefix("BENCH ")?;
    let mut words = rest.split_whitespace();
    let bench = words.next()?.to_string();
    let fields = words
        .filter_map(|w| w.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Some(Sample { bench, fields })
}

/// Median, 10th and 90th percentile (nearest rank).
pub fn stats(v: &mut [f64]) -> (f64, f64, f64) {
    v.sort_by(|a, b| a.total_cmp(b));
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.1), at(0.9))
}

fn human(size: u64) -> String {
    match size {
        s if s >= 1 << 30 => format!("{} GiB", s >> 30),
        s if s >= 1 << 20 => format!("{} MiB", s >> 20),
        s if s >= 1 << 10 => format!("{} KiB", s >> 10),
        s => format!("{s} B"),
    }
}

/// (kind, size) -> metric -> values.
type Table = BTreeMap<(String, u64), BTreeMap<String, Vec<f64>>>;

fn collect(samples: &[Sample], bench: &str) -> Table {
    let mut t: Table = BTreeMap::new();
    for s in samples.iter().filter(|s| s.bench == bench) {
        let (Some(kind), Some(size)) = (
            s.fields.get("kind"),
            s.fields.get("size").and_then(|v| v.parse().ok()),
        ) else {
            continue;
        };
        let e = t.entry((kind.clone(), size)).or_default();
        for (k, v) in &s.fields {
            if let Ok(x) = v.parse::<f64>() {
                if k != "size" && k != "rep" {
                    e.entry(k.clone()).or_default().push(x);
                }
            }
        }
    }
    t
}

/// The export+attach+map table: per size, p2pbuf next to udmabuf.
pub fn export_map_markdown(t: &Table) -> String {
    let mut md = String::from(
        "# export + attach + map: p2pbuf (device memory) vs udmabuf (system memory)\n\n\
         Median [p10, p90] over the repetitions, microseconds, measured in one VM run (TCG).\n\
         export = the ioctl that returns the dma-buf fd (p2pbuf: allocate and zero device memory);\n\
         import = dynamic attach + map by the edu importer; ranges = DMA ranges of the mapping.\n\n\
         | size | p2pbuf export | udmabuf export | p2pbuf import | udmabuf import | import ratio p2pbuf/udmabuf | p2pbuf ranges | udmabuf ranges | ranges per GiB (p2pbuf / udmabuf) |\n\
         |---|---|---|---|---|---|---|---|---|\n",
    );
    let sizes: std::collections::BTreeSet<u64> = t.keys().map(|(_, s)| *s).collect();
    for size in sizes {
        let get = |kind: &str, m: &str| {
            t.get(&(kind.to_string(), size))
                .and_then(|e| e.get(m))
                .map(|v| stats(&mut v.clone()))
        };
        let cell = |x: Option<(f64, f64, f64)>| {
            x.map(|(m, a, b)| format!("{m:.0} [{a:.0}, {b:.0}]"))
                .unwrap_or_else(|| "-".into())
        };
        let ratio = match (get("p2pbuf", "import_us"), get("udmabuf", "import_us")) {
            (Some((a, _, _)), Some((b, _, _))) if b > 0.0 => format!("{:.2}", a / b),
            _ => "-".into(),
        };
        let ranges = |k: &str| get(k, "ranges").map(|(m, _, _)| m).unwrap_or(f64::NAN);
        let per_gib = |k: &str| ranges(k) * (1u64 << 30) as f64 / size as f64;
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {ratio} | {:.0} | {:.0} | {:.0} / {:.0} |",
            human(size),
            cell(get("p2pbuf", "export_us")),
            cell(get("udmabuf", "export_us")),
            cell(get("p2pbuf", "import_us")),
            cell(get("udmabuf", "import_us")),
            ranges("p2pbuf"),
            ranges("udmabuf"),
            per_gib("p2pbuf"),
            per_gib("udmabuf"),
        );
    }
    md
}

/// A log-log SVG line plot of median `metric` against size, one line per kind.
pub fn svg_plot(t: &Table, metrics: &[(&str, &str)], title: &str) -> String {
    let (w, h, l, r, top, bot) = (720.0, 420.0, 70.0, 180.0, 40.0, 50.0);
    let mut series: Vec<(String, Vec<(f64, f64)>)> = vec![];
    for (metric, label) in metrics {
        for kind in ["p2pbuf", "udmabuf"] {
            let pts: Vec<(f64, f64)> = t
                .iter()
                .filter(|((k, _), _)| k == kind)
                .filter_map(|((_, s), e)| {
                    e.get(*metric)
                        .map(|v| (*s as f64, stats(&mut v.clone()).0.max(0.1)))
                })
                .collect();
            if !pts.is_empty() {
                series.push((format!("{kind} {label}"), pts));
            }
        }
    }
    let all: Vec<(f64, f64)> = series.iter().flat_map(|(_, p)| p.iter().copied()).collect();
    if all.is_empty() {
        return String::new();
    }
    let lx = |x: f64| x.log10();
    let (x0, x1) = all.iter().fold((f64::MAX, f64::MIN), |(a, b), p| {
        (a.min(lx(p.0)), b.max(lx(p.0)))
    });
    let (y0, y1) = all.iter().fold((f64::MAX, f64::MIN), |(a, b), p| {
        (a.min(lx(p.1)), b.max(lx(p.1)))
    });
    let (y0, y1) = (y0.floor(), y1.ceil().max(y0.floor() + 1.0));
    let sx = |x: f64| l + (lx(x) - x0) / (x1 - x0).max(1e-9) * (w - l - r);
    let sy = |y: f64| h - bot - (lx(y) - y0) / (y1 - y0) * (h - top - bot);
    let colors = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728"];
    let mut s = format!("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"{l}\" y=\"24\" font-size=\"15\">{title}</text>\n");
    let _ = writeln!(
        s,
        "<line x1=\"{l}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>",
        h - bot,
        w - r,
        h - bot
    );
    let _ = writeln!(
        s,
        "<line x1=\"{l}\" y1=\"{top}\" x2=\"{l}\" y2=\"{}\" stroke=\"black\"/>",
        h - bot
    );
    let mut e = y0 as i32;
    while e as f64 <= y1 {
        let y = sy(10f64.powi(e));
        let _ = writeln!(s, "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">1e{e} us</text><line x1=\"{l}\" y1=\"{y}\" x2=\"{}\" y2=\"{y}\" stroke=\"#ddd\"/>", l - 6.0, y + 4.0, w - r);
        e += 1;
    }
    let mut sizes: Vec<f64> = all.iter().map(|p| p.0).collect();
    sizes.sort_by(|a, b| a.total_cmp(b));
    sizes.dedup();
    for x in sizes {
        let _ = writeln!(
            s,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
            sx(x),
            h - bot + 18.0,
            human(x as u64)
        );
    }
    for (i, (name, pts)) in series.iter().enumerate() {
        let c = colors[i % colors.len()];
        let path: Vec<String> = pts
            .iter()
            .map(|p| format!("{:.1},{:.1}", sx(p.0), sy(p.1)))
            .collect();
        let _ = writeln!(
            s,
            "<polyline fill=\"none\" stroke=\"{c}\" stroke-width=\"2\" points=\"{}\"/>",
            path.join(" ")
        );
        let ly = top + 16.0 * i as f64;
        let _ = writeln!(s, "<line x1=\"{}\" y1=\"{ly}\" x2=\"{}\" y2=\"{ly}\" stroke=\"{c}\" stroke-width=\"3\"/><text x=\"{}\" y=\"{}\">{name}</text>", w - r + 10.0, w - r + 30.0, w - r + 35.0, ly + 4.0);
    }
    s.push_str("</svg>\n");
    s
}

/// Writes the results of one bench run; returns the Markdown written.
pub fn write_results(p: &Parser, out: &Path) -> Result<String> {
    let samples: Vec<Sample> = p.lines.iter().filter_map(|l| parse_sample(l)).collect();
    if samples.is_empty() {
        bail!("the VM produced no BENCH lines (see the console log)");
    }
    fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    let t = collect(&samples, "export_map");
    let md = export_map_markdown(&t);
    fs::write(out.join("export_map.md"), &md)?;
    fs::write(
        out.join("export_map.svg"),
        svg_plot(
            &t,
            &[("import_us", "attach+map"), ("export_us", "export")],
            "export and attach+map latency (median, us) by size",
        ),
    )?;
    let raw: String = p
        .lines
        .iter()
        .filter(|l| l.contains("BENCH "))
        .map(|l| format!("{}\n", l.trim()))
        .collect();
    fs::write(out.join("raw.txt"), raw)?;
    Ok(md)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_bench_lines() {
        let s = parse_sample(
            "BENCH export_map kind=p2pbuf size=4096 rep=0 export_us=12.5 import_us=30.0 ranges=1",
        )
        .unwrap();
        assert_eq!(s.bench, "export_map");
        assert_eq!(s.fields["kind"], "p2pbuf");
        assert!(parse_sample("ok 1 x").is_none());
    }

    #[test]
    fn stats_are_order_statistics() {
        let mut v = vec![5.0, 1.0, 3.0, 2.0, 4.0];
        assert_eq!(stats(&mut v), (3.0, 1.0, 5.0));
    }

    #[test]
    fn table_compares_kinds_side_by_side() {
        let lines = [
            "BENCH export_map kind=p2pbuf size=1048576 rep=0 export_us=10 import_us=20 ranges=1",
            "BENCH export_map kind=udmabuf size=1048576 rep=0 export_us=30 import_us=40 ranges=256",
        ];
        let samples: Vec<Sample> = lines.iter().filter_map(|l| parse_sample(l)).collect();
        let md = export_map_markdown(&collect(&samples, "export_map"));
        assert!(md.contains("| 1 MiB | 10 [10, 10] | 30 [30, 30] | 20 [20, 20] | 40 [40, 40] | 0.50 | 1 | 256 | 1024 / 262144 |"), "{md}");
        assert!(svg_plot(
            &collect(&samples, "export_map"),
            &[("import_us", "map")],
            "t"
        )
        .contains("polyline"));
    }
}
