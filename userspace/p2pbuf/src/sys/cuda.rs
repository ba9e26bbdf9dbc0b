//! Unsafe CUDA driver calls (through cudarc, loaded at run time), wrapped
//! in RAII types. [`crate::cuda`] builds the public API on these.
//!
//! cudarc panics if `libcuda.so` is missing or lacks a symbol when a
//! function is first used; [`load`] checks both up front so that the rest of
//! this module never reaches those panics.

use std::ffi::c_int;
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::Arc;

use cudarc::driver::result::{self, DriverError};
use cudarc::driver::sys;

pub(crate) use sys::CUdevice_attribute as Attr;

/// Every driver symbol this module calls.
const SYMBOLS: &[&str] = &[
    "cuInit",
    "cuDriverGetVersion",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceGetName",
    "cuDeviceGetAttribute",
    "cuDeviceTotalMem_v2",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxSetCurrent",
    "cuCtxSynchronize",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemsetD8_v2",
    "cuMemcpyDtoH_v2",
    "cuMemGetHandleForAddressRange",
    "cuGetErrorName",
    "cuGetErrorString",
];

/// Why the driver library cannot be used.
pub(crate) enum LoadError {
    /// No `libcuda.so` could be opened.
    NoLibrary(Vec<String>),
    /// It was opened but lacks these symbols (driver too old).
    MissingSymbols(Vec<&'static str>),
}

/// Proof that the driver library is loaded with every symbol we use.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Driver(());

/// Open the driver library and check its symbols.
pub(crate) fn load() -> Result<Driver, LoadError> {
    // SAFETY: only tries `dlopen` of the candidate names.
    if !unsafe { sys::is_culib_present() } {
        return Err(LoadError::NoLibrary(cudarc::get_lib_name_candidates(
            "cuda",
        )));
    }
    // SAFETY: `is_culib_present` just opened one of the same candidates,
    // so `culib` does not reach its panic.
    let lib = unsafe { sys::culib() };
    let missing: Vec<&'static str> = SYMBOLS
        .iter()
        .copied()
        // SAFETY: only looks the symbol up; the pointer is never called.
        .filter(|s| unsafe { lib.get::<*const ()>(s.as_bytes()) }.is_err())
        .collect();
    if !missing.is_empty() {
        return Err(LoadError::MissingSymbols(missing));
    }
    Ok(Driver(()))
}

impl Driver {
    pub(crate) fn init(self) -> Result<(), DriverError> {
        result::init()
    }

    pub(crate) fn driver_version(self) -> Result<i32, DriverError> {
        let mut v: c_int = 0;
        // SAFETY: writes one int.
        unsafe { sys::cuDriverGetVersion(&mut v).result()? };
        Ok(v)
    }

    pub(crate) fn device_count(self) -> Result<i32, DriverError> {
        result::device::get_count()
    }

    pub(crate) fn device(self, ordinal: i32) -> Result<Device, DriverError> {
        Ok(Device(result::device::get(ordinal)?))
    }

    pub(crate) fn error_name(self, e: DriverError) -> (String, String) {
        let name = e
            .error_name()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|_| format!("{:?}", e.0));
        let desc = e
            .error_string()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        (name, desc)
    }
}

/// A device handle from `cuDeviceGet`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Device(sys::CUdevice);

impl Device {
    pub(crate) fn name(self) -> Result<String, DriverError> {
        result::device::get_name(self.0)
    }

    pub(crate) fn attribute(self, a: Attr) -> Result<i32, DriverError> {
        // SAFETY: the device came from cuDeviceGet.
        unsafe { result::device::get_attribute(self.0, a) }
    }

    pub(crate) fn total_mem(self) -> Result<usize, DriverError> {
        // SAFETY: the device came from cuDeviceGet.
        unsafe { result::device::total_mem(self.0) }
    }

    /// Retain the primary context and make it current on this thread.
    pub(crate) fn primary_context(self) -> Result<Arc<PrimaryCtx>, DriverError> {
        // SAFETY: the device came from cuDeviceGet; the context is released
        // exactly once, in PrimaryCtx::drop.
        let ctx = unsafe { result::primary_ctx::retain(self.0)? };
        let pc = PrimaryCtx { dev: self.0, ctx };
        pc.make_current()?;
        Ok(Arc::new(pc))
    }
}

