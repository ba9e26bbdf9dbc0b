// SPDX-License-Identifier: GPL-2.0

//! One exported buffer: a range of a provider's device memory behind a dma-buf.

use crate::{provider::Provider, uapi};
use core::ops::Deref;
use kernel::{
    cgroup::dmem::Charge,
    device,
    dma::DataDirection,
    dma_buf::{
        export::{ExportedSgt, Exporter, MmapVma, PhysRange},
        Attachment, IoSysMap, ResvHeld,
    },
    mm::virt::{flags as vm_flags, VmFault},
    new_mutex,
    page::{PAGE_SHIFT, PAGE_SIZE},
    pci::p2pdma::P2pPages,
    prelude::*,
    str::CString,
    sync::{
        atomic::{Atomic, Relaxed},
        Arc, Mutex,
    },
    time::{delay::fsleep, Delta},
};

/// What the exporter keeps of one attachment (its [`Exporter::AttachData`]), for debugfs and
/// `P2PBUF_IOCTL_ATTACHMENT`, which read it with [`Exported::for_each_attachment`]; the
/// importing device is the attachment's own.
///
/// [`Exported::for_each_attachment`]: kernel::dma_buf::export::Exported::for_each_attachment
pub(crate) struct AttachInfo {
    /// The scatter-gather table of the latest map for this attachment.
    last_map: LastMap,
}

impl AttachInfo {
    /// The shape of the latest table mapped for the attachment, if it was mapped.
    pub(crate) fn last_map(&self) -> Option<SgShape> {
        self.last_map.get()
    }
}

/// An [`SgShape`] that the shared [`AttachInfo`] can hold: written by `map` and read by
/// [`Exported::for_each_attachment`], both under the buffer's reservation lock, which keeps a
/// reader from seeing half of one (the atomics only make it `Sync`).
///
/// [`Exported::for_each_attachment`]: kernel::dma_buf::export::Exported::for_each_attachment
struct LastMap {
    /// DMA entries; 0 until the first map (a table has at least one).
    entries: Atomic<u32>,
    bytes: Atomic<u64>,
    largest: Atomic<u64>,
    contiguous: Atomic<bool>,
}

impl LastMap {
    fn new() -> Self {
        Self {
            entries: Atomic::new(0),
            bytes: Atomic::new(0),
            largest: Atomic::new(0),
            contiguous: Atomic::new(false),
        }
    }

    fn set(&self, s: SgShape) {
        self.bytes.store(s.bytes, Relaxed);
        self.largest.store(s.largest, Relaxed);
        self.contiguous.store(s.contiguous, Relaxed);
        self.entries.store(s.entries, Relaxed);
    }

    fn get(&self) -> Option<SgShape> {
        let entries = self.entries.load(Relaxed);
        (entries != 0).then(|| SgShape {
            entries,
            bytes: self.bytes.load(Relaxed),
            largest: self.largest.load(Relaxed),
            contiguous: self.contiguous.load(Relaxed),
        })
    }
}

/// What a scatter-gather table handed to an importer looks like (debugfs; the tests check
/// that a buffer larger than 4 GiB is split where `sg_dma_len` (32 bits) needs it, and only
/// there).
#[derive(Clone, Copy)]
pub(crate) struct SgShape {
    /// DMA entries (`nents`).
    pub(crate) entries: u32,
    /// Sum of their lengths: must be the buffer's size.
    pub(crate) bytes: u64,
    /// The longest entry.
    pub(crate) largest: u64,
    /// Whether each entry starts where the one before ended (one DMA-contiguous range).
    pub(crate) contiguous: bool,
}

impl SgShape {
    fn of(sgt: &ExportedSgt<'_>) -> Self {
        let mut shape = Self {
            entries: sgt.nents(),
            bytes: 0,
            largest: 0,
            contiguous: true,
        };
        let mut next: Option<u64> = None;
        for e in sgt.iter() {
            let (addr, len) = (e.dma_address(), e.dma_len());
            if next.is_some_and(|n| n != addr) {
                shape.contiguous = false;
            }
            next = addr.checked_add(len);
            // Cannot overflow for a real table (the sum is at most the buffer's size); if
            // it did, the sum would show it: saturate rather than wrap.
            shape.bytes = shape.bytes.saturating_add(len);
            shape.largest = shape.largest.max(len);
        }
        shape
    }
}

