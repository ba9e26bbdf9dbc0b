// SPDX-License-Identifier: GPL-2.0

//! p2pbuf exporter: PCI device memory exported as p2pdma-aware dma-buf.
//!
//! What out-of-tree peer-memory hooks (`nvidia_p2p_get_pages`, peer-memory clients) did, done
//! with mainline mechanisms: a PCI driver registers a device's BAR (by default the lab's
//! emulated GPU memory, ivshmem BAR2) as p2pdma memory, and `/dev/p2pbuf` hands out buffers of
//! it as dma-buf file descriptors. Importers attach with their own device; the p2pdma map type
//! between provider and importer decides whether and how the memory is mapped (bus addresses
//! through a switch, or the DMA API/IOMMU through the host bridge). Unbinding the device revokes
//! every buffer: importers are told and unmap, CPU mappings are zapped, and the memory goes back
//! once its last user is gone.
//!
//! Layout: [`uapi`] (ioctl structs), [`provider`] (the PCI driver and a BAR's bookkeeping),
//! [`buffer`] (the dma-buf exporter callbacks), [`debugfs`] (state for humans and tests).

use kernel::{
    dma_buf::DmaBuf,
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
mod uapi;
mod uapi_arg;

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
    pub(crate) unsafe(uninit) static PROVIDERS: Mutex<KVec<Arc<Provider>>> = KVec::new();
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
        *PROVIDERS.lock() = KVec::new();
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

/// The provider with index `index`, in registration order.
fn provider(index: u32) -> Result<Arc<Provider>> {
    PROVIDERS
        .lock()
        .get(usize::try_from(index)?)
        .cloned()
        .ok_or(ENOENT)
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
            uapi::IOCTL_INFO => info(arg),
            uapi::IOCTL_PROVIDER_INFO => provider_info(arg),
            uapi::IOCTL_ALLOC => alloc(arg),
            uapi::IOCTL_REVOKE => revoke(arg),
            _ => Err(ENOTTY),
        }
        .map(|()| 0)
    }
}

fn info(arg: usize) -> Result {
    let (mut a, size) = uapi::read_arg::<uapi::Info>(arg)?;
    if a.flags != 0 {
        return Err(EINVAL);
    }
    a.api_version = uapi::API_VERSION;
    a.nr_providers = u32::try_from(PROVIDERS.lock().len())?;
    uapi::write_arg(arg, size, &a)
}

fn provider_info(arg: usize) -> Result {
    let (mut a, size) = uapi::read_arg::<uapi::ProviderInfo>(arg)?;
    provider(a.index)?.info(&mut a);
    uapi::write_arg(arg, size, &a)
}

fn alloc(arg: usize) -> Result {
    let (mut a, size) = uapi::read_arg::<uapi::Alloc>(arg)?;
    if a.flags & !uapi::ALLOC_UNINITIALIZED != 0 {
        return Err(EINVAL);
    }
    let zero = a.flags & uapi::ALLOC_UNINITIALIZED == 0;
    // SAFETY: `capable()` only reads the current task's credentials.
    if !zero && !unsafe { kernel::bindings::capable(kernel::bindings::CAP_SYS_RAWIO as i32) } {
        // Stale device memory is what /dev/mem would show: the same capability.
        return Err(EPERM);
    }
    let p = provider(a.provider)?;
    let module = kernel::module::this_module::<crate::LocalModule>();
    let (dmabuf, offset) = p.alloc(module, a.length, zero)?;
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
    let (a, _) = uapi::read_arg::<uapi::Revoke>(arg)?;
    if a.flags != 0 {
        return Err(EINVAL);
    }
    let dmabuf = DmaBuf::get(a.fd)?;
    let providers = PROVIDERS.lock().clone_all()?;
    let buf = providers.iter().find_map(|p| p.find(&dmabuf)).ok_or(EINVAL)?;
    drop(providers);
    buf.revoke();
    Ok(())
}

/// Cloning a list of providers (so that no lock is held while revoking).
trait CloneAll: Sized {
    fn clone_all(&self) -> Result<Self>;
}

impl CloneAll for KVec<Arc<Provider>> {
    fn clone_all(&self) -> Result<Self> {
        let mut v = KVec::with_capacity(self.len(), GFP_KERNEL)?;
        for p in self.iter() {
            v.push(p.clone(), GFP_KERNEL)?;
        }
        Ok(v)
    }
}