/// A retained primary context, released on drop.
#[derive(Debug)]
pub(crate) struct PrimaryCtx {
    dev: sys::CUdevice,
    ctx: sys::CUcontext,
}

impl PrimaryCtx {
    pub(crate) fn make_current(&self) -> Result<(), DriverError> {
        // SAFETY: the context is retained for as long as `self` lives.
        unsafe { result::ctx::set_current(self.ctx) }
    }

    /// `cuMemAlloc(size)`; freed when the returned value drops.
    pub(crate) fn alloc(self: &Arc<Self>, size: usize) -> Result<DeviceAlloc, DriverError> {
        self.make_current()?;
        // SAFETY: plain allocation in the current (our) context; the
        // memory is only reached through the driver.
        let ptr = unsafe { result::malloc_sync(size)? };
        Ok(DeviceAlloc {
            ctx: Arc::clone(self),
            ptr,
            size,
        })
    }
}

impl Drop for PrimaryCtx {
    fn drop(&mut self) {
        // SAFETY: balances the retain in `primary_context`.
        let _ = unsafe { result::primary_ctx::release(self.dev) };
    }
}

// SAFETY: a CUDA context may be made current on any thread, and every use
// here makes it current first.
unsafe impl Send for PrimaryCtx {}
// SAFETY: as above; the driver API is thread-safe.
unsafe impl Sync for PrimaryCtx {}

/// Device memory from `cuMemAlloc`, freed on drop.
#[derive(Debug)]
pub(crate) struct DeviceAlloc {
    ctx: Arc<PrimaryCtx>,
    ptr: sys::CUdeviceptr,
    size: usize,
}

impl DeviceAlloc {
    pub(crate) fn ptr(&self) -> u64 {
        self.ptr
    }

    pub(crate) fn size(&self) -> usize {
        self.size
    }

    /// `cuMemsetD8` over `[offset, offset+len)`, then synchronise.
    pub(crate) fn fill(&self, offset: usize, len: usize, byte: u8) -> Result<(), DriverError> {
        assert!(offset.checked_add(len).is_some_and(|e| e <= self.size));
        self.ctx.make_current()?;
        // SAFETY: the range is inside the allocation (asserted above).
        unsafe { result::memset_d8_sync(self.ptr + offset as u64, byte, len)? };
        result::ctx::synchronize()
    }

    /// Copy `out.len()` bytes at `offset` to the host.
    pub(crate) fn read(&self, offset: usize, out: &mut [u8]) -> Result<(), DriverError> {
        assert!(offset
            .checked_add(out.len())
            .is_some_and(|e| e <= self.size));
        self.ctx.make_current()?;
        // SAFETY: the source range is inside the allocation; `out` is a
        // valid host buffer of that length.
        unsafe { result::memcpy_dtoh_sync(out, self.ptr + offset as u64) }
    }

    /// `cuMemGetHandleForAddressRange(&fd, ptr+offset, len,
    /// CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, flags)`: a new dma-buf fd for
    /// the range. `pcie` asks for
    /// `CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE` (drivers for CUDA
    /// 12.8 and later).
    pub(crate) fn export_dmabuf(
        &self,
        offset: usize,
        len: usize,
        pcie: bool,
    ) -> Result<OwnedFd, DriverError> {
        assert!(offset.checked_add(len).is_some_and(|e| e <= self.size));
        self.ctx.make_current()?;
        let mut fd: c_int = -1;
        let flags = if pcie {
            sys::CUmemRangeFlags::CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE as u64
        } else {
            0
        };
        // SAFETY: for the DMA_BUF_FD handle type the driver writes an int
        // fd through `handle`; the range is inside our allocation.
        unsafe {
            sys::cuMemGetHandleForAddressRange(
                (&mut fd as *mut c_int).cast(),
                self.ptr + offset as u64,
                len,
                sys::CUmemRangeHandleType::CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
                flags,
            )
            .result()?;
        }
        if fd < 0 {
            return Err(DriverError(sys::CUresult::CUDA_ERROR_INVALID_VALUE));
        }
        // SAFETY: on success the driver returned a new fd that this process
        // owns and nobody else holds.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }
}

impl Drop for DeviceAlloc {
    fn drop(&mut self) {
        let _ = self.ctx.make_current();
        // SAFETY: allocated by cuMemAlloc in this context, freed once.
        let _ = unsafe { result::free_sync(self.ptr) };
    }
}
