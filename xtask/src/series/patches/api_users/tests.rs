//! The check on small made-up patches, and on the series in linux/series.

use super::scan::*;
use super::*;

/// A patch that creates `path` with `lines`.
fn new_file(path: &str, lines: &[&str]) -> String {
    let mut s = format!(
        "From 0 Mon\nSubject: [PATCH] x\n\n---\n 1 file changed\n\ndiff --git a/{path} b/{path}\nnew file mode 100644\n--- /dev/null\n+++ b/{path}\n@@ -0,0 +1,{} @@\n",
        lines.len()
    );
    for l in lines {
        s.push('+');
        s.push_str(l);
        s.push('\n');
    }
    s.push_str("-- \n2.50.0\n");
    s
}

fn series(id: &str, patches: &[String], held: &[(&str, &str)]) -> SeriesText {
    SeriesText {
        id: id.to_string(),
        patches: patches
            .iter()
            .enumerate()
            .map(|(i, t)| (format!("{:04}-p.patch", i + 1), t.clone()))
            .collect(),
        held: held
            .iter()
            .map(|(item, why)| HeldBack {
                item: item.to_string(),
                why: why.to_string(),
            })
            .collect(),
    }
}

fn names(v: &[Found]) -> Vec<&str> {
    v.iter().map(|f| f.item.as_str()).collect()
}

const ABSTRACTION: &[&str] = &[
    "//! The abstraction.",
    "use crate::prelude::*;",
    "",
    "/// A buffer.",
    "pub struct Buf(u32);",
    "",
    "impl Buf {",
    "    /// Used by the sample.",
    "    pub fn used(&self) -> u32 {",
    "        self.0",
    "    }",
    "",
    "    /// Only in a doctest.",
    "    ///",
    "    /// ```",
    "    /// let n = buf.doc_only();",
    "    /// ```",
    "    pub fn doc_only(&self) -> u32 {",
    "        // Not even a comment counts: self.unused()",
    "        0",
    "    }",
    "",
    "    /// Nowhere.",
    "    pub unsafe fn unused(&self) {}",
    "",
    "    /// Held back, and unused.",
    "    pub fn held(&self) {}",
    "",
    "    /// Held back, but the sample uses it.",
    "    pub const fn stale() -> u32 {",
    "        1",
    "    }",
    "",
    "    pub(crate) fn internal(&self) {}",
    "",
    "    /// Only calls its namesake (of another type): no user.",
    "    pub fn count(&self) -> usize {",
    "        self.inner.count()",
    "    }",
    "",
    "    /// Takes no `self`: `x.make()` is no call of it.",
    "    pub fn make() -> Self {",
    "        Buf(0)",
    "    }",
    "}",
    "",
    "/// Callbacks.",
    "pub trait Ops {",
    "    /// Implemented by the sample.",
    "    fn open(this: &Buf) -> Result;",
    "    /// Implemented by nobody; the glue calls it.",
    "    fn close(_this: &Buf) {}",
    "    /// A constant nobody sets.",
    "    const FLAG: bool = false;",
    "}",
    "",
    "fn glue<T: Ops>(b: &Buf) {",
    "    T::close(b);",
    "    let _ = T::FLAG;",
    "}",
    "",
    "pub fn free_unused() {}",
];

const SAMPLE: &[&str] = &[
    "use kernel::abs::{Buf, Ops, free_unused};",
    "",
    "struct S;",
    "",
    "impl Ops for S {",
    "    fn open(this: &Buf) -> Result {",
    "        let _ = this.used() + Buf::stale() + this.make();",
    "        Ok(())",
    "    }",
    "}",
];

