//! The real libibverbs functions, found after this library in the lookup order
//! (`dlvsym(RTLD_NEXT, name, version)`, the version that a program built against rdma-core
//! binds to; `dlsym` for a libibverbs without symbol versions), or, where libibverbs is not in
//! the global scope, in the libibverbs already loaded: a library that a program `dlopen`s
//! without `RTLD_GLOBAL` (UCX loads its IB transport, and with it libibverbs, that way) still
//! binds its calls to this library first, but `RTLD_NEXT` cannot see its libibverbs.

use std::ffi::{c_int, c_uint, c_void, CStr};
use std::sync::atomic::{AtomicPtr, Ordering};

use p2pbuf_rdma::ffi::{ibv_mr, ibv_pd};

/// `ibv_reg_mr` (IBVERBS_1.1).
pub type RegMr = unsafe extern "C" fn(*mut ibv_pd, *mut c_void, usize, c_int) -> *mut ibv_mr;
/// `ibv_reg_mr_iova` (IBVERBS_1.7).
pub type RegMrIova =
    unsafe extern "C" fn(*mut ibv_pd, *mut c_void, usize, u64, c_int) -> *mut ibv_mr;
/// `ibv_reg_mr_iova2` (IBVERBS_1.8).
pub type RegMrIova2 =
    unsafe extern "C" fn(*mut ibv_pd, *mut c_void, usize, u64, c_uint) -> *mut ibv_mr;
/// `ibv_reg_dmabuf_mr` (IBVERBS_1.12).
pub type RegDmabufMr =
    unsafe extern "C" fn(*mut ibv_pd, u64, usize, u64, c_int, c_int) -> *mut ibv_mr;
/// `ibv_dereg_mr` (IBVERBS_1.1).
pub type DeregMr = unsafe extern "C" fn(*mut ibv_mr) -> c_int;

/// One lazily resolved function. A failed lookup is retried next time (libibverbs may be
/// loaded later).
pub struct Sym {
    name: &'static CStr,
    version: &'static CStr,
    addr: AtomicPtr<c_void>,
}

impl Sym {
    const fn new(name: &'static CStr, version: &'static CStr) -> Sym {
        Sym {
            name,
            version,
            addr: AtomicPtr::new(std::ptr::null_mut()),
        }
    }

    /// The function's name.
    pub fn name(&self) -> &'static str {
        self.name.to_str().unwrap_or("?")
    }

    /// The address, or `None` if no later object defines it.
    pub fn get(&self) -> Option<*mut c_void> {
        let p = self.addr.load(Ordering::Acquire);
        if !p.is_null() {
            return Some(p);
        }
        let p = self
            .lookup_in(libc::RTLD_NEXT)
            .or_else(|| self.lookup_in(loaded_libibverbs()?))?;
        self.addr.store(p, Ordering::Release);
        Some(p)
    }

    /// The function in `handle` (`RTLD_NEXT` or a `dlopen` handle): the symbol version a
    /// program built against rdma-core binds to, else the unversioned symbol (a libibverbs
    /// built without symbol versions).
    fn lookup_in(&self, handle: *mut c_void) -> Option<*mut c_void> {
        // SAFETY: `handle` is RTLD_NEXT or a handle from dlopen that is never closed, and the
        // names are NUL-terminated; dlvsym returns an address or NULL.
        let p = unsafe { libc::dlvsym(handle, self.name.as_ptr(), self.version.as_ptr()) };
        if !p.is_null() {
            return Some(p);
        }
        // SAFETY: as above.
        let p = unsafe { libc::dlsym(handle, self.name.as_ptr()) };
        (!p.is_null()).then_some(p)
    }
}

/// A handle to the libibverbs that is loaded but not in the global scope (`RTLD_NOLOAD`: this
/// loads nothing), or `None` if none is loaded yet. The handle is opened once and kept, never
/// `dlclose`d: the functions found through it are cached, so libibverbs must stay.
fn loaded_libibverbs() -> Option<*mut c_void> {
    static HANDLE: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
    let h = HANDLE.load(Ordering::Acquire);
    if !h.is_null() {
        return Some(h);
    }
    // SAFETY: a NUL-terminated name; with RTLD_NOLOAD dlopen returns a handle (and a
    // reference) only if the library is already loaded.
    let h = unsafe { libc::dlopen(LIBIBVERBS.as_ptr(), libc::RTLD_NOLOAD | libc::RTLD_LAZY) };
    if h.is_null() {
        return None;
    }
    match HANDLE.compare_exchange(std::ptr::null_mut(), h, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => Some(h),
        Err(kept) => {
            // SAFETY: `h` is this call's own reference from dlopen above, not used after this;
            // the library stays loaded through the reference `kept` holds.
            unsafe { libc::dlclose(h) };
            Some(kept)
        }
    }
}

/// The soname of libibverbs.
const LIBIBVERBS: &CStr = c"libibverbs.so.1";

/// `ibv_reg_mr`.
pub static REG_MR: Sym = Sym::new(c"ibv_reg_mr", c"IBVERBS_1.1");
/// `ibv_reg_mr_iova`.
pub static REG_MR_IOVA: Sym = Sym::new(c"ibv_reg_mr_iova", c"IBVERBS_1.7");
/// `ibv_reg_mr_iova2`.
pub static REG_MR_IOVA2: Sym = Sym::new(c"ibv_reg_mr_iova2", c"IBVERBS_1.8");
/// `ibv_reg_dmabuf_mr`.
pub static REG_DMABUF_MR: Sym = Sym::new(c"ibv_reg_dmabuf_mr", c"IBVERBS_1.12");
/// `ibv_dereg_mr`.
pub static DEREG_MR: Sym = Sym::new(c"ibv_dereg_mr", c"IBVERBS_1.1");
