//! KUnit results as the kernel's own tool reads them.
//!
//! The in-VM suite prints each KUnit suite's debugfs `results` file (KTAP) as a nested test
//! named `kunit:SUITE` (tests/vm/run-tests.sh). After a boot, every such block goes through
//! `tools/testing/kunit/kunit.py parse` of the kernel tree the lab kernel was built from: its
//! input is saved as `vm/kunit-<boot>-<suite>.ktap`, its report as
//! `logs/kunit-<boot>-<suite>.log`, and its summary line is printed, so a reviewer reads the
//! output they know from `kunit.py run`. It is also a second opinion on the
//! harness's own KTAP parser: a suite that kunit.py fails while the harness passed it fails the
//! run.

use crate::util::Ctx;
use anyhow::{Context, Result};
use std::fs;
use std::path::Path;
use std::process::Command;

/// One KUnit suite's KTAP, as its debugfs `results` file held it.
#[derive(Debug, PartialEq)]
pub struct Block {
    /// The suite name (`kunit:` stripped).
    pub suite: String,
    /// The KTAP text, de-indented to top level.
    pub ktap: String,
    /// What the in-VM suite's verdict line said (`ok`/`not ok`).
    pub passed: bool,
}

/// The `kunit:SUITE` blocks of the suite's KTAP output: the indented lines before each
/// top-level `ok N kunit:SUITE` / `not ok N kunit:SUITE` line.
pub fn blocks(results: &str) -> Vec<Block> {
    let mut out = vec![];
    let mut body: Vec<&str> = vec![];
    for line in results.lines() {
        if let Some(inner) = line.strip_prefix("    ") {
            body.push(inner);
            continue;
        }
        let (passed, rest) = if let Some(r) = line.strip_prefix("not ok ") {
            (false, r)
        } else if let Some(r) = line.strip_prefix("ok ") {
            (true, r)
        } else {
            body.clear();
            continue;
        };
        // "N kunit:SUITE[ # directive]"
        let name = rest
            .split_once(' ')
            .map(|(_, n)| n)
            .unwrap_or("")
            .split(" #")
            .next()
            .unwrap_or("")
            .trim();
        if let Some(suite) = name.strip_prefix("kunit:") {
            let mut ktap = body.join("\n");
            ktap.push('\n');
            out.push(Block {
                suite: suite.to_string(),
                ktap,
                passed,
            });
        }
        body.clear();
    }
    out
}

/// The summary line of a `kunit.py parse` report, without its `[hh:mm:ss] ` stamp.
pub fn summary_line(report: &str) -> Option<&str> {
    report
        .lines()
        .map(|l| match l.strip_prefix('[') {
            Some(r) => r.split_once("] ").map_or(l, |(_, t)| t),
            None => l,
        })
        .rfind(|l| l.starts_with("Testing complete."))
}

/// Runs `kunit.py parse` on every KUnit block of `results`; prints one line per suite and
/// returns the suites kunit.py failed although the harness passed them. kunit.py missing or
/// not runnable is said and skipped (the harness's own verdict stands).
pub fn report(ctx: &Ctx, results: &Path, boot: &str) -> Result<Vec<String>> {
    let text = fs::read_to_string(results)
        .with_context(|| format!("cannot read {}", results.display()))?;
    let blocks = blocks(&text);
    if blocks.is_empty() {
        return Ok(vec![]);
    }
    let kunit_py = ctx.ksrc()?.join("tools/testing/kunit/kunit.py");
    if !kunit_py.exists() {
        println!(
            "    kunit.py: not in the kernel tree ({}): KUnit results not cross-checked",
            kunit_py.display()
        );
        return Ok(vec![]);
    }
    let mut disagree = vec![];
    for b in &blocks {
        let input = ctx.vm_dir().join(format!("kunit-{boot}-{}.ktap", b.suite));
        fs::write(&input, &b.ktap)?;
        let out = match Command::new("python3")
            .arg(&kunit_py)
            .arg("parse")
            .arg("--failed")
            .arg(&input)
            .output()
        {
            Ok(o) => o,
            Err(e) => {
                println!("    kunit.py: cannot run python3 ({e}): KUnit results not cross-checked");
                return Ok(vec![]);
            }
        };
        let report = String::from_utf8_lossy(&out.stdout).into_owned();
        let log = ctx.log_path(&format!("kunit-{boot}-{}", b.suite));
        fs::write(
            &log,
            format!("{report}{}", String::from_utf8_lossy(&out.stderr)),
        )?;
        let line = summary_line(&report).unwrap_or("no summary (see the log)");
        println!("    kunit.py parse: {}: {line}", b.suite);
        if !out.status.success() {
            for l in report.lines().filter(|l| l.contains("[FAILED]")) {
                println!("      {l}");
            }
            if b.passed {
                disagree.push(format!(
                    "kunit:{}: kunit.py parse fails it ({line}) but the suite's verdict was ok; \
                     see {}",
                    b.suite,
                    log.display()
                ));
            }
        }
    }
    Ok(disagree)
}

#[cfg(test)]
mod tests {
    use super::*;

    const RESULTS: &str = "\
KTAP version 1
1..3
    # a shell test's output
ok 1 exporter.sh
    KTAP version 1
    1..1
        KTAP version 1
        # Subtest: rust_kernel_dma_buf
        1..2
        ok 1 export_maps
        not ok 2 revoke_races
    not ok 1 rust_kernel_dma_buf
not ok 2 kunit:rust_kernel_dma_buf
    KTAP version 1
    1..1
    ok 1 rust_kernel_fmt
ok 3 kunit:rust_kernel_fmt # SKIP
";

    #[test]
    fn finds_each_kunit_block_and_its_verdict() {
        let b = blocks(RESULTS);
        assert_eq!(b.len(), 2);
        assert_eq!(b[0].suite, "rust_kernel_dma_buf");
        assert!(!b[0].passed);
        assert!(b[0]
            .ktap
            .starts_with("KTAP version 1\n1..1\n    KTAP version 1\n"));
        assert!(b[0].ktap.ends_with("not ok 1 rust_kernel_dma_buf\n"));
        assert!(!b[0].ktap.contains("shell test"));
        assert_eq!(b[1].suite, "rust_kernel_fmt");
        assert!(b[1].passed);
        assert_eq!(b[1].ktap, "KTAP version 1\n1..1\nok 1 rust_kernel_fmt\n");
    }

    #[test]
    fn no_kunit_no_blocks() {
        assert!(blocks("KTAP version 1\n1..1\n    # x\nok 1 a.sh\n").is_empty());
    }

    #[test]
    fn summary_without_the_time_stamp() {
        let r =
            "[06:39:39] ====\n[06:39:39] Testing complete. Ran 14 tests: passed: 13, failed: 1\n";
        assert_eq!(
            summary_line(r),
            Some("Testing complete. Ran 14 tests: passed: 13, failed: 1")
        );
        assert_eq!(summary_line("nothing\n"), None);
    }
}
