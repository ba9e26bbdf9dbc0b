//! Every new public Rust API has an in-tree user (issue 28, item 2): the public Rust items each
//! series of `linux/series/` adds to the kernel's `rust/` tree, and whether code that series or a
//! later one adds uses them. A reviewer's question, "which new public API has no caller in the
//! tree?", answered from the patch files alone (no kernel tree needed).
//!
//! **Items** are read from the added lines of `.rs` files under `rust/`: `pub fn` (also `const`,
//! `unsafe`, `extern`), `pub struct`, `enum`, `union`, `trait`, `type`, `const`, `static` at module
//! level, the `pub fn` and `pub const` of inherent `impl` blocks (named `Type::name`), and the
//! `fn`, `const` and `type` items of a `pub trait` (named `Trait::name`). Not items: `pub(crate)`
//! and narrower, `pub mod`, `pub use`, struct fields and enum variants. An item whose definition
//! line a patch changes (a new signature, a move) stays the item of the series that added it;
//! one a later patch deletes is gone. Where a patch changes a file that is not created by the
//! series (`rust/kernel/mm/virt.rs`), the enclosing `impl` is only known if the hunk shows it;
//! otherwise the method is named without its type (`pgoff`).
//!
//! **Uses** are read from the added lines of the `.rs` and `.c` files of the patches of the
//! item's series and every later one that are still in the tree at the end (a line a later patch
//! removes is no use). Only the kernel tree counts: the project's out-of-tree modules are no
//! user. Comments do not count, and neither do documentation lines (`///`, `//!`): a doctest
//! is an example, not a user. Neither does a `use` declaration, a definition line's own name, or
//! a call in the item's own body (recursion, or a delegation to a namesake of another type).
//! A use is the item's name as an identifier:
//! - a module-level item: `name`, `path::name` (a call, a type, a bound, `impl Name for`);
//! - a method: a path `Type::name`/`Self::name`, or, if it takes `self`, a call `.name(`; an
//!   associated const: `Type::NAME`/`Self::NAME`;
//! - a trait's item: an implementation of it (`fn name`, `const NAME`, `type Name` in an
//!   `impl Trait for X`, e.g. a sample's exporter), or a call outside the trait's own file (the
//!   abstraction's own glue that calls the callback is no user);
//! - in a `.c` file only a module-level function counts (C cannot call anything else).
//!
//! Names are matched, not resolved: two methods of one name (`VmFault::pgoff`,
//! `VmaRef::pgoff`) share their calls, and a `Mutex`'s `.lock()` is a call of `DmaBuf::lock` as
//! far as names go; such items, whose every use is a `.name(` call of a shared name, are listed
//! for information. Uses inside the abstraction itself count. A use by a KUnit test (`tests.rs`)
//! counts; such items are listed as "used by tests only", for information.
//!
//! Items held back on purpose are listed in their series' `series.toml`:
//! `unused_ok = [{ item = "Type::name", why = "..." }]`. The check fails for an item without a
//! use that is not listed, and for a listed one that is used now or is no new item of the series.

mod scan;
#[cfg(test)]
mod tests;

use crate::series::{HeldBack, Series, SERIES_DIR};
use anyhow::{Context, Result};
use scan::{
    apply, definition, occurrences, parse_patch, scan_all, strip_c, strip_rust, takes_self, Block,
    How, LineInfo, Occ, Owner, Scanner, What,
};
use std::collections::HashMap;
use std::fmt::Write as _;
use std::fs;

/// One series as the check reads it: its id (`4-rust-dma-buf`), its patches (file name, text),
/// in order, and its `unused_ok` entries.
pub(crate) struct SeriesText {
    pub(crate) id: String,
    pub(crate) patches: Vec<(String, String)>,
    pub(crate) held: Vec<HeldBack>,
}

/// Where an item is defined or used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Place {
    /// The file in the kernel tree and the line in it, after the patch.
    pub(crate) file: String,
    pub(crate) line: usize,
    /// The patch file that adds the line.
    pub(crate) patch: String,
}

impl std::fmt::Display for Place {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{} ({})", self.file, self.line, self.patch)
    }
}

/// A new public item of a series, as the report names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Found {
    pub(crate) series: String,
    pub(crate) item: String,
    pub(crate) at: Place,
}

