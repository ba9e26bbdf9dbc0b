//! The kernel series as they are stored and sent: one directory per series under
//! `linux/series/`, in sending order, and the pure logic around them (order and dependencies,
//! splitting a kernel branch back into series, identities, trailers, `get_maintainer.pl`).
//!
//! A series directory is named `<N>-<name>` (`N` its place in the sending order) and holds:
//! - `series.toml`: `tree` (where it goes, free text), `depends` (names of earlier series it
//!   needs to apply or build), `stable` (add `Cc: stable@vger.kernel.org` to every patch
//!   with a `Fixes:` tag), optionally `prefix` (the subject prefix, `PATCH` unless set, e.g. `RFC PATCH`) and
//!   `patches` (how many commits of a branch `--update-from` gives it, when that is not the
//!   number of patch files it holds, i.e. when a series gains or loses patches), and
//!   optionally `unused_ok`, the new public Rust items the series holds back without an
//!   in-tree user, each with why (`[{ item = "Type::method", why = "..." }]`, checked by
//!   `patches::api_users`);
//! - `cover-letter.txt`: the cover letter's subject on the first line, a blank line, the body;
//! - its patches, `git format-patch` files without any `Signed-off-by:` (the person who
//!   emits the series adds theirs).
//!
//! The series stage: this module is the store; `patches` emits and checks the series
//! (`cargo xtask patches`), `mail` holds what sending needs.

pub mod mail;
pub mod patches;

use anyhow::{bail, Context, Result};
use std::fs;
use std::ops::Range;
use std::path::{Path, PathBuf};

/// Where the series live, relative to the repository root.
pub const SERIES_DIR: &str = "linux/series";

/// The keys `series.toml` may have: anything else is a typo and refused.
const KEYS: [&str; 6] = [
    "tree",
    "depends",
    "stable",
    "prefix",
    "patches",
    "unused_ok",
];

/// An entry of `unused_ok`: a new public Rust item of the series that has no user in the
/// kernel tree on purpose, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldBack {
    /// The item as the check names it: `name`, or `Type::name` for an associated item.
    pub item: String,
    pub why: String,
}

/// What `series.toml` says.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Meta {
    pub tree: String,
    pub depends: Vec<String>,
    pub stable: bool,
    pub prefix: Option<String>,
    pub patches: Option<usize>,
    pub unused_ok: Vec<HeldBack>,
}

/// One series: its directory, its metadata and its stored patch files (sorted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Series {
    pub num: u32,
    pub name: String,
    pub dir: PathBuf,
    pub meta: Meta,
    pub patches: Vec<PathBuf>,
}

impl Series {
    /// The directory's name, `<N>-<name>`: how the series is named in messages and in the
    /// output directory.
    pub fn id(&self) -> String {
        format!("{}-{}", self.num, self.name)
    }
    /// How many commits of a branch belong to it: `patches` of `series.toml` if set, else
    /// the number of stored patch files.
    pub fn count(&self) -> usize {
        self.meta.patches.unwrap_or(self.patches.len())
    }
    /// The subject prefix of its emails.
    pub fn prefix(&self) -> &str {
        self.meta.prefix.as_deref().unwrap_or("PATCH")
    }
}

/// Parses `series.toml`.
pub fn parse_meta(text: &str) -> Result<Meta> {
    let t: toml::Table = text.parse().context("not valid TOML")?;
    if let Some(k) = t.keys().find(|k| !KEYS.contains(&k.as_str())) {
        bail!("unknown key `{k}` (known: {})", KEYS.join(", "));
    }
    let tree = match t.get("tree") {
        Some(toml::Value::String(s)) if !s.trim().is_empty() => s.clone(),
        Some(_) => bail!("`tree` must be a non-empty string"),
        None => bail!("`tree` is missing (the tree and list the series is meant for)"),
    };
    let depends = match t.get("depends") {
        None => vec![],
        Some(toml::Value::Array(a)) => a
            .iter()
            .map(|v| match v {
                toml::Value::String(s) => Ok(s.clone()),
                _ => bail!("`depends` must be an array of series names (strings)"),
            })
            .collect::<Result<_>>()?,
        Some(_) => bail!("`depends` must be an array of series names, e.g. [\"rust-mm\"]"),
    };
    let stable = match t.get("stable") {
        None => false,
        Some(toml::Value::Boolean(b)) => *b,
        Some(_) => bail!("`stable` must be true or false"),
    };
    let prefix = match t.get("prefix") {
        None => None,
        Some(toml::Value::String(s)) if !s.trim().is_empty() => Some(s.trim().to_string()),
        Some(_) => bail!("`prefix` must be a non-empty string, e.g. \"RFC PATCH\""),
    };
    let patches = match t.get("patches") {
        None => None,
        Some(toml::Value::Integer(n)) if *n >= 0 => Some(*n as usize),
        Some(_) => bail!("`patches` must be a number of patches (0 or more)"),
    };
    let unused_ok = match t.get("unused_ok") {
        None => vec![],
        Some(toml::Value::Array(a)) => a.iter().map(held_back).collect::<Result<_>>()?,
        Some(_) => {
            bail!("`unused_ok` must be an array of {{ item = \"Type::name\", why = \"...\" }}")
        }
    };
    let mut seen: Vec<&str> = unused_ok
        .iter()
        .map(|h: &HeldBack| h.item.as_str())
        .collect();
    seen.sort_unstable();
    if let Some(w) = seen.windows(2).find(|w| w[0] == w[1]) {
        bail!("`unused_ok` lists `{}` twice", w[0]);
    }
    Ok(Meta {
        tree,
        depends,
        stable,
        prefix,
        patches,
        unused_ok,
    })
}

