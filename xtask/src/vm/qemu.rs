//! The QEMU command line: the reference topology (one PCIe switch holding the emulated GPU
//! memory, an NVMe drive with a CMB, the `edu` DMA engine and the NIC), the root-port
//! topology, and the intel-iommu variant.

use crate::util::Ctx;
use anyhow::{bail, Context, Result};
use clap::ValueEnum;
use std::fs;
use std::path::{Path, PathBuf};

/// Where the devices sit on the PCIe fabric.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Topology {
    /// All devices behind one PCIe switch (x3130 upstream + xio3130 downstream ports): P2P
    /// through the switch, map type BUS_ADDR (nvidia-smi's "PIX").
    Switch,
    /// Each device on its own PCIe root port: P2P only through the host bridge, which the
    /// kernel allows for Zen CPUs (`--cpu EPYC`) and refuses otherwise.
    Rootports,
}

/// What the guest's /init does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Test,
    Run,
    Shell,
    Bench,
    /// One node of `--nodes 2` (tests/vm/two-nodes.sh).
    Node,
}

impl Mode {
    fn as_str(self) -> &'static str {
        match self {
            Mode::Test => "test",
            Mode::Run => "run",
            Mode::Shell => "shell",
            Mode::Bench => "bench",
            Mode::Node => "node",
        }
    }
}

/// Everything that shapes one VM.
#[derive(Clone, Debug)]
pub struct VmConfig {
    pub topology: Topology,
    pub iommu: bool,
    pub kvm: bool,
    pub cpu: String,
    pub smp: u32,
    /// Run the guest with `-icount shift=auto,sleep=off`: its clock follows the instructions
    /// it executes and jumps to the next timer while every vCPU is idle, so waiting for a
    /// device timer costs no wall time (the edu engine finishes each transfer 100 ms of
    /// virtual time after it starts). icount makes TCG single-threaded.
    pub icount: bool,
    /// Guest RAM in MiB, before what the emulated GPU memory's `struct page`s need
    /// ([`VmConfig::guest_mem_mib`] adds that).
    pub mem_mib: u32,
    /// The emulated GPU memory (ivshmem BAR2) in MiB: a power of two, at most
    /// [`GPU_MEM_MAX_MIB`] ([`VmConfig::validate`]).
    pub gpu_mem_mib: u64,
    pub nvme_mib: u64,
    pub cmb_mib: u32,
    pub mode: Mode,
    /// Extra kernel command line words.
    pub append: Vec<String>,
    /// The NIC's network: QEMU's user networking (None), or a link to another VM.
    pub link: Option<NodeLink>,
}

/// A point-to-point Ethernet link between two VMs: UDP datagrams on the host's loopback
/// (`-netdev dgram`), one port per end. Nothing else is on the link.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeLink {
    /// UDP port this VM receives on.
    pub local_port: u16,
    /// UDP port the peer VM receives on.
    pub remote_port: u16,
    /// The NIC's MAC address (each node needs its own).
    pub mac: String,
}

impl Default for VmConfig {
    fn default() -> Self {
        Self {
            topology: Topology::Switch,
            iommu: false,
            kvm: false,
            cpu: "max".into(),
            smp: 2,
            icount: false,
            mem_mib: 2048,
            gpu_mem_mib: 1024,
            nvme_mib: 512,
            cmb_mib: 64,
            mode: Mode::Test,
            append: vec![],
            link: None,
        }
    }
}

/// The largest emulated GPU memory: 256 GiB, an H200's BAR. Its `struct page`s take 4 GiB of
/// guest RAM (and the 64-bit PCI hole must hold twice the BAR, see
/// [`VmConfig::pci_hole64_bytes`]: 513 GiB, below TCG's `-cpu max` limit of 40 physical address
/// bits, 1 TiB).
pub const GPU_MEM_MAX_MIB: u64 = 256 << 10;

/// QEMU 7.2's default size of q35's 64-bit PCI hole (`q35-pcihost.pci-hole64-size`).
const Q35_HOLE64_DEFAULT: u64 = 32 << 30;

/// Room in the 64-bit hole for the other devices' 64-bit BARs (the NVMe CMB, virtio-net's
/// BAR4, ivshmem's own) and the bridges' window granularity.
const HOLE64_SLACK: u64 = 1 << 30;