/// The latest importing device the exporter refused for one buffer (`P2PBUF_IOCTL_REFUSAL`).
#[derive(Default)]
pub(crate) struct Refusals {
    /// Attachments refused so far.
    pub(crate) count: u64,
    /// The latest: the device's name, the `P2PBUF_REFUSAL_*` code, the reason in words.
    pub(crate) last: Option<(CString, u32, &'static CStr)>,
}

/// How the userspace mappings of a buffer reach its memory (`P2PBUF_ALLOC_PFNMAP`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CpuMapping {
    /// `struct page`s (`VM_MIXEDMAP`), the default: `O_DIRECT` and RDMA registration of the
    /// mapping are peer-to-peer transfers, and pin the pages while they run (revoke waits for
    /// them).
    Pages,
    /// Page frames without `struct page` (`VM_IO | VM_PFNMAP`), as vfio-pci maps BARs: nothing
    /// can pin the mapping (`O_DIRECT` and `ibv_reg_mr()` of it fail with `EFAULT`), so revoke
    /// is a zap; drivers that resolve I/O memory by PFN (`cudaHostRegister()` with
    /// `cudaHostRegisterIoMemory`) accept it.
    Pfn,
}

impl CpuMapping {
    /// The word debugfs shows.
    pub(crate) fn name(self) -> &'static str {
        match self {
            CpuMapping::Pages => "pages",
            CpuMapping::Pfn => "pfn",
        }
    }
}

/// The exporter's data of one buffer.
///
/// # Invariants
///
/// `mem`, while `Some`, holds `size` bytes of `provider`'s memory starting at `offset`
/// into its BAR. It becomes `None` in [`Exporter::revoke`], after every importer has unmapped
/// and every userspace mapping was zapped, or in [`Exporter::release`], when no file reference
/// is left.
///
/// # Locks
///
/// `mem` and `refusals` are leaves, never held together. `mem` is taken under the dma-buf
/// reservation lock (`map`, `vmap`), under `mmap_lock` (`mmap`), and under the abstraction's
/// fault lock (`fault`: `mmap_lock` -> fault lock -> `mem`); `release` takes the provider's
/// `state` after `mem` is dropped (provider `state` -> `mem` is the order elsewhere:
/// `Provider::used`; debugfs takes provider `state` -> the reservation lock).
#[pin_data]
pub(crate) struct Buffer {
    pub(crate) provider: Arc<Provider>,
    pub(crate) id: u64,
    pub(crate) size: usize,
    pub(crate) offset: u64,
    /// How userspace mappings reach the memory.
    pub(crate) mapping: CpuMapping,
    /// The memory and its dmem cgroup charge, until revoke or release.
    #[pin]
    mem: Mutex<Option<Charged>>,
    #[pin]
    pub(crate) refusals: Mutex<Refusals>,
    /// `begin_cpu_access` and `end_cpu_access` calls (`DMA_BUF_IOCTL_SYNC`, and kernel CPU
    /// importers such as rxe, which bracket every access), for debugfs.
    pub(crate) cpu_access: [Atomic<u64>; 2],
    /// Pages inserted into userspace mappings by `fault` (for debugfs, and for revoke: only a
    /// buffer whose `struct page`s were mapped can have pages that I/O pinned through a
    /// mapping).
    pub(crate) inserted: Atomic<u64>,
}

/// An allocation and the dmem cgroup charge that pays for it: they go together, so the charge
/// is undone exactly once whether the buffer is released, revoked or its provider unbound.
pub(crate) struct Charged {
    /// Dropped first: the pages go back to the pool before the cgroup is credited.
    pages: P2pPages,
    _charge: Charge,
}

impl Charged {
    /// `pages`, charged with `charge` to the cgroup of the process that allocated them.
    pub(crate) fn new(pages: P2pPages, charge: Charge) -> Self {
        Self {
            pages,
            _charge: charge,
        }
    }
}

impl Deref for Charged {
    type Target = P2pPages;

    fn deref(&self) -> &P2pPages {
        &self.pages
    }
}

/// How long a revoke waits for I/O that pinned pages of the buffer through a mapping (an
/// `O_DIRECT` read or write in flight) before it gives up saying so; 10 s, far above what one
/// request takes.
const PIN_WAIT_MS: u64 = 10_000;

impl Buffer {
    /// Creates the exporter data for `mem`, `id` being its number for debugfs.
    pub(crate) fn new(
        provider: Arc<Provider>,
        id: u64,
        mem: Charged,
        mapping: CpuMapping,
    ) -> impl PinInit<Self, Error> {
        let size = mem.size();
        let offset = provider.bar_offset(mem.phys_addr());
        try_pin_init!(Self {
            provider,
            id,
            size,
            offset,
            mapping,
            mem <- new_mutex!(Some(mem)),
            refusals <- new_mutex!(Refusals::default()),
            cpu_access: [Atomic::new(0), Atomic::new(0)],
            inserted: Atomic::new(0),
        })
    }

