//! docs/series.md's table of lines per patch, checked against the series in
//! linux/series: a patch added, dropped, moved between series or grown shows up as a failing
//! host test that prints the table as it should be.

use std::fs;
use std::path::Path;

/// One row: series number, subject, files changed, insertions, deletions.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Row {
    pub(super) series: u32,
    pub(super) subject: String,
    pub(super) files: u32,
    pub(super) plus: u32,
    pub(super) minus: u32,
}

impl Row {
    pub(super) fn line(&self) -> String {
        format!(
            "| {} | {} | {} | {} | {} |",
            self.series, self.subject, self.files, self.plus, self.minus
        )
    }
}

/// The header the table starts after.
const HEADER: &str = "| Series | Patch | Files | + | - |";

/// The rows of the table in `doc` (empty if the doc has no such table).
pub(super) fn doc_rows(doc: &str) -> Vec<Row> {
    doc.lines()
        .skip_while(|l| l.trim() != HEADER)
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .filter_map(|l| {
            let cells: Vec<&str> = l.trim_matches('|').split(" | ").map(str::trim).collect();
            match cells.as_slice() {
                [s, subject, f, p, m] => Some(Row {
                    series: s.parse().ok()?,
                    subject: subject.to_string(),
                    files: f.parse().ok()?,
                    plus: p.parse().ok()?,
                    minus: m.parse().ok()?,
                }),
                _ => None,
            }
        })
        .collect()
}

/// A format-patch file's row: its subject ([`crate::mail::patch_subject`]) and the counts of its
/// diffstat summary line.
pub(super) fn patch_row(series: u32, text: &str) -> Option<Row> {
    let subject = crate::mail::patch_subject(text)?;
    let stat = text.lines().find(|l| {
        l.contains(" changed") && (l.contains("file changed") || l.contains("files changed"))
    })?;
    let count = |what: &str| -> u32 {
        stat.split(", ")
            .find(|p| p.contains(what))
            .and_then(|p| p.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    Some(Row {
        series,
        subject,
        files: count("changed"),
        plus: count("insertion"),
        minus: count("deletion"),
    })
}

/// The rows of every series under `dir` (`N-name/NNNN-*.patch`), in order.
pub(super) fn series_rows(dir: &Path) -> std::io::Result<Vec<Row>> {
    let mut series: Vec<_> = fs::read_dir(dir)?
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_dir())
        .collect();
    series.sort_by_key(|e| e.file_name());
    let mut rows = vec![];
    for s in series {
        let name = s.file_name().to_string_lossy().to_string();
        let Some(n) = name.split('-').next().and_then(|n| n.parse().ok()) else {
            continue;
        };
        let mut patches: Vec<_> = fs::read_dir(s.path())?
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "patch"))
            .collect();
        patches.sort();
        for p in patches {
            if let Some(r) = patch_row(n, &fs::read_to_string(&p)?) {
                rows.push(r);
            }
        }
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folded_subjects_and_stats_are_read() {
        let text = "From 0 Mon\nSubject: [PATCH] rust: dma-buf: add DmaBuf, Attachment and the reservation\n lock\n\nbody\n---\n rust/a.rs | 3 ++-\n 2 files changed, 945 insertions(+), 3 deletions(-)\n";
        let r = patch_row(4, text).unwrap();
        assert_eq!(
            r.subject,
            "rust: dma-buf: add DmaBuf, Attachment and the reservation lock"
        );
        assert_eq!((r.files, r.plus, r.minus), (2, 945, 3));
        let one = "Subject: [PATCH] PCI: x\n\n---\n 1 file changed, 1 insertion(+)\n";
        let r = patch_row(2, one).unwrap();
        assert_eq!((r.files, r.plus, r.minus), (1, 1, 0));
    }

    /// The table in docs/series.md is the series as it is in linux/series.
    #[test]
    fn series_md_table_matches_the_series() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let doc = fs::read_to_string(root.join("docs/series.md")).unwrap_or_default();
        let want = series_rows(&root.join("linux/series")).unwrap_or_default();
        assert!(!want.is_empty(), "no patches under linux/series");
        let have = doc_rows(&doc);
        let table: Vec<String> = want.iter().map(Row::line).collect();
        assert!(
            have == want,
            "docs/series.md's lines-per-patch table does not match linux/series; it \
             should read:\n{HEADER}\n|---|---|---|---|---|\n{}",
            table.join("\n")
        );
    }

    /// The per-tree table's `patches = N` is each series' count, as its `series.toml` says
    /// and as its patch files are.
    #[test]
    fn series_md_patch_counts_match_the_series() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let doc = fs::read_to_string(root.join("docs/series.md")).unwrap_or_default();
        let dir = root.join("linux/series");
        let mut checked = 0;
        let mut wrong = vec![];
        for e in fs::read_dir(&dir).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            let files = fs::read_dir(e.path())
                .into_iter()
                .flatten()
                .flatten()
                .filter(|f| f.path().extension().is_some_and(|x| x == "patch"))
                .count();
            let Some(row) = doc
                .lines()
                .find(|l| l.starts_with(&format!("| `{name}` |")))
            else {
                wrong.push(format!("{name}: no row in docs/series.md's per-tree table"));
                continue;
            };
            let said = row
                .split("patches = ")
                .nth(1)
                .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
                .and_then(|n| n.parse::<usize>().ok());
            if said != Some(files) {
                wrong.push(format!(
                    "{name}: the doc says {said:?}, the series has {files}"
                ));
            }
            checked += 1;
        }
        assert!(checked > 0, "no series under linux/series");
        assert!(
            wrong.is_empty(),
            "docs/series.md's per-tree table: {wrong:#?}"
        );
    }
}