impl VmConfig {
    /// Refuses what QEMU would refuse less clearly: ivshmem's BAR must be a power of two (QEMU
    /// aborts on an assertion otherwise), and it must fit the guest's address space and RAM
    /// budget.
    pub fn validate(&self) -> Result<()> {
        let g = self.gpu_mem_mib;
        if g == 0 || !g.is_power_of_two() {
            bail!(
                "--gpu-mem-mib {g}: the emulated GPU memory is a PCI BAR, whose size must be a \
                 power of two (e.g. 1024, 8192, 65536)"
            );
        }
        if g > GPU_MEM_MAX_MIB {
            bail!(
                "--gpu-mem-mib {g}: at most {GPU_MEM_MAX_MIB} (256 GiB, an H200's BAR): its struct \
                 pages would take more than 4 GiB of guest RAM, and the 64-bit PCI hole must hold \
                 twice the BAR"
            );
        }
        Ok(())
    }

    /// Guest RAM in MiB: [`VmConfig::mem_mib`] plus the `struct page`s that p2pdma creates for
    /// every page of the BAR (`devm_memremap_pages()`: 64 bytes per 4 KiB page, 1 GiB for a
    /// 64 GiB BAR) and KASAN's shadow of them (an eighth), rounded up to 256 MiB. Nothing is
    /// added for the default 1 GiB BAR, whose 16 MiB of `struct page`s the base RAM holds.
    pub fn guest_mem_mib(&self) -> u32 {
        if self.gpu_mem_mib <= 1024 {
            return self.mem_mib;
        }
        let memmap = self.gpu_mem_mib / 64;
        let extra = (memmap + memmap / 8).div_ceil(256) * 256;
        self.mem_mib
            .saturating_add(u32::try_from(extra).unwrap_or(u32::MAX))
    }

    /// The size of q35's 64-bit PCI hole when the default (32 GiB) cannot hold the BAR, else
    /// `None`. A BAR is naturally aligned, and the hole starts wherever the RAM above 4 GiB
    /// ends, so the hole must span twice the BAR to be sure to hold one aligned copy of it,
    /// plus room for the other devices' 64-bit BARs.
    pub fn pci_hole64_bytes(&self) -> Option<u64> {
        let need = (self.gpu_mem_mib << 20)
            .saturating_mul(2)
            .saturating_add(HOLE64_SLACK);
        (need > Q35_HOLE64_DEFAULT).then_some(need)
    }
}

/// Files a VM uses.
pub struct VmFiles {
    pub kernel: PathBuf,
    pub initrd: PathBuf,
    /// Backing file of the emulated GPU memory (ivshmem BAR2): the host reads it.
    pub gpu_mem: PathBuf,
    pub nvme: PathBuf,
    /// Second serial port: the in-VM suite writes KTAP here.
    pub results: PathBuf,
    /// QEMU's trace of the NVMe controller's data addresses (test mode only): the host checks
    /// that peer-to-peer transfers reached the drive as BAR addresses (hostcheck.rs).
    pub nvme_trace: PathBuf,
}

impl VmFiles {
    pub fn new(ctx: &Ctx, kernel: PathBuf, initrd: PathBuf, node: &str) -> Self {
        let d = ctx.vm_dir();
        Self {
            kernel,
            initrd,
            gpu_mem: d.join(format!("{node}gpu-mem.bin")),
            nvme: d.join(format!("{node}nvme.img")),
            results: d.join(format!("{node}results.ktap")),
            nvme_trace: d.join(format!("{node}nvme-trace.log")),
        }
    }

    /// Creates the backing files (sparse, all zeros: the GPU memory starts blank every boot,
    /// so what the host finds there was written by this boot), and empties the results file.
    pub fn prepare(&self, cfg: &VmConfig) -> Result<()> {
        cfg.validate()?;
        let _ = fs::remove_file(&self.gpu_mem);
        for (p, mib) in [(&self.gpu_mem, cfg.gpu_mem_mib), (&self.nvme, cfg.nvme_mib)] {
            if let Some(d) = p.parent() {
                fs::create_dir_all(d)?;
            }
            let f = fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(p)
                .with_context(|| format!("cannot create {}", p.display()))?;
            f.set_len(mib << 20)?;
        }
        fs::write(&self.results, "")?;
        let _ = fs::remove_file(&self.nvme_trace);
        Ok(())
    }
}

fn p(path: &Path) -> String {
    path.display().to_string()
}

/// The devices of one VM, on the bus each topology gives them.
const DEVICES: [&str; 4] = ["gpu", "nvme", "edu", "nic"];

