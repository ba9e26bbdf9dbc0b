// SPDX-License-Identifier: GPL-2.0

//! A provider: one PCI device's BAR registered as p2pdma memory, its buffers, and the PCI
//! driver that creates providers on probe and revokes their buffers on unbind.

use crate::{
    buffer::{Buffer, Charged, CpuMapping},
    ratelimit::dev_ratelimited,
    uapi, PROVIDERS,
};
use kernel::{
    bindings,
    cgroup::dmem::{Charge, Region},
    device,
    device::Core,
    dma_buf::{export::Exported, DmaBuf},
    new_mutex, pci,
    pci::p2pdma::DevresP2pPool,
    prelude::*,
    str::CString,
    sync::{aref::ARef, Arc, Mutex},
};

/// One exported buffer as the provider tracks it.
pub(crate) struct Entry {
    /// Identity of the buffer's `struct dma_buf` (never dereferenced): how an fd is matched
    /// to its buffer. Only compared while the buffer is alive, so a reused address cannot
    /// match a dead entry.
    key: usize,
    pub(crate) buf: Exported<Buffer>,
}

/// The mutable part of a provider.
pub(crate) struct State {
    /// Set in unbind, under the lock: from then on nothing is allocated (an allocation that
    /// raced the unbind is revoked before it is handed out).
    pub(crate) gone: bool,
    /// The BAR as a dmem cgroup region (`p2pbuf/<PCI address>/bar<N>` in `dmem.capacity`):
    /// every buffer is charged to the allocating process's cgroup. Taken and unregistered in
    /// unbind. Under this mutex, not behind a `Devres`: charging may sleep, and a `Devres` is
    /// reached under an RCU read lock.
    region: Option<Region>,
    pub(crate) buffers: KVec<Entry>,
    next_id: u64,
    /// The latest refusals (importer device, reason), newest last, at most `MAX_REFUSALS`.
    pub(crate) refusals: KVec<(CString, &'static CStr)>,
}

const MAX_REFUSALS: usize = 16;

/// The exporter name of every buffer (`exp_name`, shown in debugfs and fdinfo).
pub(crate) const EXPORTER_NAME: &CStr = c"p2pbuf";

/// A PCI BAR registered as p2pdma memory.
///
/// # Locks
///
/// `PROVIDERS` -> `state` -> a buffer's locks (`Buffer::mem`, the abstraction's `buf`);
/// `state` -> the dmem controller's own locks (charging, which may sleep, is done under `state`).
/// Revoking (which sleeps) happens with none of them held.
#[pin_data]
pub(crate) struct Provider {
    pub(crate) pdev: ARef<pci::Device>,
    /// The device's p2pmem pool; unreachable once the device unbinds.
    pool: DevresP2pPool,
    pub(crate) bar: u32,
    pub(crate) bar_start: u64,
    pub(crate) bar_size: u64,
    #[pin]
    pub(crate) state: Mutex<State>,
}

impl Provider {
    /// The PCI name of the device, e.g. `0000:03:00.0`.
    pub(crate) fn name(&self) -> &CStr {
        self.pdev.as_ref().name()
    }

    /// The PCI name as text, for messages.
    pub(crate) fn name_str(&self) -> &str {
        self.name().to_str().unwrap_or("?")
    }

    /// Offset into the BAR of the CPU physical address `phys`.
    pub(crate) fn bar_offset(&self, phys: bindings::phys_addr_t) -> u64 {
        phys.wrapping_sub(self.bar_start)
    }

    /// Records that `dev` was refused, for debugfs, and says so in the debug log.
    pub(crate) fn refuse(&self, dev: &device::Device, why: &'static CStr) {
        let dev_name = dev.name().to_str().unwrap_or("?");
        // Importers attach on behalf of whoever holds the buffer's fd: rate limited.
        dev_ratelimited!(
            dev_dbg,
            &*self.pdev,
            "refusing {}: {}\n",
            dev_name,
            why.to_str().unwrap_or("?")
        );
        let Ok(name) = CString::try_from_fmt(fmt!("{}", dev_name)) else {
            return;
        };
        let mut state = self.state.lock();
        if state.refusals.len() >= MAX_REFUSALS {
            state.refusals.remove(0).ok();
        }
        let _ = state.refusals.push((name, why), GFP_KERNEL);
    }

    /// Bytes held by live, unrevoked buffers.
    fn used(state: &State) -> u64 {
        state
            .buffers
            .iter()
            .filter(|e| e.buf.is_alive() && e.buf.holds_memory())
            .map(|e| e.buf.size as u64)
            .sum()
    }

    /// Forgets buffers whose last file reference is gone (their memory goes with them).
    fn prune(state: &mut State) {
        state.buffers.retain(|e| e.buf.is_alive());
    }

