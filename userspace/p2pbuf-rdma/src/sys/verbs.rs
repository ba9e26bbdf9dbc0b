//! Owned verbs handles: librdmacm's device list and one of its contexts ([`Device`]), a
//! protection domain ([`PdHandle`]), a memory region ([`MrHandle`]) and a completion queue
//! ([`CqHandle`]). Errors are the errno; the caller says what it means.

use std::os::fd::{AsRawFd, BorrowedFd};
use std::ptr::NonNull;
use std::rc::Rc;

use p2pbuf::memory::HostBuf;

use super::ffi::{self, errno, Libs};

/// The identity of a verbs context (one of librdmacm's devices), to compare with another;
/// never dereferenced outside this module.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CtxId(pub(super) *mut ffi::ibv_context);

/// librdmacm's list of verbs contexts (`rdma_get_devices`): the contexts that its ids use, so
/// that PDs made on them can carry QPs made with `rdma_create_qp`.
///
/// # Invariants
///
/// `list` is the array `rdma_get_devices` returned, with `len` valid entries, not yet freed.
pub struct DeviceList {
    libs: &'static Libs,
    list: NonNull<*mut ffi::ibv_context>,
    len: usize,
}

impl DeviceList {
    /// `rdma_get_devices`. An empty list is an error too: `Err((count, errno))`.
    pub fn get(libs: &'static Libs) -> Result<DeviceList, (i32, i32)> {
        let mut n = 0;
        // SAFETY: rdma_get_devices writes the count and returns a NULL-terminated array it
        // owns until rdma_free_devices.
        let p = unsafe { libs.cm.rdma_get_devices(&mut n) };
        let e = errno();
        match NonNull::new(p) {
            // INVARIANT: the array of `n` contexts, ours until dropped.
            Some(list) if n > 0 => Ok(DeviceList {
                libs,
                list,
                len: n as usize,
            }),
            other => {
                if let Some(list) = other {
                    // SAFETY: `list` came from rdma_get_devices and is freed once, here.
                    unsafe { libs.cm.rdma_free_devices(list.as_ptr()) };
                }
                Err((n, e))
            }
        }
    }

    /// Its contexts.
    pub fn contexts(&self) -> impl Iterator<Item = CtxId> + '_ {
        // SAFETY: the array has `len` valid entries while `self` lives (type invariant).
        (0..self.len).map(move |i| CtxId(unsafe { *self.list.as_ptr().add(i) }))
    }

    /// The device name of context `c`; `None` when `c` is not in the list.
    pub fn name(&self, c: CtxId) -> Option<String> {
        if c.0.is_null() || !self.contexts().any(|x| x == c) {
            return None;
        }
        // SAFETY: `c` is one of the list's live contexts (checked above); ibv_get_device_name
        // returns a string owned by the device, which lives as long as the list.
        let p = unsafe { self.libs.v.ibv_get_device_name((*c.0).device) };
        // SAFETY: NULL or the device's NUL-terminated name, copied here.
        Some(unsafe { super::static_str(p) }.unwrap_or_else(|| "?".into()))
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        // SAFETY: the list came from rdma_get_devices and is freed once, here; nothing made on
        // its contexts outlives it (they hold an `Rc` of the [`Device`] that owns it).
        unsafe { self.libs.cm.rdma_free_devices(self.list.as_ptr()) }
    }
}

/// One context of a [`DeviceList`], with the list that keeps it alive.
///
/// # Invariants
///
/// `ctx` is one of `list`'s contexts.
pub struct Device {
    list: DeviceList,
    ctx: NonNull<ffi::ibv_context>,
    name: String,
}

impl Device {
    /// Context `c` of `list`; `None` when it is not one of the list's.
    pub fn new(list: DeviceList, c: CtxId) -> Option<Device> {
        let name = list.name(c)?;
        // INVARIANT: `name` found `c` in the list, so it is one of its (non-NULL) contexts.
        let ctx = NonNull::new(c.0)?;
        Some(Device { list, ctx, name })
    }

    /// Its name, e.g. `rxe0`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its identity.
    pub fn id(&self) -> CtxId {
        CtxId(self.ctx.as_ptr())
    }