/// A QEMU argument list being built.
#[derive(Default)]
struct QemuArgs(Vec<String>);

impl QemuArgs {
    fn push(&mut self, xs: &[&str]) {
        self.0.extend(xs.iter().map(|s| s.to_string()));
    }
}

/// Builds the QEMU argument list (without the binary).
pub fn qemu_args(cfg: &VmConfig, files: &VmFiles, interactive: bool) -> Vec<String> {
    let mut a = QemuArgs::default();
    machine(&mut a, cfg);
    a.push(&["-no-reboot", "-nodefaults", "-display", "none"]);
    a.push(&["-kernel", &p(&files.kernel), "-initrd", &p(&files.initrd)]);
    a.push(&["-append", &kernel_cmdline(cfg)]);
    serial_ports(&mut a, cfg, files, interactive);
    if cfg.iommu {
        a.push(&["-device", "intel-iommu,intremap=on,caching-mode=on"]);
    }
    backends(&mut a, cfg, files);
    devices(&mut a, cfg);
    a.0
}

/// The machine: q35, the accelerator and CPU, vCPUs, RAM and the 64-bit PCI hole.
fn machine(a: &mut QemuArgs, cfg: &VmConfig) {
    a.push(&[
        "-machine",
        if cfg.iommu {
            "q35,kernel-irqchip=split"
        } else {
            "q35"
        },
    ]);
    if cfg.kvm {
        a.push(&["-accel", "kvm", "-cpu", "host"]);
    } else if cfg.icount {
        a.push(&[
            "-accel",
            "tcg",
            "-icount",
            "shift=auto,sleep=off",
            "-cpu",
            &cfg.cpu,
        ]);
    } else {
        a.push(&["-accel", "tcg,thread=multi", "-cpu", &cfg.cpu]);
    }
    a.push(&[
        "-smp",
        &cfg.smp.to_string(),
        "-m",
        &format!("{}M", cfg.guest_mem_mib()),
    ]);
    if let Some(hole) = cfg.pci_hole64_bytes() {
        a.push(&[
            "-global",
            &format!("q35-pcihost.pci-hole64-size={}G", hole.div_ceil(1 << 30)),
        ]);
    }
}

/// The guest kernel's command line.
fn kernel_cmdline(cfg: &VmConfig) -> String {
    let mut append = vec![
        "console=ttyS0".to_string(),
        "panic=-1".into(),
        "printk.devkmsg=on".into(),
        // KASAN reports only its first bug per boot without this: a report from the KUnit
        // suites at boot would hide every later one (the race tests run after them).
        "kasan_multi_shot".into(),
        // 4-level paging, though `-cpu max` offers LA57. With LA57 and inline generic KASAN,
        // an interrupt that lands while identify_cpu() has cleared the boot CPU's capability
        // words computes KASAN_SHADOW_START for 4 levels and reports every access to the
        // direct map as wild; with kasan_multi_shot the reports repeat from each timer tick
        // and the boot never leaves identify_boot_cpu(). Rare (1 boot of the 9ececf6 CI run,
        // 0 of 11 tried after it), known upstream: "[PATCH v1] kasan: Fix false-positive
        // wild-memory-access on x86 under 5-level paging", June 2026.
        "no5lvl".into(),
        format!("p2pbuf.mode={}", cfg.mode.as_str()),
        format!(
            "p2pbuf.topology={}",
            if cfg.topology == Topology::Switch {
                "switch"
            } else {
                "rootports"
            }
        ),
    ];
    if cfg.mode == Mode::Run {
        append.push("loglevel=4".into());
    }
    if cfg.iommu {
        append.push("intel_iommu=on".into());
    }
    append.extend(cfg.append.iter().cloned());
    append.join(" ")
}

/// The console (the terminal, or piped to the watcher), the results port, and in test mode
/// QEMU's trace of the NVMe controller.
fn serial_ports(a: &mut QemuArgs, cfg: &VmConfig, files: &VmFiles, interactive: bool) {
    if interactive {
        a.push(&["-serial", "mon:stdio"]);
    } else {
        a.push(&["-monitor", "none", "-serial", "stdio"]);
    }
    a.push(&["-serial", &format!("file:{}", p(&files.results))]);
    if cfg.mode == Mode::Test {
        // The NVMe controller's view of each read and write: the command (LBA, bytes) and
        // every data address it was given (pci_nvme_map_addr, and _cmb for addresses in its
        // own CMB). One line per 4 KiB page; only in test mode. Every -trace names the file:
        // QEMU keeps the last one's (none: stderr).
        for ev in ["pci_nvme_map_addr*", "pci_nvme_read", "pci_nvme_write"] {
            a.push(&[
                "-trace",
                &format!("enable={ev},file={}", p(&files.nvme_trace)),
            ]);
        }
    }
}

