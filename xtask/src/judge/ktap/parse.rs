//! The streaming KTAP (and TAP 13) parser of the in-VM suite's results.

/// How a test ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Pass,
    Fail,
    Skip,
}

/// One result line, with the names of the tests it is nested in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TestResult {
    /// `suite/case` style path, outermost first.
    pub path: String,
    pub status: Status,
    /// The text after `#` (skip reason, or a note).
    pub directive: String,
    /// Whether it has no subtests (only leaves are counted in the summary).
    pub leaf: bool,
    pub depth: usize,
    path_parts: Vec<String>,
}

impl TestResult {
    /// A top-level result made outside the KTAP stream (host-side checks).
    pub fn new(path: String, status: Status, directive: String) -> Self {
        Self {
            path_parts: vec![path.clone()],
            path,
            status,
            directive,
            leaf: true,
            depth: 0,
        }
    }

    /// The test's own description, as its result line gave it (a `/` in it is text, not a
    /// level: `path` joins the levels with `/`).
    pub fn name(&self) -> &str {
        self.path_parts.last().map_or(&self.path, |n| n.as_str())
    }
}

#[derive(Default)]
struct Level {
    /// Name from `# Subtest:` announcing this level (KUnit), if any.
    name: Option<String>,
    plan: Option<usize>,
    results: usize,
    /// Index in `Parser::results` of this level's first result.
    first: usize,
}

/// Streaming parser: feed it lines, it returns the results as they complete.
#[derive(Default)]
pub struct Parser {
    levels: Vec<Level>,
    /// Top-level plan (`1..N`).
    pub plan: Option<usize>,
    pub results: Vec<TestResult>,
    /// Bail out! lines seen.
    pub bailed: Vec<String>,
    /// Every line fed, for checks that read diagnostics (`# hostcheck ...`).
    pub lines: Vec<String>,
}

/// Strips a printk timestamp (`[    1.234567] `) if there is one.
pub fn strip_timestamp(line: &str) -> &str {
    let t = line.trim_end_matches(['\r', '\n']);
    if let Some(rest) = t.strip_prefix('[') {
        if let Some(end) = rest.find("] ") {
            let ts = &rest[..end];
            if !ts.is_empty()
                && ts
                    .chars()
                    .all(|c| c.is_ascii_digit() || c == '.' || c == ' ')
            {
                return &rest[end + 2..];
            }
        }
    }
    t
}

fn indent_depth(line: &str) -> (usize, &str) {
    let mut depth = 0;
    let mut s = line;
    loop {
        if let Some(r) = s.strip_prefix("    ") {
            depth += 1;
            s = r;
        } else if let Some(r) = s.strip_prefix("# ").filter(|r| looks_like_ktap(r)) {
            // kselftest runners prefix nested TAP with "# ".
            depth += 1;
            s = r;
        } else if let Some(r) = s.strip_prefix('\t') {
            depth += 1;
            s = r;
        } else {
            return (depth, s);
        }
    }
}

fn looks_like_ktap(s: &str) -> bool {
    s.starts_with("ok ")
        || s.starts_with("not ok ")
        || s.starts_with("1..")
        || s.starts_with("KTAP version")
        || s.starts_with("TAP version")
        || s.starts_with("# ")
        || s.starts_with("    ")
}

/// Parses `ok 3 - name # SKIP reason` into (ok, name, directive).
fn parse_result(s: &str) -> Option<(bool, String, String)> {
    let (ok, rest) = if let Some(r) = s.strip_prefix("not ok ") {
        (false, r)
    } else if let Some(r) = s.strip_prefix("ok ") {
        (true, r)
    } else {
        return None;
    };
    let (_num, rest) = rest.split_once(' ').unwrap_or((rest, ""));
    if !_num.chars().all(|c| c.is_ascii_digit()) || _num.is_empty() {
        return None;
    }
    let rest = rest.trim_start_matches("- ").trim();
    let (name, directive) = match rest.split_once(" # ") {
        Some((n, d)) => (n.trim(), d.trim()),
        None => match rest.strip_prefix("# ") {
            Some(d) => ("", d.trim()),
            None => (rest, ""),
        },
    };
    Some((ok, name.to_string(), directive.to_string()))
}

impl Parser {
    pub fn new() -> Self {
        Self {
            levels: vec![Level::default()],
            ..Default::default()
        }
    }