    /// The loaded libraries.
    pub fn libs(&self) -> &'static Libs {
        self.list.libs
    }

    /// `ibv_query_device`; `Err(errno)`.
    pub fn query(&self) -> Result<ffi::ibv_device_attr, i32> {
        let mut a = ffi::ibv_device_attr::default();
        // SAFETY: a live context (type invariant) and a writable attr struct of the header's
        // layout.
        let r = unsafe { self.libs().v.ibv_query_device(self.ctx.as_ptr(), &mut a) };
        if r != 0 {
            return Err(r);
        }
        Ok(a)
    }
}

/// A protection domain (`ibv_alloc_pd`), deallocated on drop.
///
/// # Invariants
///
/// `pd` was allocated on `dev`'s context and not yet deallocated.
pub struct PdHandle {
    dev: Rc<Device>,
    pd: NonNull<ffi::ibv_pd>,
}

impl PdHandle {
    /// `ibv_alloc_pd`; `Err(errno)`.
    pub fn alloc(dev: &Rc<Device>) -> Result<PdHandle, i32> {
        // SAFETY: a live context (Device's invariant).
        let pd = unsafe { dev.libs().v.ibv_alloc_pd(dev.ctx.as_ptr()) };
        let pd = NonNull::new(pd).ok_or_else(errno)?;
        // INVARIANT: just allocated on `dev`.
        Ok(PdHandle {
            dev: dev.clone(),
            pd,
        })
    }
}

impl PdHandle {
    pub(super) fn ptr(&self) -> *mut ffi::ibv_pd {
        self.pd.as_ptr()
    }
}

impl Drop for PdHandle {
    fn drop(&mut self) {
        // SAFETY: allocated once (type invariant); every MR and QP on it holds an `Rc` of it
        // (or, for QPs, is destroyed before: see [`super::cm::CmId::create_qp`]).
        unsafe { self.dev.libs().v.ibv_dealloc_pd(self.pd.as_ptr()) };
    }
}

/// A registered memory region, deregistered on drop (or by [`MrHandle::dereg`]).
///
/// # Invariants
///
/// `mr` was registered on `pd`; it is not yet deregistered while `live`.
pub struct MrHandle {
    pd: Rc<PdHandle>,
    mr: NonNull<ffi::ibv_mr>,
    live: bool,
}

/// What an MR is: the fields of `struct ibv_mr` that the crate reports.
#[derive(Clone, Copy, Debug)]
pub struct MrFields {
    /// Its address (the virtual address of host memory; 0 or the iova of a dma-buf).
    pub addr: u64,
    /// Its length.
    pub length: u64,
    /// The key peers use.
    pub rkey: u32,
    /// The key local work requests use.
    pub lkey: u32,
}

impl MrHandle {
    fn new(pd: &Rc<PdHandle>, mr: *mut ffi::ibv_mr) -> Result<MrHandle, i32> {
        let mr = NonNull::new(mr).ok_or_else(errno)?;
        // INVARIANT: just registered on `pd`.
        Ok(MrHandle {
            pd: pd.clone(),
            mr,
            live: true,
        })
    }

    /// `ibv_reg_mr` of host memory `buf`; `Err(errno)`. The caller keeps `buf` mapped until
    /// the region is deregistered (`HostMr` drops its registration first); the pages stay
    /// pinned by the kernel until then in any case, so the device never writes into memory
    /// this process reuses.
    pub fn reg_host(pd: &Rc<PdHandle>, buf: &HostBuf, access: u32) -> Result<MrHandle, i32> {
        // SAFETY: a live PD (PdHandle's invariant) and a mapping of `buf.len()` bytes at
        // `buf.as_ptr()`, which the kernel pins.
        let mr = unsafe {
            pd.dev.libs().v.ibv_reg_mr(
                pd.pd.as_ptr(),
                buf.as_ptr().cast(),
                buf.len(),
                access as i32,
            )
        };
        MrHandle::new(pd, mr)
    }

