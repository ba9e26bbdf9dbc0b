// SPDX-License-Identifier: GPL-2.0

//! Imported buffers: a dynamic attachment of the engine to a dma-buf, and how its mapping
//! reaches the memory.
//!
//! The attachment allows peer-to-peer mappings and is revocable. The mapping is made with the
//! buffer's reservation lock held and cached by the attachment; the exporter's
//! `invalidate_mappings` (also under that lock) drops it, and the copy code maps again before
//! the engine's next transfer. A revoked exporter refuses that new mapping with `ENODEV`, which
//! is then remembered: no transfer ever uses an address that is no longer mapped, because each
//! one runs with the lock held (see [`crate::copy`]).

use crate::uapi;
use kernel::{
    bindings, device,
    dma::DataDirection,
    dma_buf::{
        import::{dma_ranges, DynamicAttachment, Importer},
        DmaBuf, ResvHeld,
    },
    pci::p2pdma::{MapType, Provider},
    prelude::*,
    scatterlist::SGTable,
    sync::{
        aref::ARef,
        atomic::{Atomic, Relaxed},
    },
    task::MAX_SCHEDULE_TIMEOUT,
};

/// The importer's side of an attachment (it needs no data of its own).
pub(crate) struct ImportState;

impl Importer for ImportState {
    const ALLOW_PEER2PEER: bool = true;

    fn invalidate_mappings(attach: &DynamicAttachment<Self>, held: &mut ResvHeld<'_>) {
        // No transfer runs now: each holds this lock. Drop the mapping; the next transfer maps
        // again, or learns that the buffer is revoked.
        attach.unmap(held);
    }
}

/// One imported buffer.
pub(crate) struct Import {
    attach: Pin<KBox<DynamicAttachment<ImportState>>>,
    /// How the first mapping reached the memory (`P2PBUF_DMA_MAP_*`).
    pub(crate) map_type: u32,
    /// Ranges of the first mapping.
    pub(crate) nr_ranges: u32,
    /// The exporter refused to map the buffer again: it is revoked.
    revoked: Atomic<bool>,
}

impl Import {
    /// Attaches `dev` to `buf` and maps it once, to learn the map type (and to fail early if
    /// the engine cannot reach the memory).
    pub(crate) fn new(buf: ARef<DmaBuf>, dev: &device::Device<device::Bound>) -> Result<Self> {
        if buf.size() == 0 {
            return Err(EINVAL);
        }
        let attach = DynamicAttachment::new(buf, dev, Ok::<_, Error>(ImportState))?;
        let (map_type, nr_ranges) = {
            let guard = attach.dma_buf().lock();
            let sgt = attach.map(&guard, DataDirection::Bidirectional)?;
            let nr = u32::try_from(dma_ranges(sgt).count()).unwrap_or(u32::MAX);
            (classify(sgt, dev), nr)
        };
        Ok(Self {
            attach,
            map_type,
            nr_ranges,
            revoked: Atomic::new(false),
        })
    }

    /// The buffer.
    pub(crate) fn dma_buf(&self) -> &DmaBuf {
        self.attach.dma_buf()
    }

    /// Size of the buffer in bytes.
    pub(crate) fn size(&self) -> u64 {
        self.dma_buf().size() as u64
    }

    /// Whether the exporter revoked the buffer (as far as we have seen).
    pub(crate) fn is_revoked(&self) -> bool {
        self.revoked.load(Relaxed)
    }

    /// Returns the mapping for the engine, mapping again after an invalidation.
    ///
    /// `held` must be this buffer's reservation lock; the table is valid while it is held.
    /// Fails with `ENODEV` if the exporter revoked the buffer.
    pub(crate) fn map<'a>(&'a self, held: &'a ResvHeld<'_>) -> Result<&'a SGTable> {
        if self.is_revoked() {
            return Err(ENODEV);
        }
        self.attach
            .map(held, DataDirection::Bidirectional)
            .inspect_err(|e| {
                if *e == ENODEV {
                    self.revoked.store(true, Relaxed);
                }
            })
    }

    /// Waits until the fences of the buffer allow the engine to read it (`write == false`) or
    /// to write it (`write == true`). A signal ends the wait with `EINTR`.
    pub(crate) fn wait_fences(&self, held: &ResvHeld<'_>, write: bool) -> Result {
        // The lock is only taken as proof that this is a locked buffer of ours.
        let _ = held;
        let usage = if write {
            bindings::dma_resv_usage_DMA_RESV_USAGE_READ
        } else {
            bindings::dma_resv_usage_DMA_RESV_USAGE_WRITE
        };
        // SAFETY: The buffer is alive (we hold an attachment) and `resv` is set at export time
        // and never changes.
        let resv = unsafe { (*self.dma_buf().as_raw()).resv };
        // SAFETY: `resv` is valid; waiting for its fences is allowed with or without its lock.
        let ret = unsafe {
            // CAST: `MAX_SCHEDULE_TIMEOUT` is `LONG_MAX`, which fits `unsigned long`.
            bindings::dma_resv_wait_timeout(resv, usage, true, MAX_SCHEDULE_TIMEOUT as c_ulong)
        };
        if ret < 0 {
            // CAST: a negative return is an errno, which fits `i32`.
            let e = Error::from_errno(ret as i32);
            // Not restartable: the copy has made progress that a restart would redo.
            return Err(if e == ERESTARTSYS { EINTR } else { e });
        }
        Ok(())
    }
}