#[test]
fn used_unused_doc_only_held_and_stale() {
    let abs = new_file("rust/kernel/abs.rs", ABSTRACTION);
    let sample = new_file("samples/rust/sample.rs", SAMPLE);
    let s = [series(
        "1-abs",
        &[abs, sample],
        &[
            ("Buf::held", "held for a later user"),
            ("Buf::stale", "was unused"),
            ("Buf::gone", "renamed since"),
        ],
    )];
    let r = check(&s);
    assert_eq!(
        names(&r.unused),
        [
            "Buf::doc_only",
            "Buf::unused",
            "Buf::count",
            "Buf::make",
            "Ops::close",
            "Ops::FLAG",
            "free_unused"
        ],
        "{}",
        r.failure()
    );
    assert_eq!(
        r.items, 13,
        "Buf, 7 methods, Ops and its 3 items, free_unused"
    );
    assert_eq!(
        names(&r.held.iter().map(|h| h.0.clone()).collect::<Vec<_>>()),
        ["Buf::held"]
    );
    let stale: Vec<&str> = r.stale.iter().map(|s| s.1.as_str()).collect();
    assert_eq!(stale, ["Buf::stale", "Buf::gone"]);
    assert!(
        r.stale[0].2.contains("samples/rust/sample.rs:7"),
        "{:?}",
        r.stale
    );
    assert!(!r.ok());
    let unused = &r.unused[1];
    assert_eq!(unused.at.file, "rust/kernel/abs.rs");
    assert_eq!(unused.at.line, 24);
    assert_eq!(unused.at.patch, "0001-p.patch");
    let msg = r.failure();
    for want in [
        "7 new public Rust item(s)",
        "rust/kernel/abs.rs:24 (0001-p.patch)",
        "linux/series/1-abs/series.toml:",
        "{ item = \"Buf::unused\", why = ",
        "linux/series/1-abs/series.toml: `Buf::stale`: used now, at samples/rust/sample.rs:7",
        "`Buf::gone`: no new public item",
    ] {
        assert!(msg.contains(want), "{want:?} not in:\n{msg}");
    }
}

#[test]
fn uses_count_from_later_series_only_and_while_in_the_tree() {
    let abs = new_file(
        "rust/kernel/a.rs",
        &["pub fn early() {}", "pub fn late() {}"],
    );
    // An earlier series calls `late`: no use of the later series' item.
    let before = new_file("drivers/x.c", &["void f(void) { late(); }"]);
    // The user of `early` is added and removed again by a later patch.
    let user = new_file("samples/rust/u.rs", &["fn f() {", "    early();", "}"]);
    let drop = "diff --git a/samples/rust/u.rs b/samples/rust/u.rs\n--- a/samples/rust/u.rs\n+++ b/samples/rust/u.rs\n@@ -1,3 +1,2 @@\n fn f() {\n-    early();\n }\n-- \n2.50.0\n";
    let s = [
        series("1-c", &[before], &[]),
        series("2-a", &[abs, user, drop.to_string()], &[]),
    ];
    let r = check(&s);
    assert_eq!(names(&r.unused), ["early", "late"], "{}", r.failure());
    assert_eq!(r.unused[1].at.line, 2);
}

#[test]
fn a_changed_definition_stays_its_series_item() {
    let abs = new_file(
        "rust/kernel/a.rs",
        &[
            "pub struct A;",
            "",
            "impl A {",
            "    pub fn f(&self) {}",
            "}",
        ],
    );
    // A later series changes the signature and adds the user.
    let change = "diff --git a/rust/kernel/a.rs b/rust/kernel/a.rs\n--- a/rust/kernel/a.rs\n+++ b/rust/kernel/a.rs\n@@ -2,4 +2,5 @@ pub struct A;\n \n impl A {\n-    pub fn f(&self) {}\n+    pub fn f(&self, x: u32) {}\n+    pub fn g(&self) { self.f(1) }\n }\n-- \n2.50.0\n";
    let s = [
        series("1-a", &[abs], &[]),
        series("2-b", &[change.to_string()], &[]),
    ];
    let r = check(&s);
    assert_eq!(r.items, 3, "A, A::f, A::g");
    let u: Vec<(&str, &str)> = r
        .unused
        .iter()
        .map(|f| (f.series.as_str(), f.item.as_str()))
        .collect();
    // `A` is used by `impl A` of the later series, `f` by `g`; `g` by nobody.
    assert_eq!(u, [("2-b", "A::g")], "{}", r.failure());
    assert_eq!(r.unused[0].at.line, 5);
}

