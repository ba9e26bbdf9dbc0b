//! The VM boots of `cargo xtask test`. The main boot (the reference switch topology) runs the
//! whole suite; the topology boots re-run the tests whose answer depends on where the devices
//! sit, on a fabric where peer-to-peer is refused or goes through the host bridge and an IOMMU.
//! The engine boot runs the DMA engine's tests under QEMU's `-icount`, where the engine's
//! 100 ms per transfer (a virtual-clock timer in QEMU's edu model) costs no wall time.
//! The KCSAN boot (opt-in, by name) runs the race tests on a kernel of its own, with KCSAN
//! instead of KASAN.

use crate::qemu::{Topology, VmConfig};
use crate::util::Flavour;

/// One boot of the in-VM suite.
#[derive(Clone, Debug)]
pub struct Boot {
    /// Name, passed to the guest as `p2pbuf.suite=` (and `P2PBUF_SUITE` for the tests).
    pub name: &'static str,
    /// What this boot shows, printed before it starts.
    pub why: &'static str,
    pub topology: Topology,
    pub cpu: &'static str,
    pub iommu: bool,
    /// Tests (file names) this boot runs: every name containing one of these; empty = all
    /// tests not reserved for another boot, plus the KUnit suites.
    pub only: &'static [&'static str],
    /// Run QEMU with `-icount shift=auto,sleep=off` (single-threaded TCG, one vCPU: the guest
    /// kernel's periodic tick wakes every vCPU 250 times per virtual second, and each wake-up
    /// costs wall time).
    pub icount: bool,
    /// The emulated GPU memory's size in MiB, when not the default 1 GiB.
    pub gpu_mem_mib: Option<u64>,
    /// Boots with the pyverbs overlay (Python, pyverbs, rdma-core's tests/), which xtask builds
    /// only for it. Such a boot runs only when named (`--boot`) or when `--filter` selects
    /// one of its tests, not in a plain `cargo xtask test`.
    pub pyverbs: bool,
    /// The kernel it boots: the lab kernel ([`Flavour::Debug`]), or the KCSAN kernel
    /// ([`Flavour::Kcsan`]: built, with its modules and initramfs, only when this boot runs).
    pub kernel: Flavour,
    /// When it runs without `--boot` naming it.
    pub opt_in: OptIn,
}

/// Whether a boot runs without being named.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OptIn {
    /// In a plain `cargo xtask test` (and when `--filter` selects one of its tests).
    No,
    /// By name, or when `--filter` selects one of its tests (those run on no other boot):
    /// `pyverbs`, and `large-bar` (too long for a cold CI run within 60 min).
    NameOrFilter,
    /// By name only: its tests run on the main boot too, and it builds a kernel of its own.
    Name,
}

/// Test-name prefix of the tests that only the topology boots run.
pub const TOPO_PREFIX: &str = "topo_";

/// Tests of the main suite that also run, with other expectations, on the topology boots.
const TOPOLOGY_AWARE: &[&str] = &[TOPO_PREFIX, "lab_topology", "cli_2_nvme", "cli_3_dma"];

/// Tests (name prefixes) that only the p2pbuf-dma-icount boot runs: the p2pbuf_dma suite, the
/// large engine copies (tests/selftests/p2pbuf_dma_large.c, up to 64 MiB = 32,788 transfers) and
/// the in-tree exporter and importer samples, whose data goes through the engine
/// (dma_buf_sample.c, dma_buf_sample_importer.c; named so that they run before
/// p2pbuf_dma_large: their exports zero the BAR, where p2pbuf_dma_large leaves a pattern for the
/// host check).
const P2PBUF_DMA_TESTS: &[&str] = &["p2pbuf_dma", "dma_buf_sample"];

/// Tests (name prefixes) that only the large-bar boot runs: buffers larger than 4 GiB
/// (tests/selftests/large_bar.c).
const LARGE_TESTS: &[&str] = &["large_"];

