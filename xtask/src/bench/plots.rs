//! The SVG plot of a benchmark (hand-written: deterministic, dependency-free output).

use super::*;

/// Axis labels: 1.5k, 10M.
pub(crate) fn si(v: f64) -> String {
    for (f, p) in [(1e9, "G"), (1e6, "M"), (1e3, "k")] {
        if v.abs() >= f {
            return format!("{}{p}", num(v / f));
        }
    }
    num(v)
}

pub(crate) fn num_short(v: f64) -> String {
    if v >= 10.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

pub(crate) const COLORS: [&str; 8] = [
    "#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf",
];

/// An SVG plot of one benchmark: a panel per metric, the sweep on the x axis (evenly spaced),
/// per kind the medians joined by a line, the interquartile range as a thick bar and min-max
/// as a thin whisker. The baseline is dashed. The y axis is logarithmic when the values span
/// more than 50x.
///
/// Over 100 lines on purpose: one SVG document written top to bottom, every panel drawn with
/// the page's geometry and x scale, which pieces split off would all take as arguments
/// (issue 30 names `plotters` as its replacement).
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
