//! What the build scripts of the p2pbuf crates share.
//!
//! `p2pbuf`, `p2pbuf-rdma` and `p2pbuf-fabric` generate bindings with bindgen against headers
//! that `cargo xtask` stages in its cache (rdma-core, libfabric) or that the repository carries
//! (the exporter's uAPI). Finding the cache, the include directory with a library's headers, the
//! libclang that `cargo xtask setup` installs and the C compiler's own headers is the same for
//! all three, and lives here.
//!
//! ```no_run
//! // In a build script:
//! let inc = p2pbuf_build::find_headers(
//!     "rdma-core",
//!     &["infiniband/verbs.h", "rdma/rdma_cma.h"],
//!     "P2PBUF_RDMA_ROOT",
//!     "build/rdma-root",
//! );
//! p2pbuf_build::use_cached_libclang();
//! ```

use std::path::{Path, PathBuf};

/// Where the wheel that `cargo xtask setup` installs keeps `libclang.so`, below the cache.
pub const LIBCLANG_DIR: &str = "tools/libclang/libclang-18.1.1.data/platlib/clang/native";

/// The lab's cache directory: `$P2PBUF_CACHE`, else `$XDG_CACHE_HOME/p2pbuf`, else
/// `~/.cache/p2pbuf` (the same rule as `cargo xtask`).
pub fn cache_dir() -> Option<PathBuf> {
    let nonempty = |v: &str| std::env::var_os(v).filter(|s| !s.is_empty());
    if let Some(c) = nonempty("P2PBUF_CACHE") {
        return Some(PathBuf::from(c));
    }
    if let Some(x) = nonempty("XDG_CACHE_HOME") {
        return Some(PathBuf::from(x).join("p2pbuf"));
    }
    nonempty("HOME").map(|h| PathBuf::from(h).join(".cache/p2pbuf"))
}

/// The include directory that has every one of `headers` (paths relative to it).
///
/// Looks, in this order, in `$<root_env>/usr/include` (a staging root named explicitly; a build
/// warning says when it lacks the headers), `<cache>/<staged>/usr/include` (what `cargo xtask`
/// built) and `/usr/include`. The error lists where it looked, for a build warning.
pub fn find_headers(
    what: &str,
    headers: &[&str],
    root_env: &str,
    staged: &str,
) -> Result<PathBuf, String> {
    let has = |inc: &Path| headers.iter().all(|h| inc.join(h).exists());
    let mut tried = vec![];
    if let Some(r) = std::env::var_os(root_env).filter(|s| !s.is_empty()) {
        let inc = PathBuf::from(r).join("usr/include");
        if has(&inc) {
            return Ok(inc);
        }
        println!(
            "cargo::warning={root_env} is set but {} lacks {}",
            inc.display(),
            headers.join(", ")
        );
        tried.push(inc);
    }
    if let Some(c) = cache_dir() {
        tried.push(c.join(staged).join("usr/include"));
    }
    tried.push(PathBuf::from("/usr/include"));
    if let Some(inc) = tried.iter().find(|i| has(i)) {
        return Ok(inc.clone());
    }
    Err(format!(
        "no {what} headers (looked in {})",
        tried
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    ))
}

/// Points bindgen (through clang-sys) at the libclang in the cache, unless `LIBCLANG_PATH` is
/// already set or the cache has none.
pub fn use_cached_libclang() {
    if std::env::var_os("LIBCLANG_PATH").is_some() {
        return;
    }
    if let Some(d) = cache_dir().map(|c| c.join(LIBCLANG_DIR)) {
        if d.join("libclang.so").exists() {
            // Read by clang-sys when bindgen loads libclang.
            std::env::set_var("LIBCLANG_PATH", d);
        }
    }
}

/// The C compiler's own include directory (`stddef.h` and friends), which the libclang wheel
/// lacks; pass it to bindgen with `-isystem`.
pub fn compiler_include() -> Option<String> {
    let out = std::process::Command::new("cc")
        .arg("-print-file-name=include")
        .output()
        .ok()?;
    let p = String::from_utf8(out.stdout).ok()?.trim().to_string();
    Path::new(&p).join("stddef.h").exists().then_some(p)
}

/// A bindgen builder with the settings the p2pbuf crates share for C library headers
/// (`-I inc`, the C compiler's own headers, enums as modules of constants, `Default` derived,
/// no comments or layout tests, pretty-printed); add the header and the allowlists.
pub fn bindgen_builder(inc: &Path) -> bindgen::Builder {
    let mut b = bindgen::Builder::default()
        .clang_arg(format!("-I{}", inc.display()))
        .default_enum_style(bindgen::EnumVariation::ModuleConsts)
        .derive_default(true)
        .generate_comments(false)
        .layout_tests(false)
        .formatter(bindgen::Formatter::Prettyplease);
    if let Some(ci) = compiler_include() {
        b = b.clang_arg(format!("-isystem{ci}"));
    }
    b
}

/// Runs `generate` (the `bindgen::Builder::generate` calls of a build script) with bindgen's
/// panic when it cannot load libclang turned into an error that says so (the panic's message,
/// and what to do), the panic itself not printed.
pub fn catch_libclang_panic<T>(generate: impl FnOnce() -> T) -> Result<T, String> {
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(generate));
    std::panic::set_hook(hook);
    r.map_err(|p| {
        format!(
            "bindgen could not run ({}); set LIBCLANG_PATH or run `cargo xtask setup`",
            p.downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| p.downcast_ref::<&str>().copied())
                .unwrap_or("libclang not found")
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_of_generate_is_an_error_that_says_what_to_do() {
        assert_eq!(catch_libclang_panic(|| 7), Ok(7));
        let e = catch_libclang_panic(|| -> u32 { panic!("Unable to find libclang") }).unwrap_err();
        assert!(e.contains("(Unable to find libclang)"), "{e}");
        assert!(e.contains("cargo xtask setup"), "{e}");
    }

    #[test]
    fn finds_headers_in_a_named_root_first() {
        let root = std::env::temp_dir().join(format!("p2pbuf-build-{}", std::process::id()));
        let inc = root.join("usr/include/x");
        std::fs::create_dir_all(&inc).unwrap();
        std::fs::write(inc.join("y.h"), "").unwrap();
        std::env::set_var("P2PBUF_BUILD_TEST_ROOT", &root);
        let got = find_headers("x", &["x/y.h"], "P2PBUF_BUILD_TEST_ROOT", "build/none").unwrap();
        assert_eq!(got, root.join("usr/include"));
        let err =
            find_headers("x", &["x/none.h"], "P2PBUF_BUILD_TEST_ROOT", "build/none").unwrap_err();
        assert!(err.starts_with("no x headers (looked in "), "{err}");
        assert!(err.contains("/usr/include"), "{err}");
        std::fs::remove_dir_all(&root).unwrap();
    }
}
