//! Statistics: samples aggregated per benchmark, kind, x value and metric (median, quartiles,
//! extremes), the baseline and the ratios against it.

use super::*;

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
    pub(crate) fn finish(&mut self) {
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
    pub(crate) fn get<'a>(
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