    /// Records that `dev` was refused with `code` (`P2PBUF_REFUSAL_*`) because of `why`: for
    /// `P2PBUF_IOCTL_REFUSAL`, for debugfs (the provider's list), and in the debug log.
    fn refuse(&self, dev: &device::Device, code: u32, why: &'static CStr) {
        self.provider.refuse(dev, why);
        let name = describe(dev).ok();
        let mut r = self.refusals.lock();
        r.count = r.count.saturating_add(1);
        // Without memory for the name the count still goes up; the last record stays.
        if let Some(name) = name {
            r.last = Some((name, code, why));
        }
    }

    /// Waits until no page of `mem` is held by anyone but the buffer, for at most
    /// [`PIN_WAIT_MS`], and says in the log what is left if that was not enough.
    ///
    /// Called by revoke after the abstraction zapped every mapping, so that no new pin can be
    /// taken: what still holds a page is I/O that pinned it through a mapping before (`O_DIRECT`
    /// pins with `FOLL_PCI_P2PDMA`) and writes to it until it completes. Returning before that
    /// would break revoke's promise that nobody reaches the memory afterwards.
    fn wait_unpinned(&self, mem: &P2pPages) {
        let (mut waited, mut step) = (0, 1);
        loop {
            let busy = mem.busy_pages();
            if busy == 0 {
                return;
            }
            if waited >= PIN_WAIT_MS {
                dev_warn!(
                    &*self.provider.pdev,
                    "p2pbuf: buffer {} revoked with {} page(s) still pinned by I/O after {} ms; they go back to the pool when it completes\n",
                    self.id,
                    busy,
                    waited
                );
                return;
            }
            fsleep(Delta::from_millis(step as i64));
            waited += step;
            step = (step * 2).min(500);
        }
    }

