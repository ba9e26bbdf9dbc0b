//! The MAINTAINERS entries that the series add, read from the stored patches: maintained
//! (`M:`) by the sender alone ([`mail::SENDER_PLACEHOLDER`], filled in at emission), never
//! by people who were not asked (the dma-buf maintainers are at most `R:`), and covering the
//! C helpers the Rust abstractions add to or use (`rust/helpers/dma-resv.c`). Also checks that
//! every hunk of every stored patch counts its lines right, since these entries are edited by
//! hand.

use crate::mail;
use crate::series::Series;
use anyhow::{bail, Result};
use std::fs;

/// Files that an entry maintained by the sender must list (`F:`).
pub(super) const MUST_COVER: &[&str] = &["rust/helpers/dma-resv.c"];

/// One hunk of a patch to MAINTAINERS: its lines (context and added, without the leading
/// character), and whether each was added.
type Hunk = Vec<(bool, String)>;

/// The hunks of `text` (a patch mail) that change MAINTAINERS, and an error for any hunk of
/// any file whose header does not count its lines.
fn maintainers_hunks(text: &str) -> Result<Vec<Hunk>> {
    let lines: Vec<&str> = text.lines().collect();
    let mut hunks = Vec::new();
    let mut in_maintainers = false;
    let mut i = 0;
    while i < lines.len() {
        let l = lines[i];
        i += 1;
        if let Some(rest) = l.strip_prefix("diff --git ") {
            in_maintainers = rest == "a/MAINTAINERS b/MAINTAINERS";
            continue;
        }
        let Some((old, new)) = hunk_counts(l) else {
            continue;
        };
        let (mut o, mut n) = (0, 0);
        let mut hunk = Vec::new();
        while o < old || n < new {
            let Some(&b) = lines.get(i) else {
                bail!("`{l}`: the patch ends after {o} old and {n} new line(s)");
            };
            i += 1;
            match b.chars().next() {
                Some(' ') | None => {
                    o += 1;
                    n += 1;
                    hunk.push((false, b.get(1..).unwrap_or("").to_string()));
                }
                Some('-') => o += 1,
                Some('+') => {
                    n += 1;
                    hunk.push((true, b[1..].to_string()));
                }
                Some('\\') => {}
                _ => bail!("`{l}`: `{b}` is no line of a hunk ({o} old, {n} new so far)"),
            }
        }
        if o != old || n != new {
            bail!("`{l}`: the hunk has {o} old and {n} new line(s)");
        }
        if let Some(next) = lines.get(i) {
            if next.starts_with([' ', '+', '-']) && !next.starts_with("-- ") {
                bail!("`{l}`: more lines than the header counts (`{next}`)");
            }
        }
        if in_maintainers {
            hunks.push(hunk);
        }
    }
    Ok(hunks)
}

/// `@@ -a,b +c,d @@` into (b, d); a missing count is 1.
fn hunk_counts(l: &str) -> Option<(usize, usize)> {
    let rest = l.strip_prefix("@@ -")?;
    let (ranges, _) = rest.split_once(" @@")?;
    let (old, new) = ranges.split_once(" +")?;
    let count = |r: &str| match r.split_once(',') {
        Some((_, n)) => n.parse().ok(),
        None => r.parse::<usize>().ok().map(|_| 1),
    };
    Some((count(old)?, count(new)?))
}

/// What the stored patches of `series` do to MAINTAINERS: every added `M:` is the sender's
/// placeholder, and the entries the sender maintains list [`MUST_COVER`]. Errors name the
/// patch.
pub(super) fn check(series: &[Series]) -> Result<()> {
    let mut covered: Vec<&str> = Vec::new();
    let mut entries = 0;
    for s in series {
        for p in &s.patches {
            let text = fs::read_to_string(p)?;
            let name = crate::util::file_name(p);
            let hunks = maintainers_hunks(&text).map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
            for h in &hunks {
                check_hunk(h, &name, &mut covered, &mut entries)?;
            }
        }
    }
    if entries > 0 {
        if let Some(f) = MUST_COVER.iter().find(|f| !covered.contains(f)) {
            bail!(
                "no MAINTAINERS entry that the series add (`M:\t{}`) lists `F:\t{f}`",
                mail::SENDER_PLACEHOLDER
            );
        }
    }
    Ok(())
}

