//! The kernel configuration: the fragment `linux/p2pbuf.config`, its `# BEGIN`/`# END`
//! blocks, the bench and KCSAN [`Variant`]s generated from it, and reading a `.config`.

use crate::util::Flavour;
use anyhow::{bail, Result};

/// Parses `CONFIG_X=y` / `# CONFIG_X is not set` lines into (symbol, value) pairs.
pub fn parse_config(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|l| {
            let l = l.trim();
            if let Some(rest) = l
                .strip_prefix("# ")
                .and_then(|r| r.strip_suffix(" is not set"))
            {
                return rest
                    .starts_with("CONFIG_")
                    .then(|| (rest.to_string(), "n".to_string()));
            }
            let (k, v) = l.split_once('=')?;
            k.starts_with("CONFIG_")
                .then(|| (k.to_string(), v.to_string()))
        })
        .collect()
}

/// The fragment's `=y`/`=m` and `=n` requests that the final `.config` does not honour.
pub fn config_mismatches(fragment: &str, config: &str) -> Vec<String> {
    let have: std::collections::HashMap<String, String> =
        parse_config(config).into_iter().collect();
    parse_config(fragment)
        .into_iter()
        .filter(|(k, v)| {
            let got = have.get(k).map(String::as_str).unwrap_or("n");
            match v.as_str() {
                "y" | "m" | "n" => got != v,
                _ => false,
            }
        })
        .map(|(k, v)| {
            format!(
                "{k}={v} (got {})",
                have.get(&k).map(String::as_str).unwrap_or("n")
            )
        })
        .collect()
}

/// The config fragment of the repository.
pub(super) const FRAGMENT: &str = "linux/p2pbuf.config";

/// The block of [`FRAGMENT`] that the benchmark kernel leaves out: from `# BEGIN debug` to
/// `# END debug`, those lines included.
pub(super) const DEBUG_BLOCK: &str = "debug";

/// What the benchmark kernel adds to the fragment: the function tracer, to find where the
/// time of a measured path goes (ftrace `function_graph` in the guest, docs/bench.md "Where
/// the time goes"). Dynamic ftrace patches the call sites to NOPs until a tracer is switched
/// on, as distribution kernels ship it; the lab kernel keeps `CONFIG_FTRACE=n`.
pub const BENCH_TRACING: &str = "\
# Bench kernel only (xtask/src/kernel.rs, BENCH_TRACING): the function(-graph) tracer.
CONFIG_FTRACE=y
CONFIG_FUNCTION_TRACER=y
CONFIG_FUNCTION_GRAPH_TRACER=y
CONFIG_DYNAMIC_FTRACE=y
";

/// What the KCSAN kernel puts in the place of the fragment's KASAN lines (the debug block
/// stays otherwise as it is). lib/Kconfig.kcsan (7.3.4): `KCSAN` depends on `HAVE_ARCH_KCSAN`
/// (x86_64), `HAVE_KCSAN_COMPILER` (Clang's `-fsanitize=thread`), `DEBUG_KERNEL` and
/// `!KASAN`, and selects `STACKTRACE`. `RUST` (init/Kconfig) has no KCSAN dependency: the Rust
/// modules load; kbuild instruments C only (scripts/Makefile.kcsan: `CFLAGS_KCSAN`, no rustc
/// flag), so a race is seen where one of its accesses is C (the dma-buf core, udmabuf, rxe,
/// umem_dmabuf, p2pdma, the Rust helpers), with the Rust callers in its stacks.
pub const KCSAN_CONFIG: &str = "\
# KCSAN kernel only (xtask/src/kernel.rs, KCSAN_CONFIG; `cargo xtask test --boot kcsan`):
# the debug block with KCSAN in the place of KASAN, which it cannot share a kernel with.
CONFIG_KASAN=n
CONFIG_KCSAN=y
# Non-strict: the default rules, which the kernel's own code is written to (no
# weak-memory modelling); strict mode reports every plain access that races a marked one.
CONFIG_KCSAN_STRICT=n
# Report a race even when the watched value did not change while the watchpoint was up:
# under TCG the watch window (KCSAN_UDELAY_TASK, 80 us) sees few changes, and a race in our
# code fails the boot whether or not the value happened to change. Other code's races are
# only listed, so the reports this adds there cost nothing but lines.
CONFIG_KCSAN_REPORT_VALUE_CHANGE_ONLY=n
# Races of a task with an interrupt on its own CPU too (rxe receives its packets in the
# network stack's softirq; dma-fence callbacks may run in interrupt context). Off by default
# upstream because some safe per-CPU patterns may be reported: a report is read, not trusted.
CONFIG_KCSAN_INTERRUPT_WATCHER=y
# One report per pair of racing functions every 3 s (the default): a race inside a test's
# loop prints a few reports, not a flood on the console.
CONFIG_KCSAN_REPORT_ONCE_IN_MS=3000
# KCSAN's boot selftest (panics if the detector does not work), enabled from early boot.
CONFIG_KCSAN_SELFTEST=y
CONFIG_KCSAN_EARLY_ENABLE=y
";

