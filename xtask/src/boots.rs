//! The VM boots of `cargo xtask test`. The main boot (the reference switch topology) runs the
//! whole suite; the topology boots re-run the tests whose answer depends on where the devices
//! sit, on a fabric where peer-to-peer is refused or goes through the host bridge and an IOMMU.

use crate::vm::{Topology, VmConfig};

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
}

/// Test-name prefix of the tests that only the topology boots run.
pub const TOPO_PREFIX: &str = "topo_";

/// Tests of the main suite that also run, with other expectations, on the topology boots.
const TOPOLOGY_AWARE: &[&str] = &[TOPO_PREFIX, "lab_topology", "cli_2_nvme", "cli_3_fpga"];

/// Every boot of `cargo xtask test`, in order.
pub fn all() -> Vec<Boot> {
    vec![
        Boot {
            name: "main",
            why: "the reference lab: every device behind one PCIe switch",
            topology: Topology::Switch,
            cpu: "max",
            iommu: false,
            only: &[],
        },
        Boot {
            name: "rootports",
            why: "each device on its own root port, non-Zen CPU: p2pdma must refuse, and say why",
            topology: Topology::Rootports,
            cpu: "max",
            iommu: false,
            only: TOPOLOGY_AWARE,
        },
        Boot {
            name: "rootports-zen-iommu",
            why: "root ports, Zen CPU, intel-iommu: peer-to-peer through the host bridge",
            topology: Topology::Rootports,
            cpu: "EPYC",
            iommu: true,
            only: TOPOLOGY_AWARE,
        },
    ]
}

impl Boot {
    /// Applies this boot to a VM configuration and adds its kernel command line words.
    pub fn apply(&self, cfg: &mut VmConfig) {
        cfg.topology = self.topology;
        cfg.cpu = self.cpu.to_string();
        cfg.iommu = self.iommu;
        cfg.append.push(format!("p2pbuf.suite={}", self.name));
        if !self.only.is_empty() {
            cfg.append
                .push(format!("p2pbuf.only={}", self.only.join(",")));
        } else {
            cfg.append.push(format!("p2pbuf.skip={TOPO_PREFIX}"));
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
            !test.starts_with(TOPO_PREFIX)
        } else {
            self.only.iter().any(|o| test.contains(o))
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

    fn names(v: &[Boot]) -> Vec<&str> {
        v.iter().map(|b| b.name).collect()
    }

    #[test]
    fn main_boot_skips_topology_tests() {
        let b = &all()[0];
        assert!(b.selects("exporter", None));
        assert!(!b.selects("topo_rdma_refusal", None));
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
        assert_eq!(
            names(&select(&[], Some("exporter"), &tests).unwrap()),
            ["main"]
        );
        assert_eq!(
            names(&select(&[], Some("topo_"), &tests).unwrap()),
            ["rootports", "rootports-zen-iommu"]
        );
        assert_eq!(
            names(&select(&[], Some("kunit"), &tests).unwrap()),
            ["main"]
        );
        assert_eq!(names(&select(&[], None, &tests).unwrap()).len(), 3);
        assert!(select(&["nope".into()], None, &tests).is_err());
    }
}