/// One entry of `unused_ok`: a table with a non-empty `item` and `why`, nothing else.
fn held_back(v: &toml::Value) -> Result<HeldBack> {
    let form = "each entry of `unused_ok` is { item = \"Type::name\", why = \"...\" }";
    let toml::Value::Table(t) = v else {
        bail!("{form}")
    };
    if let Some(k) = t.keys().find(|k| *k != "item" && *k != "why") {
        bail!("{form}: unknown key `{k}`");
    }
    let field = |k: &str| match t.get(k) {
        Some(toml::Value::String(s)) if !s.trim().is_empty() => Ok(s.trim().to_string()),
        _ => bail!("{form}: `{k}` must be a non-empty string"),
    };
    Ok(HeldBack {
        item: field("item")?,
        why: field("why")?,
    })
}

/// `<N>-<name>` into its parts (`N` a number, `name` not empty).
pub fn parse_dir_name(s: &str) -> Option<(u32, &str)> {
    let (n, name) = s.split_once('-')?;
    let num = n
        .parse()
        .ok()
        .filter(|_| n.bytes().all(|b| b.is_ascii_digit()))?;
    (!name.is_empty()).then_some((num, name))
}

/// The cover letter text: subject (first line), then the body after a blank line.
pub fn parse_cover(text: &str) -> Result<(String, String)> {
    let (subject, rest) = text.split_once('\n').unwrap_or((text, ""));
    let subject = subject.trim();
    if subject.is_empty() {
        bail!("the first line (the cover letter's subject) is empty");
    }
    if !rest.starts_with('\n') && !rest.trim().is_empty() {
        bail!("the subject must be followed by a blank line, then the body");
    }
    Ok((subject.to_string(), rest.trim().to_string()))
}

/// Reads every series under `root/linux/series`, in sending order, and checks them.
pub fn load(root: &Path) -> Result<Vec<Series>> {
    let top = root.join(SERIES_DIR);
    let rd = fs::read_dir(&top).with_context(|| format!("cannot read {}", top.display()))?;
    let mut v = Vec::new();
    for e in rd {
        let dir = e?.path();
        if !dir.is_dir() {
            continue;
        }
        let fname = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let Some((num, name)) = parse_dir_name(&fname) else {
            bail!(
                "{}: a series directory is named <N>-<name> (N its place in the sending order)",
                dir.display()
            );
        };
        let toml_path = dir.join("series.toml");
        let text = fs::read_to_string(&toml_path)
            .with_context(|| format!("cannot read {}", toml_path.display()))?;
        let meta = parse_meta(&text).with_context(|| format!("{}", toml_path.display()))?;
        let mut patches: Vec<PathBuf> = fs::read_dir(&dir)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "patch"))
            .collect();
        patches.sort();
        v.push(Series {
            num,
            name: name.to_string(),
            dir,
            meta,
            patches,
        });
    }
    v.sort_by_key(|s| s.num);
    check(&v)?;
    Ok(v)
}

