// SPDX-License-Identifier: GPL-2.0

//! The bound engine as the misc device sees it: imported buffers by handle, copies, and the
//! teardown when the device is unbound.
//!
//! Handles are numbered by the engine and owned by the open file that imported them (an
//! `owner` number given at open). The attachments are made with the engine's PCI device; the
//! abstraction unmaps them when that device is unbound, but the engine must first stop using
//! them, so they live here rather than in the files: [`Engine::shutdown`] stops new work, waits
//! for copies in flight (which end after at most one window step) and detaches every buffer,
//! while files may stay open and get `ENODEV`.

use crate::{
    copy::{self, Progress, Request},
    edu::{Edu, DEFAULT_TIMEOUT_MS},
    import::Import,
    uapi,
};
use kernel::{
    device,
    dma_buf::DmaBuf,
    new_condvar, new_mutex, pci,
    prelude::*,
    sync::{
        aref::ARef,
        atomic::{Atomic, Relaxed},
        Arc, CondVar, Mutex,
    },
};

/// One imported buffer and who owns it.
struct Entry {
    owner: u64,
    handle: u32,
    import: Arc<Import>,
}

/// What the engine's lock protects.
struct State {
    /// Set by [`Engine::shutdown`]: the device is unbinding or unbound.
    gone: bool,
    imports: KVec<Entry>,
    /// The last handle given out.
    last_handle: u32,
    /// Copies in flight.
    active: u32,
}

/// A bound `edu` device serving `/dev/p2pbuf-dma`.
///
/// # Invariants
///
/// While `state.gone` is `false`, `pdev` is bound to this driver.
#[pin_data]
pub(crate) struct Engine {
    pdev: ARef<pci::Device>,
    pub(crate) edu: Arc<Edu>,
    /// `state.gone`, readable without the lock.
    gone: Atomic<bool>,
    #[pin]
    state: Mutex<State>,
    /// Signalled when the last copy in flight ends.
    #[pin]
    idle: CondVar,
}

/// Counts a copy in flight until dropped.
struct Active<'a>(&'a Engine);

impl Drop for Active<'_> {
    fn drop(&mut self) {
        let mut st = self.0.state.lock();
        st.active -= 1;
        if st.active == 0 {
            self.0.idle.notify_all();
        }
    }
}

impl Engine {
    /// A new engine for `pdev`, which is bound now (and until [`Engine::shutdown`]).
    pub(crate) fn new(pdev: ARef<pci::Device>, edu: Arc<Edu>) -> impl PinInit<Self> {
        // INVARIANT: The caller's promise.
        pin_init!(Self {
            pdev,
            edu,
            gone: Atomic::new(false),
            state <- new_mutex!(State {
                gone: false,
                imports: KVec::new(),
                last_handle: 0,
                active: 0,
            }),
            idle <- new_condvar!(),
        })
    }

    /// The PCI device.
    pub(crate) fn pdev(&self) -> &pci::Device {
        &self.pdev
    }

    /// Imports the dma-buf behind `fd` for `owner`.
    pub(crate) fn import(&self, owner: u64, fd: i32, out: &mut uapi::p2pbuf_dma_import) -> Result {
        let buf = DmaBuf::get(fd)?;
        let mut st = self.state.lock();
        if st.gone {
            return Err(ENODEV);
        }
        let dup = st
            .imports
            .iter()
            .any(|e| e.owner == owner && core::ptr::eq(e.import.dma_buf().as_raw(), buf.as_raw()));
        if dup {
            return Err(EEXIST);
        }
        // SAFETY: `gone` is false and we hold the lock, which `shutdown` takes to set it, so by
        // the type invariant the device is bound while `dev` is used (the attachment is made
        // here; it is detached in `shutdown` at the latest).
        let dev = unsafe { AsRef::<device::Device>::as_ref(&*self.pdev).as_bound() };
        let import = Arc::new(Import::new(buf, dev)?, GFP_KERNEL)?;
        let handle = Self::next_handle(&mut st);
        out.length = import.size();
        out.map_type = import.map_type;
        out.nr_ranges = import.nr_ranges;
        out.handle = handle;
        st.imports.push(
            Entry {
                owner,
                handle,
                import,
            },
            GFP_KERNEL,
        )?;
        Ok(())
    }

