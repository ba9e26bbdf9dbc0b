//! Why an exporter of device memory refused an RDMA device: the PCI path between the NIC
//! that an RDMA device attaches dma-bufs with and the memory's PCI device, from sysfs, and
//! the p2pbuf exporter's own record of the refusal (`P2PBUF_IOCTL_REFUSAL` on the buffer).
//!
//! A hardware RDMA device attaches a dma-buf with its own PCI function. When that function
//! and the memory's device share no PCIe switch, the only path is through the host bridge,
//! which the kernel's p2pdma allows for AMD Zen CPUs and for whitelisted host bridges only
//! (`drivers/pci/p2pdma.c`); elsewhere the map type is `NOT_SUPPORTED` and the exporter
//! answers `EOPNOTSUPP`.
//!
//! A software RDMA device (rxe) does no DMA: it attaches dma-bufs for CPU access
//! (`dma_buf_cpu_attach()`), where no PCI path matters; `EOPNOTSUPP` then means that the
//! buffer's exporter offers no CPU access (no `vmap`, or not `dma_buf_ops.cpu_attach`), or a
//! kernel whose rxe has no dma-buf MRs.

use std::fs;
use std::path::{Path, PathBuf};

use p2pbuf::{DmaBuf, Error};
use p2pbuf_rdma::verbs::errnos::EOPNOTSUPP;
use p2pbuf_rdma::Pd;

/// Where a PCI device sits: its address, the bridges above it (nearest first, PCI addresses)
/// and its host bridge (`pci0000:00`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PciPath {
    pub dev: String,
    pub bridges: Vec<String>,
    pub host: String,
}

fn is_pci_addr(s: &str) -> bool {
    // DDDD:BB:DD.F
    let b = s.as_bytes();
    b.len() == 12
        && b[4] == b':'
        && b[7] == b':'
        && b[10] == b'.'
        && s.chars()
            .enumerate()
            .all(|(i, c)| matches!(i, 4 | 7 | 10) || c.is_ascii_hexdigit())
}

impl PciPath {
    /// From a resolved sysfs device path (`/sys/devices/pci0000:00/0000:00:04.0/0000:04:00.0`
    /// or a child of a PCI device such as `.../0000:04:00.0/virtio0/net/eth0`): the closest
    /// PCI device on it.
    pub fn from_sysfs(path: &str) -> Option<PciPath> {
        let mut host = None;
        let mut chain: Vec<String> = vec![];
        for c in path.split('/') {
            if host.is_none() {
                if c.starts_with("pci") && c.contains(':') {
                    host = Some(c.to_string());
                }
                continue;
            }
            if is_pci_addr(c) {
                chain.push(c.to_string());
            } else {
                break;
            }
        }
        let dev = chain.pop()?;
        chain.reverse();
        Some(PciPath {
            dev,
            bridges: chain,
            host: host?,
        })
    }

    /// The bridge nearest to both devices, or None when only the host bridge joins them.
    pub fn common_bridge(&self, other: &PciPath) -> Option<String> {
        if self.host != other.host {
            return None;
        }
        self.bridges
            .iter()
            .find(|b| other.bridges.contains(b))
            .cloned()
    }

    /// The root port (the bridge on the host bridge), if any.
    pub fn root_port(&self) -> Option<&str> {
        self.bridges.last().map(String::as_str)
    }
}

/// A PCI device's path, from `/sys/bus/pci/devices/ADDR`.
pub fn pci_path(addr: &str) -> Option<PciPath> {
    let p = fs::canonicalize(format!("/sys/bus/pci/devices/{addr}")).ok()?;
    PciPath::from_sysfs(&p.to_string_lossy())
}

/// Whether an RDMA device is a software device (rxe, siw): it has no device of its own
/// (no `device` link in sysfs), runs on a net device, and moves data with the CPU.
pub fn is_software_rdma_device(ibdev: &str) -> bool {
    let ib = PathBuf::from("/sys/class/infiniband").join(ibdev);
    ib.exists() && !ib.join("device").exists()
}

/// The net device an RDMA device runs on, and the PCI device it attaches dma-bufs with;
/// `None` for a software RDMA device, which attaches for CPU access, without a device.
pub fn rdma_device_pci(ibdev: &str) -> Option<(String, PciPath)> {
    if is_software_rdma_device(ibdev) {
        return None;
    }
    let ib = PathBuf::from("/sys/class/infiniband").join(ibdev);
    let netdev = fs::read_to_string(ib.join("parent"))
        .or_else(|_| fs::read_to_string(ib.join("ports/1/gid_attrs/ndevs/0")))
        .ok()?
        .trim()
        .to_string();
    // A hardware RDMA device is a PCI function itself.
    let from_ib = fs::canonicalize(ib.join("device")).ok();
    let from_net = fs::canonicalize(Path::new("/sys/class/net").join(&netdev).join("device")).ok();
    let p = from_ib.or(from_net)?;
    Some((netdev, PciPath::from_sysfs(&p.to_string_lossy())?))
}