/// How a mapping reaches the memory, as `P2PBUF_DMA_MAP_*`.
///
/// Only the DMA side of the table is read: an importer must not look at the exporter's pages
/// (`CONFIG_DMABUF_DEBUG` hands importers a copy without them). The first DMA address is turned
/// back into a CPU physical address (through the device's IOMMU domain when there is one; a
/// bus address of a peer, which the IOMMU does not map, is taken as it is, and on x86 a bus
/// address is the CPU address). System RAM is host memory. Otherwise the map type is the PCI
/// core's answer for the provider, the PCI device whose memory BAR holds the address.
fn classify(sgt: &SGTable, dev: &device::Device) -> u32 {
    let Some((addr, _)) = dma_ranges(sgt).next() else {
        return uapi::MAP_UNKNOWN;
    };
    let phys = dma_to_phys(dev, addr);
    if is_system_ram(phys) {
        return uapi::MAP_HOST_MEMORY;
    }
    match provider_map_type(phys, dev) {
        Some(MapType::BusAddr) => uapi::MAP_BUS_ADDR,
        Some(MapType::ThruHostBridge) => uapi::MAP_THRU_HOST_BRIDGE,
        Some(MapType::NotSupported) | None => uapi::MAP_UNKNOWN,
    }
}

/// The CPU physical address behind DMA address `addr` of `dev`.
fn dma_to_phys(dev: &device::Device, addr: u64) -> u64 {
    // `device::Device` is `repr(transparent)` over `struct device`.
    let raw = core::ptr::from_ref(dev).cast::<bindings::device>().cast_mut();
    // SAFETY: `raw` is a valid device; the IOMMU core returns NULL for a device without an
    // IOMMU domain.
    let domain = unsafe { bindings::iommu_get_domain_for_dev(raw) };
    if domain.is_null() {
        return addr;
    }
    // SAFETY: `domain` is the device's domain, valid while the device is bound (it is: it has
    // an attachment mapped). Identity domains return `addr`; an address the domain does not map
    // (a peer's bus address) gives 0.
    match unsafe { bindings::iommu_iova_to_phys(domain, addr) } {
        0 => addr,
        phys => phys,
    }
}

/// Whether `phys` is system RAM.
fn is_system_ram(phys: u64) -> bool {
    // SAFETY: `region_intersects()` only reads the resource tree, under its own lock.
    let r = unsafe {
        bindings::region_intersects(
            phys,
            1,
            // CAST: resource flags are `unsigned long`.
            bindings::IORESOURCE_SYSTEM_RAM as c_ulong,
            // CAST: `IORES_DESC_NONE` is 0, a valid `unsigned long` descriptor.
            bindings::IORES_DESC_NONE as c_ulong,
        )
    };
    // CAST: `REGION_INTERSECTS` is 0.
    r == bindings::REGION_INTERSECTS as i32
}

/// The PCI core's map type between `client` and the PCI device whose memory BAR contains
/// `addr`, if there is one.
fn provider_map_type(addr: u64, client: &device::Device) -> Option<MapType> {
    let mut found = None;
    let mut pdev: *mut bindings::pci_dev = core::ptr::null_mut();
    loop {
        // SAFETY: `pci_get_device()` drops the reference on `pdev` (NULL at first) and returns
        // the next device with a new reference, or NULL at the end.
        pdev = unsafe { bindings::pci_get_device(PCI_ANY_ID, PCI_ANY_ID, pdev) };
        if pdev.is_null() {
            break;
        }
        // SAFETY: We hold a reference on `pdev`; its resources are set at enumeration.
        if (0..bindings::PCI_STD_NUM_BARS).any(|bar| unsafe { bar_contains(pdev, bar, addr) }) {
            let mut provider = bindings::p2pdma_provider {
                // SAFETY: `pdev` is valid; we hold a reference.
                owner: unsafe { &raw mut (*pdev).dev },
                bus_offset: 0,
            };
            // SAFETY: `provider` is a valid provider for the duration of the call: the PCI
            // core's `pci_p2pdma_map_type()` reads only `owner` (and that device's p2pdma
            // state under RCU), and we hold a reference on it.
            let p = unsafe { Provider::from_raw(&raw mut provider) };
            found = Some(p.map_type(client));
            // SAFETY: We own the reference `pci_get_device()` gave us.
            unsafe { bindings::pci_dev_put(pdev) };
            break;
        }
    }
    found
}

/// `PCI_ANY_ID`, as the unsigned value `pci_get_device()` takes.
const PCI_ANY_ID: u32 = !0;

/// Whether memory BAR `bar` of `pdev` contains `addr`.
///
/// # Safety
///
/// `pdev` must be a valid PCI device on which the caller holds a reference.
unsafe fn bar_contains(pdev: *mut bindings::pci_dev, bar: u32, addr: u64) -> bool {
    // SAFETY: `pdev` is valid (guaranteed by the caller) and `bar` is below
    // `PCI_STD_NUM_BARS`, inside the `resource` array.
    let res = unsafe { &(*pdev).resource[bar as usize] };
    // CAST: `IORESOURCE_MEM` is a flag bit of the `unsigned long` field.
    res.flags & bindings::IORESOURCE_MEM as c_ulong != 0
        && res.end > res.start
        && (res.start..=res.end).contains(&addr)
}