    /// Takes the memory out of the buffer (revoke, release); the caller drops it after the
    /// lock is released.
    fn take_memory(&self) -> Option<Charged> {
        self.mem.lock().take()
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
    /// Device memory: the abstraction refuses importers that do not allow peer2peer or cannot
    /// be revoked (an importer that cannot be told to unmap would hold up the unbind for as long
    /// as it likes) before `attach` is called.
    const DEVICE_MEMORY: bool = true;

    type AttachData = AttachInfo;

    /// Decides per importer with the dma-buf core's check between the provider and the
    /// importing device (`dma_buf_phys_vec_check()`): through a common switch (bus addresses)
    /// and through the host bridge (the DMA API and the IOMMU) both work; without a path the
    /// importer gets `EOPNOTSUPP`, and the reason is recorded.
    fn attach(this: &Self, attach: &Attachment) -> Result<AttachInfo> {
        let dev = attach.device();
        let mem = this.mem.lock();
        // The memory's provider stays valid while the allocation exists.
        let checked = attach.check_p2p(mem.as_ref().ok_or(ENODEV)?.provider());
        drop(mem);
        checked.inspect_err(|&e| {
            if e == EOPNOTSUPP {
                this.refuse(
                    dev,
                    uapi::P2PBUF_REFUSAL_NO_P2P_PATH,
                    c"no peer-to-peer path (see the kernel log for the blocking bridge)",
                );
            }
        })?;
        // `dev_dbg!` prints only with `CONFIG_RUST_DEBUG_ASSERTIONS`, but its argument (a name
        // checked as UTF-8) would be computed on every attach: 0.6 us of an 8 us 4 KiB import
        // under TCG (docs/bench.md, "Where the time goes").
        if cfg!(debug_assertions) {
            dev_dbg!(
                &*this.provider.pdev,
                "buffer {}: {} attached\n",
                this.id,
                dev.name().to_str().unwrap_or("?")
            );
        }
        Ok(AttachInfo {
            last_map: LastMap::new(),
        })
    }

    /// One scatter-gather entry per physically contiguous range: the buffer is one range, split
    /// only where `sg_dma_len` cannot describe it.
    fn map<'a>(
        this: &Self,
        attach: &'a Attachment,
        info: &AttachInfo,
        held: &'a ResvHeld<'a>,
        dir: DataDirection,
    ) -> Result<ExportedSgt<'a>> {
        let mem = this.mem.lock();
        let mem = mem.as_ref().ok_or(ENODEV)?;
        let range = [PhysRange::new(mem.phys_addr(), mem.size())];
        // SAFETY: The range is the buffer's own allocation, from `mem.provider()`; it is only
        // given back in `revoke` and `release`, which the abstraction calls after every unmap.
        let sgt =
            unsafe { ExportedSgt::from_phys_ranges(attach, held, mem.provider(), &range, dir)? };
        info.last_map.set(SgShape::of(&sgt));
        Ok(sgt)
    }

    fn begin_cpu_access(this: &Self, _dir: DataDirection) -> Result {
        // Device memory is mapped uncached: nothing to flush or invalidate; only counted.
        this.cpu_access[0].add(1, Relaxed);
        Ok(())
    }

    fn end_cpu_access(this: &Self, _dir: DataDirection) -> Result {
        this.cpu_access[1].add(1, Relaxed);
        Ok(())
    }

    /// Sets up a shared mapping of the buffer: of its pages (p2pdma pages, with `struct page`, so
    /// that `O_DIRECT` I/O into the mapping is a peer-to-peer transfer), or of its page frames
    /// for a buffer allocated with `P2PBUF_ALLOC_PFNMAP` (see [`CpuMapping`]). Nothing is mapped
    /// here: [`Exporter::fault`] inserts each page on first access.
    fn mmap(this: &Self, vma: &MmapVma<'_>) -> Result {
        if vma.flags() & vm_flags::SHARED == 0 {
            return Err(EINVAL);
        }
        let pages = (vma.end() - vma.start()) / PAGE_SIZE;
        if vma
            .pgoff()
            .checked_add(pages)
            .is_none_or(|end| end * PAGE_SIZE > this.size)
        {
            return Err(EINVAL);
        }
        if !this.holds_memory() {
            return Err(ENODEV);
        }
        match this.mapping {
            CpuMapping::Pages => vma.set_mixedmap(),
            CpuMapping::Pfn => vma.set_pfnmap()?,
        }
        Ok(())
    }

    /// Inserts the page at `vmf.pgoff()`; the abstraction calls this only while the buffer is
    /// not revoked, under the lock that revoke zaps with.
    fn fault(this: &Self, vmf: &VmFault) -> Result {
        let mem = this.mem.lock();
        let mem = mem.as_ref().ok_or(ENODEV)?;
        let index = vmf.pgoff();
        match this.mapping {
            CpuMapping::Pages => {
                let page = mem.page(index).ok_or(EINVAL)?;
                let vma = vmf.vma().as_mixedmap_vma().ok_or(EINVAL)?;
                vma.vm_insert_page(vmf.address(), &page)?;
            }
            CpuMapping::Pfn => {
                if index >= mem.page_count() {
                    return Err(EINVAL);
                }
                let vma = vmf.vma().as_pfnmap_vma().ok_or(EINVAL)?;
                let pfn = usize::try_from(mem.phys_addr() >> PAGE_SHIFT)? + index;
                // SAFETY: `pfn` is a page of `mem`, device memory of a bound provider that the
                // buffer holds until `revoke` or `release` takes it. The abstraction zaps every
                // mapping of the buffer before it calls `revoke`, and `release` comes only after
                // the last mapping (which holds the file) is gone.
                unsafe { vma.vmf_insert_pfn(vmf.address(), pfn) }?;
            }
        }
        this.inserted.add(1, Relaxed);
        Ok(())
    }

    fn vmap(this: &Self, _held: &ResvHeld<'_>) -> Result<IoSysMap> {
        let mem = this.mem.lock();
        Ok(IoSysMap::iomem(mem.as_ref().ok_or(ENODEV)?.as_ptr().cast()))
    }

    /// Called once every importer has unmapped and every mapping was zapped: waits (bounded)
    /// for I/O that pinned pages through a mapping, then the memory goes back to the provider.
    fn revoke(this: &Self) {
        if let Some(mem) = this.take_memory() {
            // Page frames cannot be pinned: the abstraction's zap took them away.
            if this.mapping == CpuMapping::Pages && this.inserted.load(Relaxed) != 0 {
                this.wait_unpinned(&mem);
            }
            drop(mem);
        }
        dev_dbg!(&*this.provider.pdev, "buffer {} revoked\n", this.id);
    }

    /// The last file reference is gone: the memory goes back to the provider now, and the
    /// provider forgets the buffer, so that its free count is exact at every moment.
    fn release(this: &Self) {
        drop(this.take_memory());
        this.provider.forget(this.id);
    }
}