#[test]
fn a_hunk_of_an_upstream_file_names_what_it_shows() {
    // The hunk shows no `impl` line: the method's type is unknown, and any path counts.
    let up = "diff --git a/rust/kernel/mm.rs b/rust/kernel/mm.rs\n--- a/rust/kernel/mm.rs\n+++ b/rust/kernel/mm.rs\n@@ -10,3 +10,9 @@ pub fn end(&self) -> usize {\n     }\n \n+    pub fn pgoff(&self) -> usize {\n+        0\n+    }\n+\n+    /// ```\n+    /// vma.start2();\n     pub fn start2(&self) {}\n-- \n2.50.0\n";
    // The hunk header is the impl: the type is known.
    let up2 = "diff --git a/rust/kernel/mm.rs b/rust/kernel/mm.rs\n--- a/rust/kernel/mm.rs\n+++ b/rust/kernel/mm.rs\n@@ -40,2 +40,3 @@ impl VmaNew {\n     }\n+    pub fn set_pfnmap(&self) {}\n }\n-- \n2.50.0\n";
    let user = new_file(
        "samples/rust/u.rs",
        &["fn f(v: &V) {", "    v.pgoff();", "}"],
    );
    let s = [series(
        "1-mm",
        &[up.to_string(), up2.to_string(), user],
        &[],
    )];
    let r = check(&s);
    assert_eq!(names(&r.unused), ["VmaNew::set_pfnmap"], "{}", r.failure());
    assert_eq!(r.items, 2);
    assert_eq!(r.unused[0].at.line, 41);
}

#[test]
fn impl_heads_and_occurrences() {
    let b = |h: &str| head_block(h);
    assert_eq!(
        b("impl<'a> Device<device::Core<'a>> {"),
        Some(Block::Impl {
            ty: Some("Device".into()),
            tr: None
        })
    );
    assert_eq!(
        b("impl<T: Exporter> core::ops::Deref for Exported<T> {"),
        Some(Block::Impl {
            ty: Some("Exported".into()),
            tr: Some("Deref".into())
        })
    );
    assert_eq!(
        b("unsafe impl Send for P2pRegion {}"),
        Some(Block::Impl {
            ty: Some("P2pRegion".into()),
            tr: Some("Send".into())
        })
    );
    assert_eq!(
        b("pub trait Exporter: Sized + Send {"),
        Some(Block::Trait {
            name: "Exporter".into(),
            public: true
        })
    );
    assert_eq!(b("pub fn implement(&self) {"), None);
    let o = occurrences("let x = Self::a(y.b(), c, <T as Tr>::d, e.f, 'a, 3u32);");
    let got: Vec<(&str, How)> = o.iter().map(|o| (o.name.as_str(), o.how.clone())).collect();
    assert_eq!(
        got,
        [
            ("let", How::Bare),
            ("x", How::Other),
            ("Self", How::Bare),
            ("a", How::Path("Self".into())),
            ("y", How::Bare),
            ("b", How::Dot),
            ("c", How::Bare),
            ("T", How::Bare),
            ("as", How::Bare),
            ("Tr", How::Bare),
            ("d", How::Path("".into())),
            ("e", How::Bare),
            ("f", How::Other),
        ]
    );
    assert_eq!(strip_rust("a(\"b // c\"); // d"), "a(\"\"); ");
    assert_eq!(strip_c("x = f(); /* g() */ h();").trim(), "x = f();   h();");
    let d = definition;
    assert_eq!(
        d("pub const unsafe fn x() {}", &Block::Module),
        Some(("x".into(), Owner::Free, What::Fn))
    );
    assert_eq!(
        d("pub unsafe extern \"C\" fn y() {}", &Block::Module),
        Some(("y".into(), Owner::Free, What::Fn))
    );
    assert_eq!(
        d("pub const Z: u32 = 1;", &Block::Module),
        Some(("Z".into(), Owner::Free, What::Const))
    );
    assert_eq!(d("pub(crate) fn w() {}", &Block::Module), None);
    assert_eq!(d("pub mod m;", &Block::Module), None);
    assert_eq!(d("pub use a::b;", &Block::Module), None);
}

/// Every new public Rust item of the series in linux/series has a user in the kernel tree,
/// or is held back in its series.toml's `unused_ok`, and no entry there is stale.
#[test]
fn every_new_api_of_the_series_has_an_in_tree_user() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let r = check_series(&crate::series::load(&root).unwrap()).unwrap();
    assert!(r.items > 50, "only {} new public items found", r.items);
    assert!(r.ok(), "{}", r.failure());
}