/// The large-bar boot's emulated GPU memory: 256 GiB, the size of an H200's BAR (measured:
/// 274,877,906,944 bytes; it exports up to 120 GiB as one dma-buf). p2pdma gives each of its
/// 64 Mi pages a `struct page`: 4 GiB of guest RAM and KASAN's eighth on top
/// (`VmConfig::guest_mem_mib` adds them), and about half a minute of the exporter's probe under
/// TCG.
pub const LARGE_BAR_MIB: u64 = 256 << 10;

/// Guest seconds one test may take on the engine boot (run-tests.sh's limit): a 64 MiB copy
/// is 3,279 s of virtual time there.
const ENGINE_TEST_TIMEOUT: u32 = 20000;

/// The hung-task detector's limit while the tests run, in guest seconds: set on every boot's
/// command line (a sysctl, applied after the built-in KUnit suites, before init). While the
/// kernel boots the config's 120 s (`CONFIG_DEFAULT_HUNG_TASK_TIMEOUT`, linux/p2pbuf.config)
/// holds: one upstream KUnit case took 65 s once.
const HUNG_TASK_TIMEOUT: u32 = 30;

/// The hung-task detector's limit on the engine boot, in guest seconds: the debug kernel's
/// 30 s ([`HUNG_TASK_TIMEOUT`]) would report a test that
/// waits uninterruptibly for one engine copy, which takes up to thousands of virtual seconds
/// there. As long as a test may take, so that run-tests.sh's limit ends a slow test first and
/// the detector still reports a task stuck beyond it.
const ENGINE_HUNG_TASK_TIMEOUT: u32 = ENGINE_TEST_TIMEOUT;

/// Tests (name prefixes) that only the pyverbs boot runs: rdma-core's own test suite.
const PYVERBS_TESTS: &[&str] = &["pyverbs_"];

/// Guest seconds the pyverbs boot's test may take (run-tests.sh's limit; rdma-core's suite on
/// rxe under TCG takes minutes).
const PYVERBS_TEST_TIMEOUT: u32 = 2400;

/// Wall seconds the pyverbs boot gets at least.
const PYVERBS_MIN_WALL_S: u64 = 2700;

/// Wall seconds the engine boot gets at least.
const ENGINE_MIN_WALL_S: u64 = 2400;

/// Wall seconds the large-bar boot gets at least: giving back the 64 Mi pages of a 256 GiB
/// buffer one by one takes about four minutes under TCG with KASAN, and the boot does it twice
/// (large_bar.c, large_rdma.sh); 794 s measured with another build on the machine.
const LARGE_MIN_WALL_S: u64 = 1800;

/// The tests the KCSAN boot runs (names containing one of these): those that race the
/// modules' and the series' paths against each other from several threads
/// (tests/selftests/races_*.c, p2pbuf_dma_races.c, udmabuf_sync_race.c, odirect_revoke.c,
/// vivid_vmap.c). `races` also matches every `races_*` and `p2pbuf_dma_races`, named for the
/// list to say it.
const KCSAN_TESTS: &[&str] = &[
    "races",
    "p2pbuf_dma_races",
    "udmabuf_sync_race",
    "odirect_revoke",
    "vivid_vmap",
];

/// Wall seconds the KCSAN boot gets at least: every instrumented C access goes through
/// KCSAN's runtime (and one in KCSAN_SKIP_WATCH waits on a watchpoint), on top of TCG; and
/// p2pbuf_dma_races waits for the engine's 100 ms transfers in wall time (no -icount: KCSAN
/// sees races between CPUs, and -icount runs one).
const KCSAN_MIN_WALL_S: u64 = 2400;

/// Name prefixes of the tests the main boot leaves to other boots.
fn reserved() -> Vec<&'static str> {
    let mut v = vec![TOPO_PREFIX];
    v.extend_from_slice(P2PBUF_DMA_TESTS);
    v.extend_from_slice(LARGE_TESTS);
    v.extend_from_slice(PYVERBS_TESTS);
    v
}