/// A kernel configured from a variant of [`FRAGMENT`], generated into its flavour's build
/// directory: the bench kernel and the KCSAN kernel. One generator ([`variant_fragment`]).
pub struct Variant {
    /// The generated fragment's file name, in the flavour's build directory.
    pub file: &'static str,
    /// Whether the variant leaves out the debug block.
    pub without_debug: bool,
    /// Options of the fragment the variant takes out, besides those `extra` sets.
    pub remove: &'static [&'static str],
    /// What the variant appends (and where the fragment sets one of these options, its line
    /// is taken out: the option is set once).
    pub extra: &'static str,
    /// What the variant is, after "`linux/p2pbuf.config` ", in messages.
    pub what: &'static str,
}

/// The benchmark kernel: no debug block, the function tracer.
pub const BENCH: Variant = Variant {
    file: "bench.config",
    without_debug: true,
    remove: &[],
    extra: BENCH_TRACING,
    what: "without its debug block",
};

/// The KCSAN kernel: the debug block, KASAN's lines replaced by [`KCSAN_CONFIG`].
pub const KCSAN: Variant = Variant {
    file: "kcsan.config",
    without_debug: false,
    remove: &["CONFIG_KASAN_GENERIC", "CONFIG_KASAN_INLINE"],
    extra: KCSAN_CONFIG,
    what: "with KCSAN instead of KASAN",
};

impl Flavour {
    /// How the flavour's fragment differs from the repository's (none: the lab kernel's is
    /// the repository's).
    pub fn variant(self) -> Option<&'static Variant> {
        match self {
            Flavour::Debug => None,
            Flavour::Bench => Some(&BENCH),
            Flavour::Kcsan => Some(&KCSAN),
        }
    }
}

/// The fragment of a variant: `text` (without its debug block where the variant says so),
/// without the lines that set an option of `v.remove` or of `v.extra`, then `v.extra`.
pub fn variant_fragment(text: &str, v: &Variant) -> Result<String> {
    let mut gone: Vec<String> = parse_config(v.extra).into_iter().map(|(k, _)| k).collect();
    gone.extend(v.remove.iter().map(|k| k.to_string()));
    let kept = if v.without_debug {
        without_block(text, DEBUG_BLOCK)?
    } else {
        text.to_string()
    };
    let mut out: String = kept
        .lines()
        .filter(|l| {
            parse_config(l)
                .first()
                .is_none_or(|(k, _)| !gone.contains(k))
        })
        .map(|l| format!("{l}\n"))
        .collect();
    out.push_str(v.extra);
    Ok(out)
}