/// One hunk: its added `M:` lines, and the `F:` lines of the entries (paragraphs) in it that
/// the sender maintains.
fn check_hunk(
    h: &Hunk,
    name: &str,
    covered: &mut Vec<&'static str>,
    entries: &mut usize,
) -> Result<()> {
    let ours = format!("M:\t{}", mail::SENDER_PLACEHOLDER);
    for (added, l) in h {
        if *added && l.starts_with("M:") && *l != ours {
            bail!(
                "{name} adds `{l}` to MAINTAINERS: the project's own entries are maintained by \
                 the sender (`{ours}`, filled in at emission); people who were not asked are \
                 at most `R:`"
            );
        }
    }
    for entry in h.split(|(_, l)| l.trim().is_empty()) {
        if entry.iter().any(|(a, l)| *a && *l == ours) {
            *entries += 1;
        }
        let is_ours = entry.iter().any(|(_, l)| *l == ours);
        let touched = entry.iter().any(|(a, _)| *a);
        if !(is_ours && touched) {
            continue;
        }
        for (_, l) in entry {
            if let Some(f) = l.strip_prefix("F:\t") {
                if let Some(m) = MUST_COVER.iter().find(|m| **m == f) {
                    covered.push(m);
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    /// The repository's series: the entries they add are the project's (`M:` the sender, the
    /// dma-buf maintainers `R:` at most), cover `rust/helpers/dma-resv.c`, and every hunk counts
    /// its lines.
    #[test]
    fn the_series_maintainers_entries_are_the_senders() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let all = crate::series::load(&root).unwrap();
        check(&all).unwrap();
        let added: Vec<String> = all
            .iter()
            .flat_map(|s| s.patches.iter())
            .flat_map(|p| maintainers_hunks(&fs::read_to_string(p).unwrap()).unwrap())
            .flatten()
            .filter(|(a, _)| *a)
            .map(|(_, l)| l)
            .collect();
        assert!(added.contains(&format!("M:\t{}", mail::SENDER_PLACEHOLDER)));
        for who in ["Sumit Semwal", "Christian König"] {
            let lines: Vec<&String> = added.iter().filter(|l| l.contains(who)).collect();
            assert!(
                lines.iter().all(|l| l.starts_with("R:\t")),
                "{who}: {lines:?}"
            );
        }
        // At emission the sender takes the placeholder's place.
        let me = mail::parse_ident("Jane Doe <jane@kernel.org>").unwrap();
        let p = all
            .iter()
            .flat_map(|s| s.patches.iter())
            .find(|p| crate::util::file_name(p).starts_with("0004-rust-dma-buf"))
            .unwrap();
        let sent = mail::fill_sender(&fs::read_to_string(p).unwrap(), &me);
        assert!(sent.contains("\n+M:\tJane Doe <jane@kernel.org>\n"));
        assert!(!sent.contains(mail::SENDER_PLACEHOLDER));
    }

    fn patch(body: &str) -> String {
        format!("Subject: x\n---\ndiff --git a/MAINTAINERS b/MAINTAINERS\n--- a/MAINTAINERS\n+++ b/MAINTAINERS\n{body}")
    }

    #[test]
    fn refuses_other_maintainers_and_miscounted_hunks() {
        let ok = patch("@@ -1,2 +1,6 @@\n K:\tx\n \n+X [RUST]\n+M:\t@SENDER@\n+F:\trust/helpers/dma-resv.c\n+\n");
        let h = maintainers_hunks(&ok).unwrap();
        assert_eq!(h.len(), 1);
        let (mut cov, mut n) = (vec![], 0);
        check_hunk(&h[0], "p", &mut cov, &mut n).unwrap();
        assert_eq!((cov, n), (vec!["rust/helpers/dma-resv.c"], 1));
        let other = patch("@@ -1,1 +1,3 @@\n \n+X [RUST]\n+M:\tSumit Semwal <s@l.org>\n");
        let h = maintainers_hunks(&other).unwrap();
        let e = check_hunk(&h[0], "p", &mut vec![], &mut 0).unwrap_err();
        assert!(e.to_string().contains("at most `R:`"), "{e}");
        let short = patch("@@ -1,1 +1,4 @@\n \n+X [RUST]\n+M:\t@SENDER@\n");
        assert!(maintainers_hunks(&short).is_err());
        let long = patch("@@ -1,1 +1,2 @@\n \n+X [RUST]\n+M:\t@SENDER@\n");
        assert!(maintainers_hunks(&long).is_err());
        assert_eq!(hunk_counts("@@ -7,6 +7,20 @@ F:\tx"), Some((6, 20)));
        assert_eq!(hunk_counts("@@ -0,0 +1 @@"), Some((0, 1)));
    }
}