    /// `ibv_reg_dmabuf_mr` of `len` bytes of the dma-buf `fd`, `offset` bytes into it, seen
    /// by peers at `iova`; `Err(errno)`. The kernel keeps its own reference to the dma-buf.
    pub fn reg_dmabuf(
        pd: &Rc<PdHandle>,
        offset: u64,
        len: usize,
        iova: u64,
        fd: BorrowedFd<'_>,
        access: u32,
    ) -> Result<MrHandle, i32> {
        // SAFETY: a live PD; the kernel validates offset, length, iova, access and the fd, and
        // nothing in this process's memory is handed over.
        let mr = unsafe {
            pd.dev.libs().v.ibv_reg_dmabuf_mr(
                pd.pd.as_ptr(),
                offset,
                len,
                iova,
                fd.as_raw_fd(),
                access as i32,
            )
        };
        MrHandle::new(pd, mr)
    }

    /// Its address, length and keys.
    pub fn fields(&self) -> MrFields {
        // SAFETY: the MR is live while `self` is (type invariant: `dereg` consumes `self`), and
        // only the library writes it (at registration).
        let m = unsafe { self.mr.as_ref() };
        MrFields {
            addr: m.addr as u64,
            length: m.length as u64,
            rkey: m.rkey,
            lkey: m.lkey,
        }
    }

    /// `ibv_dereg_mr` now; `Err(errno)` (the region is gone either way: libibverbs frees it).
    pub fn dereg(mut self) -> Result<(), i32> {
        // INVARIANT: deregistered below, so no longer live.
        self.live = false;
        // SAFETY: a live MR (it was until now), deregistered once: Drop sees `live` false.
        let r = unsafe { self.pd.dev.libs().v.ibv_dereg_mr(self.mr.as_ptr()) };
        if r != 0 {
            return Err(r);
        }
        Ok(())
    }
}

impl Drop for MrHandle {
    fn drop(&mut self) {
        if !self.live {
            return;
        }
        // SAFETY: a live MR (type invariant), deregistered once; no work request uses it any
        // more (the connections that used it wait for their completions).
        unsafe { self.pd.dev.libs().v.ibv_dereg_mr(self.mr.as_ptr()) };
    }
}

/// A completion queue (`ibv_create_cq`, polled, no completion channel), destroyed on drop.
///
/// # Invariants
///
/// `cq` was created on `dev`'s context and not yet destroyed.
pub struct CqHandle {
    dev: Rc<Device>,
    cq: NonNull<ffi::ibv_cq>,
}

impl CqHandle {
    /// `ibv_create_cq` with `cqe` entries; `Err(errno)`.
    pub fn create(dev: &Rc<Device>, cqe: i32) -> Result<CqHandle, i32> {
        // SAFETY: a live context; no channel, no user context.
        let cq = unsafe {
            dev.libs().v.ibv_create_cq(
                dev.ctx.as_ptr(),
                cqe,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            )
        };
        let cq = NonNull::new(cq).ok_or_else(errno)?;
        // INVARIANT: just created on `dev`.
        Ok(CqHandle {
            dev: dev.clone(),
            cq,
        })
    }

    pub(super) fn ptr(&self) -> *mut ffi::ibv_cq {
        self.cq.as_ptr()
    }

    /// `ibv_poll_cq` into `wc`: how many completions it filled in, or `Err(errno)`.
    pub fn poll(&self, wc: &mut [ffi::ibv_wc]) -> Result<usize, i32> {
        // SAFETY: ibv_poll_cq is a static inline that calls the context's poll_cq op with the
        // CQ (live: type invariant) and an array of `wc.len()` writable entries.
        let n = unsafe {
            let ctx = (*self.cq.as_ptr()).context;
            let poll = (*ctx).ops.poll_cq.expect("provider without poll_cq");
            poll(self.cq.as_ptr(), wc.len() as i32, wc.as_mut_ptr())
        };
        if n < 0 {
            return Err(-n);
        }
        Ok(n as usize)
    }
}

impl Drop for CqHandle {
    fn drop(&mut self) {
        // SAFETY: created once (type invariant); the QPs that use it are destroyed before
        // (a `Connection` drops its id, and with it the QP, before its CQ).
        unsafe { self.dev.libs().v.ibv_destroy_cq(self.cq.as_ptr()) };
    }
}

/// rdma-core's description of a work completion status (`ibv_wc_status_str`).
pub fn wc_status_str(libs: &Libs, status: u32) -> Option<String> {
    // SAFETY: returns a static string (or NULL) for any value.
    unsafe { super::static_str(libs.v.ibv_wc_status_str(status)) }
}
