// SPDX-License-Identifier: GPL-2.0

//! One exported buffer: a range of a provider's device memory behind a dma-buf.

use crate::provider::Provider;
use kernel::{
    device,
    dma::DataDirection,
    dma_buf::{
        export::{Exporter, ExportedSgt, PhysRange},
        Attachment, IoSysMap, ResvHeld,
    },
    mm::virt::{flags as vm_flags, VmaNew},
    new_mutex,
    page::PAGE_SIZE,
    pci::p2pdma::{MapType, P2pPages},
    prelude::*,
    str::CString,
    sync::{Arc, Mutex},
};

/// What the exporter remembers of one attachment, for debugfs.
pub(crate) struct AttachRecord {
    /// Identity of the attachment (its address; never dereferenced).
    key: usize,
    /// Name of the importing device.
    pub(crate) device: CString,
    /// How that device reaches the memory.
    pub(crate) map_type: MapType,
}

/// The exporter's data of one buffer.
///
/// # Invariants
///
/// `mem`, while `Some`, holds `size` bytes of `provider`'s memory starting at `offset` into its
/// BAR. It becomes `None` only in [`Exporter::revoke`], after every importer has unmapped.
#[pin_data]
pub(crate) struct Buffer {
    pub(crate) provider: Arc<Provider>,
    pub(crate) id: u64,
    pub(crate) size: usize,
    pub(crate) offset: u64,
    #[pin]
    mem: Mutex<Option<P2pPages>>,
    #[pin]
    pub(crate) attachments: Mutex<KVec<AttachRecord>>,
}

impl Buffer {
    /// Creates the exporter data for `mem`, `id` being its number for debugfs.
    pub(crate) fn new(provider: Arc<Provider>, id: u64, mem: P2pPages) -> impl PinInit<Self, Error> {
        let size = mem.size();
        let offset = provider.bar_offset(mem.phys_addr());
        try_pin_init!(Self {
            provider,
            id,
            size,
            offset,
            mem <- new_mutex!(Some(mem)),
            attachments <- new_mutex!(KVec::new()),
        })
    }

    /// Whether the buffer still holds device memory (it does until it is revoked).
    pub(crate) fn holds_memory(&self) -> bool {
        self.mem.lock().is_some()
    }
}

fn describe(dev: &device::Device) -> Result<CString> {
    CString::try_from_fmt(fmt!("{}", dev.name().to_str().unwrap_or("?")))
}

#[vtable]
impl Exporter for Buffer {
    /// Decides per importer, from the p2pdma map type between the provider and the importing
    /// device: through a common switch (bus addresses) and through the host bridge (the DMA
    /// API and the IOMMU) both work; everything else, importers that do not allow peer2peer,
    /// and importers that cannot be revoked get `EOPNOTSUPP`, and the reason is recorded.
    fn attach(this: &Self, attach: &Attachment) -> Result {
        let dev = attach.device();
        if !attach.peer2peer() {
            this.provider.refuse(dev, c"importer does not allow peer2peer (device memory)");
            return Err(EOPNOTSUPP);
        }
        if !attach.is_revocable() {
            // Device memory must be given back when the provider unbinds; an importer that
            // cannot be told to unmap would hold up the unbind for as long as it likes.
            this.provider.refuse(dev, c"importer cannot be revoked (no invalidate_mappings)");
            return Err(EOPNOTSUPP);
        }
        let map_type = {
            let mem = this.mem.lock();
            // The memory's provider stays valid while the allocation exists.
            mem.as_ref().ok_or(ENODEV)?.provider().map_type(dev)
        };
        if !map_type.is_supported() {
            this.provider
                .refuse(dev, c"no peer-to-peer path (see the kernel log for the blocking bridge)");
            return Err(EOPNOTSUPP);
        }
        dev_dbg!(
            &*this.provider.pdev,
            "buffer {}: {} attached, map type {}\n",
            this.id,
            dev.name().to_str().unwrap_or("?"),
            map_type.name().to_str().unwrap_or("?")
        );
        let rec = AttachRecord {
            key: core::ptr::from_ref(attach) as usize,
            device: describe(dev)?,
            map_type,
        };
        this.attachments.lock().push(rec, GFP_KERNEL)?;
        Ok(())
    }

    fn detach(this: &Self, attach: &Attachment) {
        let key = core::ptr::from_ref(attach) as usize;
        this.attachments.lock().retain(|r| r.key != key);
    }

    /// One scatter-gather entry per physically contiguous range: the buffer is one range, split
    /// only where `sg_dma_len` cannot describe it.
    fn map<'a>(
        this: &Self,
        attach: &'a Attachment,
        held: &'a ResvHeld<'a>,
        dir: DataDirection,
    ) -> Result<ExportedSgt<'a>> {
        let mem = this.mem.lock();
        let mem = mem.as_ref().ok_or(ENODEV)?;
        let range = [PhysRange::new(mem.phys_addr(), this.size)];
        ExportedSgt::from_phys_ranges(attach, held, mem.provider(), &range, dir)
    }

    fn begin_cpu_access(_this: &Self, _dir: DataDirection) -> Result {
        // Device memory is mapped uncached: nothing to flush or invalidate.
        Ok(())
    }

    fn end_cpu_access(_this: &Self, _dir: DataDirection) -> Result {
        Ok(())
    }

    /// Maps the buffer's pages (p2pdma pages, with `struct page`) into the process, so that
    /// `O_DIRECT` I/O into the mapping is a peer-to-peer transfer.
    fn mmap(this: &Self, vma: &VmaNew) -> Result {
        if vma.flags() & vm_flags::SHARED == 0 {
            return Err(EINVAL);
        }
        let mem = this.mem.lock();
        let mem = mem.as_ref().ok_or(ENODEV)?;
        let first = vma.pgoff();
        let pages = (vma.end() - vma.start()) / PAGE_SIZE;
        if first.checked_add(pages).is_none_or(|end| end * PAGE_SIZE > this.size) {
            return Err(EINVAL);
        }
        let vma = vma.set_mixedmap();
        for i in 0..pages {
            let page = mem.page(first + i).ok_or(EINVAL)?;
            vma.vm_insert_page(vma.start() + i * PAGE_SIZE, &page)?;
        }
        Ok(())
    }

    fn vmap(this: &Self, _held: &ResvHeld<'_>) -> Result<IoSysMap> {
        let mem = this.mem.lock();
        Ok(IoSysMap::iomem(mem.as_ref().ok_or(ENODEV)?.as_ptr().cast()))
    }

    /// Called once every importer has unmapped: the memory goes back to the provider (pages
    /// that a process still maps or that I/O still pins go back when those let go).
    fn revoke(this: &Self) {
        let mem = this.mem.lock().take();
        drop(mem);
        dev_dbg!(&*this.provider.pdev, "buffer {} revoked\n", this.id);
    }
}