/// What the check found.
#[derive(Debug, Default)]
pub(crate) struct Report {
    /// How many new public items the series add.
    pub(crate) items: usize,
    /// Items without a use that no `unused_ok` lists: the failures.
    pub(crate) unused: Vec<Found>,
    /// `unused_ok` entries that are wrong now: (series, item, why it is stale).
    pub(crate) stale: Vec<(String, String, String)>,
    /// Items without a use that `unused_ok` lists, with its reason.
    pub(crate) held: Vec<(Found, String)>,
    /// Items whose only uses are in KUnit tests (for information).
    pub(crate) test_only: Vec<Found>,
    /// Methods whose every use is a `.name(` call of a name that another new method or a
    /// common type has too (`.lock()`, `.as_raw()`): used as far as names tell, maybe not (for
    /// information).
    pub(crate) ambiguous: Vec<Found>,
}

impl Report {
    pub(crate) fn ok(&self) -> bool {
        self.unused.is_empty() && self.stale.is_empty()
    }

    /// The failures, with what to change: the table of unused items and the `unused_ok` lines
    /// that would hold them back, and the stale entries to remove.
    pub(crate) fn failure(&self) -> String {
        let mut s = String::new();
        if !self.unused.is_empty() {
            let _ = writeln!(
                s,
                "{} new public Rust item(s) of {SERIES_DIR} have no user in the kernel tree \
                 (non-documentation code added by their series or a later one):",
                self.unused.len()
            );
            s.push_str(&table(&self.unused));
            s.push_str(
                "Give each a user in the series, or hold it back on purpose in its series.toml \
                 (append to its `unused_ok` array if it has one), with one line saying why:\n",
            );
            let mut series: Vec<&str> = self.unused.iter().map(|f| f.series.as_str()).collect();
            series.dedup();
            for id in series {
                let _ = writeln!(s, "  {SERIES_DIR}/{id}/series.toml:\n    unused_ok = [");
                for f in self.unused.iter().filter(|f| f.series == id) {
                    let _ = writeln!(
                        s,
                        "        {{ item = \"{}\", why = \"<why it has no in-tree user yet>\" }},",
                        f.item
                    );
                }
                s.push_str("    ]\n");
            }
        }
        if !self.stale.is_empty() {
            let _ = writeln!(
                s,
                "{} stale `unused_ok` entr{} (remove from series.toml):",
                self.stale.len(),
                if self.stale.len() == 1 { "y" } else { "ies" }
            );
            for (id, item, why) in &self.stale {
                let _ = writeln!(s, "  {SERIES_DIR}/{id}/series.toml: `{item}`: {why}");
            }
        }
        s
    }
}

/// The rows `series  item  defined at`, aligned.
pub(crate) fn table(rows: &[Found]) -> String {
    let w1 = rows
        .iter()
        .map(|f| f.series.len())
        .max()
        .unwrap_or(0)
        .max(6);
    let w2 = rows.iter().map(|f| f.item.len()).max().unwrap_or(0).max(4);
    let mut s = format!("  {:<w1$}  {:<w2$}  defined at\n", "series", "item");
    for f in rows {
        let _ = writeln!(s, "  {:<w1$}  {:<w2$}  {}", f.series, f.item, f.at);
    }
    s
}

/// The check on the stored series (as `series::load` gives them).
pub(crate) fn check_series(all: &[Series]) -> Result<Report> {
    let mut input = Vec::new();
    for s in all {
        let mut patches = Vec::new();
        for p in &s.patches {
            let text =
                fs::read_to_string(p).with_context(|| format!("cannot read {}", p.display()))?;
            patches.push((crate::util::file_name(p), text));
        }
        input.push(SeriesText {
            id: s.id(),
            patches,
            held: s.meta.unused_ok.clone(),
        });
    }
    Ok(check(&input))
}

