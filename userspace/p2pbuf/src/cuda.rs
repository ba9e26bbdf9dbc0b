//! CUDA device memory exported as a dma-buf (feature `cuda`).
//!
//! [`export`] allocates device memory with `cuMemAlloc` (2 MiB aligned,
//! size rounded up to 2 MiB), fills it with a known byte, and exports it
//! with `cuMemGetHandleForAddressRange(...,
//! CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, ...)`. The fd becomes a
//! [`DmaBuf`], so the same fd-passing and registration code works on it.
//!
//! The driver library is loaded at run time (cudarc's dynamic loading): a
//! machine without the NVIDIA driver, without a GPU, or whose GPU/driver
//! lacks dma-buf support gets [`Error::Unavailable`] with the reason, never
//! a panic.

use std::sync::Arc;

use serde::Serialize;

use crate::dmabuf::DmaBuf;
use crate::error::{Error, Result};
use crate::sys::cuda::{self as sc, Attr, DeviceAlloc, Driver, LoadError, PrimaryCtx};

/// Alignment (and size granularity) of exported allocations: the GPU's
/// large page size, which the dma-buf exporter maps in whole.
pub const ALIGN: usize = 2 << 20;

/// `CUDA_ERROR_NO_DEVICE`.
const CUDA_ERROR_NO_DEVICE: i32 = 100;

/// One device attribute, by CUDA name and number.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Attribute {
    /// `CU_DEVICE_ATTRIBUTE_*` name, without the prefix.
    pub name: &'static str,
    /// Its enum value.
    pub id: u32,
    /// What `cuDeviceGetAttribute` returned.
    pub value: i32,
}

/// What the driver says about a device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeviceInfo {
    /// Device ordinal.
    pub ordinal: i32,
    /// `cuDeviceGetName`.
    pub name: String,
    /// `cuDriverGetVersion`, e.g. 13000 for CUDA 13.0.
    pub driver_version: i32,
    /// Number of devices the driver sees.
    pub device_count: i32,
    /// `cuDeviceTotalMem`.
    pub total_mem: u64,
    /// PCI address, `dddd:bb:dd`.
    pub pci_address: String,
    /// `CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED` (124) != 0.
    pub dma_buf_supported: bool,
    /// `CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED` (116) != 0.
    pub gpu_direct_rdma_supported: bool,
    /// Every attribute read, raw.
    pub attributes: Vec<Attribute>,
}

impl DeviceInfo {
    /// `13.0` style driver version.
    pub fn driver_version_string(&self) -> String {
        format!(
            "{}.{}",
            self.driver_version / 1000,
            (self.driver_version % 1000) / 10
        )
    }
}

const ATTRS: &[(&str, Attr)] = &[
    (
        "DMA_BUF_SUPPORTED",
        Attr::CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED,
    ),
    (
        "GPU_DIRECT_RDMA_SUPPORTED",
        Attr::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED,
    ),
    (
        "GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS",
        Attr::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS,
    ),
    (
        "GPU_DIRECT_RDMA_WRITES_ORDERING",
        Attr::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING,
    ),
    (
        "GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED",
        Attr::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED,
    ),
    (
        "COMPUTE_CAPABILITY_MAJOR",
        Attr::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
    ),
    (
        "COMPUTE_CAPABILITY_MINOR",
        Attr::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
    ),
    ("PCI_DOMAIN_ID", Attr::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID),
    ("PCI_BUS_ID", Attr::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID),
    ("PCI_DEVICE_ID", Attr::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID),
];

struct Session {
    drv: Driver,
    dev: sc::Device,
    info: DeviceInfo,
}

fn cuda_err(
    drv: Driver,
    what: impl Into<String>,
    e: cudarc::driver::DriverError,
    check: Option<&str>,
) -> Error {
    let (name, description) = drv.error_name(e);
    Error::Cuda {
        what: what.into(),
        code: e.0 as i32,
        name,
        description,
        check: check.map(str::to_string),
    }
}