    /// A handle that is not in use (never 0).
    fn next_handle(st: &mut State) -> u32 {
        loop {
            st.last_handle = st.last_handle.wrapping_add(1);
            let h = st.last_handle;
            if h != 0 && !st.imports.iter().any(|e| e.handle == h) {
                return h;
            }
        }
    }

    /// Releases `handle` of `owner`; `ENODEV` once the engine is unbound (the unbind released
    /// every handle already), as for every other ioctl.
    pub(crate) fn release(&self, owner: u64, handle: u32) -> Result {
        let entry = {
            let mut st = self.state.lock();
            if st.gone {
                return Err(ENODEV);
            }
            let i = st
                .imports
                .iter()
                .position(|e| e.owner == owner && e.handle == handle)
                .ok_or(ENOENT)?;
            st.imports.remove(i)?
        };
        // Detach (unless a copy still holds it) without our lock held.
        drop(entry);
        Ok(())
    }

    /// Releases every handle of `owner` (its file is closed).
    pub(crate) fn release_all(&self, owner: u64) {
        let mut mine = KVec::new();
        {
            let mut st = self.state.lock();
            let mut i = 0;
            while i < st.imports.len() {
                if st.imports[i].owner == owner {
                    if let Ok(e) = st.imports.remove(i) {
                        // On allocation failure the entry is dropped here, under the lock,
                        // which is allowed too (detaching takes only the buffer's lock).
                        let _ = mine.push(e, GFP_KERNEL);
                    }
                } else {
                    i += 1;
                }
            }
        }
        drop(mine);
    }

    /// The import behind `handle` of `owner`.
    fn lookup(st: &State, owner: u64, handle: u32) -> Result<Arc<Import>> {
        st.imports
            .iter()
            .find(|e| e.owner == owner && e.handle == handle)
            .map(|e| e.import.clone())
            .ok_or(ENOENT)
    }

    /// Runs the copy `a` for `owner`; fills in `a.copied` and `a.nr_transfers`, also on error.
    pub(crate) fn copy(&self, owner: u64, a: &mut uapi::p2pbuf_dma_copy) -> Result {
        let (src, dst, active) = {
            let mut st = self.state.lock();
            if st.gone {
                return Err(ENODEV);
            }
            let src = Self::lookup(&st, owner, a.src_handle)?;
            let dst = Self::lookup(&st, owner, a.dst_handle)?;
            st.active += 1;
            (src, dst, Active(self))
        };
        let req = Request {
            src: &src,
            src_offset: a.src_offset,
            dst: &dst,
            dst_offset: a.dst_offset,
            len: a.len.min(u64::from(uapi::P2PBUF_DMA_COPY_MAX)),
            timeout_ms: if a.timeout_ms == 0 {
                DEFAULT_TIMEOUT_MS
            } else {
                a.timeout_ms
            },
        };
        let mut progress = Progress::default();
        let r = req
            .check()
            .and_then(|()| copy::copy(&self.edu, &req, &mut progress, || self.gone.load(Relaxed)));
        a.copied = progress.copied;
        a.nr_transfers = progress.transfers;
        // Our references go before the copy stops counting as active: `shutdown` relies on
        // holding the last ones once no copy is active.
        drop((src, dst));
        drop(active);
        r
    }

    /// Unbind: refuse new work, wait for copies in flight, detach every buffer.
    pub(crate) fn shutdown(&self) {
        let imports = {
            let mut st = self.state.lock();
            st.gone = true;
            self.gone.store(true, Relaxed);
            while st.active > 0 {
                self.idle.wait(&mut st);
            }
            core::mem::take(&mut st.imports)
        };
        let n = imports.len();
        drop(imports);
        if n > 0 {
            dev_info!(self.pdev.as_ref(), "unbound: {} buffer(s) detached\n", n);
        }
    }
}
