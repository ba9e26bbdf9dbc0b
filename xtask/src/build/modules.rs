//! `cargo xtask modules`: builds `exporter-kmod/` and `importer/` out of tree against the
//! kernel of `cargo xtask kernel`, with build output in the cache (`make M= MO=`): under
//! `build/` for the lab kernel, `build/bench/` for the benchmark kernel.

use crate::util::{heading, run_step, Ctx};
use anyhow::Result;
use std::path::PathBuf;

/// The project's out-of-tree modules: (source directory, module name).
pub const MODULES: &[(&str, &str)] = &[
    ("exporter-kmod", "p2pbuf_exporter"),
    ("importer", "p2pbuf_importer"),
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
        "modules: exporter-kmod, importer{}",
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
                "importer/p2pbuf_importer.rs",
            ])
            .output()
            .expect("rustfmt (rustup component add rustfmt)");
        assert!(
            out.status.success(),
            "run `rustfmt --edition 2021 exporter-kmod/p2pbuf_exporter.rs \
             importer/p2pbuf_importer.rs`:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
