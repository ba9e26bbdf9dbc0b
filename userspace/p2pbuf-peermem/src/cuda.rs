//! CUDA device pointers: recognised with `cuPointerGetAttributes`, exported as dma-bufs with
//! `cuMemGetHandleForAddressRange(..., CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, ...)`.
//!
//! The driver library is never loaded by this library: it is looked up with
//! `dlopen(RTLD_NOLOAD)`, so only a process that already uses CUDA (a device pointer cannot
//! exist otherwise) pays for a look at its pointers, and a process without CUDA is left as it
//! was.

use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void, CStr};
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

type CuResult = c_int;
type CuDevicePtr = c_ulonglong;
type CuContext = *mut c_void;

type PointerGetAttributes =
    unsafe extern "C" fn(c_uint, *mut c_int, *mut *mut c_void, CuDevicePtr) -> CuResult;
type GetHandleForAddressRange =
    unsafe extern "C" fn(*mut c_void, CuDevicePtr, usize, c_int, c_ulonglong) -> CuResult;
type CtxPushCurrent = unsafe extern "C" fn(CuContext) -> CuResult;
type CtxPopCurrent = unsafe extern "C" fn(*mut CuContext) -> CuResult;
type GetErrorName = unsafe extern "C" fn(CuResult, *mut *const c_char) -> CuResult;

/// `CUpointer_attribute` values (cuda.h).
mod attr {
    pub const CONTEXT: i32 = 1;
    pub const MEMORY_TYPE: i32 = 2;
    pub const BUFFER_ID: i32 = 7;
    pub const IS_MANAGED: i32 = 8;
    pub const DEVICE_ORDINAL: i32 = 9;
    pub const RANGE_START_ADDR: i32 = 11;
    pub const RANGE_SIZE: i32 = 12;
}
/// `CU_MEMORYTYPE_HOST`.
const MEMORYTYPE_HOST: u64 = 1;
/// `CU_MEMORYTYPE_DEVICE`.
const MEMORYTYPE_DEVICE: u64 = 2;
/// `CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD`.
const HANDLE_TYPE_DMA_BUF_FD: c_int = 1;
/// `CUDA_ERROR_INVALID_VALUE`.
pub const ERROR_INVALID_VALUE: i32 = 1;
/// `CUDA_ERROR_OUT_OF_MEMORY`.
pub const ERROR_OUT_OF_MEMORY: i32 = 2;
/// `CUDA_ERROR_NOT_INITIALIZED`.
pub const ERROR_NOT_INITIALIZED: i32 = 3;
/// `CUDA_ERROR_DEINITIALIZED`.
pub const ERROR_DEINITIALIZED: i32 = 4;
/// `CUDA_ERROR_NOT_PERMITTED`.
pub const ERROR_NOT_PERMITTED: i32 = 800;
/// `CUDA_ERROR_NOT_SUPPORTED`.
pub const ERROR_NOT_SUPPORTED: i32 = 801;

struct Driver {
    pointer_get_attributes: PointerGetAttributes,
    get_handle: GetHandleForAddressRange,
    ctx_push: CtxPushCurrent,
    ctx_pop: CtxPopCurrent,
    error_name: GetErrorName,
}

// SAFETY: function pointers into libcuda, which stays loaded (dlopen took a reference).
unsafe impl Send for Driver {}
// SAFETY: see above; the driver API is thread-safe.
unsafe impl Sync for Driver {}

static DRIVER: OnceLock<Result<Driver, String>> = OnceLock::new();

/// `dlpi_adds` when [`loaded_libcuda`] last found no libcuda: nothing was loaded since.
static ADDS_WITHOUT_CUDA: AtomicU64 = AtomicU64::new(u64::MAX);

