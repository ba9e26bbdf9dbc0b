// SPDX-License-Identifier: GPL-2.0

//! QEMU's `edu` device (`docs/specs/edu.rst`) as a DMA engine.
//!
//! The device has one DMA channel between bus addresses and an internal buffer at device
//! address [`WINDOW_BASE`], of which we use [`WINDOW`] bytes: one transfer moves at most that
//! much in one direction (the model finishes a transfer 100 ms of virtual time after it was
//! started). A running transfer cannot be aborted, and its registers ignore writes until it is
//! done.
//!
//! The driver polls the engine's `run` bit for the end of a transfer instead of taking its
//! interrupt. Linux 7.3's PCI interrupt API hands out an [`irq::Registration`] that borrows the
//! [`pci::IrqVectorRegistration`] it came from, so a driver cannot keep both in its per-device
//! data without a self-referential struct; a transfer takes 100 ms, so polling every
//! [`POLL`] costs nothing measurable. Transfers are started without the `irq` bit, so the
//! device never raises an interrupt that nobody handles.
//!
//! [`Edu`] owns the mapped registers (revocable: they go away on unbind); [`Edu::claim`]
//! serialises transfers and hands out a [`Claim`], through which the copy code drives the engine
//! while it holds the reservation lock of the buffer being accessed.
//!
//! [`irq::Registration`]: kernel::irq::Registration
//! [`pci::IrqVectorRegistration`]: kernel::pci::IrqVectorRegistration

use kernel::{
    bindings,
    device::Bound,
    dma::DmaAddress,
    io::{poll::read_poll_timeout, Io, IoBackend, IoBase, MmioBackend},
    new_mutex, pci,
    pci::DevresBar,
    prelude::*,
    sync::{aref::ARef, lock::mutex::MutexGuard, Mutex},
    time::Delta,
};

/// The registers of BAR0.
pub(crate) mod regs {
    use kernel::io::register;

    register! {
        /// Identification: `0xRRrr00ed`, major and minor version and a magic byte.
        pub(crate) ID(u32) @ 0x00 {
            /// Major version.
            31:24 major;
            /// Minor version.
            23:16 minor;
            /// Always [`ID_MAGIC`].
            7:0 magic;
        }

        /// Pending interrupt sources (read-only).
        pub(crate) IRQ_STATUS(u32) @ 0x24 {
            /// A DMA transfer that asked for an interrupt is done.
            8:8 dma => bool;
            /// A factorial computation is done (unused here).
            0:0 fact => bool;
        }

        /// Interrupt acknowledge: clears the sources written as 1.
        pub(crate) IRQ_ACK(u32) @ 0x64 {
            /// Clears [`IRQ_STATUS::dma`].
            8:8 dma => bool;
            /// Clears [`IRQ_STATUS::fact`].
            0:0 fact => bool;
        }

        /// DMA command; writing it with `run` set starts a transfer.
        pub(crate) DMA_CMD(u32) @ 0x98 {
            /// Raise [`IRQ_STATUS::dma`] when done.
            2:2 irq => bool;
            /// Direction: `false` from a bus address into the window, `true` from the window
            /// to a bus address.
            1:1 to_ram => bool;
            /// Set while the transfer runs.
            0:0 run => bool;
        }
    }

    /// The 64-bit DMA registers, by offset (see [`super::write64`]).
    #[derive(Clone, Copy)]
    pub(crate) enum Reg64 {
        /// DMA source address: a bus address, or a device address in the window.
        Src = 0x80,
        /// DMA destination address: a bus address, or a device address in the window.
        Dst = 0x88,
        /// DMA length in bytes.
        Count = 0x90,
    }

    /// The magic byte of [`ID`].
    pub(crate) const ID_MAGIC: u32 = 0xed;

    /// Size of the register block we use.
    pub(crate) const END: usize = 0x100;
}

use regs::*;

/// The engine's internal buffer: its device address.
pub(crate) const WINDOW_BASE: u64 = 0x40000;
/// Bytes of the internal buffer a transfer may use.
///
/// The buffer has 4096 bytes, but QEMU 7.2's model (Debian 12's) stops the whole VM with a
/// hardware error for a transfer that ends at its last byte (an off-by-one in
/// `edu_check_range()`, which later versions only log), so the last byte is never used.
pub(crate) const WINDOW: usize = 4095;

/// How long a transfer is given when the caller does not say.
pub(crate) const DEFAULT_TIMEOUT_MS: u32 = 1000;

