// SPDX-License-Identifier: GPL-2.0

//! p2pbuf exporter: PCI device memory exported as p2pdma-aware dma-buf.
//!
//! What out-of-tree peer-memory hooks (`nvidia_p2p_get_pages`, peer-memory clients) did, done
//! with mainline mechanisms: a PCI driver registers a device's BAR (by default the lab's
//! emulated GPU memory, ivshmem BAR2) as p2pdma memory, and `/dev/p2pbuf` hands out buffers of
//! it as dma-buf file descriptors. Importers attach with their own device; the dma-buf core
//! decides whether it can reach the memory (`dma_buf_phys_vec_check()`, asked at attach) and how
//! to map it (bus addresses through a switch, or the DMA API/IOMMU through the host bridge, in
//! `dma_buf_phys_vec_to_sgt()`). Unbinding the device revokes
//! every buffer: importers are told and unmap, CPU mappings are zapped, and the memory goes back
//! once its last user is gone.
//!
//! Layout: [`uapi`] (ioctl structs), [`provider`] (the PCI driver and a BAR's bookkeeping),
//! [`buffer`] (the dma-buf exporter callbacks), [`debugfs`] (state for humans and tests),
//! [`ratelimit`] (log messages that users can cause).

use kernel::{
    dma_buf::{export::Exported, DmaBuf},
    driver,
    fs::{file::FileDescriptorReservation, File},
    miscdevice::{MiscDevice, MiscDeviceOptions, MiscDeviceRegistration},
    pci,
    prelude::*,
    sync::Arc,
};

mod buffer;
mod debugfs;
mod provider;
mod ratelimit;
mod uapi;

use buffer::CpuMapping;
use provider::Provider;

module! {
    type: P2pbufExporter,
    name: "p2pbuf_exporter",
    authors: ["p2pbuf developers"],
    description: "Exports PCI device memory as p2pdma-aware dma-buf",
    license: "GPL",
    imports_ns: ["DMA_BUF"],
    params: {
        bar: u32 {
            default: 2,
            description: "BAR of a bound device to register as p2pdma memory (ivshmem: 2)",
        },
    },
}

kernel::sync::global_lock! {
    // SAFETY: Initialised in the module initialiser, before the driver and the misc device are
    // registered (their callbacks are the only users).
    pub(crate) unsafe(uninit) static PROVIDERS: Mutex<Registry> = Registry::new();
}

/// The providers, each under the id it got when its device was bound.
///
/// Ids start at 1, only grow, and are never reused while the module is loaded: an id that
/// userspace kept names the same device or none (`ENODEV`), never the next device bound.
pub(crate) struct Registry {
    /// Bound providers (and ones being unbound), in id order.
    entries: KVec<(u32, Arc<Provider>)>,
    /// The id the next provider gets.
    next_id: u32,
}

/// What an id names.
pub(crate) enum Lookup {
    /// A bound provider (or one in the middle of its unbind).
    Bound(Arc<Provider>),
    /// A provider whose device was unbound: the id is stale.
    Gone,
}

impl Registry {
    const fn new() -> Self {
        Self {
            entries: KVec::new(),
            next_id: 1,
        }
    }

    /// Adds a provider under a new id.
    pub(crate) fn push(&mut self, p: Arc<Provider>, flags: kernel::alloc::Flags) -> Result<u32> {
        let id = self.next_id;
        let next = id.checked_add(1).ok_or(EOVERFLOW)?;
        self.entries.push((id, p), flags)?;
        self.next_id = next;
        Ok(id)
    }

    /// Keeps the providers for which `keep` says so.
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&Arc<Provider>) -> bool) {
        self.entries.retain(|(_, p)| keep(p));
    }

    /// The providers with their ids, in id order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u32, &Arc<Provider>)> {
        self.entries.iter().map(|(id, p)| (*id, p))
    }

    /// Number of providers.
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// The provider `id`: `ENOENT` for an id never given out.
    pub(crate) fn get(&self, id: u32) -> Result<Lookup> {
        if let Some((_, p)) = self.entries.iter().find(|(i, _)| *i == id) {
            return Ok(Lookup::Bound(p.clone()));
        }
        if id == 0 || id >= self.next_id {
            return Err(ENOENT);
        }
        Ok(Lookup::Gone)
    }

    /// The first provider with an id of `id` or more.
    pub(crate) fn next_from(&self, id: u32) -> Option<(u32, Arc<Provider>)> {
        self.entries
            .iter()
            .find(|(i, _)| *i >= id)
            .map(|(i, p)| (*i, p.clone()))
    }

    /// A copy of the provider list with the ids (so that no lock is held while revoking).
    pub(crate) fn clone_ids(&self) -> Result<KVec<(u32, Arc<Provider>)>> {
        let mut v = KVec::with_capacity(self.entries.len(), GFP_KERNEL)?;
        for (id, p) in self.entries.iter() {
            v.push((*id, p.clone()), GFP_KERNEL)?;
        }
        Ok(v)
    }
}

