//! Checks of the source tree itself, host tests only (`#[cfg(test)]`): `cargo test -p xtask`
//! runs them, and so does `cargo xtask test`, whose host stage is `cargo test --workspace`
//! ([`crate::suite::host_tests`]).
//! - The workspace reads as `cargo fmt --all` writes it (nothing else checks it: merges of
//!   branches have left files unformatted before).
//! - No in-VM test script assigns `_n`, the KTAP counter of `tests/vm/lib.sh` (a script that
//!   counted its own steps in `_n` restarted the numbering of the results once).
//! - No hand-written function (Rust or C) runs over [`LONG_FN`] lines unless the comment above
//!   it says why, in a line with [`LONG_FN_REASON`].

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The files `cargo fmt --all` would rewrite in the workspace at `root`, as `rustfmt -l`
/// names them (empty when it is formatted).
fn unformatted(root: &Path) -> Result<Vec<String>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(root)
        .args(["fmt", "--all", "--", "--check", "-l"])
        .output()
        .context("cargo fmt (is rustfmt installed? `rustup component add rustfmt`)")?;
    let files: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(String::from)
        .collect();
    if !out.status.success() && files.is_empty() {
        bail!(
            "cargo fmt --all -- --check failed without naming a file: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(files)
}

/// The script lib.sh's counter belongs to, relative to the tree's root.
const KTAP_LIB: &str = "tests/vm/lib.sh";

/// Every line of the shell scripts under `root/tests/vm` (at any depth; lib.sh itself left
/// out) that assigns `_n`, as `path:line: text` with the path relative to `root`.
fn counter_assignments(root: &Path) -> Vec<String> {
    let mut scripts = vec![];
    shell_scripts(&root.join("tests/vm"), &mut scripts);
    scripts.sort();
    let mut found = vec![];
    for path in scripts {
        let rel = path.strip_prefix(root).unwrap_or(&path);
        if rel == Path::new(KTAP_LIB) {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        for (i, line) in text.lines().enumerate() {
            if assigns_counter(line) {
                found.push(format!("{}:{}: {}", rel.display(), i + 1, line.trim()));
            }
        }
    }
    found
}

/// The `*.sh` files below `dir`, into `out`.
fn shell_scripts(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for p in rd.flatten().map(|e| e.path()) {
        if p.is_dir() {
            shell_scripts(&p, out);
        } else if p.extension().is_some_and(|x| x == "sh") {
            out.push(p);
        }
    }
}

/// Whether a shell line assigns the variable `_n`: `_n=…` (also after `local` or `export`),
/// `_n+=…`, or arithmetic `((_n++))`, `((_n -= 1))`. Not a read (`$_n`, `${_n}`, `_n ==`),
/// not a longer name (`my_n=`), not a comment line.
fn assigns_counter(line: &str) -> bool {
    let line = line.trim_start();
    if line.starts_with('#') {
        return false;
    }
    let b = line.as_bytes();
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    line.match_indices("_n").any(|(at, _)| {
        let before = at.checked_sub(1).map(|i| b[i]);
        if before.is_some_and(|c| ident(c) || c == b'$' || c == b'{') {
            return false;
        }
        let rest = &line[at + 2..];
        if rest.bytes().next().is_some_and(ident) {
            return false;
        }
        let rest = rest.trim_start();
        (rest.starts_with('=') && !rest.starts_with("=="))
            || ["+=", "-=", "++", "--"]
                .iter()
                .any(|op| rest.starts_with(op))
    })
}

/// The most lines (from its signature to its closing brace) a function may have without a
/// reason.
const LONG_FN: usize = 100;
/// What the comment above a longer function says (\"Over 100 lines on purpose: ...\"), with
/// why it is not split.
const LONG_FN_REASON: &str = "Over 100 lines";

/// Where a function starts in a line of `lang` (`rs` or `c`), as its indentation; `None` for
/// any other line. Rust: a `fn` item as rustfmt writes it (`pub`, `const`, `unsafe`,
/// `extern "C"`, `async` before it). C: a definition at column 0 as kernel style writes it (a
/// line opening a parameter list that ends with `)` and is not a declaration, a macro or a
/// control statement).
fn fn_start(lang: &str, line: &str) -> Option<usize> {
    let indent = line.len() - line.trim_start().len();
    let mut rest = line.trim_start();
    if lang == "rs" {
        for prefix in [
            "pub(crate) ",
            "pub(super) ",
            "pub ",
            "const ",
            "async ",
            "unsafe ",
        ] {
            rest = rest.strip_prefix(prefix).unwrap_or(rest);
        }
        rest = rest.strip_prefix("extern \"C\" ").unwrap_or(rest);
        rest = rest.strip_prefix("unsafe ").unwrap_or(rest);
        return rest.starts_with("fn ").then_some(indent);
    }
    let first = line.chars().next()?;
    let control = [
        "if", "for", "while", "switch", "return", "else", "do", "typedef",
    ];
    (indent == 0
        && (first.is_ascii_alphabetic() || first == '_')
        && line.contains('(')
        && !line.trim_end().ends_with(';')
        && !control.iter().any(|c| line.starts_with(c)))
    .then_some(0)
}

/// The functions of `text` (in `lang`, see [`fn_start`]) longer than [`LONG_FN`] lines whose
/// comment does not give [`LONG_FN_REASON`]: (first line, lines, the signature line).
fn long_fns(lang: &str, text: &str) -> Vec<(usize, usize, String)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut found = vec![];
    let mut i = 0;
    while i < lines.len() {
        let Some(indent) = fn_start(lang, lines[i]) else {
            i += 1;
            continue;
        };
        // The body: from the line that opens it to the brace at the function's indentation.
        let Some(open) = (i..lines.len().min(i + 20)).find(|&j| {
            let t = lines[j].trim_end();
            t.ends_with('{') || t.ends_with(';')
        }) else {
            i += 1;
            continue;
        };
        if lines[open].trim_end().ends_with(';') {
            i = open + 1;
            continue;
        }
        let close = format!("{}}}", &lines[i][..indent]);
        let Some(end) = (open + 1..lines.len()).find(|&j| lines[j].trim_end() == close) else {
            i += 1;
            continue;
        };
        let len = end - i + 1;
        if len > LONG_FN {
            let comment = lines[..i]
                .iter()
                .rev()
                .take_while(|l| {
                    let t = l.trim_start();
                    t.starts_with("//")
                        || t.starts_with("/*")
                        || t.starts_with('*')
                        || t.starts_with("#[")
                })
                .any(|l| l.contains(LONG_FN_REASON));
            if !comment {
                found.push((i + 1, len, lines[i].trim().to_string()));
            }
        }
        i = end + 1;
    }
    found
}

/// The hand-written Rust and C files git tracks under `root` (generated bindings and the
/// kernel series' patch files left out), relative to `root`.
fn source_files(root: &Path) -> Result<Vec<String>> {
    let out = Command::new("git")
        .current_dir(root)
        .args(["ls-files", "--", "*.rs", "*.c", "*.h"])
        .output()
        .context("git ls-files")?;
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|f| !f.contains("/pregenerated/") && !f.starts_with("linux/"))
        .map(String::from)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
    }

    #[test]
    fn workspace_is_formatted() {
        let files = unformatted(&root()).unwrap();
        assert!(
            files.is_empty(),
            "not formatted as `cargo fmt --all` writes them (run it):\n{}",
            files.join("\n")
        );
    }

    #[test]
    fn no_vm_script_assigns_the_ktap_counter() {
        let found = counter_assignments(&root());
        assert!(
            found.is_empty(),
            "`_n` is {KTAP_LIB}'s KTAP counter (ktap_ok/ktap_fail/ktap_skip count in it); \
             these lines assign it, name the variable otherwise:\n{}",
            found.join("\n")
        );
    }

    #[test]
    fn counter_assignments_are_told_from_reads() {
        for l in [
            "_n=0",
            "\tlocal _n=3",
            "export _n=1",
            "x=1 _n=2 cmd",
            "_n+=1",
            "(( _n++ ))",
            "((_n -= 1))",
        ] {
            assert!(assigns_counter(l), "{l}");
        }
        for l in [
            "echo $_n",
            "[ ${_n} -lt 3 ]",
            "my_n=1",
            "_nr=1",
            "__n=1",
            "[[ _n == 1 ]]",
            "echo $((_n + 1))",
            "# _n=0 is lib.sh's",
        ] {
            assert!(!assigns_counter(l), "{l}");
        }
    }

    #[test]
    fn counter_assignments_skip_lib_sh_and_name_the_line() {
        let dir = std::env::temp_dir().join(format!("p2pbuf-tree-{}", std::process::id()));
        let tests = dir.join("tests/vm/tests");
        std::fs::create_dir_all(&tests).unwrap();
        std::fs::write(dir.join(KTAP_LIB), "_n=0\n").unwrap();
        std::fs::write(tests.join("a.sh"), "ok\n\t_n=$((_n + 1))\n").unwrap();
        std::fs::write(tests.join("b.txt"), "_n=1\n").unwrap();
        let found = counter_assignments(&dir);
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(found, ["tests/vm/tests/a.sh:2: _n=$((_n + 1))"]);
    }

    #[test]
    fn no_long_function_without_a_reason() {
        let root = root();
        let mut found = vec![];
        for f in source_files(&root).unwrap() {
            let lang = if f.ends_with(".rs") { "rs" } else { "c" };
            let text = std::fs::read_to_string(root.join(&f)).unwrap_or_default();
            for (line, len, sig) in long_fns(lang, &text) {
                found.push(format!("{f}:{line}: {len} lines: {sig}"));
            }
        }
        assert!(
            found.is_empty(),
            "functions over {LONG_FN} lines whose comment does not say why (a line with \
             \"{LONG_FN_REASON} on purpose: ...\"), or split them:\n{}",
            found.join("\n")
        );
    }

    #[test]
    fn long_functions_are_found_in_rust_and_c() {
        let body = "    x();\n".repeat(LONG_FN);
        let rs = format!("/// Doc.\npub fn a() {{\n{body}}}\n\nfn b() {{\n}}\n");
        assert_eq!(
            long_fns("rs", &rs),
            [(2, LONG_FN + 2, "pub fn a() {".into())]
        );
        let why =
            format!("/// Doc.\n/// {LONG_FN_REASON} a table.\n#[test]\nfn a() {{\n{body}}}\n");
        assert!(long_fns("rs", &why).is_empty());
        let nested = format!("impl X {{\n    pub(crate) unsafe fn a(\n        x: u8,\n    ) -> u8 {{\n{body}    }}\n}}\n");
        assert_eq!(long_fns("rs", &nested).len(), 1);
        let c = format!(
            "static int main_loop(int argc,\n\t\t     char **argv)\n{{\n{body}}}\nint f(void);\n"
        );
        assert_eq!(
            long_fns("c", &c),
            [(1, LONG_FN + 4, "static int main_loop(int argc,".into())]
        );
        let short = "int f(void)\n{\n\treturn 0;\n}\n";
        assert!(long_fns("c", short).is_empty());
    }
}