/// The path under which the process loaded libcuda, if it did. Walks the loaded objects
/// (`dl_iterate_phdr`), and not at all when nothing was loaded since the last walk (the
/// loader's `dlpi_adds` counter). `dlopen("libcuda.so.1", RTLD_NOLOAD)` would answer the same
/// but searches the library path on disk first, tens of microseconds on every registration.
fn loaded_libcuda() -> Option<std::ffi::CString> {
    struct Walk {
        adds: u64,
        first: bool,
        unchanged: bool,
        found: Option<std::ffi::CString>,
    }
    unsafe extern "C" fn cb(
        info: *mut libc::dl_phdr_info,
        size: usize,
        data: *mut c_void,
    ) -> c_int {
        // SAFETY: `data` is the `Walk` passed below; `info` is valid for this call.
        let w = unsafe { &mut *(data as *mut Walk) };
        let info = unsafe { &*info };
        if w.first {
            w.first = false;
            if size >= std::mem::offset_of!(libc::dl_phdr_info, dlpi_subs) {
                w.adds = info.dlpi_adds;
                if w.adds == ADDS_WITHOUT_CUDA.load(Ordering::Relaxed) {
                    w.unchanged = true;
                    return 1;
                }
            }
        }
        if info.dlpi_name.is_null() {
            return 0;
        }
        // SAFETY: a NUL-terminated name from the loader.
        let name = unsafe { CStr::from_ptr(info.dlpi_name) };
        let file = name
            .to_bytes()
            .rsplit(|&b| b == b'/')
            .next()
            .unwrap_or_default();
        if file.starts_with(b"libcuda.so") {
            w.found = Some(name.to_owned());
            return 1;
        }
        0
    }
    let mut w = Walk {
        adds: u64::MAX,
        first: true,
        unchanged: false,
        found: None,
    };
    // SAFETY: the callback only reads the loader's records and writes `w`.
    unsafe { libc::dl_iterate_phdr(Some(cb), (&mut w) as *mut Walk as *mut c_void) };
    if w.found.is_none() && !w.unchanged && w.adds != u64::MAX {
        ADDS_WITHOUT_CUDA.store(w.adds, Ordering::Relaxed);
    }
    w.found
}

/// The process's libcuda, if it has one loaded.
fn driver() -> Option<Result<&'static Driver, &'static str>> {
    if let Some(d) = DRIVER.get() {
        return Some(d.as_ref().map_err(String::as_str));
    }
    let path = loaded_libcuda()?;
    // SAFETY: RTLD_NOLOAD with the loaded object's own name: a reference to it, no loading.
    let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
    if handle.is_null() {
        return None;
    }
    let sym = |n: &CStr| {
        // SAFETY: `handle` is a live dlopen handle; dlsym returns an address or NULL.
        let p = unsafe { libc::dlsym(handle, n.as_ptr()) };
        (!p.is_null())
            .then_some(p)
            .ok_or_else(|| n.to_string_lossy().into_owned())
    };
    let d = (|| -> Result<Driver, String> {
        // SAFETY: the driver API's signatures (cuda.h), for symbols of that name.
        unsafe {
            Ok(Driver {
                pointer_get_attributes: std::mem::transmute::<*mut c_void, PointerGetAttributes>(
                    sym(c"cuPointerGetAttributes")?,
                ),
                get_handle: std::mem::transmute::<*mut c_void, GetHandleForAddressRange>(sym(
                    c"cuMemGetHandleForAddressRange",
                )?),
                ctx_push: std::mem::transmute::<*mut c_void, CtxPushCurrent>(sym(
                    c"cuCtxPushCurrent_v2",
                )?),
                ctx_pop: std::mem::transmute::<*mut c_void, CtxPopCurrent>(sym(
                    c"cuCtxPopCurrent_v2",
                )?),
                error_name: std::mem::transmute::<*mut c_void, GetErrorName>(sym(
                    c"cuGetErrorName",
                )?),
            })
        }
    })()
    .map_err(|missing| {
        format!("libcuda is loaded but lacks {missing} (dma-buf export needs a driver for CUDA 11.7 or later)")
    });
    Some(DRIVER.get_or_init(|| d).as_ref().map_err(String::as_str))
}

/// `CUDA_ERROR_...` name of a result.
pub fn error_name(code: i32) -> String {
    if let Some(Ok(d)) = driver() {
        let mut p: *const c_char = std::ptr::null();
        // SAFETY: cuGetErrorName stores a pointer to a static string.
        if unsafe { (d.error_name)(code, &mut p) } == 0 && !p.is_null() {
            // SAFETY: a NUL-terminated static string from the driver.
            return unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned();
        }
    }
    format!("CUDA error {code}")
}

