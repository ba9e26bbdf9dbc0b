//! A streaming KTAP (and TAP 13) parser for the in-VM suite, and the console scanner that
//! turns kernel oopses, WARNs, BUGs, lockdep and kmemleak reports into failures.

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

/// What the console scanner flags.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    pub kind: &'static str,
    pub line: String,
}

/// Patterns in the kernel console log that fail a run, with a name for each.
const PATTERNS: &[(&str, &str)] = &[
    ("Oops", "Oops:"),
    ("Oops", "Oops -"),
    ("BUG", "BUG:"),
    ("BUG", "kernel BUG at"),
    ("WARN", "WARNING:"),
    ("WARN", "------------[ cut here ]------------"),
    ("KASAN", "KASAN:"),
    ("UBSAN", "UBSAN:"),
    ("panic", "Kernel panic"),
    ("GPF", "general protection fault"),
    ("kmemleak", "unreferenced object 0x"),
    ("kmemleak", "kmemleak: "),
    ("hung task", "blocked for more than"),
    ("RCU stall", "rcu_sched self-detected stall"),
    ("RCU stall", "rcu: INFO:"),
    ("lockdep", "possible recursive locking"),
    ("lockdep", "inconsistent lock state"),
    ("Rust panic", "rust_kernel: panicked"),
];

/// Benign kernel lines that contain a pattern.
const ALLOWED: &[&str] = &[
    // kmemleak's own informational lines at boot.
    "kmemleak: Kernel memory leak detector initialized",
    "kmemleak: Automatic memory scanning thread",
];

/// Returns the problem on this console line, if any.
pub fn scan_console(raw: &str) -> Option<Problem> {
    let line = strip_timestamp(raw);
    if ALLOWED.iter().any(|a| line.contains(a)) {
        return None;
    }
    // kmemleak prints "kmemleak: N new suspected memory leaks": the interesting one.
    PATTERNS
        .iter()
        .find(|(_, p)| line.contains(p))
        .map(|(k, _)| Problem {
            kind: k,
            line: line.to_string(),
        })
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
        let text = "KTAP version 1\n1..1\n    KTAP version 1\n    # Subtest: dma_buf\n    1..2\n    ok 1 export\n    not ok 2 revoke\nnot ok 1 dma_buf\n";
        let p = parse(text);
        assert_eq!(p.counts(), (1, 1, 0));
        assert_eq!(p.results[1].path, "dma_buf/revoke");
        assert!(!p.results[2].leaf);
    }

    #[test]
    fn kselftest_hash_prefixed_nesting() {
        let text = "TAP version 13\n1..1\n# TAP version 13\n# 1..2\n# ok 1 alloc_4k\n# ok 2 alloc_zero # SKIP x\nok 1 selftests: p2pbuf: exporter\n";
        let p = parse(text);
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

    #[test]
    fn bail_out_is_recorded() {
        let p = parse("1..2\nBail out! no memory\n");
        assert_eq!(p.bailed, vec!["no memory"]);
    }

    #[test]
    fn console_scanner_flags_and_allows() {
        assert!(scan_console("[    0.100000] kmemleak: Kernel memory leak detector initialized (mempool available: 16000)").is_none());
        assert_eq!(
            scan_console("[   12.1] WARNING: CPU: 0 PID: 1 at mm/x.c:1 f+0x1/0x2").map(|p| p.kind),
            Some("WARN")
        );
        assert_eq!(
            scan_console("[   3.0] BUG: kernel NULL pointer dereference, address: 0")
                .map(|p| p.kind),
            Some("BUG")
        );
        assert_eq!(
            scan_console("unreferenced object 0xffff888003d1e000 (size 64):").map(|p| p.kind),
            Some("kmemleak")
        );
        assert!(scan_console("[    1.0] nvme nvme0: 1/0/0 default/read/poll queues").is_none());
    }
}