    /// Fills the uAPI description of this provider (all but its id, which the registry has).
    pub(crate) fn info(&self, out: &mut uapi::p2pbuf_provider_info) {
        let mut state = self.state.lock();
        Self::prune(&mut state);
        out.bar = self.bar;
        out.bar_size = self.bar_size;
        out.total = self.bar_size;
        out.free = if state.gone {
            0
        } else {
            self.bar_size - Self::used(&state)
        };
        out.state = if state.gone {
            uapi::P2PBUF_PROVIDER_GONE
        } else {
            uapi::P2PBUF_PROVIDER_PUBLISHED
        };
        let name = self.name().to_bytes();
        let n = name.len().min(out.pci_name.len() - 1);
        out.pci_name[..n].copy_from_slice(&name[..n]);
    }

    /// Allocates `length` bytes, zeroed unless `zero` is false, and exports them as a dma-buf
    /// whose userspace mappings are made as `mapping` says.
    pub(crate) fn alloc(
        self: &Arc<Self>,
        module: &'static ThisModule,
        length: u64,
        zero: bool,
        mapping: CpuMapping,
    ) -> Result<(ARef<DmaBuf>, u64)> {
        if length == 0 || length % kernel::page::PAGE_SIZE as u64 != 0 {
            return Err(EINVAL);
        }
        if length > self.bar_size {
            // Any holder of a `/dev/p2pbuf` fd can ask again and again: rate limited.
            dev_ratelimited!(
                dev_info,
                &*self.pdev,
                "p2pbuf: cannot allocate {} bytes from BAR{} of {} bytes ({} MiB): ask for at most the BAR's size (PROVIDER_INFO), or give the device a larger BAR (lab: cargo xtask --gpu-mem-mib)\n",
                length,
                self.bar,
                self.bar_size,
                self.bar_size >> 20
            );
            return Err(EINVAL);
        }
        // Charged to the caller's cgroup before anything is allocated, as TTM does, and given
        // back if anything below fails (the charge is dropped).
        let charge = self.charge(length)?;
        let length = usize::try_from(length)?;
        let (mem, id) = {
            let mut state = self.state.lock();
            if state.gone {
                return Err(ENODEV);
            }
            Self::prune(&mut state);
            // Under the pool's access guard (an RCU read lock) only the allocation itself.
            let mem = self.pool.try_access().ok_or(ENODEV)?.alloc(length)?;
            state.next_id += 1;
            (mem, state.next_id)
        };
        // Setting up the pages goes through every page, 64 Mi of them for a 256 GiB buffer: with
        // no lock held, rescheduling on the way (the allocation keeps the pool alive).
        let mem = mem.into_pages()?;
        // Hand out no stale data: zero the memory (MMIO: with I/O accessors), unless a caller
        // allowed to read the BAR anyway asked for it as it is. A GPU-sized buffer takes
        // minutes at uncached speed: the clear reschedules, and stops for a signal (a killed
        // process is gone at once; the half-cleared memory goes back with `mem`).
        if zero {
            mem.zero_interruptible()?;
        }
        let (buf, dmabuf) = Exported::new(
            module,
            EXPORTER_NAME,
            length,
            kernel::fs::file::flags::O_RDWR,
            Buffer::new(self.clone(), id, Charged::new(mem, charge), mapping),
        )?;
        let offset = buf.offset;
        let key = dmabuf.as_raw() as usize;
        let mut state = self.state.lock();
        if state.gone {
            // Unbound while we were zeroing: this buffer was never seen by unbind.
            drop(state);
            buf.revoke();
            return Err(ENODEV);
        }
        state.buffers.push(Entry { key, buf }, GFP_KERNEL)?;
        Ok((dmabuf, offset))
    }

    /// Charges `length` bytes of the BAR to the current process's dmem cgroup.
    ///
    /// Over the `dmem.max` of its cgroup (or of an ancestor) for this BAR: `ENOSPC`, the errno
    /// TTM gives when it cannot evict (p2pbuf never evicts), and a debug-level line that says
    /// which region and how much.
    fn charge(&self, length: u64) -> Result<Charge> {
        let state = self.state.lock();
        let charged = state.region.as_ref().ok_or(ENODEV)?.try_charge(length);
        drop(state);
        charged.map_err(|e| {
            if e != EAGAIN {
                return e;
            }
            // Any process can ask again and again: rate limited.
            dev_ratelimited!(
                dev_dbg,
                &*self.pdev,
                "p2pbuf: {} bytes refused: the dmem cgroup of pid {} (or an ancestor) is at its dmem.max for region p2pbuf/{}/bar{}\n",
                length,
                kernel::current!().pid(),
                self.name_str(),
                self.bar
            );
            ENOSPC
        })
    }

    /// Forgets buffer `id` (its file was released). Dropping the entry may drop the last
    /// handle on the buffer's data; the caller (the buffer's `release`) still holds its own.
    pub(crate) fn forget(&self, id: u64) {
        let gone = {
            let mut state = self.state.lock();
            let Some(i) = state.buffers.iter().position(|e| e.buf.id == id) else {
                return;
            };
            state.buffers.remove(i)
        };
        // Dropped outside the lock.
        drop(gone);
    }