/// The module: the misc device and the PCI driver.
#[pin_data]
struct P2pbufExporter {
    #[pin]
    _misc: MiscDeviceRegistration<P2pbufFile>,
    #[pin]
    _pci: driver::Registration<pci::Adapter<provider::Driver>>,
    _debugfs: debugfs::Files,
    /// Last: frees the provider list once the driver (which empties it) is unregistered.
    _registry: RegistryCleanup,
}

/// Frees the storage of [`PROVIDERS`] on module unload: statics are never dropped.
struct RegistryCleanup;

impl Drop for RegistryCleanup {
    fn drop(&mut self) {
        *PROVIDERS.lock() = Registry::new();
    }
}

impl kernel::InPlaceModule for P2pbufExporter {
    fn init(module: &'static ThisModule) -> impl PinInit<Self, Error> {
        // SAFETY: Called exactly once, before anything can use `PROVIDERS`.
        unsafe { PROVIDERS.init() };
        try_pin_init!(Self {
            _misc <- MiscDeviceRegistration::register(MiscDeviceOptions { name: c"p2pbuf" }),
            _pci <- driver::Registration::new(c"p2pbuf_exporter", module),
            _debugfs: debugfs::Files::new(),
            _registry: RegistryCleanup,
        })
    }
}

/// The bound provider `id`: `ENODEV` when its device was unbound, `ENOENT` for an id never
/// given out.
fn provider(id: u32) -> Result<Arc<Provider>> {
    match PROVIDERS.lock().get(id)? {
        Lookup::Bound(p) => Ok(p),
        Lookup::Gone => Err(ENODEV),
    }
}

/// The buffer behind dma-buf fd `fd`: `EBADF` if it is no open fd, `EINVAL` if it is not a
/// buffer of a bound provider. Returns the buffer and its provider's id.
fn buffer(fd: i32) -> Result<(Exported<buffer::Buffer>, u32)> {
    let dmabuf = DmaBuf::get(fd)?;
    find_buffer(&dmabuf)?.ok_or(EINVAL)
}

/// The buffer `dmabuf` is, if a bound provider lists it, with its provider's id.
fn find_buffer(dmabuf: &DmaBuf) -> Result<Option<(Exported<buffer::Buffer>, u32)>> {
    let providers = PROVIDERS.lock().clone_ids()?;
    Ok(providers
        .iter()
        .find_map(|(id, p)| p.find(dmabuf).map(|b| (b, *id))))
}

/// Whether this module exported `dmabuf` ([`Provider::alloc`] is its only exporter): its owner
/// is this module and its exporter name ours.
fn exported_here(dmabuf: &DmaBuf) -> bool {
    let module = kernel::module::this_module::<crate::LocalModule>();
    // SAFETY: `dmabuf` is a valid buffer while we hold our reference on it, and `owner` is set
    // by `dma_buf_export()` and never written again.
    let owner = unsafe { (*dmabuf.as_raw()).owner };
    core::ptr::eq(owner, module.as_ptr())
        && dmabuf.exporter_name().to_bytes() == provider::EXPORTER_NAME.to_bytes()
}

/// An open `/dev/p2pbuf`.
struct P2pbufFile;

#[vtable]
impl MiscDevice for P2pbufFile {
    type Ptr = KBox<Self>;

    fn open(_file: &File, _misc: &MiscDeviceRegistration<Self>) -> Result<KBox<Self>> {
        Ok(KBox::new(P2pbufFile, GFP_KERNEL)?)
    }

    fn ioctl(_this: &Self, _file: &File, cmd: u32, arg: usize) -> Result<isize> {
        match cmd {
            uapi::P2PBUF_IOCTL_INFO => info(arg),
            uapi::P2PBUF_IOCTL_PROVIDER_INFO => provider_info(arg),
            uapi::P2PBUF_IOCTL_ALLOC => alloc(arg),
            uapi::P2PBUF_IOCTL_REVOKE => revoke(arg),
            uapi::P2PBUF_IOCTL_REFUSAL => refusal(arg),
            uapi::P2PBUF_IOCTL_ATTACHMENT => attachment(arg),
            _ => Err(ENOTTY),
        }
        .map(|()| 0)
    }
}

fn info(arg: usize) -> Result {
    let (mut a, size) = uapi::read_arg::<uapi::p2pbuf_info>(arg)?;
    if a.flags != 0 {
        return Err(EINVAL);
    }
    a.api_version = uapi::P2PBUF_API_VERSION;
    a.nr_providers = u32::try_from(PROVIDERS.lock().len())?;
    uapi::write_arg(arg, size, &a)
}