fn describe(p: &PciPath) -> String {
    match p.root_port() {
        Some(rp) => format!("{} (under root port {rp})", p.dev),
        None => format!("{} (on the host bridge {})", p.dev, p.host),
    }
}

/// The CPU as p2pdma's host-bridge rule sees it: vendor and family (`cpu_supports_p2pdma()`
/// wants an AMD family 0x17 (Zen) or later; QEMU's TCG `max` CPU is AuthenticAMD family 15).
fn cpu_model() -> String {
    let info = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |k: &str| {
        info.lines()
            .find(|l| l.split(':').next().is_some_and(|n| n.trim() == k))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
    };
    let vendor = field("vendor_id").unwrap_or_else(|| "unknown".into());
    match field("cpu family").and_then(|f| f.parse::<u32>().ok()) {
        Some(f) => format!("{vendor} family {f:#x}"),
        None => vendor,
    }
}

/// The host bridge's PCI function (`DDDD:00:00.0` of `pciDDDD:BB`, class 0x0600) as
/// `ADDR VENDOR:DEVICE`: what p2pdma's host-bridge whitelist is matched against.
fn host_bridge_id(host: &str) -> Option<String> {
    let (dom, bus) = host.strip_prefix("pci")?.split_once(':')?;
    let addr = format!("{dom}:{bus}:00.0");
    let d = PathBuf::from("/sys/bus/pci/devices").join(&addr);
    let rd = |f: &str| {
        fs::read_to_string(d.join(f))
            .ok()
            .map(|v| v.trim().to_string())
    };
    if !rd("class")?.starts_with("0x0600") {
        return None;
    }
    let hex = |v: String| v.trim_start_matches("0x").to_string();
    Some(format!(
        "{addr} {}:{}",
        hex(rd("vendor")?),
        hex(rd("device")?)
    ))
}

/// Words for the path between `nic` and `mem`, and what p2pdma makes of it.
pub fn explain_path(nic: &PciPath, mem: &PciPath, cpu: &str) -> String {
    match nic.common_bridge(mem) {
        Some(b) => format!(
            "{} and the memory's {} are both below {b}: p2pdma maps that as BUS_ADDR unless ACS redirects the path (dmesg says so)",
            describe(nic),
            describe(mem)
        ),
        None => format!(
            "map type NOT_SUPPORTED: {} and the memory's {} share no PCI switch, only the host bridge {}, and the kernel's p2pdma allows peer-to-peer through a host bridge only on AMD Zen CPUs (AuthenticAMD family 0x17 or later) or whitelisted host bridges (this CPU: {cpu})",
            describe(nic),
            describe(mem),
            nic.host
        ),
    }
}

/// The last kernel log message (`/dev/kmsg`) that names `dev` and says peer-to-peer: p2pdma
/// logs which devices share no bridge ("cannot be used for peer-to-peer DMA as the client
/// and provider (...) do not share an upstream bridge or whitelisted host bridge").
pub fn kernel_says(dev: &str) -> Option<String> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    // O_NONBLOCK (x86-64, arm64): a read past the last record answers EAGAIN.
    const O_NONBLOCK: i32 = 0o4000;
    let mut f = fs::OpenOptions::new()
        .read(true)
        .custom_flags(O_NONBLOCK)
        .open("/dev/kmsg")
        .ok()?;
    let mut last = None;
    let mut buf = vec![0u8; 8192];
    // One record per read; stop at the end (EAGAIN) or on any error.
    while let Ok(n) = f.read(&mut buf) {
        if n == 0 {
            break;
        }
        let rec = String::from_utf8_lossy(&buf[..n]);
        let msg = rec.split_once(';').map_or(&*rec, |(_, m)| m);
        let msg = msg.lines().next().unwrap_or("");
        if msg.contains(dev) && msg.contains("peer-to-peer") {
            last = Some(msg.to_string());
        }
    }
    last
}

