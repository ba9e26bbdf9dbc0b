//! The line protocol: `BENCHINFO`, `BENCHMETRIC` and `BENCH` lines parsed.

use super::*;

/// Which way a metric improves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Better {
    Lower,
    Higher,
}

impl Better {
    pub(crate) fn words(self) -> &'static str {
        match self {
            Better::Lower => "lower is better",
            Better::Higher => "higher is better",
        }
    }
}

/// One parsed protocol line.
#[derive(Clone, Debug, PartialEq)]
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
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub bench: String,
    /// In the order of the line.
    pub fields: Vec<(String, String)>,
}

impl Sample {
    pub(crate) fn get(&self, k: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.as_str())
    }
}

pub(crate) fn kv(words: &mut std::str::SplitWhitespace<'_>) -> Vec<(String, String)> {
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
