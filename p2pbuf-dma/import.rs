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
        DmaBuf, ResvMut, ResvUsage,
    },
    prelude::*,
    scatterlist::SGTable,
    sync::{
        aref::ARef,
        atomic::{Atomic, Relaxed},
    },
};

/// The importer's side of an attachment (it needs no data of its own).
pub(crate) struct ImportState;

impl Importer for ImportState {
    const ALLOW_PEER2PEER: bool = true;

    fn invalidate_mappings(attach: &DynamicAttachment<Self>, held: &mut ResvMut<'_, '_>) {
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
            let mut guard = attach.dma_buf().lock();
            let mut held = guard.exclusive();
            let sgt = attach.map(&mut held, DataDirection::Bidirectional)?;
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
    /// `held` must be this buffer's reservation lock; the table is valid while it is held (and
    /// keeps it borrowed). Fails with `ENODEV` if the exporter revoked the buffer.
    pub(crate) fn map<'a>(&'a self, held: &'a mut ResvMut<'_, '_>) -> Result<&'a SGTable> {
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
    /// to write it (`write == true`). A signal ends the wait with `EINTR`. Called after
    /// [`Import::map`]: an exporter that moves the buffer there adds the move's fence.
    pub(crate) fn wait_fences(&self, write: bool) -> Result {
        let usage = if write {
            ResvUsage::Read
        } else {
            ResvUsage::Write
        };
        self.dma_buf().resv().wait(usage, true).map_err(|e| {
            // Not restartable: the copy has made progress that a restart would redo.
            if e == ERESTARTSYS {
                EINTR
            } else {
                e
            }
        })
    }
}

/// What the engine's DMA addresses for a mapping are, as `P2PBUF_DMA_MAP_*`.
///
/// Only the DMA side of the table is read: an importer must not look at the exporter's pages
/// (`CONFIG_DMABUF_DEBUG` hands importers a copy without them), and which PCI device provides
/// a peer's memory, or the route to it, is the exporter's knowledge, not the importer's. The
/// first DMA address is turned back into a CPU physical address through the device's IOMMU
/// domain when it translates; an address the domain does not map is a peer's bus address,
/// which on x86 is its CPU address. System RAM is host memory; anything else is device memory,
/// at its bus address or at an IOVA.
fn classify(sgt: &SGTable, dev: &device::Device) -> u32 {
    let Some((addr, _)) = dma_ranges(sgt).next() else {
        return uapi::P2PBUF_DMA_MAP_UNKNOWN;
    };
    let (phys, translated) = dma_to_phys(dev, addr);
    if is_system_ram(phys) {
        uapi::P2PBUF_DMA_MAP_HOST_MEMORY
    } else if translated {
        uapi::P2PBUF_DMA_MAP_THRU_HOST_BRIDGE
    } else {
        uapi::P2PBUF_DMA_MAP_BUS_ADDR
    }
}

/// The CPU physical address behind DMA address `addr` of `dev`, and whether `dev`'s IOMMU
/// translated it.
fn dma_to_phys(dev: &device::Device, addr: u64) -> (u64, bool) {
    // `device::Device` is `repr(transparent)` over `struct device`.
    let raw = core::ptr::from_ref(dev)
        .cast::<bindings::device>()
        .cast_mut();
    // SAFETY: `raw` is a valid device; the IOMMU core returns NULL for a device without an
    // IOMMU domain.
    let domain = unsafe { bindings::iommu_get_domain_for_dev(raw) };
    if domain.is_null() {
        return (addr, false);
    }
    // SAFETY: `domain` is the device's domain, valid while the device is bound (it is: it has
    // an attachment mapped).
    if unsafe { (*domain).type_ } == bindings::IOMMU_DOMAIN_IDENTITY {
        return (addr, false);
    }
    // SAFETY: As above. An address the domain does not map (a peer's bus address) gives 0.
    match unsafe { bindings::iommu_iova_to_phys(domain, addr) } {
        0 => (addr, false),
        phys => (phys, true),
    }
}

/// Whether `phys` is system RAM: online memory, which device memory (a BAR, p2pdma's
/// `ZONE_DEVICE` pages) never is.
///
/// `pfn_to_online_page()` looks at the memory section (and, for a section that mixes in device
/// memory, at its `dev_pagemap`); `region_intersects()`, used without `CONFIG_MEMORY_HOTPLUG`,
/// walks the resource tree, and for a BAR the whole PCI part of it (docs/bench.md, "Where the
/// time goes"). The section test is exact to a subsection (2 MiB with `SPARSEMEM_VMEMMAP`): a
/// BAR without `struct page`s inside a subsection that is partly RAM would count as RAM, which
/// x86 firmware does not lay out (BARs sit in the PCI windows, away from RAM).
fn is_system_ram(phys: u64) -> bool {
    #[cfg(CONFIG_MEMORY_HOTPLUG)]
    {
        // CAST: a pfn is an `unsigned long`; the lab's kernels are 64-bit, where any physical
        // address shifted by the page size fits.
        let pfn = (phys >> kernel::page::PAGE_SHIFT) as c_ulong;
        // SAFETY: `pfn_to_online_page()` takes any pfn and returns NULL for one that is not
        // online memory; the page is not used.
        !unsafe { bindings::pfn_to_online_page(pfn) }.is_null()
    }
    #[cfg(not(CONFIG_MEMORY_HOTPLUG))]
    {
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
}