/// Why the p2pbuf exporter refused `ibdev` (EOPNOTSUPP from `ibv_reg_dmabuf_mr` of `buf`),
/// from sysfs and the exporter's record of the refusal (`P2PBUF_IOCTL_REFUSAL`), and whether
/// the exporter recorded one for this device; None when the RDMA device has no PCI device to
/// look at.
pub fn explain_refusal(ibdev: &str, buf: &DmaBuf) -> Option<(String, bool)> {
    let (netdev, nic) = rdma_device_pci(ibdev)?;
    let ex = p2pbuf::exporter::Exporter::open().ok();
    let record = ex.as_ref().and_then(|e| e.refusals(buf).ok());
    let refusal = record
        .as_ref()
        .and_then(|r| r.last.as_ref())
        .filter(|r| r.device == nic.dev)
        .map(|r| (r.text.clone(), r.count));
    // The buffer's provider; without the record (an old module), every provider is a candidate.
    let mem_pci: Vec<String> = match (&ex, &record) {
        (Some(e), Some(r)) => e
            .provider(r.provider)
            .map(|p| vec![p.pci_name])
            .unwrap_or_default(),
        (Some(e), None) => e
            .providers()
            .map(|v| v.into_iter().map(|p| p.pci_name).collect())
            .unwrap_or_default(),
        (None, _) => vec![],
    };
    let mut parts = vec![format!(
        "{ibdev} attaches dma-bufs with {} (the PCI device of {netdev}), and the p2pbuf exporter {} it",
        nic.dev,
        if refusal.is_some() {
            "refused"
        } else {
            "may have refused"
        }
    )];
    if let Some((why, count)) = &refusal {
        parts.push(format!(
            "its reason (P2PBUF_IOCTL_REFUSAL, {count} refusal(s) of this buffer): {why}"
        ));
    }
    for m in mem_pci.iter().filter_map(|a| pci_path(a)) {
        parts.push(explain_path(&nic, &m, &cpu_model()));
        if nic.common_bridge(&m).is_none() {
            if let Some(h) = host_bridge_id(&nic.host) {
                parts.push(format!(
                    "the host bridge is {h} (the whitelist it is matched against: pci_p2pdma_whitelist in drivers/pci/p2pdma.c)"
                ));
            }
        }
    }
    if let Some(k) = kernel_says(&nic.dev) {
        parts.push(format!("the kernel logged: {k}"));
    }
    if refusal.is_some() {
        parts.push("put the NIC and the memory under one PCIe switch (`cargo xtask --topology switch`), or use a Zen CPU (`--cpu EPYC`)".into());
    }
    Some((parts.join("; "), refusal.is_some()))
}

/// EOPNOTSUPP from `ibv_reg_dmabuf_mr`: on a software RDMA device, the exporter offers no
/// CPU access (or the kernel has no dma-buf MRs for it); on a NIC, for p2pbuf device memory,
/// the exporter refusing the NIC (no peer-to-peer path): say so, with the PCI path and the
/// exporter's reason, instead of "no dma-buf MR support".
pub fn explain_dmabuf_refusal(e: Error, pd: &Pd, buf: &DmaBuf) -> Error {
    let ibdev = pd.context().name();
    match e {
        Error::Os {
            what,
            errno: EOPNOTSUPP,
            check,
        } if is_software_rdma_device(ibdev) => Error::Os {
            what,
            errno: EOPNOTSUPP,
            check: Some(format!(
                "{ibdev} is a software RDMA device: it copies with the CPU and attaches dma-bufs for CPU access (dma_buf_cpu_attach()), which the {} exporter does not offer (it needs a vmap and dma_buf_ops.cpu_attach; udmabuf and p2pbuf have both){}",
                buf.exporter(),
                check.map(|c| format!("; or else {c}")).unwrap_or_default()
            )),
        },
        Error::Os {
            what,
            errno: EOPNOTSUPP,
            check,
        } if buf.exporter().starts_with("p2pbuf") => Error::Os {
            what,
            errno: EOPNOTSUPP,
            check: match (explain_refusal(pd.context().name(), buf), check) {
                (Some((why, true)), _) => Some(why),
                // Nothing recorded (a kernel whose rxe has no dma-buf MRs and never asked the
                // exporter): both explanations.
                (Some((why, false)), Some(c)) => Some(format!("{c}; or else {why}")),
                (why, c) => why.map(|w| w.0).or(c),
            },
        },
        e => e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(s: &str) -> PciPath {
        PciPath::from_sysfs(s).unwrap()
    }

    #[test]
    fn sysfs_paths() {
        let nic = path("/sys/devices/pci0000:00/0000:00:04.0/0000:04:00.0/virtio0/net/eth0");
        assert_eq!(nic.dev, "0000:04:00.0");
        assert_eq!(nic.bridges, ["0000:00:04.0"]);
        assert_eq!(nic.host, "pci0000:00");
        assert_eq!(nic.root_port(), Some("0000:00:04.0"));
        let sw =
            path("/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:03.0/0000:05:00.0");
        assert_eq!(sw.bridges, ["0000:02:03.0", "0000:01:00.0", "0000:00:01.0"]);
        assert!(PciPath::from_sysfs("/sys/devices/virtual/net/lo").is_none());
        assert!(!is_pci_addr("virtio0"));
    }

    #[test]
    fn paths_through_a_switch_or_the_host_bridge() {
        let a = path("/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:03:00.0");
        let b = path("/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:03.0/0000:06:00.0");
        assert_eq!(a.common_bridge(&b).as_deref(), Some("0000:01:00.0"));
        let m = path("/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0");
        let n = path("/sys/devices/pci0000:00/0000:00:04.0/0000:04:00.0");
        assert_eq!(m.common_bridge(&n), None);
        let t = explain_path(&n, &m, "AuthenticAMD family 0xf");
        assert!(t.contains("NOT_SUPPORTED"), "{t}");
        assert!(t.contains("root port 0000:00:04.0"), "{t}");
        assert!(t.contains("root port 0000:00:01.0"), "{t}");
        assert!(t.contains("host bridge pci0000:00"), "{t}");
        assert!(t.contains("this CPU: AuthenticAMD family 0xf"), "{t}");
    }
}
