// SPDX-License-Identifier: GPL-2.0

//! p2pbuf-dma: a PCI DMA engine that imports dma-buf fds and copies between them.
//!
//! What FPGA drivers did with `nvidia_p2p_get_pages()` and `nvidia_p2p_dma_map_pages()`, done
//! with dma-buf: the engine (in the lab, QEMU's `edu` device standing in for an FPGA) attaches
//! to any dma-buf as a dynamic, peer-to-peer capable importer, and copies between buffers with
//! its DMA channel: device memory exported by `p2pbuf_exporter` (peer to peer, through a switch
//! or the host bridge), system memory (udmabuf), or one of each. Exporters may move or revoke
//! a buffer at any time; the engine never transfers to an address that is no longer mapped.
//!
//! Userspace uses the root-only misc device `/dev/p2pbuf-dma` (ioctls in
//! `include/uapi/linux/p2pbuf-dma.h`): IMPORT an fd to get a handle, COPY between
//! handles, RELEASE a handle (or close the file).
//!
//! Layout: [`driver`] (the PCI driver), [`edu`] (the device's registers and transfers),
//! [`engine`] (handles, copies, unbind), [`import`] (attachments and map types), [`copy`] (the
//! chunked copy), [`uapi`] (ioctl structs).

use kernel::{
    driver as kdriver,
    fs::File,
    miscdevice::{MiscDevice, MiscDeviceOptions, MiscDeviceRegistration},
    pci,
    prelude::*,
    sync::Arc,
};

mod copy;
mod driver;
mod edu;
mod engine;
mod import;
mod uapi;

use engine::Engine;

module! {
    type: P2pbufDma,
    name: "p2pbuf_dma",
    authors: ["p2pbuf developers"],
    description: "A PCI DMA engine importing dma-buf fds",
    license: "GPL",
    imports_ns: ["DMA_BUF"],
}

kernel::sync::global_lock! {
    // SAFETY: Initialised in the module initialiser, before the driver and the misc device are
    // registered (their callbacks are the only users).
    pub(crate) unsafe(uninit) static ENGINE: Mutex<Option<Arc<Engine>>> = None;
}

/// The module: the misc device and the PCI driver.
#[pin_data]
struct P2pbufDma {
    #[pin]
    _misc: MiscDeviceRegistration<DmaFile>,
    #[pin]
    _pci: kdriver::Registration<pci::Adapter<driver::Driver>>,
}

impl kernel::InPlaceModule for P2pbufDma {
    fn init(module: &'static ThisModule) -> impl PinInit<Self, Error> {
        // SAFETY: Called exactly once, before anything can use `ENGINE`.
        unsafe { ENGINE.init() };
        try_pin_init!(Self {
            _misc <- MiscDeviceRegistration::register(MiscDeviceOptions {
                name: c"p2pbuf-dma"
            }),
            _pci <- kdriver::Registration::new(c"p2pbuf_dma", module),
        })
    }
}

/// An open `/dev/p2pbuf-dma`: the engine it was opened on, and its handles (kept by the
/// engine under this file's owner number).
struct DmaFile {
    engine: Arc<Engine>,
}

impl DmaFile {
    /// The owner number of this file's handles: the address of its data, unique while open
    /// (all its handles are released before it is freed).
    fn owner(&self) -> u64 {
        core::ptr::from_ref(self) as usize as u64
    }

    fn import(&self, arg: usize) -> Result<isize> {
        let (mut a, size) = uapi::read_arg::<uapi::p2pbuf_dma_import>(arg)?;
        if a.flags != 0 {
            return Err(EINVAL);
        }
        self.engine.import(self.owner(), a.fd, &mut a)?;
        if let Err(e) = uapi::write_arg(arg, size, &a) {
            // The caller cannot learn the handle: do not keep it.
            let _ = self.engine.release(self.owner(), a.handle);
            return Err(e);
        }
        Ok(0)
    }

    fn release(&self, arg: usize) -> Result<isize> {
        let (a, _) = uapi::read_arg::<uapi::p2pbuf_dma_release>(arg)?;
        if a.flags != 0 || a.reserved != 0 {
            return Err(EINVAL);
        }
        self.engine.release(self.owner(), a.handle)?;
        Ok(0)
    }

    fn copy(&self, arg: usize) -> Result<isize> {
        let (mut a, size) = uapi::read_arg::<uapi::p2pbuf_dma_copy>(arg)?;
        if a.flags != 0 {
            return Err(EINVAL);
        }
        let r = self.engine.copy(self.owner(), &mut a);
        uapi::write_arg(arg, size, &a)?;
        match r {
            // Interrupted after some progress: a short count, as read(2) does.
            Err(e) if e == EINTR && a.copied > 0 => {}
            r => r?,
        }
        // At most `COPY_MAX` (1 GiB), which fits.
        Ok(isize::try_from(a.copied)?)
    }
}

#[vtable]
impl MiscDevice for DmaFile {
    type Ptr = KBox<Self>;

    fn open(_file: &File, _misc: &MiscDeviceRegistration<Self>) -> Result<KBox<Self>> {
        let engine = ENGINE.lock().clone().ok_or(ENODEV)?;
        Ok(KBox::new(DmaFile { engine }, GFP_KERNEL)?)
    }

    fn release(this: KBox<Self>, _file: &File) {
        this.engine.release_all(this.owner());
    }

    fn ioctl(this: &Self, _file: &File, cmd: u32, arg: usize) -> Result<isize> {
        match cmd {
            uapi::P2PBUF_DMA_IOCTL_IMPORT => this.import(arg),
            uapi::P2PBUF_DMA_IOCTL_RELEASE => this.release(arg),
            uapi::P2PBUF_DMA_IOCTL_COPY => this.copy(arg),
            _ => Err(ENOTTY),
        }
    }
}