fn open(ordinal: i32) -> Result<Session> {
    let drv = sc::load().map_err(|e| match e {
        LoadError::NoLibrary(names) => Error::unavailable(
            "loading the CUDA driver",
            format!(
                "no NVIDIA driver library: none of the {} names tried could be opened ({}, ...)",
                names.len(),
                names
                    .iter()
                    .filter(|n| n.as_str() == "libcuda.so" || n.as_str() == "libcuda.so.1")
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Some("is the NVIDIA driver installed (nvidia-smi)? is libcuda.so.1 on the loader path (ldconfig -p | grep libcuda)?".into()),
        ),
        LoadError::MissingSymbols(syms) => Error::unavailable(
            "loading the CUDA driver",
            format!("libcuda lacks {}", syms.join(", ")),
            Some("dma-buf export needs a driver for CUDA 11.7 or later (r515+)".into()),
        ),
    })?;
    if let Err(e) = drv.init() {
        if e.0 as i32 == CUDA_ERROR_NO_DEVICE {
            return Err(Error::unavailable(
                "cuInit",
                "the NVIDIA driver is installed but reports no CUDA device (CUDA_ERROR_NO_DEVICE)",
                Some("nvidia-smi; /dev/nvidia* device nodes; CUDA_VISIBLE_DEVICES".into()),
            ));
        }
        return Err(cuda_err(
            drv,
            "cuInit(0)",
            e,
            Some("nvidia-smi; dmesg for NVRM errors; does the kernel module match the user-space driver?"),
        ));
    }
    let driver_version = drv
        .driver_version()
        .map_err(|e| cuda_err(drv, "cuDriverGetVersion", e, None))?;
    let device_count = drv
        .device_count()
        .map_err(|e| cuda_err(drv, "cuDeviceGetCount", e, None))?;
    if ordinal < 0 || ordinal >= device_count {
        return Err(Error::unavailable(
            format!("opening CUDA device {ordinal}"),
            format!("the driver sees {device_count} device(s)"),
            Some("CUDA_VISIBLE_DEVICES; the --device argument".into()),
        ));
    }
    let dev = drv
        .device(ordinal)
        .map_err(|e| cuda_err(drv, format!("cuDeviceGet({ordinal})"), e, None))?;
    let name = dev
        .name()
        .map_err(|e| cuda_err(drv, "cuDeviceGetName", e, None))?;
    let total_mem = dev
        .total_mem()
        .map_err(|e| cuda_err(drv, "cuDeviceTotalMem", e, None))? as u64;
    let mut attributes = Vec::new();
    for (n, a) in ATTRS {
        let value = dev.attribute(*a).map_err(|e| {
            cuda_err(
                drv,
                format!("cuDeviceGetAttribute({n} = {})", *a as u32),
                e,
                None,
            )
        })?;
        attributes.push(Attribute {
            name: n,
            id: *a as u32,
            value,
        });
    }
    let get = |n: &str| {
        attributes
            .iter()
            .find(|a| a.name == n)
            .map_or(0, |a| a.value)
    };
    let info = DeviceInfo {
        ordinal,
        name,
        driver_version,
        device_count,
        total_mem,
        pci_address: format!(
            "{:04x}:{:02x}:{:02x}",
            get("PCI_DOMAIN_ID"),
            get("PCI_BUS_ID"),
            get("PCI_DEVICE_ID")
        ),
        dma_buf_supported: get("DMA_BUF_SUPPORTED") != 0,
        gpu_direct_rdma_supported: get("GPU_DIRECT_RDMA_SUPPORTED") != 0,
        attributes,
    };
    Ok(Session { drv, dev, info })
}

/// Load the driver and read a device's properties and attributes.
pub fn probe(ordinal: i32) -> Result<DeviceInfo> {
    open(ordinal).map(|s| s.info)
}

/// What to export.
#[derive(Debug, Clone)]
pub struct ExportOptions {
    /// Device ordinal.
    pub device: i32,
    /// Bytes; rounded up to [`ALIGN`].
    pub size: usize,
    /// Byte to fill the memory with before export (so importers can check
    /// what they read), or `None` to leave it as allocated.
    pub fill: Option<u8>,
    /// Pass `CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE` (force the
    /// exporter to map through the PCIe BAR; drivers for CUDA 12.8+).
    pub pcie_mapping: bool,
}

impl Default for ExportOptions {
    fn default() -> Self {
        ExportOptions {
            device: 0,
            size: ALIGN,
            fill: Some(0xa5),
            pcie_mapping: false,
        }
    }
}

/// Device memory and the dma-buf that exports it. Dropping it closes the
/// fd and frees the memory (another process holding a copy of the fd keeps
/// the dma-buf itself alive).
#[derive(Debug)]
pub struct CudaExport {
    dmabuf: DmaBuf,
    alloc: DeviceAlloc,
    offset: usize,
    size: usize,
    fill: Option<u8>,
    info: DeviceInfo,
    drv: Driver,
    _ctx: Arc<PrimaryCtx>,
}

/// Allocate, fill and export device memory as a dma-buf.
pub fn export(opts: &ExportOptions) -> Result<CudaExport> {
    let s = open(opts.device)?;
    let (drv, info) = (s.drv, s.info);
    if !info.dma_buf_supported {
        return Err(Error::unavailable(
            format!("dma-buf export from {} (device {})", info.name, info.ordinal),
            "CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED (124) is 0",
            Some("dma-buf export needs the open NVIDIA kernel modules (r515+) on a Turing or newer GPU, and a kernel with CONFIG_DMA_SHARED_BUFFER".into()),
        ));
    }
    if opts.size == 0 {
        return Err(Error::protocol("CUDA export", "size must be > 0"));
    }
    let size = opts
        .size
        .checked_next_multiple_of(ALIGN)
        .ok_or_else(|| Error::protocol("CUDA export", "size overflows"))?;
    let ctx = s
        .dev
        .primary_context()
        .map_err(|e| cuda_err(drv, "cuDevicePrimaryCtxRetain", e, None))?;
    let alloc_err = |n: usize, e| {
        cuda_err(
            drv,
            format!("cuMemAlloc({n})"),
            e,
            Some("free device memory (nvidia-smi)"),
        )
    };
    let mut alloc = ctx.alloc(size).map_err(|e| alloc_err(size, e))?;
    let mut offset = 0;
    if alloc.ptr() % ALIGN as u64 != 0 {
        // Over-allocate and use the aligned part.
        drop(alloc);
        alloc = ctx
            .alloc(size + ALIGN)
            .map_err(|e| alloc_err(size + ALIGN, e))?;
        offset = (ALIGN as u64 - alloc.ptr() % ALIGN as u64) as usize % ALIGN;
    }
    if let Some(b) = opts.fill {
        alloc
            .fill(offset, size, b)
            .map_err(|e| cuda_err(drv, format!("cuMemsetD8({size} bytes, {b:#04x})"), e, None))?;
    }
    let fd = alloc.export_dmabuf(offset, size, opts.pcie_mapping).map_err(|e| {
        cuda_err(
            drv,
            format!(
                "cuMemGetHandleForAddressRange({:#x}, {size}, DMA_BUF_FD, {})",
                alloc.ptr() + offset as u64,
                if opts.pcie_mapping { "MAPPING_TYPE_PCIE" } else { "0" }
            ),
            e,
            Some(if opts.pcie_mapping {
                "MAPPING_TYPE_PCIE is for cache-coherent (C2C) platforms; on a PCIe-attached GPU the default mapping already goes through BAR1: leave the flag out"
            } else {
                "the open NVIDIA kernel modules (cat /proc/driver/nvidia/version says \"Open Kernel Module\"); dmesg for NVRM errors"
            }),
        )
    })?;
    let dmabuf = DmaBuf::from_fd(fd)?;
    Ok(CudaExport {
        dmabuf,
        alloc,
        offset,
        size,
        fill: opts.fill,
        info,
        drv,
        _ctx: ctx,
    })
}

impl CudaExport {
    /// The exported buffer.
    pub fn dmabuf(&self) -> &DmaBuf {
        &self.dmabuf
    }

    /// The exported buffer, to name it ([`DmaBuf::set_name`]).
    pub fn dmabuf_mut(&mut self) -> &mut DmaBuf {
        &mut self.dmabuf
    }

    /// The device the memory lives on.
    pub fn device(&self) -> &DeviceInfo {
        &self.info
    }

    /// Device address of the exported range.
    pub fn device_ptr(&self) -> u64 {
        self.alloc.ptr() + self.offset as u64
    }

    /// Exported size in bytes (a multiple of [`ALIGN`]).
    pub fn size(&self) -> usize {
        self.size
    }

    /// Bytes actually allocated (more than [`size`](Self::size) when the
    /// allocation had to be over-sized to align it).
    pub fn allocated(&self) -> usize {
        self.alloc.size()
    }

    /// The fill byte, if the memory was filled.
    pub fn fill(&self) -> Option<u8> {
        self.fill
    }

    /// Copy `len` bytes at `offset` of the exported range back to the host
    /// (to check what an importer wrote).
    pub fn read_back(&self, offset: usize, len: usize) -> Result<Vec<u8>> {
        if offset.checked_add(len).is_none_or(|e| e > self.size) {
            return Err(Error::protocol(
                "reading back device memory",
                format!("{offset}+{len} is outside {} bytes", self.size),
            ));
        }
        let mut out = vec![0u8; len];
        self.alloc
            .read(self.offset + offset, &mut out)
            .map_err(|e| cuda_err(self.drv, format!("cuMemcpyDtoH({len} bytes)"), e, None))?;
        Ok(out)
    }
}

/// These run on a machine with an NVIDIA GPU and skip (pass, with a
/// message on stderr) elsewhere.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::mapping::Access;

    /// `Some(export)` on a GPU machine, `None` (after saying why) elsewhere.
    fn export_or_skip(opts: &ExportOptions) -> Option<CudaExport> {
        match export(opts) {
            Ok(x) => Some(x),
            Err(e) if e.is_unavailable() => {
                eprintln!("skipping CUDA test: {e}");
                None
            }
            Err(e) => panic!("CUDA export failed: {e}"),
        }
    }

    #[test]
    fn probe_never_panics() {
        match probe(0) {
            Ok(d) => {
                eprintln!("{d:?}");
                assert!(!d.name.is_empty());
                assert_eq!(d.attributes.len(), ATTRS.len());
            }
            Err(e) => {
                eprintln!("probe: {e}");
                assert!(
                    e.is_unavailable() || matches!(e, Error::Cuda { .. }),
                    "{e:?}"
                );
            }
        }
    }

    #[test]
    fn bad_device_ordinal_is_unavailable() {
        let e = export(&ExportOptions {
            device: 9999,
            ..Default::default()
        })
        .unwrap_err();
        assert!(e.is_unavailable(), "{e:?}");
    }

    #[test]
    fn export_is_an_nv_dmabuf() {
        let Some(x) = export_or_skip(&ExportOptions {
            fill: Some(0x5a),
            ..Default::default()
        }) else {
            return;
        };
        let b = x.dmabuf();
        eprintln!("fdinfo: {:?}", b.info());
        assert_eq!(b.exporter(), "nv_dmabuf");
        assert_eq!(b.size(), ALIGN as u64);
        assert_eq!(x.device_ptr() % ALIGN as u64, 0);
        assert_eq!(x.read_back(0, 64).unwrap(), vec![0x5a; 64]);
        assert_eq!(x.read_back(ALIGN - 8, 8).unwrap(), vec![0x5a; 8]);
        assert!(x.read_back(ALIGN - 8, 9).is_err());

        // CPU mapping: NVIDIA's exporter is expected to refuse (ENOTSUPP,
        // 524); if some driver allows it, the bytes must be the fill.
        match b.map(Access::Read) {
            Err(e) => {
                eprintln!("mmap: {e}");
                assert!(e.errno().is_some(), "{e:?}");
            }
            Ok(m) => assert_eq!(m.read().unwrap()[0], 0x5a),
        }

        // Through a socket: the receiver sees the same buffer (inode).
        let (s1, s2) = std::os::unix::net::UnixStream::pair().unwrap();
        crate::fdpass::send_dmabuf(&s1, b).unwrap();
        let got = crate::fdpass::recv_dmabuf(&s2).unwrap();
        assert_eq!(got.buf.exporter(), "nv_dmabuf");
        assert_eq!(got.buf.info().ino, b.info().ino);
        assert_eq!(got.header.size, ALIGN as u64);
    }

    #[test]
    fn sizes_round_up_to_2mib() {
        let Some(x) = export_or_skip(&ExportOptions {
            size: 3 << 20,
            fill: None,
            ..Default::default()
        }) else {
            return;
        };
        assert_eq!(x.size(), 4 << 20);
        assert_eq!(x.dmabuf().size(), 4 << 20);
    }
}