/// A device allocation that holds a pointer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceAlloc {
    /// The owning context (`CU_POINTER_ATTRIBUTE_CONTEXT`; NULL for some VMM mappings).
    pub ctx: usize,
    /// `CU_POINTER_ATTRIBUTE_BUFFER_ID`: unique in the process for the allocation's lifetime
    /// (a new allocation at the same address has another id).
    pub buffer_id: u64,
    /// `CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL`.
    pub device: i32,
    /// `CU_POINTER_ATTRIBUTE_RANGE_START_ADDR`.
    pub base: u64,
    /// `CU_POINTER_ATTRIBUTE_RANGE_SIZE`.
    pub size: u64,
}

impl DeviceAlloc {
    /// The range that is exported: the allocation, widened to whole host pages (what
    /// `cuMemGetHandleForAddressRange` requires).
    pub fn export_range(&self, page: u64) -> (u64, u64) {
        let start = self.base & !(page - 1);
        let end = (self.base + self.size).div_ceil(page) * page;
        (start, end - start)
    }
}

/// What the driver says about an address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    /// No CUDA in this process, or the address is not CUDA's.
    NotCuda,
    /// CUDA knows it, but it is memory that `ibv_reg_mr` takes as it is (pinned host memory,
    /// managed memory).
    Host(String),
    /// Device memory.
    Device(DeviceAlloc),
    /// libcuda is loaded but unusable.
    Unusable(String),
}

/// Classifies `addr`.
pub fn probe(addr: u64) -> Probe {
    let d = match driver() {
        None => return Probe::NotCuda,
        Some(Err(why)) => return Probe::Unusable(why.to_string()),
        Some(Ok(d)) => d,
    };
    let mut attrs = [
        attr::MEMORY_TYPE,
        attr::CONTEXT,
        attr::BUFFER_ID,
        attr::IS_MANAGED,
        attr::DEVICE_ORDINAL,
        attr::RANGE_START_ADDR,
        attr::RANGE_SIZE,
    ];
    // Each value in a zeroed 8-byte slot: the driver writes 1 (bool), 4 (unsigned int, int) or 8
    // bytes, little-endian.
    let mut vals = [0u64; 7];
    let mut ptrs: [*mut c_void; 7] = std::array::from_fn(|i| (&mut vals[i]) as *mut u64 as _);
    // SAFETY: seven attributes, each with room for its value. Unlike cuPointerGetAttribute,
    // the plural form answers CUDA_SUCCESS with zeroes for a pointer CUDA does not know.
    let r = unsafe {
        (d.pointer_get_attributes)(
            attrs.len() as c_uint,
            attrs.as_mut_ptr(),
            ptrs.as_mut_ptr(),
            addr,
        )
    };
    match r {
        0 => {}
        // No cuInit yet: there can be no device pointer.
        ERROR_NOT_INITIALIZED | ERROR_DEINITIALIZED => return Probe::NotCuda,
        e => {
            return Probe::Unusable(format!(
                "cuPointerGetAttributes failed with {} ({e})",
                error_name(e)
            ))
        }
    }
    let [mem_type, ctx, buffer_id, managed, device, base, size] = vals;
    if managed & 0xff != 0 {
        return Probe::Host(format!(
            "CUDA managed memory (buffer id {buffer_id}): the CPU can fault it in, so ibv_reg_mr takes it as host memory"
        ));
    }
    match mem_type & 0xffff_ffff {
        MEMORYTYPE_DEVICE if size > 0 => Probe::Device(DeviceAlloc {
            ctx: ctx as usize,
            buffer_id,
            device: device as u32 as i32,
            base,
            size,
        }),
        MEMORYTYPE_HOST => Probe::Host(format!("CUDA pinned host memory (buffer id {buffer_id})")),
        _ => Probe::NotCuda,
    }
}

/// A failed export.
#[derive(Debug)]
pub struct ExportError {
    /// The driver's result code.
    pub code: i32,
    /// What was called.
    pub call: String,
}

impl ExportError {
    /// The errno that registration fails with.
    pub fn errno(&self) -> i32 {
        cuda_errno(self.code)
    }
}

/// The errno for a failed export: what a caller of `ibv_reg_mr` can act on.
pub fn cuda_errno(code: i32) -> i32 {
    match code {
        ERROR_INVALID_VALUE => libc::EINVAL,
        ERROR_OUT_OF_MEMORY => libc::ENOMEM,
        ERROR_NOT_PERMITTED => libc::EPERM,
        ERROR_NOT_SUPPORTED => libc::EOPNOTSUPP,
        _ => libc::EIO,
    }
}