/// The devices' backends: the GPU memory's file, the drive's image, the NIC's network.
fn backends(a: &mut QemuArgs, cfg: &VmConfig, files: &VmFiles) {
    a.push(&[
        "-object",
        &format!(
            "memory-backend-file,id=gpumem,size={}M,mem-path={},share=on",
            cfg.gpu_mem_mib,
            p(&files.gpu_mem)
        ),
    ]);
    a.push(&[
        "-drive",
        &format!(
            "file={},if=none,id=nvme0,format=raw,cache=unsafe",
            p(&files.nvme)
        ),
    ]);
    match &cfg.link {
        None => a.push(&["-netdev", "user,id=net0"]),
        Some(l) => a.push(&[
            "-netdev",
            &format!(
                "dgram,id=net0,local.type=inet,local.host=127.0.0.1,local.port={},remote.type=inet,remote.host=127.0.0.1,remote.port={}",
                l.local_port, l.remote_port
            ),
        ]),
    }
}

/// The fabric (the bus each device plugs into, by topology), then the devices on it.
fn devices(a: &mut QemuArgs, cfg: &VmConfig) {
    let buses: Vec<String> = match cfg.topology {
        Topology::Switch => {
            a.push(&[
                "-device",
                "pcie-root-port,id=rp0,chassis=1,slot=0,bus=pcie.0",
            ]);
            a.push(&["-device", "x3130-upstream,id=sw0,bus=rp0"]);
            (0..DEVICES.len())
                .map(|i| {
                    let id = format!("dp{i}");
                    a.push(&[
                        "-device",
                        &format!(
                            "xio3130-downstream,id={id},bus=sw0,chassis={},slot=0",
                            i + 2
                        ),
                    ]);
                    id
                })
                .collect()
        }
        Topology::Rootports => (0..DEVICES.len())
            .map(|i| {
                let id = format!("rp{}", i + 1);
                a.push(&[
                    "-device",
                    &format!("pcie-root-port,id={id},chassis={},slot=0,bus=pcie.0", i + 1),
                ]);
                id
            })
            .collect(),
    };
    let mac = cfg
        .link
        .as_ref()
        .map_or(String::new(), |l| format!(",mac={}", l.mac));
    for (dev, bus) in DEVICES.iter().zip(&buses) {
        let d = match *dev {
            "gpu" => format!("ivshmem-plain,memdev=gpumem,bus={bus},id=gpu0"),
            "nvme" => format!(
                "nvme,serial=p2pbuf-nvme0,drive=nvme0,cmb_size_mb={},bus={bus},id=nvme0",
                cfg.cmb_mib
            ),
            "edu" => format!("edu,dma_mask=0xffffffffffffffff,bus={bus},id=edu0"),
            _ => format!("virtio-net-pci,netdev=net0,bus={bus},id=nic0{mac}"),
        };
        a.push(&["-device", &d]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files() -> VmFiles {
        VmFiles {
            kernel: "/c/bzImage".into(),
            initrd: "/c/initrd".into(),
            gpu_mem: "/c/gpu".into(),
            nvme: "/c/nvme".into(),
            results: "/c/res".into(),
            nvme_trace: "/c/trace".into(),
        }
    }

    fn joined(cfg: &VmConfig) -> String {
        qemu_args(cfg, &files(), false).join(" ")
    }

    #[test]
    fn switch_topology_puts_every_device_behind_the_switch() {
        let s = joined(&VmConfig::default());
        assert!(s.contains("x3130-upstream,id=sw0,bus=rp0"));
        for d in [
            "-device ivshmem-plain",
            "-device nvme,",
            "-device edu,",
            "-device virtio-net-pci",
        ] {
            let i = s.find(d).expect(d);
            assert!(
                s[i + 8..]
                    .split(' ')
                    .next()
                    .is_some_and(|x| x.contains("bus=dp")),
                "{d} not on a downstream port"
            );
        }
        assert!(s.contains("dma_mask=0xffffffffffffffff"));
        assert!(s.contains("share=on"));
        assert!(s.contains("-accel tcg"));
        assert!(!s.contains("intel-iommu"));
        assert!(!s.contains("-icount"));
        assert!(s.contains("-trace enable=pci_nvme_map_addr*,file=/c/trace"));
    }

    #[test]
    fn icount_drops_multithreaded_tcg() {
        let cfg = VmConfig {
            icount: true,
            mode: Mode::Bench,
            ..Default::default()
        };
        let s = joined(&cfg);
        assert!(s.contains("-accel tcg -icount shift=auto,sleep=off"));
        assert!(!s.contains("thread=multi"));
        // No trace outside test mode: benchmarks run untraced.
        assert!(!s.contains("-trace"));
    }

    #[test]
    fn rootports_and_iommu() {
        let cfg = VmConfig {
            topology: Topology::Rootports,
            iommu: true,
            cpu: "EPYC".into(),
            ..Default::default()
        };
        let s = joined(&cfg);
        assert!(!s.contains("x3130"));
        assert_eq!(s.matches("pcie-root-port").count(), 4);
        assert!(s.contains("intel-iommu"));
        assert!(s.contains("intel_iommu=on"));
        assert!(s.contains("-cpu EPYC"));
        // The IOMMU must come before the devices it translates for.
        assert!(s.find("intel-iommu").unwrap() < s.find("ivshmem-plain").unwrap());
    }

    #[test]
    fn nodes_are_linked_by_udp_on_loopback() {
        let cfg = VmConfig {
            mode: Mode::Node,
            link: Some(NodeLink {
                local_port: 40001,
                remote_port: 40002,
                mac: "52:54:00:00:0a:01".into(),
            }),
            ..Default::default()
        };
        let s = joined(&cfg);
        assert!(s.contains("-netdev dgram,id=net0,local.type=inet,local.host=127.0.0.1,local.port=40001,remote.type=inet,remote.host=127.0.0.1,remote.port=40002"));
        assert!(s.contains("virtio-net-pci,netdev=net0,bus=dp3,id=nic0,mac=52:54:00:00:0a:01"));
        assert!(s.contains("p2pbuf.mode=node"));
        assert!(!s.contains("user,id=net0"));
    }

    #[test]
    fn a_large_bar_widens_the_64_bit_hole_and_the_guest_ram() {
        let s = joined(&VmConfig::default());
        assert!(
            !s.contains("pci-hole64-size"),
            "the default BAR keeps QEMU's hole"
        );
        assert!(s.contains("-m 2048M"));
        let cfg = VmConfig {
            gpu_mem_mib: 64 << 10,
            ..Default::default()
        };
        let s = joined(&cfg);
        // Twice the BAR (it is naturally aligned, the hole is not) plus 1 GiB for the others.
        assert!(
            s.contains("-global q35-pcihost.pci-hole64-size=129G"),
            "{s}"
        );
        assert!(s.contains("size=65536M,mem-path=/c/gpu,share=on"));
        assert!(s.contains("-m 3328M"));
        let cfg = VmConfig {
            gpu_mem_mib: 256 << 10,
            ..Default::default()
        };
        assert!(cfg.validate().is_ok());
        assert_eq!(cfg.guest_mem_mib(), 2048 + 4608);
    }

    #[test]
    fn bar_sizes_qemu_cannot_give_are_refused_with_a_reason() {
        for (g, why) in [
            (0, "power of two"),
            (3000, "power of two"),
            (512 << 10, "at most 262144"),
        ] {
            let cfg = VmConfig {
                gpu_mem_mib: g,
                ..Default::default()
            };
            let e = cfg.validate().unwrap_err().to_string();
            assert!(e.contains(why) && e.contains("--gpu-mem-mib"), "{g}: {e}");
        }
        for g in [1, 1024, 8192, 65536] {
            let cfg = VmConfig {
                gpu_mem_mib: g,
                ..Default::default()
            };
            assert!(cfg.validate().is_ok(), "{g}");
        }
    }

    #[test]
    fn kvm_is_opt_in_and_mode_reaches_init() {
        let cfg = VmConfig {
            kvm: true,
            mode: Mode::Run,
            ..Default::default()
        };
        let s = joined(&cfg);
        assert!(s.contains("-accel kvm"));
        assert!(s.contains("p2pbuf.mode=run"));
    }
}