/// The reference boot, and what the others share unless they say otherwise: every device
/// behind one PCIe switch, a non-Zen CPU without an IOMMU, the lab kernel, in every run.
const MAIN: Boot = Boot {
    name: "main",
    why: "the reference lab: every device behind one PCIe switch",
    topology: Topology::Switch,
    cpu: "max",
    iommu: false,
    only: &[],
    icount: false,
    gpu_mem_mib: None,
    pyverbs: false,
    kernel: Flavour::Debug,
    opt_in: OptIn::No,
};

/// Every boot of `cargo xtask test`, in order.
pub fn all() -> Vec<Boot> {
    vec![
        MAIN,
        Boot {
            name: "rootports",
            why: "each device on its own root port, non-Zen CPU: p2pdma must refuse, and say why",
            topology: Topology::Rootports,
            only: TOPOLOGY_AWARE,
            ..MAIN
        },
        Boot {
            name: "rootports-zen-iommu",
            why: "root ports, Zen CPU, intel-iommu: peer-to-peer through the host bridge",
            topology: Topology::Rootports,
            cpu: "EPYC",
            iommu: true,
            only: TOPOLOGY_AWARE,
            ..MAIN
        },
        Boot {
            name: "p2pbuf-dma-icount",
            why: "the DMA engine under -icount: p2pbuf_dma suite, copies from 1 byte to 64 MiB",
            only: P2PBUF_DMA_TESTS,
            icount: true,
            ..MAIN
        },
        Boot {
            name: "large-bar",
            why: "GPU-sized device memory: a 256 GiB BAR (an H200's), buffers larger than 4 GiB",
            only: LARGE_TESTS,
            gpu_mem_mib: Some(LARGE_BAR_MIB),
            // Opt-in since 2026-11-28 (`--boot large-bar`, or a `--filter` of a `large_` test):
            // 10 to 13 min under TCG (the REVOKE of 64 Mi pages alone 227 s) would take a cold
            // `bash .ci/run` past 60 min (cold kernel 16 min + install check + 39 min of boots).
            opt_in: OptIn::NameOrFilter,
            ..MAIN
        },
        Boot {
            name: "pyverbs",
            why: "rdma-core's own test suite (tests/run_tests.py, pyverbs) on rxe0, dma-bufs from udmabuf and p2pbuf",
            only: PYVERBS_TESTS,
            pyverbs: true,
            opt_in: OptIn::NameOrFilter,
            ..MAIN
        },
        Boot {
            name: "kcsan",
            why: "the race tests on the KCSAN kernel (KCSAN instead of KASAN): a data race in the modules or the series fails it, others are listed",
            only: KCSAN_TESTS,
            kernel: Flavour::Kcsan,
            opt_in: OptIn::Name,
            ..MAIN
        },
    ]
}

impl Boot {
    /// Applies this boot to a VM configuration and adds its kernel command line words.
    pub fn apply(&self, cfg: &mut VmConfig) {
        cfg.topology = self.topology;
        cfg.cpu = self.cpu.to_string();
        cfg.iommu = self.iommu;
        if let Some(g) = self.gpu_mem_mib {
            cfg.gpu_mem_mib = g;
        }
        let hung_task = if self.icount {
            cfg.icount = true;
            cfg.smp = 1;
            cfg.append
                .push(format!("p2pbuf.test_timeout={ENGINE_TEST_TIMEOUT}"));
            ENGINE_HUNG_TASK_TIMEOUT
        } else {
            HUNG_TASK_TIMEOUT
        };
        cfg.append
            .push(format!("sysctl.kernel.hung_task_timeout_secs={hung_task}"));
        if self.pyverbs {
            cfg.append
                .push(format!("p2pbuf.test_timeout={PYVERBS_TEST_TIMEOUT}"));
        }
        cfg.append.push(format!("p2pbuf.suite={}", self.name));
        if !self.only.is_empty() {
            cfg.append
                .push(format!("p2pbuf.only={}", self.only.join(",")));
        } else {
            cfg.append
                .push(format!("p2pbuf.skip={}", reserved().join(",")));
        }
    }