    /// Feeds one line; returns the result it completed, if any.
    pub fn feed(&mut self, raw: &str) -> Option<TestResult> {
        let line = strip_timestamp(raw);
        self.lines.push(line.to_string());
        let (depth, s) = indent_depth(line);
        let s = s.trim_end();
        if let Some(b) = s.strip_prefix("Bail out!") {
            self.bailed.push(b.trim().to_string());
            return None;
        }
        while self.levels.len() < depth + 1 {
            self.levels.push(Level::default());
        }
        if let Some(name) = s.strip_prefix("# Subtest: ") {
            // KTAP v1: the subtest is announced at the indentation of its body.
            self.levels[depth] = Level {
                name: Some(name.trim().to_string()),
                first: self.results.len(),
                ..Default::default()
            };
            return None;
        }
        if let Some(p) = s.strip_prefix("1..") {
            if let Ok(n) = p.split_whitespace().next().unwrap_or("").parse::<usize>() {
                if depth == 0 {
                    self.plan = Some(n);
                }
                self.levels[depth].plan = Some(n);
            }
            return None;
        }
        let (ok, name, directive) = parse_result(s)?;
        // The level below (if it has results) belongs to this test: close it, and name its
        // results after this one where no `# Subtest:` line did.
        let leaf = match self.levels.get(depth + 1) {
            Some(l) if l.results > 0 => {
                let first = l.first;
                for r in &mut self.results[first..] {
                    if r.depth > depth && r.path_parts[depth] == "?" {
                        r.path_parts[depth] = name.clone();
                        r.path = r.path_parts.join("/");
                    }
                }
                false
            }
            _ => true,
        };
        self.levels.truncate(depth + 1);
        if self.levels[depth].results == 0 && self.levels[depth].name.is_none() {
            self.levels[depth].first = self.results.len();
        }
        self.levels[depth].results += 1;
        let mut path: Vec<String> = self.parent_names(depth);
        path.push(name);
        let upper = directive.to_ascii_uppercase();
        let status = if upper.starts_with("SKIP") {
            Status::Skip
        } else if ok || upper.starts_with("TODO") {
            Status::Pass
        } else {
            Status::Fail
        };
        let r = TestResult {
            path: path.join("/"),
            path_parts: path,
            status,
            directive,
            leaf,
            depth,
        };
        self.results.push(r.clone());
        Some(r)
    }

    fn parent_names(&self, depth: usize) -> Vec<String> {
        (1..=depth)
            .map(|d| {
                self.levels
                    .get(d)
                    .and_then(|l| l.name.clone())
                    .unwrap_or_else(|| "?".into())
            })
            .collect()
    }

    /// Leaf counts: (passed, failed, skipped).
    pub fn counts(&self) -> (usize, usize, usize) {
        let mut c = (0, 0, 0);
        for r in self.results.iter().filter(|r| r.leaf) {
            match r.status {
                Status::Pass => c.0 += 1,
                Status::Fail => c.1 += 1,
                Status::Skip => c.2 += 1,
            }
        }
        c
    }

    /// Top-level tests announced by the plan but never reported.
    pub fn missing(&self) -> usize {
        let top = self.results.iter().filter(|r| r.depth == 0).count();
        self.plan.map(|p| p.saturating_sub(top)).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Parser {
        let mut p = Parser::new();
        for l in text.lines() {
            p.feed(l);
        }
        p
    }

    #[test]
    fn flat_tap() {
        let p = parse("KTAP version 1\n1..3\nok 1 a\nnot ok 2 b\nok 3 c # SKIP no device\n");
        assert_eq!(p.counts(), (1, 1, 1));
        assert_eq!(p.missing(), 0);
        assert_eq!(p.results[2].directive, "SKIP no device");
    }

    #[test]
    fn nested_kunit_counts_leaves() {
        let p = parse("KTAP version 1\n1..1\n    KTAP version 1\n    # Subtest: dma_buf\n    1..2\n    ok 1 export\n    not ok 2 revoke\nnot ok 1 dma_buf\n");
        assert_eq!(p.counts(), (1, 1, 0));
        assert_eq!(p.results[1].path, "dma_buf/revoke");
        assert!(!p.results[2].leaf);
    }

    #[test]
    fn kselftest_hash_prefixed_nesting() {
        let p = parse("TAP version 13\n1..1\n# TAP version 13\n# 1..2\n# ok 1 alloc_4k\n# ok 2 alloc_zero # SKIP x\nok 1 selftests: p2pbuf: exporter\n");
        assert_eq!(p.counts(), (1, 0, 1));
        assert_eq!(p.results[0].path, "selftests: p2pbuf: exporter/alloc_4k");
    }

    #[test]
    fn missing_results_are_counted() {
        let p = parse("1..3\nok 1 a\n");
        assert_eq!(p.missing(), 2);
    }

    #[test]
    fn timestamps_are_stripped() {
        assert_eq!(strip_timestamp("[    1.234567] ok 1 x"), "ok 1 x");
        assert_eq!(strip_timestamp("[x] ok"), "[x] ok");
    }

    #[test]
    fn result_with_dash_and_todo() {
        let p = parse("1..2\nok 1 - first\nnot ok 2 second # TODO later\n");
        assert_eq!(p.results[0].path, "first");
        assert_eq!(p.counts(), (2, 0, 0));
    }

    /// A description with a `/` (a rate) is the leaf's name as written; the old display cut
    /// the joined path at its last `/` and showed `s)` for `rate (3.2 MiB/s)`.
    #[test]
    fn name_keeps_slashes_of_the_description() {
        let p = parse("KTAP version 1\n1..1\n    1..1\n    ok 1 copy (3.2 MiB/s)\nok 1 bench\n");
        assert_eq!(p.results[0].name(), "copy (3.2 MiB/s)");
        assert_eq!(p.results[0].path, "bench/copy (3.2 MiB/s)");
        assert_eq!(p.results[1].name(), "bench");
    }

    #[test]
    fn bail_out_is_recorded() {
        let p = parse("1..2\nBail out! no memory\n");
        assert_eq!(p.bailed, vec!["no memory"]);
    }
}