    /// Handles on the buffers the provider tracks, for readers that must not hold the
    /// provider's lock while they look at them (debugfs).
    pub(crate) fn buffer_handles(&self) -> Result<KVec<Exported<Buffer>>> {
        let state = self.state.lock();
        let mut v = KVec::with_capacity(state.buffers.len(), GFP_KERNEL)?;
        for e in state.buffers.iter() {
            v.push(e.buf.clone(), GFP_KERNEL)?;
        }
        Ok(v)
    }

    /// The buffer behind `dmabuf`, if it is one of ours.
    pub(crate) fn find(&self, dmabuf: &DmaBuf) -> Option<Exported<Buffer>> {
        let key = dmabuf.as_raw() as usize;
        let state = self.state.lock();
        state
            .buffers
            .iter()
            .find(|e| e.key == key && e.buf.is_alive())
            .map(|e| e.buf.clone())
    }

    /// Unbind: refuse new allocations, revoke every buffer (importers unmap, CPU mappings are
    /// zapped, memory goes back), and forget each once it is revoked.
    ///
    /// A buffer stays listed until its revoke has returned: a `REVOKE` of it meanwhile finds it
    /// and waits for that revoke (a second revoker waits for the first), and one that no longer
    /// finds it may answer that the unbind revoked it (see `revoke()` of the ioctls).
    fn shutdown(&self) {
        let region = {
            let mut state = self.state.lock();
            state.gone = true;
            state.region.take()
        };
        // Unregistering waits for the controller's readers: outside the lock. Buffers that
        // live on keep their charges until their memory goes.
        drop(region);
        // Nothing is added to the list once `gone` is set, and every turn takes the first entry
        // off it (here, or in `forget` when its file went meanwhile): the loop ends.
        let mut n = 0usize;
        loop {
            let buf = match self.state.lock().buffers.first() {
                Some(e) => e.buf.clone(),
                None => break,
            };
            buf.revoke();
            n += 1;
            let entry = {
                let mut state = self.state.lock();
                let i = state.buffers.iter().position(|e| e.buf.id == buf.id);
                i.and_then(|i| state.buffers.remove(i).ok())
            };
            // Dropped outside the lock, as in `forget`.
            drop(entry);
        }
        dev_info!(&*self.pdev, "unbound: {} buffer(s) revoked\n", n);
    }
}

kernel::pci_device_table!(
    PCI_TABLE,
    <Driver as pci::Driver>::IdInfo,
    [(
        // ivshmem-plain: the emulated GPU memory of the lab (its BAR2).
        pci::DeviceId::from_id(pci::Vendor::REDHAT_QUMRANET, 0x1110),
        ()
    )]
);

/// The PCI driver: one provider per bound device.
pub(crate) struct Driver;

/// Per-device driver data.
pub(crate) struct DriverData {
    provider: Arc<Provider>,
}

impl pci::Driver for Driver {
    type IdInfo = ();
    type Data<'bound> = DriverData;

    const ID_TABLE: pci::IdTable<Self::IdInfo> = &PCI_TABLE;

    fn probe<'bound>(
        pdev: &'bound pci::Device<Core<'_>>,
        _info: Option<&'bound Self::IdInfo>,
    ) -> impl PinInit<Self::Data<'bound>, Error> + 'bound {
        let bar = crate::module_parameters::bar.value();
        pdev.enable_device_mem()?;
        let bar_start = pdev.resource_start(bar)?;
        let bar_size = pdev.resource_len(bar)?;
        if bar_size == 0 {
            dev_err!(pdev, "BAR{} is empty\n", bar);
            return Err(ENODEV);
        }
        pdev.p2pdma_add_resource(bar, 0, 0)?;
        pdev.p2pmem_publish(true);
        let pool = pdev.p2pmem_pool()?;
        let region = Region::new(bar_size, fmt!("p2pbuf/{}/bar{}", pdev.as_ref().name(), bar))?;
        let generic: &pci::Device = pdev;
        let provider = Arc::pin_init(
            try_pin_init!(Provider {
                pdev: generic.into(),
                pool,
                bar,
                bar_start,
                bar_size,
                state <- new_mutex!(State {
                    gone: false,
                    region: Some(region),
                    buffers: KVec::new(),
                    next_id: 0,
                    refusals: KVec::new(),
                }),
            }),
            GFP_KERNEL,
        )?;
        PROVIDERS.lock().push(provider.clone(), GFP_KERNEL)?;
        dev_info!(
            pdev,
            "p2pbuf: BAR{} ({} MiB) registered as p2pdma memory and published\n",
            bar,
            bar_size >> 20
        );
        Ok(DriverData { provider })
    }

    fn unbind<'bound>(_pdev: &'bound pci::Device<Core<'_>>, this: Pin<&Self::Data<'bound>>) {
        this.provider.shutdown();
        PROVIDERS
            .lock()
            .retain(|p| !core::ptr::eq::<Provider>(&**p, &*this.provider));
    }
}