/// `text` without the lines from `# BEGIN <name>` to `# END <name>` (markers included, each
/// alone on its line); every other line kept as it is. An error if the block is missing,
/// unterminated, nested or repeated, or if an END comes without its BEGIN.
pub fn without_block(text: &str, name: &str) -> Result<String> {
    let (begin, end) = (format!("# BEGIN {name}"), format!("# END {name}"));
    let mut out = String::with_capacity(text.len());
    let mut inside: Option<usize> = None;
    let mut blocks = 0;
    for (i, line) in text.lines().enumerate() {
        let marker = line.trim_end();
        if marker == begin {
            if let Some(open) = inside {
                bail!(
                    "line {}: `{begin}` inside the block opened on line {open}",
                    i + 1
                );
            }
            if blocks > 0 {
                bail!("line {}: a second `{begin}` block", i + 1);
            }
            inside = Some(i + 1);
        } else if marker == end {
            if inside.take().is_none() {
                bail!("line {}: `{end}` without a `{begin}` before it", i + 1);
            }
            blocks += 1;
        } else if inside.is_none() {
            out.push_str(line);
            out.push('\n');
        }
    }
    if let Some(open) = inside {
        bail!("line {open}: `{begin}` has no `{end}`");
    }
    if blocks == 0 {
        bail!("no `{begin}` ... `{end}` block");
    }
    Ok(out)
}