/// How long to wait, after a completion timed out, for the transfer to end anyway before the
/// engine is declared dead. The model always ends a transfer after 100 ms.
const GRACE: Delta = Delta::from_secs(10);

/// How often a running transfer is polled for its end.
const POLL: Delta = Delta::from_millis(1);

/// What the engine's mutex protects.
struct HwState {
    /// A transfer never ended: the engine must not be used any more.
    dead: bool,
}

/// The DMA engine of one `edu` device.
#[pin_data]
pub(crate) struct Edu {
    /// The device, for its bus-master bit (see [`Edu::bus_master`]).
    pdev: ARef<pci::Device>,
    bar: DevresBar<{ END }>,
    #[pin]
    hw: Mutex<HwState>,
}

impl Edu {
    /// Takes over a mapped BAR0, after checking that it is an `edu` device.
    pub(crate) fn new(
        pdev: &pci::Device<Bound>,
        bar: pci::Bar<'_, { END }>,
    ) -> Result<impl PinInit<Self, Error>> {
        let id = bar.read(ID);
        if u32::from(id.magic()) != ID_MAGIC {
            dev_err!(
                pdev.as_ref(),
                "not an edu device (id {:#x})\n",
                id.into_raw()
            );
            return Err(ENODEV);
        }
        dev_info!(
            pdev.as_ref(),
            "edu {}.{}: DMA window {} bytes\n",
            u32::from(id.major()),
            u32::from(id.minor()),
            WINDOW
        );
        // No interrupt is pending from before us.
        bar.write_reg(IRQ_ACK::zeroed().with_dma(true).with_fact(true));
        let bar = bar.into_devres()?;
        let generic: &pci::Device = pdev;
        let pdev: ARef<pci::Device> = generic.into();
        Ok(try_pin_init!(Self {
            pdev,
            bar,
            hw <- new_mutex!(HwState { dead: false }),
        }))
    }

    /// Serialises use of the engine; fails with `EIO` once it is dead.
    pub(crate) fn claim(&self) -> Result<Claim<'_>> {
        let hw = self.hw.lock();
        if hw.dead {
            return Err(EIO);
        }
        Ok(Claim { edu: self, hw })
    }

    /// Whether a transfer is running; `ENODEV` once the device is unbound.
    fn busy(&self) -> Result<bool> {
        let bar = self.bar.try_access().ok_or(ENODEV)?;
        Ok(bar.read(DMA_CMD).run())
    }

    /// Turns the device's bus mastering on or off: off, a transfer still running cannot reach
    /// memory (QEMU drops its accesses; real PCI devices must not issue any). `ENODEV` once the
    /// device is unbound (its probe set mastering again if it is bound anew).
    fn bus_master(&self, on: bool) -> Result {
        // The BAR is ours only while the device is bound to us: while we hold it, the config
        // space write below cannot reach a device that another driver (or none) has now.
        let _bound = self.bar.try_access().ok_or(ENODEV)?;
        let pdev = core::ptr::from_ref::<pci::Device>(&self.pdev)
            .cast::<bindings::pci_dev>()
            .cast_mut();
        if on {
            // SAFETY: `pci::Device` is `repr(transparent)` over `Opaque<struct pci_dev>`, so
            // `pdev` points to the valid `struct pci_dev` that `self.pdev` keeps referenced, and
            // the device is bound to this driver while `_bound` is held (its BAR mapping is
            // revoked at unbind). `pci_set_master()` only reads and writes config space, under
            // the PCI config spinlock, which is allowed in the RCU read-side section the guard
            // holds.
            unsafe { bindings::pci_set_master(pdev) };
        } else {
            // SAFETY: As for `pci_set_master()` above; `pci_clear_master()` likewise only writes
            // `PCI_COMMAND` in config space.
            unsafe { bindings::pci_clear_master(pdev) };
        }
        Ok(())
    }

    /// Waits until no transfer runs, polling every [`POLL`], for at most `timeout`
    /// (`ETIMEDOUT` then).
    fn wait_idle(&self, timeout: Delta) -> Result {
        read_poll_timeout(|| self.busy(), |busy| !*busy, POLL, timeout)?;
        Ok(())
    }
}

/// Exclusive use of the engine.
pub(crate) struct Claim<'a> {
    edu: &'a Edu,
    hw: MutexGuard<'a, HwState>,
}