    /// Whether this boot would run a test of this name (as run-tests.sh decides), given the
    /// `--filter` substring.
    pub fn selects(&self, test: &str, filter: Option<&str>) -> bool {
        if let Some(f) = filter {
            if !test.contains(f) {
                return false;
            }
        }
        if self.only.is_empty() {
            !reserved().iter().any(|r| test.starts_with(r))
        } else {
            self.only.iter().any(|o| test.contains(o))
        }
    }

    /// The wall-clock limit for this boot, given the one asked for (`--timeout`): the engine
    /// boot's 64 MiB copies take minutes even under icount.
    pub fn timeout(&self, asked: u64) -> u64 {
        if self.icount {
            asked.max(ENGINE_MIN_WALL_S)
        } else if self.pyverbs {
            asked.max(PYVERBS_MIN_WALL_S)
        } else if self.kernel == Flavour::Kcsan {
            asked.max(KCSAN_MIN_WALL_S)
        } else if self.gpu_mem_mib.is_some_and(|g| g >= LARGE_BAR_MIB) {
            asked.max(LARGE_MIN_WALL_S)
        } else {
            asked
        }
    }

    /// KUnit suites run in the main boot only.
    pub fn runs_kunit(&self) -> bool {
        self.only.is_empty()
    }
}

/// Picks the boots to run: by name (`--boot`), then drops those that a `--filter` leaves
/// without a test. `tests` are the in-VM test names (file stems).
pub fn select(
    names: &[String],
    filter: Option<&str>,
    tests: &[String],
) -> anyhow::Result<Vec<Boot>> {
    let all = all();
    for n in names {
        if !all.iter().any(|b| b.name == n) {
            anyhow::bail!(
                "no boot named {n:?}; the boots are: {}",
                all.iter().map(|b| b.name).collect::<Vec<_>>().join(", ")
            );
        }
    }
    Ok(all
        .into_iter()
        .filter(|b| names.is_empty() || names.iter().any(|n| n == b.name))
        // An opt-in boot: by name, or (pyverbs, large-bar) by a --filter that picks one of its
        // tests.
        .filter(|b| match b.opt_in {
            OptIn::No => true,
            OptIn::NameOrFilter => !names.is_empty() || filter.is_some(),
            OptIn::Name => !names.is_empty(),
        })
        .filter(|b| {
            filter.is_none()
                || tests.iter().any(|t| b.selects(t, filter))
                || (b.runs_kunit()
                    && filter.is_some_and(|f| "kunit:".contains(f) || f.starts_with("kunit")))
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &[Boot]) -> Vec<&'static str> {
        v.iter().map(|b| b.name).collect()
    }

    /// The names of the boots [`select`] chooses.
    fn chosen(boots: &[String], filter: Option<&str>, tests: &[String]) -> Vec<&'static str> {
        names(&select(boots, filter, tests).unwrap())
    }

    #[test]
    fn main_boot_skips_topology_tests() {
        let b = &all()[0];
        assert!(b.selects("exporter", None));
        assert!(!b.selects("topo_rdma_refusal", None));
    }

    #[test]
    fn engine_tests_run_on_the_icount_boot_only() {
        let all = all();
        let main = &all[0];
        let engine = all.iter().find(|b| b.name == "p2pbuf-dma-icount").unwrap();
        for t in ["p2pbuf_dma_large", "p2pbuf_dma", "dma_buf_sample"] {
            assert!(!main.selects(t, None), "{t}");
            assert!(engine.selects(t, None), "{t}");
        }
        assert!(!engine.selects("exporter", None));
        assert!(!engine.runs_kunit());
        let mut cfg = VmConfig::default();
        main.apply(&mut cfg);
        assert!(!cfg.icount);
        assert!(cfg
            .append
            .contains(&"sysctl.kernel.hung_task_timeout_secs=30".to_string()));
        assert!(cfg
            .append
            .contains(&"p2pbuf.skip=topo_,p2pbuf_dma,dma_buf_sample,large_,pyverbs_".to_string()));
        let mut cfg = VmConfig::default();
        engine.apply(&mut cfg);
        assert!(cfg.icount);
        assert_eq!(cfg.smp, 1);
        assert!(cfg
            .append
            .iter()
            .any(|a| a.starts_with("p2pbuf.test_timeout=")));
    }

    #[test]
    fn the_tests_get_30_s_and_the_icount_boot_its_own_hung_task_limit() {
        for b in all() {
            let mut cfg = VmConfig::default();
            b.apply(&mut cfg);
            let limits: Vec<u64> = cfg
                .append
                .iter()
                .filter_map(|a| a.strip_prefix("sysctl.kernel.hung_task_timeout_secs="))
                .map(|v| v.parse().unwrap())
                .collect();
            if b.icount {
                // Longer than a 64 MiB copy (3,279 s of virtual time) and than a test may run.
                assert_eq!(limits, [u64::from(ENGINE_TEST_TIMEOUT)], "{}", b.name);
                assert!(limits[0] > 3279);
            } else {
                // The tests' 30 s, not the config's 120 s for the boot's KUnit suites.
                assert_eq!(limits, [u64::from(HUNG_TASK_TIMEOUT)], "{}", b.name);
            }
        }
    }

    #[test]
    fn topology_boots_rerun_topology_aware_tests_only() {
        let b = &all()[1];
        assert!(b.selects("topo_rdma_refusal", None));
        assert!(b.selects("cli_2_nvme", None));
        assert!(!b.selects("exporter", None));
    }

    #[test]
    fn filter_drops_boots_without_tests() {
        let tests: Vec<String> = ["exporter", "topo_x", "cli_2_nvme"]
            .map(String::from)
            .to_vec();
        assert_eq!(chosen(&[], Some("exporter"), &tests), ["main"]);
        assert_eq!(
            chosen(&[], Some("topo_"), &tests),
            ["rootports", "rootports-zen-iommu"]
        );
        assert_eq!(chosen(&[], Some("kunit"), &tests), ["main"]);
        // main, rootports, rootports-zen-iommu, p2pbuf-dma-icount: large-bar, pyverbs and kcsan
        // are opt-in.
        assert_eq!(
            chosen(&[], None, &tests),
            [
                "main",
                "rootports",
                "rootports-zen-iommu",
                "p2pbuf-dma-icount"
            ]
        );
        // large-bar: by name, or by a filter of one of its tests.
        let with_large: Vec<String> = ["exporter", "large_bar"].map(String::from).to_vec();
        assert_eq!(chosen(&[], Some("large_"), &with_large), ["large-bar"]);
        assert_eq!(
            chosen(&["large-bar".into()], None, &with_large),
            ["large-bar"]
        );
        // The pyverbs boot: by name or by a filter of its test, never by default.
        let with_py: Vec<String> = ["exporter", "pyverbs_tests"].map(String::from).to_vec();
        assert!(!chosen(&[], None, &with_py).contains(&"pyverbs"));
        assert_eq!(chosen(&[], Some("pyverbs"), &with_py), ["pyverbs"]);
        assert_eq!(chosen(&["pyverbs".into()], None, &with_py), ["pyverbs"]);
        assert!(!all()[0].selects("pyverbs_tests", None));
        assert_eq!(
            chosen(&[], Some("p2pbuf_dma"), &["p2pbuf_dma".to_string()]),
            ["p2pbuf-dma-icount"]
        );
        assert_eq!(
            chosen(&[], Some("large_"), &["large_bar".to_string()]),
            ["large-bar"]
        );
        assert!(select(&["nope".into()], None, &tests).is_err());
    }

    #[test]
    fn the_kcsan_boot_runs_the_race_tests_on_its_kernel_when_named() {
        let all = all();
        let k = all.iter().find(|b| b.name == "kcsan").unwrap();
        assert_eq!(k.kernel, Flavour::Kcsan);
        assert!(all
            .iter()
            .all(|b| b.name == "kcsan" || b.kernel == Flavour::Debug));
        for t in [
            "races",
            "races_unbind",
            "p2pbuf_dma_races",
            "udmabuf_sync_race",
            "odirect_revoke",
            "vivid_vmap",
        ] {
            assert!(k.selects(t, None), "{t}");
        }
        for t in [
            "exporter",
            "fail_nth",
            "p2pbuf_dma_large",
            "p2pbuf_dma",
            "kunit",
        ] {
            assert!(!k.selects(t, None), "{t}");
        }
        assert!(!k.runs_kunit());
        assert!(!k.icount, "KCSAN needs several CPUs");
        assert_eq!(k.timeout(900), KCSAN_MIN_WALL_S);
        let mut cfg = VmConfig::default();
        k.apply(&mut cfg);
        assert!(cfg.append.contains(
            &"p2pbuf.only=races,p2pbuf_dma_races,udmabuf_sync_race,odirect_revoke,vivid_vmap"
                .to_string()
        ));
        assert!(cfg.append.contains(&"p2pbuf.suite=kcsan".to_string()));
        assert_eq!(cfg.smp, VmConfig::default().smp);
        // Opt-in by name only: not by default, not by a --filter (the main boot runs the
        // race tests already, on the lab kernel).
        let tests: Vec<String> = ["exporter", "races", "vivid_vmap", "pyverbs_tests"]
            .map(String::from)
            .to_vec();
        assert!(!chosen(&[], None, &tests).contains(&"kcsan"));
        assert_eq!(chosen(&[], Some("races"), &tests), ["main"]);
        assert_eq!(chosen(&["kcsan".into()], None, &tests), ["kcsan"]);
        assert_eq!(chosen(&["kcsan".into()], Some("vivid"), &tests), ["kcsan"]);
        assert_eq!(
            chosen(&["main".into(), "kcsan".into()], None, &tests),
            ["main", "kcsan"]
        );
    }

    #[test]
    fn the_large_bar_boot_has_a_256_gib_bar_and_the_ram_for_its_pages() {
        let all = all();
        let b = all.iter().find(|b| b.name == "large-bar").unwrap();
        assert!(b.selects("large_bar", None));
        assert!(!all[0].selects("large_bar", None));
        let mut cfg = VmConfig::default();
        b.apply(&mut cfg);
        assert_eq!(cfg.gpu_mem_mib, 256 << 10);
        cfg.validate().unwrap();
        // 2 GiB + 4 GiB of struct pages + KASAN's eighth, within the lab's 8 GiB per boot.
        assert_eq!(cfg.guest_mem_mib(), 2048 + 4608);
        assert!(cfg.guest_mem_mib() <= 8192);
        // A 512 GiB hole and the RAM below 1 TiB, QEMU's 40 physical address bits under TCG.
        assert_eq!(cfg.pci_hole64_bytes(), Some((512 << 30) + (1 << 30)));
        assert_eq!(b.timeout(900), LARGE_MIN_WALL_S);
        assert_eq!(all[0].timeout(900), 900);
        // The other boots keep the 1 GiB BAR, the 2 GiB guest and QEMU's default hole.
        let mut cfg = VmConfig::default();
        all[0].apply(&mut cfg);
        assert_eq!(cfg.gpu_mem_mib, 1024);
        assert_eq!(cfg.guest_mem_mib(), 2048);
        assert_eq!(cfg.pci_hole64_bytes(), None);
    }
}