/// What the check finds in the series, in order.
pub(crate) fn check(series: &[SeriesText]) -> Report {
    let mut st = State::default();
    for (si, s) in series.iter().enumerate() {
        for (name, text) in &s.patches {
            st.patch(si, name, text);
        }
    }
    let mut report = Report::default();
    let mut live: Vec<&UseLine> = st.live.values().flatten().collect();
    live.sort_by(|a, b| (a.series, &a.at.file, a.at.line).cmp(&(b.series, &b.at.file, b.at.line)));
    for (si, s) in series.iter().enumerate() {
        let items: Vec<&Item> = st.items.iter().filter(|i| i.series == si).collect();
        report.items += items.len();
        for it in &items {
            let uses: Vec<&&UseLine> = live
                .iter()
                .filter(|u| u.series >= si && u.occs.iter().any(|o| it.used_by(o, u)))
                .collect();
            let found = Found {
                series: s.id.clone(),
                item: it.qualified(),
                at: it.at.clone(),
            };
            let held = s.held.iter().find(|h| h.item == found.item);
            match (uses.first(), held) {
                (None, None) => report.unused.push(found),
                (None, Some(h)) => report.held.push((found, h.why.clone())),
                (Some(u), Some(_)) => report.stale.push((
                    s.id.clone(),
                    found.item.clone(),
                    format!("used now, at {}", u.at),
                )),
                (Some(_), None) => {
                    let by_name_only = it.what == What::Fn
                        && (COMMON.contains(&it.name.as_str())
                            || st.items.iter().any(|o| {
                                o.name == it.name && o.takes_self && o.qualified() != found.item
                            }))
                        && uses.iter().all(|u| {
                            u.occs
                                .iter()
                                .all(|o| o.name != it.name || o.how == How::Dot)
                        });
                    if uses.iter().all(|u| is_test_file(&u.at.file)) {
                        report.test_only.push(found);
                    } else if by_name_only {
                        report.ambiguous.push(found);
                    }
                }
            }
        }
        for h in &s.held {
            if !items.iter().any(|i| i.qualified() == h.item) {
                report.stale.push((
                    s.id.clone(),
                    h.item.clone(),
                    "no new public item of the series has this name (renamed or gone?)".into(),
                ));
            }
        }
    }
    let key = |f: &Found| (f.at.file.clone(), f.at.line);
    report.unused.sort_by_key(|f| (f.series.clone(), key(f)));
    report
}

/// Method names that core types or most kernel types have, so that a call `.name(` says
/// little about which type's method it calls.
const COMMON: &[&str] = &[
    "as_ptr", "as_raw", "clone", "data", "device", "end", "flags", "get", "is_empty", "is_null",
    "len", "lock", "map", "read", "size", "start", "take", "write",
];

fn is_test_file(file: &str) -> bool {
    let name = file.rsplit('/').next().unwrap_or(file);
    name == "tests.rs"
        || name.ends_with("_test.rs")
        || name.ends_with("_test.c")
        || name.contains("kunit")
}

#[derive(Debug, Clone)]
struct Item {
    series: usize,
    name: String,
    owner: Owner,
    what: What,
    /// A function that takes `self`: a method call `.name(` can be one of its uses.
    takes_self: bool,
    at: Place,
}

impl Item {
    fn qualified(&self) -> String {
        match &self.owner {
            Owner::Free | Owner::Inherent(None) => self.name.clone(),
            Owner::Inherent(Some(t)) | Owner::Trait(t) => format!("{t}::{}", self.name),
        }
    }
    /// The key that a later patch's change of the definition line is matched with.
    fn key(&self) -> String {
        match &self.owner {
            Owner::Inherent(None) => format!("{}@{}", self.name, self.at.file),
            _ => self.qualified(),
        }
    }

    fn used_by(&self, o: &Occ, u: &UseLine) -> bool {
        // A call in the item's own body (a delegation to a namesake, recursion) is no user.
        if o.name != self.name || u.within.contains(&self.qualified()) {
            return false;
        }
        if u.c {
            return self.owner == Owner::Free && self.what == What::Fn && o.how == How::Bare;
        }
        match (&self.owner, &o.how) {
            (Owner::Free, How::Bare | How::Path(_)) => true,
            (Owner::Free, _) => false,
            (Owner::Inherent(_), How::Dot) => self.takes_self,
            (Owner::Inherent(ty), How::Path(seg)) => match ty {
                None => true,
                Some(t) => seg.is_empty() || seg == "Self" || seg == t,
            },
            (Owner::Inherent(_), _) => false,
            (Owner::Trait(t), How::Def(w)) => *w == self.what && u.impl_trait.as_ref() == Some(t),
            (Owner::Trait(_), How::Dot) => self.takes_self && u.at.file != self.at.file,
            (Owner::Trait(_), How::Path(_)) => u.at.file != self.at.file,
            (Owner::Trait(_), _) => false,
        }
    }
}

/// An added code line, with its identifiers.
#[derive(Debug, Clone)]
struct UseLine {
    series: usize,
    at: Place,
    occs: Vec<Occ>,
    /// The trait of the `impl Trait for X` block the line is in.
    impl_trait: Option<String>,
    /// The functions the line is in (`Type::name`, or `name`).
    within: Vec<String>,
    /// A C line.
    c: bool,
}

#[derive(Default)]
struct State {
    /// The files created by the series so far, as they are now.
    files: HashMap<String, Vec<String>>,
    items: Vec<Item>,
    /// Added code lines still in the tree, by (file, text).
    live: HashMap<(String, String), Vec<UseLine>>,
}