/// The options the block `name` of a fragment turns on (`=y`), without `CONFIG_`.
pub fn block_options(text: &str, name: &str) -> Result<Vec<String>> {
    let kept = parse_config(&without_block(text, name)?);
    Ok(parse_config(text)
        .into_iter()
        .filter(|kv| kv.1 == "y" && !kept.contains(kv))
        .map(|(k, _)| k.trim_start_matches("CONFIG_").to_string())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn parses_config_lines() {
        let c = parse_config("CONFIG_A=y\n# CONFIG_B is not set\nCONFIG_C=\"x\"\n# comment\n");
        assert_eq!(
            c,
            vec![
                ("CONFIG_A".into(), "y".into()),
                ("CONFIG_B".into(), "n".into()),
                ("CONFIG_C".into(), "\"x\"".into())
            ]
        );
    }

    const FRAG: &str = "CONFIG_A=y\n# about the block\n# BEGIN debug\nCONFIG_KASAN=y\nCONFIG_T=30\nCONFIG_P=n\n# END debug\nCONFIG_B=y\n# CONFIG_C is not set\n";

    #[test]
    fn bench_fragment_leaves_out_the_debug_block_only() {
        assert_eq!(
            without_block(FRAG, "debug").unwrap(),
            "CONFIG_A=y\n# about the block\nCONFIG_B=y\n# CONFIG_C is not set\n"
        );
        // Markers with trailing blanks still count; the last line needs no newline.
        assert_eq!(
            without_block("X=1\n# BEGIN debug  \nY=1\n# END debug\t\nZ=1", "debug").unwrap(),
            "X=1\nZ=1\n"
        );
        assert_eq!(block_options(FRAG, "debug").unwrap(), ["KASAN"]);
    }

    #[test]
    fn bench_fragment_refuses_a_broken_block() {
        for (text, why) in [
            (
                "CONFIG_A=y\n# BEGIN debug\nCONFIG_KASAN=y\n",
                "has no `# END debug`",
            ),
            ("CONFIG_A=y\n# END debug\n", "without a `# BEGIN debug`"),
            (
                "# BEGIN debug\n# BEGIN debug\n# END debug\n# END debug\n",
                "inside the block",
            ),
            (
                "# BEGIN debug\n# END debug\n# BEGIN debug\n# END debug\n",
                "a second",
            ),
            ("CONFIG_A=y\n", "no `# BEGIN debug`"),
            // Another block's markers do not close this one.
            (
                "# BEGIN debug\nCONFIG_X=y\n# END other\n",
                "has no `# END debug`",
            ),
        ] {
            let e = without_block(text, "debug").unwrap_err().to_string();
            assert!(e.contains(why), "{text:?}: {e}");
        }
    }

    #[test]
    fn the_repository_fragment_has_a_debug_block() {
        let text = fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../linux/p2pbuf.config"),
        )
        .unwrap();
        let bench = without_block(&text, DEBUG_BLOCK).unwrap();
        assert!(bench.contains("CONFIG_PCI_P2PDMA=y"));
        assert!(!bench.contains("CONFIG_DMA_API_DEBUG=y"));
        assert!(!block_options(&text, DEBUG_BLOCK).unwrap().is_empty());
    }

    #[test]
    fn kcsan_fragment_keeps_the_debug_block_and_trades_kasan_for_kcsan() {
        let frag = "CONFIG_A=y\n# BEGIN debug\nCONFIG_KASAN=y\nCONFIG_KASAN_GENERIC=y\nCONFIG_KASAN_INLINE=y\nCONFIG_T=30\n# END debug\nCONFIG_B=y\n";
        let k = variant_fragment(frag, &KCSAN).unwrap();
        assert_eq!(
            k,
            format!(
                "CONFIG_A=y\n# BEGIN debug\nCONFIG_T=30\n# END debug\nCONFIG_B=y\n{KCSAN_CONFIG}"
            )
        );
        let set: std::collections::HashMap<String, String> = parse_config(&k).into_iter().collect();
        assert_eq!(set["CONFIG_KASAN"], "n");
        assert_eq!(set["CONFIG_KCSAN"], "y");
        assert_eq!(set["CONFIG_KCSAN_STRICT"], "n");
        assert!(!set.contains_key("CONFIG_KASAN_GENERIC"));
    }

    #[test]
    fn the_repository_fragment_makes_a_kcsan_kernel() {
        let repo = fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../linux/p2pbuf.config"),
        )
        .unwrap();
        let k = variant_fragment(&repo, &KCSAN).unwrap();
        let set: Vec<(String, String)> = parse_config(&k);
        let get = |o: &str| {
            let v: Vec<&str> = set
                .iter()
                .filter(|(key, _)| key == o)
                .map(|(_, v)| v.as_str())
                .collect();
            v
        };
        // KASAN off once, KCSAN on; no KASAN line of the repository's left to contradict it.
        assert_eq!(get("CONFIG_KASAN"), ["n"]);
        assert!(get("CONFIG_KASAN_GENERIC").is_empty());
        assert!(get("CONFIG_KASAN_INLINE").is_empty());
        assert_eq!(get("CONFIG_KCSAN"), ["y"]);
        assert!(config_mismatches(&k, &k).is_empty());
        // Every other option of the debug block stays (the race tests need SW_SYNC, vivid,
        // fault injection; the checkers still check), and what KCSAN needs is there.
        for o in block_options(&repo, DEBUG_BLOCK).unwrap() {
            let want: &[&str] = match o.as_str() {
                "KASAN" => &["n"],
                _ if o.starts_with("KASAN_") => &[],
                _ => &["y"],
            };
            assert_eq!(get(&format!("CONFIG_{o}")), want, "{o}");
        }
        for o in [
            "CONFIG_DEBUG_KERNEL",
            "CONFIG_RUST",
            "CONFIG_STACKTRACE",
            "CONFIG_KALLSYMS",
        ] {
            assert_eq!(get(o), ["y"], "{o}");
        }
        // The tracer stays off, as on the lab kernel.
        assert_eq!(get("CONFIG_FTRACE"), ["n"]);
    }

    #[test]
    fn finds_dropped_options() {
        let frag = "CONFIG_A=y\nCONFIG_B=y\nCONFIG_C=n\n# CONFIG_D is not set\nCONFIG_N=16\n";
        let conf = "CONFIG_A=y\n# CONFIG_B is not set\nCONFIG_C=y\nCONFIG_N=8\n";
        assert_eq!(
            config_mismatches(frag, conf),
            vec!["CONFIG_B=y (got n)", "CONFIG_C=n (got y)"]
        );
    }
}