impl Claim<'_> {
    /// Copies `len` bytes from bus address `src` into the window at `offset`.
    ///
    /// The caller keeps the memory at `src` mapped for the engine until this returns, also on
    /// error: it returns only when the engine no longer accesses it (or is declared dead).
    pub(crate) fn fill_window(
        &mut self,
        src: DmaAddress,
        offset: usize,
        len: usize,
        timeout_ms: u32,
    ) -> Result {
        let dst = WINDOW_BASE + Self::window(offset, len)?;
        self.transfer(src, dst, len, false, timeout_ms)
    }

    /// Copies `len` bytes from the window at `offset` to bus address `dst`. As for
    /// [`Claim::fill_window`], the caller keeps `dst` mapped until this returns.
    pub(crate) fn drain_window(
        &mut self,
        offset: usize,
        dst: DmaAddress,
        len: usize,
        timeout_ms: u32,
    ) -> Result {
        let src = WINDOW_BASE + Self::window(offset, len)?;
        self.transfer(src, dst, len, true, timeout_ms)
    }

    /// Checks that `offset..offset + len` lies in the window; returns `offset`.
    fn window(offset: usize, len: usize) -> Result<u64> {
        match offset.checked_add(len) {
            Some(end) if len > 0 && end <= WINDOW => Ok(offset as u64),
            _ => Err(EINVAL),
        }
    }

    fn transfer(
        &mut self,
        src: u64,
        dst: u64,
        len: usize,
        to_ram: bool,
        timeout_ms: u32,
    ) -> Result {
        let edu = self.edu;
        // A transfer that timed out earlier has ended (or the engine is dead): see below.
        if edu.busy()? {
            let _ = edu.bus_master(false);
            if let Err(e) = edu.wait_idle(GRACE) {
                self.give_up();
                return Err(e);
            }
            edu.bus_master(true)?;
        }
        {
            let bar = edu.bar.try_access().ok_or(ENODEV)?;
            write64(&bar, Reg64::Src, src);
            write64(&bar, Reg64::Dst, dst);
            write64(&bar, Reg64::Count, len as u64);
            bar.write_reg(DMA_CMD::zeroed().with_run(true).with_to_ram(to_ram));
        }
        match edu.wait_idle(Delta::from_millis(i64::from(timeout_ms.max(1)))) {
            Err(e) if e == ETIMEDOUT => {}
            done => return done,
        }
        // Not done in time. The transfer cannot be aborted, and our caller unmaps the memory
        // once we return: first take the bus from the engine (review N11), so that whatever it
        // still does reaches no memory, then wait (a bounded time) until it is idle. An engine
        // that ends the transfer gets the bus back; one that never does stays without it, and
        // disabled, until the device is bound again.
        // `ENODEV` only once the device is unbound, and the unbind waits for copies in flight.
        edu.bus_master(false)?;
        if edu.wait_idle(GRACE).is_err() {
            self.give_up();
            return Err(ETIMEDOUT);
        }
        edu.bus_master(true)?;
        Err(ETIMEDOUT)
    }

    /// The engine never became idle: disabled until the device is bound again (its probe
    /// enables bus mastering again), with bus mastering off.
    fn give_up(&mut self) {
        self.hw.dead = true;
        let _ = self.edu.bus_master(false);
        pr_err!("p2pbuf_dma: DMA transfer never ended; engine disabled until rebound\n");
    }
}

/// Writes the 64-bit DMA register `reg`.
///
/// `register!` cannot declare these on Linux 7.3: a PCI BAR's I/O region promises only 4-byte
/// alignment (`Region::MIN_ALIGN`), so a `u64` access to it fails to build, and the model takes
/// a 4-byte write to one of them as the whole 64-bit value (no way to set the upper half). The
/// BAR is mapped at a page boundary, so an 8-aligned offset is an 8-aligned address.
fn write64(bar: &pci::Bar<'_, { END }>, reg: Reg64, value: u64) {
    let view = bar.as_view();
    let ptr = MmioBackend::as_ptr(view)
        .cast::<u8>()
        .wrapping_add(reg as usize)
        .cast::<u64>();
    // SAFETY: `ptr` is a projection of the view: `reg` is one of the 8-aligned offsets of
    // `Reg64`, each at most `END - 8`, and the region is at least `END` bytes (the `Bar`'s size
    // parameter) and mapped page-aligned, so the `u64` at `ptr` lies inside it and is aligned.
    let reg = unsafe { MmioBackend::project_view(view, ptr) };
    reg.write_val(value);
}