/// Sending order and dependencies make sense: numbers and names unique, each dependency an
/// earlier series.
pub fn check(series: &[Series]) -> Result<()> {
    for (i, s) in series.iter().enumerate() {
        if let Some(o) = series[..i].iter().find(|o| o.num == s.num) {
            bail!("{} and {} have the same number", o.id(), s.id());
        }
        if let Some(o) = series[..i].iter().find(|o| o.name == s.name) {
            bail!("{} and {} have the same name", o.id(), s.id());
        }
        for d in &s.meta.depends {
            match series.iter().position(|o| &o.name == d) {
                Some(j) if j < i => {}
                Some(j) if j == i => bail!("{}: depends on itself", s.id()),
                Some(j) => bail!(
                    "{}: depends on {}, which is sent after it: renumber the directories so that a \
                     series comes after what it depends on",
                    s.id(),
                    series[j].id()
                ),
                None => bail!(
                    "{}: depends on `{d}`, which is no series (known: {})",
                    s.id(),
                    series
                        .iter()
                        .map(|s| s.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            }
        }
    }
    Ok(())
}

/// The series that series `i` needs under it, directly or through another, in sending order
/// (indices into `series`, `i` not included).
pub fn needs(series: &[Series], i: usize) -> Vec<usize> {
    let mut want = vec![false; series.len()];
    let mut stack = vec![i];
    while let Some(k) = stack.pop() {
        for d in &series[k].meta.depends {
            if let Some(j) = series.iter().position(|o| &o.name == d) {
                if !want[j] {
                    want[j] = true;
                    stack.push(j);
                }
            }
        }
    }
    (0..series.len()).filter(|&j| want[j] && j != i).collect()
}

/// Every stored patch, series after series: what the lab kernel applies.
pub fn all_patches(series: &[Series]) -> Vec<PathBuf> {
    series.iter().flat_map(|s| s.patches.clone()).collect()
}

/// Splits the subjects of a branch's commits (oldest first) into the series: each series takes
/// [`Series::count`] commits, in order. `stored[i]` are the subjects of series `i`'s stored
/// patches. A series whose count is its number of files must have the same subjects in the
/// same order; one with `patches = N` may differ (patches added, dropped, reworded), but no
/// commit of its range may carry the subject of another series' patch.
pub fn split(
    series: &[Series],
    stored: &[Vec<String>],
    subjects: &[String],
) -> Result<Vec<Range<usize>>> {
    let want: usize = series.iter().map(Series::count).sum();
    if want != subjects.len() {
        bail!(
            "the branch has {} commit(s) after p2pbuf-base, the series expect {want} ({}). If a \
             series gained or lost patches, set `patches = N` in its series.toml",
            subjects.len(),
            series
                .iter()
                .map(|s| format!("{}: {}", s.id(), s.count()))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let mut ranges = Vec::new();
    let mut at = 0;
    for (i, s) in series.iter().enumerate() {
        let r = at..at + s.count();
        at = r.end;
        let got = &subjects[r.clone()];
        if s.meta.patches.is_none() {
            for (k, (g, w)) in got.iter().zip(&stored[i]).enumerate() {
                if g != w {
                    bail!(
                        "{}: commit {} of the branch is \"{g}\", where the series' patch {} is \
                         \"{w}\". Reorder the branch, or if the series changed, set `patches = \
                         N` in {}/series.toml",
                        s.id(),
                        r.start + k + 1,
                        k + 1,
                        s.dir.display()
                    );
                }
            }
        }
        for (k, g) in got.iter().enumerate() {
            if let Some(j) = (0..series.len()).find(|&j| j != i && stored[j].contains(g)) {
                bail!(
                    "commit {} of the branch, \"{g}\", is a patch of {} but falls in {}'s \
                     commits: check the `patches` counts in their series.toml",
                    r.start + k + 1,
                    series[j].id(),
                    s.id()
                );
            }
        }
        ranges.push(r);
    }
    Ok(ranges)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(num: u32, name: &str, depends: &[&str], files: &[&str], count: Option<usize>) -> Series {
        Series {
            num,
            name: name.into(),
            dir: PathBuf::from(format!("linux/series/{num}-{name}")),
            meta: Meta {
                tree: "t".into(),
                depends: depends.iter().map(|d| d.to_string()).collect(),
                patches: count,
                ..Meta::default()
            },
            patches: files.iter().map(PathBuf::from).collect(),
        }
    }

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn parses_series_toml() {
        let m = parse_meta(
            "# where\ntree = \"drm-misc\"\ndepends = [\"a\", \"b\"]\nstable = true\nprefix = \"RFC PATCH\"\npatches = 3\n",
        )
        .unwrap();
        assert_eq!(
            m,
            Meta {
                tree: "drm-misc".into(),
                depends: strings(&["a", "b"]),
                stable: true,
                prefix: Some("RFC PATCH".into()),
                patches: Some(3),
                unused_ok: vec![],
            }
        );
        let m = parse_meta(
            "tree = \"x\"\nunused_ok = [\n  { item = \"A::f\", why = \"later\" },\n  { item = \"g\", why = \"w\" },\n]\n",
        )
        .unwrap();
        assert_eq!(
            m.unused_ok,
            [
                HeldBack {
                    item: "A::f".into(),
                    why: "later".into()
                },
                HeldBack {
                    item: "g".into(),
                    why: "w".into()
                }
            ]
        );
        let m = parse_meta("tree = \"pci\"\n").unwrap();
        assert_eq!((m.depends.len(), m.stable, m.patches), (0, false, None));
        for (text, why) in [
            ("depends = []\n", "`tree` is missing"),
            ("tree = \"x\"\nstabel = true\n", "unknown key `stabel`"),
            ("tree = \"x\"\ndepends = \"a\"\n", "array of series names"),
            ("tree = \"x\"\ndepends = [1]\n", "array of series names"),
            ("tree = \"x\"\nstable = \"yes\"\n", "true or false"),
            ("tree = \"x\"\npatches = -1\n", "number of patches"),
            ("tree = \"x\"\nunused_ok = \"f\"\n", "must be an array"),
            ("tree = \"x\"\nunused_ok = [\"f\"]\n", "each entry"),
            ("tree = \"x\"\nunused_ok = [{ item = \"f\" }]\n", "`why` must be"),
            (
                "tree = \"x\"\nunused_ok = [{ item = \"f\", why = \"w\", x = 1 }]\n",
                "unknown key `x`",
            ),
            (
                "tree = \"x\"\nunused_ok = [{ item = \"f\", why = \"a\" }, { item = \"f\", why = \"b\" }]\n",
                "lists `f` twice",
            ),
            ("tree = ", "not valid TOML"),
        ] {
            let e = format!("{:#}", parse_meta(text).unwrap_err());
            assert!(e.contains(why), "{text:?}: {e}");
        }
    }

    #[test]
    fn names_and_cover_letters() {
        assert_eq!(parse_dir_name("4-rust-dma-buf"), Some((4, "rust-dma-buf")));
        assert_eq!(parse_dir_name("10-x"), Some((10, "x")));
        for bad in ["rust", "x-rust", "4-", "+4-a", "-a"] {
            assert_eq!(parse_dir_name(bad), None, "{bad}");
        }
        assert_eq!(
            parse_cover("dma-buf: fixes\n\nBody\nmore.\n").unwrap(),
            ("dma-buf: fixes".into(), "Body\nmore.".into())
        );
        assert_eq!(
            parse_cover("only a subject\n").unwrap(),
            ("only a subject".into(), "".into())
        );
        assert!(parse_cover("\nbody").is_err());
        assert!(parse_cover("subject\nbody right after").is_err());
    }

    #[test]
    fn order_and_dependencies() {
        let v = vec![
            s(1, "fixes", &[], &[], None),
            s(2, "p2p", &[], &[], None),
            s(3, "mm", &[], &[], None),
            s(4, "dmabuf", &["p2p", "mm"], &[], None),
            s(5, "user", &["dmabuf"], &[], None),
        ];
        check(&v).unwrap();
        assert_eq!(needs(&v, 4), [1, 2, 3]);
        assert_eq!(needs(&v, 3), [1, 2]);
        assert!(needs(&v, 0).is_empty());
        let bad = |v: Vec<Series>| check(&v).unwrap_err().to_string();
        let e = bad(vec![
            s(1, "a", &["b"], &[], None),
            s(2, "b", &[], &[], None),
        ]);
        assert!(
            e.contains("1-a: depends on 2-b, which is sent after it"),
            "{e}"
        );
        let e = bad(vec![s(1, "a", &["zz"], &[], None)]);
        assert!(e.contains("`zz`, which is no series (known: a)"), "{e}");
        let e = bad(vec![s(1, "a", &["a"], &[], None)]);
        assert!(e.contains("depends on itself"), "{e}");
        let e = bad(vec![s(1, "a", &[], &[], None), s(1, "b", &[], &[], None)]);
        assert!(e.contains("same number"), "{e}");
        let e = bad(vec![s(1, "a", &[], &[], None), s(2, "a", &[], &[], None)]);
        assert!(e.contains("same name"), "{e}");
    }

    #[test]
    fn loads_series_directories_in_sending_order() {
        let root = std::env::temp_dir().join(format!("p2pbuf-series-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        let top = root.join(SERIES_DIR);
        for (d, toml, files) in [
            (
                "10-late",
                "tree = \"x\"\ndepends = [\"early\"]\n",
                &["0001-b.patch"][..],
            ),
            (
                "2-early",
                "tree = \"y\"\nstable = true\n",
                &["0002-z.patch", "0001-a.patch"][..],
            ),
        ] {
            fs::create_dir_all(top.join(d)).unwrap();
            fs::write(top.join(d).join("series.toml"), toml).unwrap();
            fs::write(top.join(d).join("cover-letter.txt"), "s\n\nb\n").unwrap();
            for f in files {
                fs::write(top.join(d).join(f), "").unwrap();
            }
        }
        let v = load(&root).unwrap();
        assert_eq!(
            v.iter().map(Series::id).collect::<Vec<_>>(),
            ["2-early", "10-late"]
        );
        let names: Vec<String> = all_patches(&v)
            .iter()
            .map(|p| p.strip_prefix(&top).unwrap().display().to_string())
            .collect();
        assert_eq!(
            names,
            [
                "2-early/0001-a.patch",
                "2-early/0002-z.patch",
                "10-late/0001-b.patch"
            ]
        );
        assert!(v[0].meta.stable && !v[1].meta.stable);
        // A stray name is refused, with what it should be.
        fs::create_dir_all(top.join("misc")).unwrap();
        let e = load(&root).unwrap_err().to_string();
        assert!(e.contains("named <N>-<name>"), "{e}");
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn the_repository_series_load() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let v = load(&root).unwrap();
        assert!(!v.is_empty());
        for s in &v {
            let text = fs::read_to_string(s.dir.join("cover-letter.txt")).unwrap();
            parse_cover(&text).unwrap();
            assert!(!s.patches.is_empty(), "{}", s.id());
            // No made-up identity and no sign-off is stored: the sender adds theirs.
            for p in &s.patches {
                let t = fs::read_to_string(p).unwrap();
                let msg = t.split("\n---\n").next().unwrap();
                assert!(!msg.contains("Signed-off-by:"), "{}", p.display());
                assert!(!t.contains("p2pbuf.invalid"), "{}", p.display());
            }
        }
    }

    fn split_err(v: &[Series], stored: &[Vec<String>], got: &[&str]) -> String {
        format!("{:#}", split(v, stored, &strings(got)).unwrap_err())
    }

    #[test]
    fn splits_a_branch_into_the_series() {
        let v = vec![
            s(1, "fixes", &[], &["1", "2"], None),
            s(2, "p2p", &[], &["1"], None),
            s(3, "dmabuf", &["p2p"], &["1", "2"], None),
        ];
        let stored = vec![
            strings(&["f1", "f2"]),
            strings(&["p1"]),
            strings(&["d1", "d2"]),
        ];
        assert_eq!(
            split(&v, &stored, &strings(&["f1", "f2", "p1", "d1", "d2"])).unwrap(),
            [0..2, 2..3, 3..5]
        );
        // A commit too many (a new patch) without `patches = N`: counted, and said how to fix.
        let e = split_err(&v, &stored, &["f1", "f2", "p0", "p1", "d1", "d2"]);
        assert!(
            e.contains("has 6 commit(s) after p2pbuf-base, the series expect 5 (1-fixes: 2, 2-p2p: 1, 3-dmabuf: 2)"),
            "{e}"
        );
        assert!(e.contains("set `patches = N`"), "{e}");
        // Same count but another order: the first disagreement is named.
        let e = split_err(&v, &stored, &["f1", "f2", "d1", "p1", "d2"]);
        assert!(
            e.contains(
                "2-p2p: commit 3 of the branch is \"d1\", where the series' patch 1 is \"p1\""
            ),
            "{e}"
        );
        // With `patches = 2`, the p2p series may gain a patch...
        let mut v2 = v.clone();
        v2[1].meta.patches = Some(2);
        assert_eq!(
            split(
                &v2,
                &stored,
                &strings(&["f1", "f2", "p0", "p1", "d1", "d2"])
            )
            .unwrap(),
            [0..2, 2..4, 4..6]
        );
        // ... and its patch may be reworded, but never take another series' patch.
        assert!(split(
            &v2,
            &stored,
            &strings(&["f1", "f2", "p0", "p1b", "d1", "d2"])
        )
        .is_ok());
        let mut v3 = v.clone();
        v3[0].meta.patches = Some(3);
        v3[1].meta.patches = Some(0);
        let e = split_err(&v3, &stored, &["f1", "f2", "p1", "d1", "d2"]);
        assert!(
            e.contains("commit 3 of the branch, \"p1\", is a patch of 2-p2p but falls in 1-fixes"),
            "{e}"
        );
    }
}
