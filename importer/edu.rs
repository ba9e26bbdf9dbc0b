// SPDX-License-Identifier: GPL-2.0

//! QEMU's `edu` device (`docs/specs/edu.rst`) as a DMA engine.
//!
//! The device has one DMA channel between bus addresses and an internal buffer at device
//! address [`WINDOW_BASE`], of which we use [`WINDOW`] bytes: one transfer moves at most that
//! much in one direction, and raises interrupt [`regs::IRQ_STATUS`]`.dma` when it is done (the model
//! finishes a transfer 100 ms of virtual time after it was started). A running transfer cannot
//! be aborted, and its registers ignore writes until it is done.
//!
//! [`Edu`] owns the mapped registers and the completion the interrupt handler signals;
//! [`Edu::claim`] serialises transfers and hands out a [`Claim`], through which the copy code
//! drives the engine while it holds the reservation lock of the buffer being accessed.

use kernel::{
    bindings,
    device::{Bound, Device},
    devres::Devres,
    dma::DmaAddress,
    io::{poll::read_poll_timeout, Io},
    irq::{self, IrqReturn},
    new_mutex, pci,
    prelude::*,
    sync::{lock::mutex::MutexGuard, Arc, Mutex},
    time::{msecs_to_jiffies, Delta},
    types::Opaque,
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

        /// DMA source address: a bus address, or a device address in the window.
        pub(crate) DMA_SRC(u64) @ 0x80 {
            63:0 addr;
        }

        /// DMA destination address: a bus address, or a device address in the window.
        pub(crate) DMA_DST(u64) @ 0x88 {
            63:0 addr;
        }

        /// DMA length in bytes.
        pub(crate) DMA_COUNT(u64) @ 0x90 {
            63:0 count;
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

/// BAR0, sized for the registers we use.
pub(crate) type Bar0 = pci::Bar<'static, { END }>;

/// A counted completion with a timed wait, signalled from the interrupt handler.
///
/// The Rust [`kernel::sync::Completion`] only has `complete_all()` and an untimed wait; a DMA
/// engine needs `complete()` (one wake-up per interrupt) and `wait_for_completion_timeout()`.
#[pin_data]
struct Done {
    #[pin]
    inner: Opaque<bindings::completion>,
}

// SAFETY: A `struct completion` is designed to be signalled and waited for from any context
// and thread; it has its own lock.
unsafe impl Send for Done {}
// SAFETY: See above.
unsafe impl Sync for Done {}

impl Done {
    fn new() -> impl PinInit<Self> {
        pin_init!(Self {
            inner <- Opaque::ffi_init(|slot: *mut bindings::completion| {
                // SAFETY: `slot` is a valid pointer to an uninitialised `struct completion`.
                unsafe { bindings::init_completion(slot) };
            }),
        })
    }

    /// Wakes one waiter (or the next one to wait).
    fn complete(&self) {
        // SAFETY: `inner` was initialised by `init_completion()` and is pinned.
        unsafe { bindings::complete(self.inner.get()) };
    }

    /// Waits for a wake-up; returns the jiffies left of `timeout`, or 0 when it ran out.
    fn wait(&self, timeout: c_ulong) -> c_ulong {
        // SAFETY: `inner` was initialised by `init_completion()` and is pinned.
        unsafe { bindings::wait_for_completion_timeout(self.inner.get(), timeout) }
    }

    /// Forgets wake-ups nobody waited for (from an interrupt that came late).
    fn drain(&self) {
        // SAFETY: `inner` was initialised by `init_completion()` and is pinned.
        while unsafe { bindings::try_wait_for_completion(self.inner.get()) } {}
    }
}

/// What the engine's mutex protects.
struct HwState {
    /// A transfer never ended: the engine must not be used any more.
    dead: bool,
}

/// The DMA engine of one `edu` device.
#[pin_data]
pub(crate) struct Edu {
    bar: Devres<Bar0>,
    #[pin]
    done: Done,
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
        Ok(try_pin_init!(Self {
            bar,
            done <- Done::new(),
            hw <- new_mutex!(HwState { dead: false }),
        }))
    }

    /// The interrupt: acknowledges the DMA source and wakes the waiter.
    fn handle_irq(&self, dev: &Device<Bound>) -> IrqReturn {
        let Ok(bar) = self.bar.access(dev) else {
            return IrqReturn::None;
        };
        let status = bar.read(IRQ_STATUS);
        if status.into_raw() == 0 {
            return IrqReturn::None;
        }
        bar.write_reg(IRQ_ACK::from_raw(status.into_raw()));
        if status.dma() {
            self.done.complete();
        }
        IrqReturn::Handled
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

    /// Waits until no transfer runs, polling, for at most `timeout`.
    fn wait_idle(&self, timeout: Delta) -> Result {
        read_poll_timeout(
            || self.busy(),
            |busy| !*busy,
            Delta::from_millis(5),
            timeout,
        )?;
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
            edu.wait_idle(GRACE).inspect_err(|_| self.hw.dead = true)?;
        }
        edu.done.drain();
        {
            let bar = edu.bar.try_access().ok_or(ENODEV)?;
            bar.write_reg(DMA_SRC::zeroed().with_addr(src));
            bar.write_reg(DMA_DST::zeroed().with_addr(dst));
            bar.write_reg(DMA_COUNT::zeroed().with_count(len as u64));
            bar.write_reg(
                DMA_CMD::zeroed()
                    .with_run(true)
                    .with_to_ram(to_ram)
                    .with_irq(true),
            );
        }
        let mut left = msecs_to_jiffies(timeout_ms).max(1);
        loop {
            left = edu.done.wait(left);
            // A wake-up may be left over from an earlier, late interrupt: the engine's own
            // `run` bit says whether this transfer is done.
            if !edu.busy()? {
                return Ok(());
            }
            if left == 0 {
                break;
            }
        }
        // No interrupt in time. The engine cannot be stopped, and our caller unmaps the memory
        // once we return: wait (a bounded time) until it is idle before giving up.
        if edu.wait_idle(GRACE).is_err() {
            self.hw.dead = true;
            pr_err!("p2pbuf_importer: DMA transfer never ended; engine disabled\n");
        }
        Err(ETIMEDOUT)
    }
}

/// The interrupt handler's data: the engine whose completion it signals.
pub(crate) struct IrqHandler(pub(crate) Arc<Edu>);

impl irq::Handler for IrqHandler {
    fn handle(&self, dev: &Device<Bound>) -> IrqReturn {
        self.0.handle_irq(dev)
    }
}

/// Requests the device's interrupt (MSI if it has it, else INTx) for `edu`.
pub(crate) fn request_irq<'a>(
    pdev: &'a pci::Device<Bound>,
    edu: Arc<Edu>,
) -> Result<impl PinInit<irq::Registration<IrqHandler>, Error> + 'a> {
    let types = pci::IrqTypes::default()
        .with(pci::IrqType::Msi)
        .with(pci::IrqType::Intx);
    let vectors = pdev.alloc_irq_vectors(1, 1, types)?;
    Ok(pdev.request_irq(
        *vectors.start(),
        irq::Flags::SHARED,
        c"p2pbuf-dma",
        Ok::<_, Error>(IrqHandler(edu)),
    ))
}
