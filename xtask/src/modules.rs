//! `cargo xtask modules`: builds `exporter-kmod/` and `p2pbuf-dma/` out of tree against the
//! kernel of `cargo xtask kernel`, with build output in the cache (`make M= MO=`): under
//! `build/` for the lab kernel, `build/bench/` for the benchmark kernel.

use crate::util::{heading, run_step, Ctx};
use anyhow::Result;
use std::path::PathBuf;

/// The project's out-of-tree modules: (source directory, module name).
pub const MODULES: &[(&str, &str)] = &[
    ("exporter-kmod", "p2pbuf_exporter"),
    ("p2pbuf-dma", "p2pbuf_dma"),
];

/// The build output of one module, for the context's kernel flavour.
pub fn module_out(ctx: &Ctx, dir: &str) -> PathBuf {
    ctx.flavour_build().join(dir)
}

/// Modules of the kernel tree that the lab loads itself (built by the kernel's `make modules`,
/// `=m` in `linux/p2pbuf.config`), relative to the kernel build directory: the in-tree user of
/// the Rust dma-buf exporter, which its test binds in place of `p2pbuf_exporter`.
pub const IN_TREE_MODULES: &[&str] = &["samples/rust/rust_dma_buf_exporter.ko"];

/// Paths of the built `.ko` files: the project's modules, then the kernel tree's.
pub fn module_files(ctx: &Ctx) -> Vec<PathBuf> {
    MODULES
        .iter()
        .map(|(d, m)| module_out(ctx, d).join(format!("{m}.ko")))
        .chain(IN_TREE_MODULES.iter().map(|k| ctx.kbuild().join(k)))
        .collect()
}

pub fn modules(ctx: &Ctx, clippy: bool) -> Result<()> {
    heading(&format!(
        "modules: exporter-kmod, p2pbuf-dma{}",
        ctx.flavour.note()
    ));
    for (dir, _) in MODULES {
        let out = module_out(ctx, dir);
        std::fs::create_dir_all(&out)?;
        let mut m = ctx.kmake()?;
        m.arg(format!("M={}", ctx.root.join(dir).display()))
            .arg(format!("MO={}", out.display()))
            .arg("W=1");
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

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::process::Command;

    /// The modules' Rust is formatted as the kernel's own is (`make rustfmtcheck`: the tree's
    /// `.rustfmt.toml` says edition 2021 and Unix newlines, nothing else). rustfmt follows the
    /// `mod` items (and `#[path]`) from each module's crate root.
    #[test]
    fn module_sources_are_formatted_as_the_kernel_formats() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("xtask lives in the repository root");
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

    /// The names the DMA engine had before it was p2pbuf-dma everywhere (module `p2pbuf_dma`,
    /// folder `p2pbuf-dma/`, `/dev/p2pbuf-dma`, `P2PBUF_DMA_*` in `linux/p2pbuf-dma.h`,
    /// `p2pbuf::dma`, `p2pbuf dma copy`, tests `p2pbuf_dma*`, boot `p2pbuf-dma-icount`; see
    /// docs/p2pbuf-dma.md, "One name"). Spelled in halves here so that this file passes its
    /// own check.
    const OLD_DMA_NAMES: &[&str] = &[
        concat!("p2pbuf_", "importer"),
        concat!("p2pbuf::", "importer"),
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

    /// The DMA engine goes by one name: none of its old names is back in a tracked file (file
    /// names included), and neither module reaches into the other's folder with `#[path]`.
    #[test]
    fn p2pbuf_dma_has_one_name() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("xtask lives in the repository root");
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
                if path.contains(old) {
                    found.push(format!("{path}: its name has `{old}`"));
                }
                for (n, line) in text.lines().enumerate() {
                    if line.contains(old) {
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