impl State {
    // Over 100 lines on purpose: one pass over a patch's files and hunks that keeps the files,
    // the scanners of the old and new side and the added and removed items in step, line by
    // line; split, each piece would take all of that state.
    fn patch(&mut self, series: usize, patch: &str, text: &str) {
        let mut added: Vec<Item> = vec![];
        let mut removed: Vec<String> = vec![];
        for f in parse_patch(text) {
            let path = f.new.clone().or(f.old.clone()).unwrap_or_default();
            let rust = path.ends_with(".rs");
            let c = path.ends_with(".c");
            // The file before and after, where the series created it.
            let before = match &f.old {
                None => Some(vec![]),
                Some(p) => self.files.get(p).cloned(),
            };
            let after = before.as_ref().and_then(|b| apply(b, &f.hunks));
            if let Some(p) = &f.old {
                self.files.remove(p);
            }
            if let (Some(p), Some(a)) = (&f.new, &after) {
                self.files.insert(p.clone(), a.clone());
            }
            if !rust && !c {
                continue;
            }
            let full = match (&before, &after) {
                (Some(b), Some(a)) if rust => Some((scan_all(b), scan_all(a))),
                _ => None,
            };
            let api = rust && path.starts_with("rust/");
            for h in &f.hunks {
                let (mut o, mut n) = (h.old_start.max(1), h.new_start.max(1));
                let mut old_scan = Scanner::new(true, &h.header);
                let mut new_scan = Scanner::new(true, &h.header);
                for (idx, (k, l)) in h.lines.iter().enumerate() {
                    let (old_info, new_info) = match (&full, k) {
                        _ if !rust => (None, None),
                        (Some((b, a)), _) => (b.get(o - 1).cloned(), a.get(n - 1).cloned()),
                        (None, ' ') => (Some(old_scan.line(l)), Some(new_scan.line(l))),
                        (None, '-') => (Some(old_scan.line(l)), None),
                        (None, _) => (None, Some(new_scan.line(l))),
                    };
                    let code = if rust { strip_rust(l) } else { strip_c(l) };
                    match k {
                        '-' => {
                            if let Some(info) = old_info.filter(|_| api) {
                                if let Some((name, owner, what)) = definition(&code, &info.block) {
                                    let it = Item {
                                        series,
                                        name,
                                        owner,
                                        what,
                                        takes_self: false,
                                        at: place(&path, o, patch),
                                    };
                                    removed.push(it.key());
                                }
                            }
                            if let Some(v) = self.live.get_mut(&(path.clone(), l.clone())) {
                                v.pop();
                            }
                        }
                        '+' => {
                            let info = new_info.unwrap_or(LineInfo {
                                block: Block::Body,
                                in_use: false,
                                within: vec![],
                            });
                            if api {
                                if let Some((name, owner, what)) = definition(&code, &info.block) {
                                    let next = h.lines[idx + 1..]
                                        .iter()
                                        .find(|(k, _)| *k != '-')
                                        .map(|(_, l)| l.as_str());
                                    added.push(Item {
                                        series,
                                        name,
                                        owner,
                                        what,
                                        takes_self: what == What::Fn && takes_self(&code, next),
                                        at: place(&path, n, patch),
                                    });
                                }
                            }
                            if !code.trim().is_empty() && !info.in_use {
                                let impl_trait = match &info.block {
                                    Block::Impl { tr, .. } => tr.clone(),
                                    _ => None,
                                };
                                self.live
                                    .entry((path.clone(), l.clone()))
                                    .or_default()
                                    .push(UseLine {
                                        series,
                                        at: place(&path, n, patch),
                                        occs: occurrences(&code),
                                        impl_trait,
                                        within: info.within,
                                        c,
                                    });
                            }
                        }
                        _ => {}
                    }
                    match k {
                        ' ' => {
                            o += 1;
                            n += 1;
                        }
                        '-' => o += 1,
                        _ => n += 1,
                    }
                }
            }
        }
        // A definition removed and added again (a new signature, a move) is the same item.
        let re_added: Vec<String> = added.iter().map(Item::key).collect();
        self.items
            .retain(|i| !removed.contains(&i.key()) || re_added.contains(&i.key()));
        for it in added {
            let key = it.key();
            if let Some(old) = self.items.iter_mut().find(|i| i.key() == key) {
                if removed.contains(&key) {
                    old.at = it.at;
                    old.takes_self = it.takes_self;
                }
            } else if !removed.contains(&key) {
                self.items.push(it);
            }
        }
    }
}

fn place(file: &str, line: usize, patch: &str) -> Place {
    Place {
        file: file.to_string(),
        line,
        patch: patch.to_string(),
    }
}
