//! `cargo xtask modules`: builds `exporter-kmod/` and `p2pbuf-dma/` out of tree against the
//! kernel of `cargo xtask kernel`, with build output in the cache (`make M= MO=`): under
//! `build/` for the lab kernel, `build/bench/` for the benchmark kernel.
//!
//! Each module's uAPI types are generated from its header in `include/uapi/linux/` before
//! `make`, by the cache's bindgen on the kernel's own uAPI headers (as the kernel's `rust/uapi`
//! is for in-tree drivers, with bindgen's layout checks kept): `uapi_generated.rs` in the
//! module's build directory, which the module's `uapi.rs` includes through the environment
//! variable `P2PBUF_UAPI_BINDINGS` that this `make` passes to rustc. A plain `make` in the
//! module's folder therefore needs that variable (and the file) too.

use crate::util::{heading, run_step, Ctx};
use anyhow::{Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

/// One of the project's out-of-tree modules.
pub struct Module {
    /// Its source directory (`make M=`), also the name of its build directory.
    pub dir: &'static str,
    /// The module's name (of its `.ko`).
    pub name: &'static str,
    /// Its uAPI header, in `include/uapi/linux/`.
    header: &'static str,
    /// The C names of the header that its bindings keep (bindgen's `--allowlist-type` and
    /// `--allowlist-var`): its own, not those of a header it includes.
    types: &'static str,
    vars: &'static str,
}

/// The project's out-of-tree modules.
pub const MODULES: &[Module] = &[
    Module {
        dir: "exporter-kmod",
        name: "p2pbuf_exporter",
        header: "p2pbuf.h",
        types: "p2pbuf_.*",
        vars: "P2PBUF_.*",
    },
    Module {
        dir: "p2pbuf-dma",
        name: "p2pbuf_dma",
        header: "p2pbuf-dma.h",
        types: "p2pbuf_dma_.*",
        vars: "P2PBUF_DMA_.*|P2PBUF_IOCTL_MAGIC",
    },
];

/// The environment variable that names a module's generated bindings to its `uapi.rs`.
const BINDINGS_VAR: &str = "P2PBUF_UAPI_BINDINGS";

/// The prefix of the constants through which clang evaluates the header's ioctl numbers, taken
/// off again after bindgen (the kernel's `bindings_helper.h` does the same).
const HELPER: &str = "RUST_CONST_HELPER_";

/// The build output of one module, for the context's kernel flavour.
pub fn module_out(ctx: &Ctx, dir: &str) -> PathBuf {
    ctx.flavour_build().join(dir)
}

/// Modules of the kernel tree that the lab loads itself (built by the kernel's `make modules`,
/// `=m` in `linux/p2pbuf.config`), relative to the kernel build directory: the in-tree users of
/// the Rust dma-buf exporter and importer, which their test binds in place of `p2pbuf_exporter`
/// and `p2pbuf_dma`.
pub const IN_TREE_MODULES: &[&str] = &[
    "samples/rust/rust_dma_buf_exporter.ko",
    "samples/rust/rust_dma_buf_importer.ko",
];

/// Paths of the built `.ko` files: the project's modules, then the kernel tree's.
pub fn module_files(ctx: &Ctx) -> Vec<PathBuf> {
    MODULES
        .iter()
        .map(|m| module_out(ctx, m.dir).join(format!("{}.ko", m.name)))
        .chain(IN_TREE_MODULES.iter().map(|k| ctx.kbuild().join(k)))
        .collect()
}

pub fn modules(ctx: &Ctx, clippy: bool) -> Result<()> {
    heading(&format!(
        "modules: exporter-kmod, p2pbuf-dma{}",
        ctx.flavour.note()
    ));
    for module in MODULES {
        let dir = module.dir;
        let out = module_out(ctx, dir);
        std::fs::create_dir_all(&out)?;
        let bindings = uapi_bindings(ctx, module, &out)?;
        let mut m = ctx.kmake()?;
        m.arg(format!("M={}", ctx.root.join(dir).display()))
            .arg(format!("MO={}", out.display()))
            .arg("W=1")
            .env(BINDINGS_VAR, &bindings);
        if clippy {
            m.arg("CLIPPY=1");
        } else {
            // A rustc warning fails the build: one slipped into a commit once, printed in the
            // log of a step that passed.
            m.arg("KRUSTFLAGS=-Dwarnings");
        }
        m.arg("modules");
        run_step(ctx, &format!("make M={dir}"), "modules", &mut m)?;
    }
    Ok(())
}

/// The header bindgen reads for a module: its uAPI header, then each ioctl number the header
/// defines (`#define P2PBUF_..IOCTL_.. _IO..(...)`) as a constant whose initialiser clang
/// evaluates (bindgen does not expand function-like macros such as `_IOWR()`).
fn bindgen_helper(header: &Path, text: &str) -> String {
    let mut h = format!("#include \"{}\"\n", header.display());
    for line in text.lines() {
        let mut words = line.split_whitespace();
        if let (Some("#define"), Some(name), Some(value)) =
            (words.next(), words.next(), words.next())
        {
            if name.contains("IOCTL_") && value.starts_with("_IO") {
                h.push_str(&format!("const unsigned int {HELPER}{name} = {name};\n"));
            }
        }
    }
    h
}

/// Generates `module`'s uAPI bindings into `out/uapi_generated.rs` (rewritten only when they
/// change, so that an unchanged module is not rebuilt); returns the file's path.
fn uapi_bindings(ctx: &Ctx, module: &Module, out: &Path) -> Result<PathBuf> {
    let header = ctx.root.join("include/uapi/linux").join(module.header);
    let text = std::fs::read_to_string(&header)
        .with_context(|| format!("reading {}", header.display()))?;
    let helper = out.join("uapi_helper.h");
    std::fs::write(&helper, bindgen_helper(&header, &text))?;
    let raw = out.join("uapi_bindgen.rs");
    let (ksrc, kbuild) = (ctx.ksrc()?, ctx.kbuild());
    let mut c = Command::new(ctx.tools_bin().join("bindgen"));
    c.arg(&helper)
        .args(["--use-core", "--ctypes-prefix", "kernel::ffi"])
        .args(["--with-derive-default", "--no-doc-comments"])
        .args(["--allowlist-type", module.types])
        .arg("--allowlist-var")
        .arg(format!("{}|{HELPER}.*", module.vars))
        .arg("-o")
        .arg(&raw)
        // The kernel's uAPI headers (<linux/types.h>, <linux/ioctl.h>), as headers_install
        // exports them, and no others.
        .args(["--", "-nostdinc", "-D__EXPORTED_HEADERS__"]);
    for inc in [
        ksrc.join("include/uapi"),
        ksrc.join("arch/x86/include/uapi"),
        kbuild.join("arch/x86/include/generated/uapi"),
        kbuild.join("include/generated/uapi"),
    ] {
        c.arg(format!("-I{}", inc.display()));
    }
    c.env("LIBCLANG_PATH", ctx.libclang_dir());
    run_step(
        ctx,
        &format!("bindgen {}", module.header),
        "modules",
        &mut c,
    )?;
    let rs = std::fs::read_to_string(&raw)?.replace(HELPER, "");
    let generated = out.join("uapi_generated.rs");
    if std::fs::read_to_string(&generated).ok().as_deref() != Some(rs.as_str()) {
        std::fs::write(&generated, rs)?;
    }
    Ok(generated)
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::process::Command;

    /// The repository's root (xtask's parent).
    fn repo_root() -> &'static Path {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("xtask lives in the repository root")
    }

    /// The modules' Rust is formatted as the kernel's own is (`make rustfmtcheck`: the tree's
    /// `.rustfmt.toml` says edition 2021 and Unix newlines, nothing else). rustfmt follows the
    /// `mod` items (and `#[path]`) from each module's crate root.
    #[test]
    fn module_sources_are_formatted_as_the_kernel_formats() {
        let root = repo_root();
        let out = Command::new("rustfmt")
            .current_dir(root)
            .args([
                "--check",
                "--edition",
                "2021",
                "--config",
                "newline_style=Unix",
            ])
            .args([
                "exporter-kmod/p2pbuf_exporter.rs",
                "p2pbuf-dma/p2pbuf_dma.rs",
            ])
            .output()
            .expect("rustfmt (rustup component add rustfmt)");
        assert!(
            out.status.success(),
            "run `rustfmt --edition 2021 exporter-kmod/p2pbuf_exporter.rs \
             p2pbuf-dma/p2pbuf_dma.rs`:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Every ioctl number of both headers reaches the bindings (as a constant clang evaluates),
    /// and nothing else does.
    #[test]
    fn bindgen_helper_evaluates_each_ioctl_number() {
        let root = repo_root();
        let mut all = Vec::new();
        for m in super::MODULES {
            let header = root.join("include/uapi/linux").join(m.header);
            let text = std::fs::read_to_string(&header).unwrap();
            let h = super::bindgen_helper(&header, &text);
            assert!(h.starts_with(&format!("#include \"{}\"\n", header.display())));
            all.extend(h.lines().skip(1).map(str::to_string));
        }
        let want = |n: &str| format!("const unsigned int {}{n} = {n};", super::HELPER);
        let names = [
            "P2PBUF_IOCTL_INFO",
            "P2PBUF_IOCTL_PROVIDER_INFO",
            "P2PBUF_IOCTL_ALLOC",
            "P2PBUF_IOCTL_REVOKE",
            "P2PBUF_IOCTL_REFUSAL",
            "P2PBUF_IOCTL_ATTACHMENT",
            "P2PBUF_DMA_IOCTL_IMPORT",
            "P2PBUF_DMA_IOCTL_RELEASE",
            "P2PBUF_DMA_IOCTL_COPY",
        ];
        assert_eq!(all, names.map(want));
    }

    /// The names the DMA engine had before it was p2pbuf-dma everywhere (module `p2pbuf_dma`,
    /// folder `p2pbuf-dma/`, `/dev/p2pbuf-dma`, `P2PBUF_DMA_*` in `linux/p2pbuf-dma.h`,
    /// `p2pbuf::dma`, `p2pbuf dma copy`, tests `p2pbuf_dma*`, boot `p2pbuf-dma-icount`; see
    /// docs/p2pbuf-dma.md, "One name"). Spelled in halves here so that this file passes its
    /// own check.
    const OLD_DMA_NAMES: &[&str] = &[
        concat!("p2pbuf_", "importer"),
        concat!("p2pbuf::", "importer"),
        concat!("P2pbuf", "Importer"),
        concat!("importer", "/"),
        concat!("importer", ".md"),
        concat!("importer", ".c"),
        concat!("importer", ".rs"),
        concat!("dma-", "engine"),
        concat!("dma_", "engine"),
        concat!("Dma", "Engine"),
        concat!("fp", "ga"),
        concat!("engine_", "large"),
        concat!("engine_", "races"),
        concat!("engine-", "icount"),
        concat!("p2pbuf_", "engine_"),
        concat!("exporter-kmod/", "include"),
        concat!("exporter-kmod/", "uapi_arg"),
        concat!("../", "exporter-kmod"),
        concat!("../", "p2pbuf-dma"),
    ];

    /// Tracked files where old names stay: the kernel series and other patches (history), and
    /// measured logs (docs/*.txt, docs/bench/*.txt, results/), which record what ran then.
    fn keeps_history(path: &str) -> bool {
        path.starts_with("linux/")
            || path.starts_with("results/")
            || (path.starts_with("docs/") && path.ends_with(".txt"))
    }

    /// Whether `hay` has `old` where it starts a name: not right after a letter, digit or `_`
    /// (the in-tree sample `rust_dma_buf_importer` is not the old importer module).
    fn has_old_name(hay: &str, old: &str) -> bool {
        hay.match_indices(old).any(|(at, _)| {
            !hay[..at]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
        })
    }

    /// The DMA engine goes by one name: none of its old names is back in a tracked file (file
    /// names included), and neither module reaches into the other's folder with `#[path]`.
    #[test]
    fn p2pbuf_dma_has_one_name() {
        let root = repo_root();
        let out = Command::new("git")
            .current_dir(root)
            .args(["ls-files", "-z"])
            .output()
            .expect("git");
        assert!(out.status.success(), "git ls-files failed");
        let mut found = Vec::new();
        for path in String::from_utf8_lossy(&out.stdout).split('\0') {
            if path.is_empty() || keeps_history(path) {
                continue;
            }
            // A file deleted in the work tree but still in the index has nothing to check.
            let text = std::fs::read(root.join(path))
                .map(|b| String::from_utf8_lossy(&b).into_owned())
                .unwrap_or_default();
            for old in OLD_DMA_NAMES {
                if has_old_name(path, old) {
                    found.push(format!("{path}: its name has `{old}`"));
                }
                for (n, line) in text.lines().enumerate() {
                    if has_old_name(line, old) {
                        found.push(format!("{path}:{}: `{old}`", n + 1));
                    }
                }
            }
        }
        assert!(
            found.is_empty(),
            "old names of the DMA engine (now p2pbuf-dma / p2pbuf_dma / P2PBUF_DMA_):\n{}",
            found.join("\n")
        );
    }
}