/// Exports `[start, start + len)` of `alloc` as a dma-buf fd (its own context made current
/// around the call).
pub fn export(alloc: &DeviceAlloc, start: u64, len: u64) -> Result<OwnedFd, ExportError> {
    let d = match driver() {
        Some(Ok(d)) => d,
        _ => {
            return Err(ExportError {
                code: ERROR_NOT_INITIALIZED,
                call: "loading libcuda".into(),
            })
        }
    };
    let call = format!(
        "cuMemGetHandleForAddressRange({start:#x}, {len}, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0)"
    );
    let ctx = alloc.ctx as CuContext;
    // SAFETY: pushing the allocation's own context (from the driver) for this thread.
    if !ctx.is_null() {
        let r = unsafe { (d.ctx_push)(ctx) };
        if r != 0 {
            return Err(ExportError {
                code: r,
                call: format!("cuCtxPushCurrent({ctx:?})"),
            });
        }
    }
    let mut fd: c_int = -1;
    // SAFETY: for the DMA_BUF_FD handle type the driver writes an int fd through `handle`.
    let r = unsafe {
        (d.get_handle)(
            (&mut fd) as *mut c_int as *mut c_void,
            start,
            len as usize,
            HANDLE_TYPE_DMA_BUF_FD,
            0,
        )
    };
    if !ctx.is_null() {
        let mut old: CuContext = std::ptr::null_mut();
        // SAFETY: pops what was pushed above.
        unsafe { (d.ctx_pop)(&mut old) };
    }
    if r != 0 || fd < 0 {
        return Err(ExportError { code: r, call });
    }
    // SAFETY: a new fd from the driver, owned by us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn export_range_is_whole_pages() {
        let a = DeviceAlloc {
            ctx: 1,
            buffer_id: 1,
            device: 0,
            base: 0x7f00_0020_0000,
            size: 4096,
        };
        assert_eq!(a.export_range(4096), (0x7f00_0020_0000, 4096));
        let b = DeviceAlloc {
            base: 0x7f00_0020_0200,
            size: 100,
            ..a
        };
        assert_eq!(b.export_range(4096), (0x7f00_0020_0000, 4096));
        let c = DeviceAlloc {
            base: 0x7f00_0020_0f00,
            size: 0x200,
            ..a
        };
        assert_eq!(c.export_range(4096), (0x7f00_0020_0000, 8192));
        let big = DeviceAlloc {
            base: 0x7e00_0000_0000,
            size: 64 << 30,
            ..a
        };
        assert_eq!(big.export_range(4096), (0x7e00_0000_0000, 64 << 30));
    }

    #[test]
    fn finds_a_loaded_library_by_file_name() {
        // Nothing called libcuda here; the walk sees the loaded objects and remembers the
        // loader's count, and a second walk with nothing loaded since returns at once.
        assert!(loaded_libcuda().is_none());
        let adds = ADDS_WITHOUT_CUDA.load(Ordering::Relaxed);
        assert_ne!(adds, u64::MAX);
        assert!(loaded_libcuda().is_none());
        assert_eq!(ADDS_WITHOUT_CUDA.load(Ordering::Relaxed), adds);
    }

    #[test]
    fn errnos_for_driver_errors() {
        assert_eq!(cuda_errno(ERROR_INVALID_VALUE), libc::EINVAL);
        assert_eq!(cuda_errno(ERROR_NOT_SUPPORTED), libc::EOPNOTSUPP);
        assert_eq!(cuda_errno(ERROR_OUT_OF_MEMORY), libc::ENOMEM);
        assert_eq!(cuda_errno(ERROR_NOT_PERMITTED), libc::EPERM);
        assert_eq!(cuda_errno(999), libc::EIO);
    }

    #[test]
    fn without_libcuda_nothing_is_cuda() {
        // The test binary does not link libcuda, and this library never loads it.
        let v = [0u8; 64];
        if driver().is_none() {
            assert_eq!(probe(v.as_ptr() as u64), Probe::NotCuda);
        }
        assert!(
            loaded_libcuda().is_none(),
            "probing must not have loaded libcuda"
        );
        // SAFETY: RTLD_NOLOAD loads nothing.
        let h =
            unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
        assert!(h.is_null(), "probing must not have loaded libcuda");
    }
}
