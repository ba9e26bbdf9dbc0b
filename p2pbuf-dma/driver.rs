// SPDX-License-Identifier: GPL-2.0

//! The PCI driver: binds the `edu` device, sets it up as a DMA engine and publishes it to
//! `/dev/p2pbuf-dma`; unbinding detaches every imported buffer first.

use crate::{
    edu::{regs, Edu},
    engine::Engine,
    ENGINE,
};
use kernel::{
    bindings,
    device::Core,
    dma::{Device as _, DmaMask},
    pci,
    prelude::*,
    sync::Arc,
};

/// QEMU's vendor ID, which has no `pci::Vendor` constant (Linux has no `PCI_VENDOR_ID_QEMU`).
const VENDOR_QEMU: u32 = 0x1234;
/// The `edu` device.
const DEVICE_EDU: u32 = 0x11e8;

/// `PCI_DEVICE(0x1234, 0x11e8)`.
///
/// `pci::DeviceId::from_id()` takes a `pci::Vendor`, which drivers can only name from the
/// kernel's list of vendor constants.
// SAFETY: `pci::DeviceId` is `repr(transparent)` over `struct pci_device_id`, so both have the
// same layout, and any `struct pci_device_id` value is a valid ID.
const EDU_ID: pci::DeviceId = unsafe {
    core::mem::transmute::<bindings::pci_device_id, pci::DeviceId>(bindings::pci_device_id {
        vendor: VENDOR_QEMU,
        device: DEVICE_EDU,
        subvendor: !0,
        subdevice: !0,
        class: 0,
        class_mask: 0,
        driver_data: 0,
        override_only: 0,
    })
};

kernel::pci_device_table!(PCI_TABLE, <Driver as pci::Driver>::IdInfo, [(EDU_ID, ())]);

/// The PCI driver.
pub(crate) struct Driver;

/// Per-device data: the engine.
pub(crate) struct DriverData {
    engine: Arc<Engine>,
}

impl pci::Driver for Driver {
    type IdInfo = ();
    type Data<'bound> = DriverData;

    const ID_TABLE: pci::IdTable<Self::IdInfo> = &PCI_TABLE;

    fn probe<'bound>(
        pdev: &'bound pci::Device<Core<'_>>,
        _info: Option<&'bound Self::IdInfo>,
    ) -> impl PinInit<Self::Data<'bound>, Error> + 'bound {
        pdev.enable_device_mem()?;
        pdev.set_master();
        // SAFETY: Nothing allocates or maps DMA memory for this device yet: we are in probe,
        // before the engine is published.
        unsafe { pdev.dma_set_mask_and_coherent(DmaMask::new::<64>())? };
        let bar = pdev.iomap_region_sized::<{ regs::END }>(0, c"p2pbuf_dma")?;
        let edu = Arc::pin_init(Edu::new(pdev, bar)?, GFP_KERNEL)?;
        let generic: &pci::Device = pdev;
        let engine = Arc::pin_init(Engine::new(generic.into(), edu), GFP_KERNEL)?;
        publish(engine.clone())?;
        dev_info!(pdev.as_ref(), "DMA engine ready: /dev/p2pbuf-dma\n");
        Ok(DriverData { engine })
    }

    fn unbind<'bound>(_pdev: &'bound pci::Device<Core<'_>>, this: Pin<&Self::Data<'bound>>) {
        let mut g = ENGINE.lock();
        if g.as_ref().is_some_and(|e| Arc::ptr_eq(e, &this.engine)) {
            *g = None;
        }
        drop(g);
        this.engine.shutdown();
    }
}

/// Makes `engine` the one `/dev/p2pbuf-dma` serves; `EBUSY` if another device has it.
fn publish(engine: Arc<Engine>) -> Result {
    let mut g = ENGINE.lock();
    if g.is_some() {
        dev_warn!(
            engine.pdev().as_ref(),
            "another edu device already serves /dev/p2pbuf-dma\n"
        );
        return Err(EBUSY);
    }
    *g = Some(engine);
    Ok(())
}