fn provider_info(arg: usize) -> Result {
    let (a, size) = uapi::read_arg::<uapi::p2pbuf_provider_info>(arg)?;
    if a.flags & !uapi::P2PBUF_PROVIDER_INFO_NEXT != 0 || a.reserved != 0 {
        return Err(EINVAL);
    }
    // Only the id and the flags are input: the rest is answered afresh.
    let mut out = uapi::p2pbuf_provider_info {
        id: a.id,
        flags: a.flags,
        ..Default::default()
    };
    if a.flags & uapi::P2PBUF_PROVIDER_INFO_NEXT != 0 {
        let (id, p) = PROVIDERS.lock().next_from(a.id).ok_or(ENOENT)?;
        out.id = id;
        p.info(&mut out);
    } else {
        let found = PROVIDERS.lock().get(a.id)?;
        match found {
            Lookup::Bound(p) => p.info(&mut out),
            // Unbound: the id stays answerable, so that a stale id is told apart from a wrong one.
            Lookup::Gone => out.state = uapi::P2PBUF_PROVIDER_GONE,
        }
    }
    out.size = a.size;
    uapi::write_arg(arg, size, &out)
}

fn alloc(arg: usize) -> Result {
    let (mut a, size) = uapi::read_arg::<uapi::p2pbuf_alloc>(arg)?;
    if a.flags & !(uapi::P2PBUF_ALLOC_UNINITIALIZED | uapi::P2PBUF_ALLOC_PFNMAP) != 0 {
        return Err(EINVAL);
    }
    let zero = a.flags & uapi::P2PBUF_ALLOC_UNINITIALIZED == 0;
    let mapping = if a.flags & uapi::P2PBUF_ALLOC_PFNMAP != 0 {
        CpuMapping::Pfn
    } else {
        CpuMapping::Pages
    };
    // SAFETY: `capable()` only reads the current task's credentials.
    if !zero && !unsafe { kernel::bindings::capable(kernel::bindings::CAP_SYS_RAWIO as i32) } {
        // Stale device memory is what /dev/mem would show: the same capability.
        return Err(EPERM);
    }
    let p = provider(a.provider)?;
    let module = kernel::module::this_module::<crate::LocalModule>();
    let (dmabuf, offset) = p.alloc(module, a.length, zero, mapping)?;
    // Install the fd only once nothing can fail any more: on error the reservation and the
    // buffer are dropped, and the memory goes back.
    let fd = FileDescriptorReservation::get_unused_fd_flags(kernel::fs::file::flags::O_CLOEXEC)?;
    a.fd = i32::try_from(fd.reserved_fd())?;
    a.offset = offset;
    uapi::write_arg(arg, size, &a)?;
    fd.fd_install(DmaBuf::into_file(dmabuf));
    Ok(())
}

fn revoke(arg: usize) -> Result {
    let (a, _) = uapi::read_arg::<uapi::p2pbuf_revoke>(arg)?;
    if a.flags != 0 {
        return Err(EINVAL);
    }
    let dmabuf = DmaBuf::get(a.fd)?;
    match find_buffer(&dmabuf)? {
        // No lock is held while revoking.
        Some((buf, _)) => buf.revoke(),
        // Ours, but no bound provider lists it: its provider was unbound, and the unbind
        // revoked it (`Provider::shutdown` unlists a buffer only once its revoke has returned,
        // and every other buffer leaves the list only when its file is gone). Revoking a
        // revoked buffer succeeds and does nothing.
        None if exported_here(&dmabuf) => {}
        None => return Err(EINVAL),
    }
    Ok(())
}

fn refusal(arg: usize) -> Result {
    let (a, size) = uapi::read_arg::<uapi::p2pbuf_refusal>(arg)?;
    if a.flags != 0 || a.reserved != 0 {
        return Err(EINVAL);
    }
    let (buf, provider) = buffer(a.fd)?;
    let mut out = uapi::p2pbuf_refusal {
        size: a.size,
        fd: a.fd,
        provider,
        ..Default::default()
    };
    {
        let r = buf.refusals.lock();
        out.nr_refused = r.count;
        if let Some((dev, code, why)) = &r.last {
            out.reason = *code;
            uapi::copy_cstr(&mut out.device, dev.to_bytes());
            uapi::copy_cstr(&mut out.text, why.to_bytes());
        }
    }
    uapi::write_arg(arg, size, &out)
}

/// `P2PBUF_IOCTL_ATTACHMENT`: the exporter's decision for one importing device of a buffer.
fn attachment(arg: usize) -> Result {
    let (a, size) = uapi::read_arg::<uapi::p2pbuf_attachment>(arg)?;
    if a.flags != 0 || a.reserved != 0 {
        return Err(EINVAL);
    }
    let (buf, _) = buffer(a.fd)?;
    let mut out = uapi::p2pbuf_attachment {
        size: a.size,
        fd: a.fd,
        index: a.index,
        ..Default::default()
    };
    // Attachments are numbered in the order they were made.
    let want = usize::try_from(a.index).ok();
    let (mut i, mut found) = (0, false);
    let count = buf.for_each_attachment(|att, _info| {
        if want == Some(i) {
            found = true;
            uapi::copy_cstr(&mut out.device, att.device().name().to_bytes());
        }
        i += 1;
    })?;
    out.nr_attachments = u32::try_from(count).unwrap_or(u32::MAX);
    // The count is written back with `ENOENT` too: that is how a caller learns it.
    uapi::write_arg(arg, size, &out)?;
    if found {
        Ok(())
    } else {
        Err(ENOENT)
    }
}
