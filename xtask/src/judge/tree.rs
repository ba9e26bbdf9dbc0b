//! Checks of the source tree itself, host tests only (`#[cfg(test)]`): `cargo test -p xtask`
//! runs them, and so does `cargo xtask test`, whose host stage is `cargo test --workspace`
//! ([`crate::suite::host_tests`]).
//! - The workspace reads as `cargo fmt --all` writes it (nothing else checks it: merges of
//!   branches have left files unformatted before).
//! - No in-VM test script assigns `_n`, the KTAP counter of `tests/vm/lib.sh` (a script that
//!   counted its own steps in `_n` restarted the numbering of the results once).

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
}
