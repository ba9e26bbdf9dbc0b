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
type GetAddressRange = unsafe extern "C" fn(*mut CuDevicePtr, *mut usize, CuDevicePtr) -> CuResult;
type PrimaryCtxRetain = unsafe extern "C" fn(*mut CuContext, c_int) -> CuResult;
type PrimaryCtxRelease = unsafe extern "C" fn(c_int) -> CuResult;

/// `CUpointer_attribute` values (cuda.h).
mod attr {
    pub const CONTEXT: i32 = 1;
    pub const MEMORY_TYPE: i32 = 2;
    pub const BUFFER_ID: i32 = 7;
    pub const IS_MANAGED: i32 = 8;
    pub const DEVICE_ORDINAL: i32 = 9;
    pub const RANGE_START_ADDR: i32 = 11;
    pub const RANGE_SIZE: i32 = 12;
    /// CUDA 12.x: "a process-wide unique id corresponding to the physical allocation".
    pub const MEMORY_BLOCK_ID: i32 = 20;
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
    get_address_range: GetAddressRange,
    primary_retain: PrimaryCtxRetain,
    primary_release: PrimaryCtxRelease,
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
    // The symbol `name` as a function pointer of type `ty`; a missing one ends the closure
    // below with its name.
    macro_rules! load {
        ($name:expr, $ty:ty) => {
            std::mem::transmute::<*mut c_void, $ty>(sym($name)?)
        };
    }
    let d = (|| -> Result<Driver, String> {
        // SAFETY: the driver API's signatures (cuda.h), for symbols of that name.
        unsafe {
            Ok(Driver {
                pointer_get_attributes: load!(c"cuPointerGetAttributes", PointerGetAttributes),
                get_handle: load!(c"cuMemGetHandleForAddressRange", GetHandleForAddressRange),
                ctx_push: load!(c"cuCtxPushCurrent_v2", CtxPushCurrent),
                ctx_pop: load!(c"cuCtxPopCurrent_v2", CtxPopCurrent),
                error_name: load!(c"cuGetErrorName", GetErrorName),
                get_address_range: load!(c"cuMemGetAddressRange_v2", GetAddressRange),
                primary_retain: load!(c"cuDevicePrimaryCtxRetain", PrimaryCtxRetain),
                primary_release: load!(c"cuDevicePrimaryCtxRelease_v2", PrimaryCtxRelease),
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
    /// The start of what holds the pointer: `CU_POINTER_ATTRIBUTE_RANGE_START_ADDR`, or for
    /// CUDA VMM memory the mapping's base (`cuMemGetAddressRange`).
    pub base: u64,
    /// Its size (`CU_POINTER_ATTRIBUTE_RANGE_SIZE`, or the mapping's).
    pub size: u64,
    /// For CUDA VMM memory, the reserved range (`RANGE_START_ADDR`, `RANGE_SIZE`) that holds the
    /// mapping `base`/`size` and more; `None` for other memory.
    pub reservation: Option<(u64, u64)>,
    /// For VMM memory, `CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID` where the driver has it (the
    /// physical allocation mapped there: another allocation mapped at the same address is
    /// another id), else 0.
    pub block_id: u64,
}

/// What holds `addr`, from the pointer's range (`RANGE_START_ADDR`, `RANGE_SIZE`) and the
/// mapping that `cuMemGetAddressRange` reports: the mapping where it holds `addr` and lies
/// strictly inside the range (CUDA VMM memory, where the range is the whole reservation), else
/// the range itself (`cuMemAlloc`, pool memory: the two agree, or the mapping is not inside).
/// The second value is the reservation when the mapping was chosen.
pub fn holding_range(
    range: (u64, u64),
    mapping: Option<(u64, u64)>,
    addr: u64,
) -> ((u64, u64), Option<(u64, u64)>) {
    let end = |(b, s): (u64, u64)| b.saturating_add(s);
    match mapping {
        Some(m)
            if m.1 > 0
                && m != range
                && m.0 <= addr
                && addr < end(m)
                && range.0 <= m.0
                && end(m) <= end(range) =>
        {
            (m, Some(range))
        }
        _ => (range, None),
    }
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
    /// Inside a CUDA VMM reservation, where nothing is mapped: registration fails (EFAULT, as
    /// `ibv_reg_mr` of unmapped memory does).
    Unmapped(String),
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
        MEMORYTYPE_DEVICE if size > 0 => locate(
            d,
            DeviceAlloc {
                ctx: ctx as usize,
                buffer_id,
                device: device as u32 as i32,
                base,
                size,
                reservation: None,
                block_id: 0,
            },
            addr,
        ),
        MEMORYTYPE_HOST => Probe::Host(format!("CUDA pinned host memory (buffer id {buffer_id})")),
        _ => Probe::NotCuda,
    }
}

/// Narrows `a` (what `cuPointerGetAttributes` says) to the VMM mapping that holds `addr`, if
/// it is VMM memory (see [`holding_range`]).
fn locate(d: &Driver, a: DeviceAlloc, addr: u64) -> Probe {
    let mapping = Current::enter(d, a.ctx, a.device).and_then(|_cur| {
        let (mut base, mut size): (CuDevicePtr, usize) = (0, 0);
        // SAFETY: the driver writes the mapping's base and size.
        match unsafe { (d.get_address_range)(&mut base, &mut size, addr) } {
            0 => Ok((base, size as u64)),
            e => Err(ExportError {
                code: e,
                call: format!("cuMemGetAddressRange({addr:#x})"),
            }),
        }
    });
    let found = mapping.as_ref().ok().copied();
    let ((base, size), reservation) = holding_range((a.base, a.size), found, addr);
    if a.ctx == 0 && found.is_none_or(|(b, s)| addr < b || addr - b >= s) {
        // VMM memory (no owning context) that CUDA cannot place in a mapping.
        let why = match mapping {
            Err(e) => format!("{} failed with {} ({})", e.call, error_name(e.code), e.code),
            Ok((b, s)) => format!("cuMemGetAddressRange says {b:#x}+{s}, which does not hold it"),
        };
        return Probe::Unmapped(format!(
            "the address is in a CUDA virtual address reservation ({:#x}+{}) but not in a mapping: {why}; map it (cuMemMap, cuMemSetAccess) before registering",
            a.base, a.size
        ));
    }
    let block_id = match reservation {
        Some(_) => memory_block_id(d, addr),
        None => 0,
    };
    Probe::Device(DeviceAlloc {
        base,
        size,
        reservation,
        block_id,
        ..a
    })
}

/// `CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID`, or 0 where the driver does not know it (asked
/// alone: an attribute unknown to an older driver fails the whole call).
fn memory_block_id(d: &Driver, addr: u64) -> u64 {
    let mut a = [attr::MEMORY_BLOCK_ID];
    let mut v = 0u64;
    let mut p = [(&mut v) as *mut u64 as *mut c_void];
    // SAFETY: one attribute, an 8-byte slot for its value.
    match unsafe { (d.pointer_get_attributes)(1, a.as_mut_ptr(), p.as_mut_ptr(), addr) } {
        0 => v,
        _ => 0,
    }
}

/// A context made current on this thread for a driver call, popped (and a retained primary
/// context released) when dropped: the thread's own state is as it was before.
struct Current<'a> {
    d: &'a Driver,
    primary: Option<c_int>,
}

impl<'a> Current<'a> {
    /// Pushes the allocation's own context, or for memory without one (CUDA VMM memory) the
    /// primary context of its device, retained for the call.
    fn enter(d: &'a Driver, ctx: usize, device: i32) -> Result<Current<'a>, ExportError> {
        let fail = |code, call: String| Err(ExportError { code, call });
        if ctx != 0 {
            // SAFETY: the allocation's own context, from the driver.
            return match unsafe { (d.ctx_push)(ctx as CuContext) } {
                0 => Ok(Current { d, primary: None }),
                r => fail(r, format!("cuCtxPushCurrent({ctx:#x})")),
            };
        }
        let mut p: CuContext = std::ptr::null_mut();
        // SAFETY: the driver writes the device's primary context.
        let r = unsafe { (d.primary_retain)(&mut p, device) };
        if r != 0 {
            return fail(
                r,
                format!("cuDevicePrimaryCtxRetain(device {device}) (the memory has no owning context; its device's primary context is used)"),
            );
        }
        // SAFETY: the context just retained.
        match unsafe { (d.ctx_push)(p) } {
            0 => Ok(Current {
                d,
                primary: Some(device),
            }),
            r => {
                // SAFETY: releases the reference taken above.
                unsafe { (d.primary_release)(device) };
                fail(
                    r,
                    format!("cuCtxPushCurrent(primary context of device {device})"),
                )
            }
        }
    }
}

impl Drop for Current<'_> {
    fn drop(&mut self) {
        let mut old: CuContext = std::ptr::null_mut();
        // SAFETY: pops what `enter` pushed, then drops the reference it took.
        unsafe {
            (self.d.ctx_pop)(&mut old);
            if let Some(dev) = self.primary {
                (self.d.primary_release)(dev);
            }
        }
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

/// Exports `[start, start + len)` of `alloc` as a dma-buf fd (its own context, or for memory
/// without one its device's primary context, made current around the call).
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
    let cur = Current::enter(d, alloc.ctx, alloc.device)?;
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
    drop(cur);
    if r != 0 || fd < 0 {
        return Err(ExportError { code: r, call });
    }
    // SAFETY: a new fd from the driver, owned by us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What this file types by hand (it must not load libcuda, and takes results as plain
    /// ints, where cudarc's enum would be undefined behaviour for a code newer than its
    /// cuda.h) is the driver ABI of the binding p2pbuf's CUDA path uses: cudarc's, generated
    /// from cuda.h. Every constant has cuda.h's value, the pointer type is cuda.h's, and every
    /// symbol `driver()` looks up is a function there.
    #[test]
    fn driver_abi_is_cudas() {
        use cudarc::driver::sys::{
            self, CUmemRangeHandleType as H, CUmemorytype as M, CUpointer_attribute as A,
            CUresult as R,
        };
        let attrs = [
            (attr::CONTEXT, A::CU_POINTER_ATTRIBUTE_CONTEXT),
            (attr::MEMORY_TYPE, A::CU_POINTER_ATTRIBUTE_MEMORY_TYPE),
            (attr::BUFFER_ID, A::CU_POINTER_ATTRIBUTE_BUFFER_ID),
            (attr::IS_MANAGED, A::CU_POINTER_ATTRIBUTE_IS_MANAGED),
            (attr::DEVICE_ORDINAL, A::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL),
            (
                attr::RANGE_START_ADDR,
                A::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
            ),
            (attr::RANGE_SIZE, A::CU_POINTER_ATTRIBUTE_RANGE_SIZE),
            (
                attr::MEMORY_BLOCK_ID,
                A::CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID,
            ),
        ];
        for (ours, cuda_h) in attrs {
            assert_eq!(ours, cuda_h as i32, "{cuda_h:?}");
        }
        assert_eq!(MEMORYTYPE_HOST, M::CU_MEMORYTYPE_HOST as u64);
        assert_eq!(MEMORYTYPE_DEVICE, M::CU_MEMORYTYPE_DEVICE as u64);
        assert_eq!(
            HANDLE_TYPE_DMA_BUF_FD,
            H::CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD as c_int
        );
        let errors = [
            (ERROR_INVALID_VALUE, R::CUDA_ERROR_INVALID_VALUE),
            (ERROR_OUT_OF_MEMORY, R::CUDA_ERROR_OUT_OF_MEMORY),
            (ERROR_NOT_INITIALIZED, R::CUDA_ERROR_NOT_INITIALIZED),
            (ERROR_DEINITIALIZED, R::CUDA_ERROR_DEINITIALIZED),
            (ERROR_NOT_PERMITTED, R::CUDA_ERROR_NOT_PERMITTED),
            (ERROR_NOT_SUPPORTED, R::CUDA_ERROR_NOT_SUPPORTED),
        ];
        for (ours, cuda_h) in errors {
            assert_eq!(ours, cuda_h as i32, "{cuda_h:?}");
        }
        let _same_type: sys::CUdeviceptr = 0 as CuDevicePtr;
        // The symbols of `driver()`, by cuda.h's own names (a rename there fails the build).
        macro_rules! symbols {
            ($($f:ident),*) => { [$((stringify!($f), sys::$f as *const () as usize)),*] };
        }
        let symbols = symbols!(
            cuPointerGetAttributes,
            cuMemGetHandleForAddressRange,
            cuCtxPushCurrent_v2,
            cuCtxPopCurrent_v2,
            cuGetErrorName,
            cuMemGetAddressRange_v2,
            cuDevicePrimaryCtxRetain,
            cuDevicePrimaryCtxRelease_v2
        );
        let src = include_str!("cuda.rs");
        for (name, f) in symbols {
            assert_ne!(f, 0);
            let lit = format!("load!(c\"{name}\"");
            assert!(src.contains(&lit), "driver() no longer loads {name}");
        }
        assert_eq!(src.matches("load!(c\"").count(), symbols.len());
    }

    #[test]
    fn export_range_is_whole_pages() {
        let a = DeviceAlloc {
            ctx: 1,
            buffer_id: 1,
            device: 0,
            base: 0x7f00_0020_0000,
            size: 4096,
            reservation: None,
            block_id: 0,
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
    fn vmm_mapping_is_exported_not_the_reservation() {
        const G: u64 = 2 << 20;
        let res = (0x7f00_0000_0000, 8 * G);
        // Chunk 1 of a reservation of 8, mapped alone: the mapping.
        let m = (res.0 + G, G);
        assert_eq!(holding_range(res, Some(m), m.0 + 4096), (m, Some(res)));
        assert_eq!(holding_range(res, Some(m), m.0), (m, Some(res)));
        // cuMemAlloc: the mapping is the range.
        assert_eq!(holding_range(res, Some(res), res.0 + 5), (res, None));
        // Nothing reported, or a mapping that does not hold the address, or that is not
        // inside the range (pool memory, if the driver reported the pool's mapping): the range.
        assert_eq!(holding_range(res, None, res.0), (res, None));
        assert_eq!(holding_range(res, Some(m), m.0 + G), (res, None));
        assert_eq!(holding_range(res, Some(m), m.0 - 1), (res, None));
        let pool = (res.0 - G, 16 * G);
        assert_eq!(holding_range(res, Some(pool), res.0), (res, None));
        assert_eq!(holding_range(res, Some((m.0, 0)), m.0), (res, None));
        // The last mapping of the reservation.
        let last = (res.0 + 7 * G, G);
        assert_eq!(
            holding_range(res, Some(last), res.0 + 8 * G - 1),
            (last, Some(res))
        );
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
