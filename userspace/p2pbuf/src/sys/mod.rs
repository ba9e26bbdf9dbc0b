//! The only place in the crate with `unsafe` code.
//!
//! Everything here is a thin wrapper over one system call (or, in
//! [`cuda`], one driver call) that upholds the call's contract and hands
//! back an owned, safe value. The public types in the rest of the crate are
//! built on these.
//!
//! uAPI sources:
//! - `struct dma_buf_sync` and the `DMA_BUF_SYNC_*` flags:
//!   `include/uapi/linux/dma-buf.h`.
//! - `struct udmabuf_create` and `UDMABUF_FLAGS_CLOEXEC`:
//!   `include/uapi/linux/udmabuf.h`.
//! - `DMA_BUF_MAGIC`: `include/uapi/linux/magic.h`.
//! - `DMA_BUF_SET_NAME`: `include/uapi/linux/dma-buf.h` (its argument is the string).
//!
//! The request numbers (`DMA_BUF_IOCTL_SYNC`, `UDMABUF_CREATE`) come from
//! `linux-raw-sys`, which generates them from those headers. `linux-raw-sys`
//! does not carry the two argument structs, so they are written out below;
//! the compile-time assertions check them against the generated request
//! numbers (which encode the struct size), using rustix's opcode helpers.

#[cfg(feature = "cuda")]
pub(crate) mod cuda;

use std::ffi::c_void;
use std::os::fd::{BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;

use rustix::io::Errno;
use rustix::ioctl::{opcode, Ioctl, IoctlOutput, Opcode};
use rustix::mm::{MapFlags, ProtFlags};

/// `DMA_BUF_MAGIC` (`include/uapi/linux/magic.h`): `f_type` of the
/// filesystem every dma-buf file lives in.
pub(crate) const DMA_BUF_MAGIC: u64 = linux_raw_sys::general::DMA_BUF_MAGIC as u64;

/// `struct dma_buf_sync` from `include/uapi/linux/dma-buf.h`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct DmaBufSync {
    flags: u64,
}

/// `DMA_BUF_SYNC_READ` (`include/uapi/linux/dma-buf.h`).
#[allow(clippy::identity_op)] // written as in the header
pub(crate) const DMA_BUF_SYNC_READ: u64 = 1 << 0;
/// `DMA_BUF_SYNC_WRITE`.
#[allow(clippy::identity_op)]
pub(crate) const DMA_BUF_SYNC_WRITE: u64 = 2 << 0;
/// `DMA_BUF_SYNC_START`.
#[allow(clippy::identity_op)]
pub(crate) const DMA_BUF_SYNC_START: u64 = 0 << 2;
/// `DMA_BUF_SYNC_END`.
pub(crate) const DMA_BUF_SYNC_END: u64 = 1 << 2;

/// `DMA_BUF_IOCTL_SYNC`, generated from the header by linux-raw-sys.
const DMA_BUF_IOCTL_SYNC: Opcode = linux_raw_sys::ioctl::DMA_BUF_IOCTL_SYNC as Opcode;
// `_IOW(DMA_BUF_BASE = 'b', 0, struct dma_buf_sync)`: same number, so the
// struct above has the header's size.
const _: () = assert!(opcode::write::<DmaBufSync>(b'b', 0) == DMA_BUF_IOCTL_SYNC);

/// `struct udmabuf_create` from `include/uapi/linux/udmabuf.h`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct UdmabufCreate {
    memfd: u32,
    flags: u32,
    offset: u64,
    size: u64,
}

/// `UDMABUF_FLAGS_CLOEXEC` (`include/uapi/linux/udmabuf.h`).
const UDMABUF_FLAGS_CLOEXEC: u32 = 0x01;

/// `UDMABUF_CREATE`, generated from the header by linux-raw-sys.
const UDMABUF_CREATE: Opcode = linux_raw_sys::ioctl::UDMABUF_CREATE as Opcode;
// `_IOW('u', 0x42, struct udmabuf_create)`.
const _: () = assert!(opcode::write::<UdmabufCreate>(b'u', 0x42) == UDMABUF_CREATE);

/// `ioctl(fd, DMA_BUF_IOCTL_SYNC, &{flags})`, retried on EINTR and EAGAIN
/// as the kernel documentation asks.
pub(crate) fn dma_buf_sync(fd: BorrowedFd<'_>, flags: u64) -> Result<(), Errno> {
    loop {
        let arg = DmaBufSync { flags };
        // SAFETY: DMA_BUF_IOCTL_SYNC takes a pointer to a `struct
        // dma_buf_sync` that the kernel only reads; `Setter` passes a
        // pointer to `arg`, whose layout is checked above.
        let r = unsafe {
            rustix::ioctl::ioctl(fd, rustix::ioctl::Setter::<DMA_BUF_IOCTL_SYNC, _>::new(arg))
        };
        match r {
            Err(Errno::INTR) | Err(Errno::AGAIN) => continue,
            other => return other,
        }
    }
}

/// `DMA_BUF_SET_NAME` (`_IOW('b', 1, const char *)`), generated from the header by
/// linux-raw-sys; the argument is the pointer to the name itself.
const DMA_BUF_SET_NAME: Opcode = linux_raw_sys::ioctl::DMA_BUF_SET_NAME_B as Opcode;
const _: () = assert!(opcode::write::<u64>(b'b', 1) == DMA_BUF_SET_NAME);

/// `ioctl(fd, DMA_BUF_SET_NAME, name)`: the kernel copies at most `DMA_BUF_NAME_LEN` (32)
/// bytes of the NUL-terminated string (EINVAL when it has no NUL within them).
pub(crate) fn dma_buf_set_name(fd: BorrowedFd<'_>, name: &std::ffi::CStr) -> Result<(), Errno> {
    // SAFETY: DMA_BUF_SET_NAME takes a pointer to a NUL-terminated string that the kernel
    // only reads (strndup_user) during the call; `name` is one and outlives the call.
    unsafe {
        rustix::ioctl::ioctl(
            fd,
            rustix::ioctl::IntegerSetter::<DMA_BUF_SET_NAME>::new_pointer(
                name.as_ptr() as *mut c_void
            ),
        )
    }
}

/// The `UDMABUF_CREATE` ioctl: the kernel reads the struct and returns a
/// new dma-buf fd as the ioctl's return value.
struct UdmabufCreateIoctl(UdmabufCreate);

// SAFETY: the opcode is UDMABUF_CREATE, the pointer is to a live `struct
// udmabuf_create` (layout checked above) that the kernel only reads, and the
// ioctl's non-negative return value is a new file descriptor that nobody
// else owns.
unsafe impl Ioctl for UdmabufCreateIoctl {
    type Output = OwnedFd;
    const IS_MUTATING: bool = false;

    fn opcode(&self) -> Opcode {
        UDMABUF_CREATE
    }

    fn as_ptr(&mut self) -> *mut c_void {
        (&mut self.0 as *mut UdmabufCreate).cast()
    }

    unsafe fn output_from_ptr(out: IoctlOutput, _: *mut c_void) -> rustix::io::Result<OwnedFd> {
        if out < 0 {
            return Err(Errno::INVAL);
        }
        // SAFETY: see the impl's comment: `out` is a fresh fd.
        Ok(unsafe { OwnedFd::from_raw_fd(out) })
    }
}

/// `ioctl(/dev/udmabuf, UDMABUF_CREATE, {memfd, CLOEXEC, offset, size})`.
pub(crate) fn udmabuf_create(
    dev: BorrowedFd<'_>,
    memfd: BorrowedFd<'_>,
    offset: u64,
    size: u64,
) -> Result<OwnedFd, Errno> {
    let memfd = u32::try_from(std::os::fd::AsRawFd::as_raw_fd(&memfd)).map_err(|_| Errno::BADF)?;
    let arg = UdmabufCreate {
        memfd,
        flags: UDMABUF_FLAGS_CLOEXEC,
        offset,
        size,
    };
    // SAFETY: see `UdmabufCreateIoctl`.
    unsafe { rustix::ioctl::ioctl(dev, UdmabufCreateIoctl(arg)) }
}

/// `struct dma_heap_allocation_data` from `include/uapi/linux/dma-heap.h`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct DmaHeapAllocationData {
    len: u64,
    fd: u32,
    fd_flags: u32,
    heap_flags: u64,
}

/// `DMA_HEAP_IOCTL_ALLOC`, generated from the header by linux-raw-sys.
const DMA_HEAP_IOCTL_ALLOC: Opcode = linux_raw_sys::ioctl::DMA_HEAP_IOCTL_ALLOC as Opcode;
// `_IOWR('H', 0x0, struct dma_heap_allocation_data)`.
const _: () = assert!(opcode::read_write::<DmaHeapAllocationData>(b'H', 0) == DMA_HEAP_IOCTL_ALLOC);

/// `ioctl(fd, OPCODE, arg)` for a request that reads and writes (or only reads) its argument
/// in place: `Updater` passes the kernel a pointer to `arg`, valid for the call.
///
/// # Safety
///
/// `OPCODE`'s argument must be a `T`: the kernel reads and writes `size_of::<T>()` bytes.
unsafe fn update<const OPCODE: Opcode, T>(fd: BorrowedFd<'_>, arg: &mut T) -> Result<(), Errno> {
    // SAFETY: the caller's.
    unsafe { rustix::ioctl::ioctl(fd, rustix::ioctl::Updater::<OPCODE, _>::new(arg)) }
}

/// `ioctl(heap, DMA_HEAP_IOCTL_ALLOC, {len, O_RDWR | O_CLOEXEC})`: a new dma-buf of `len`
/// bytes from the heap `heap` (a `/dev/dma_heap/NAME` fd).
pub(crate) fn dma_heap_alloc(heap: BorrowedFd<'_>, len: u64) -> Result<OwnedFd, Errno> {
    let mut arg = DmaHeapAllocationData {
        len,
        fd_flags: (rustix::fs::OFlags::RDWR | rustix::fs::OFlags::CLOEXEC).bits(),
        ..Default::default()
    };
    // SAFETY: DMA_HEAP_IOCTL_ALLOC reads and writes a `struct dma_heap_allocation_data`
    // (layout checked above).
    unsafe { update::<DMA_HEAP_IOCTL_ALLOC, _>(heap, &mut arg) }?;
    // SAFETY: on success the kernel installed a new fd for the buffer in `arg.fd`, owned by
    // nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(arg.fd as RawFd) })
}

/// The p2pbuf exporter's uAPI, generated by bindgen from
/// `include/uapi/linux/p2pbuf.h` (see build.rs).
#[cfg(p2pbuf_uapi)]
#[allow(non_camel_case_types, non_upper_case_globals, dead_code, clippy::all)]
pub(crate) mod uapi {
    include!(concat!(env!("OUT_DIR"), "/p2pbuf_uapi.rs"));
}

/// The request numbers of the p2pbuf uAPI.
#[cfg(p2pbuf_uapi)]
mod request {
    use super::{uapi, Opcode};
    pub(super) const P2PBUF_IOCTL_INFO: Opcode = uapi::P2PBUF_REQUEST_INFO as Opcode;
    pub(super) const P2PBUF_IOCTL_PROVIDER_INFO: Opcode =
        uapi::P2PBUF_REQUEST_PROVIDER_INFO as Opcode;
    pub(super) const P2PBUF_IOCTL_ALLOC: Opcode = uapi::P2PBUF_REQUEST_ALLOC as Opcode;
    pub(super) const P2PBUF_IOCTL_REVOKE: Opcode = uapi::P2PBUF_REQUEST_REVOKE as Opcode;
    pub(super) const P2PBUF_IOCTL_REFUSAL: Opcode = uapi::P2PBUF_REQUEST_REFUSAL as Opcode;
    pub(super) const P2PBUF_DMA_IOCTL_IMPORT: Opcode = uapi::P2PBUF_REQUEST_DMA_IMPORT as Opcode;
    pub(super) const P2PBUF_DMA_IOCTL_RELEASE: Opcode = uapi::P2PBUF_REQUEST_DMA_RELEASE as Opcode;
    pub(super) const P2PBUF_DMA_IOCTL_COPY: Opcode = uapi::P2PBUF_REQUEST_DMA_COPY as Opcode;
}
#[cfg(p2pbuf_uapi)]
use request::*;

// The header's `_IOWR`/`_IOW(P2PBUF_IOCTL_MAGIC, nr, struct ...)`: direction and the size of
// the struct's first version in the number; rustix's encoding of the same must agree (this
// also checks that the generated structs have the sizes the numbers were made with).
#[cfg(p2pbuf_uapi)]
const _: () = {
    const M: u8 = uapi::P2PBUF_IOCTL_MAGIC as u8;
    assert!(opcode::read_write::<uapi::p2pbuf_info>(M, 0x00) == P2PBUF_IOCTL_INFO);
    assert!(
        opcode::read_write::<uapi::p2pbuf_provider_info>(M, 0x01) == P2PBUF_IOCTL_PROVIDER_INFO
    );
    assert!(opcode::read_write::<uapi::p2pbuf_alloc>(M, 0x02) == P2PBUF_IOCTL_ALLOC);
    assert!(opcode::write::<uapi::p2pbuf_revoke>(M, 0x03) == P2PBUF_IOCTL_REVOKE);
    assert!(opcode::read_write::<uapi::p2pbuf_refusal>(M, 0x04) == P2PBUF_IOCTL_REFUSAL);
    assert!(opcode::read_write::<uapi::p2pbuf_dma_import>(M, 0x10) == P2PBUF_DMA_IOCTL_IMPORT);
    assert!(opcode::write::<uapi::p2pbuf_dma_release>(M, 0x11) == P2PBUF_DMA_IOCTL_RELEASE);
    assert!(opcode::read_write::<uapi::p2pbuf_dma_copy>(M, 0x12) == P2PBUF_DMA_IOCTL_COPY);
};

/// The p2pbuf requests whose argument the kernel reads and writes (or only reads) in place, each
/// as `fn name(dev, &mut uapi::struct_name)`.
macro_rules! p2pbuf_ioctls {
    ($($(#[$doc:meta])* fn $name:ident($opcode:ident, $arg:ident);)*) => {$(
        $(#[$doc])*
        #[cfg(p2pbuf_uapi)]
        pub(crate) fn $name(dev: BorrowedFd<'_>, arg: &mut uapi::$arg) -> Result<(), Errno> {
            // SAFETY: the request's argument is this struct, generated from the same header
            // (its size checked against the request number above); the kernel checks `size`.
            unsafe { update::<$opcode, _>(dev, arg) }
        }
    )*};
}

p2pbuf_ioctls! {
    /// `ioctl(/dev/p2pbuf, P2PBUF_IOCTL_INFO, &info)`.
    fn p2pbuf_info(P2PBUF_IOCTL_INFO, p2pbuf_info);
    /// `ioctl(/dev/p2pbuf, P2PBUF_IOCTL_PROVIDER_INFO, &info)`.
    fn p2pbuf_provider_info(P2PBUF_IOCTL_PROVIDER_INFO, p2pbuf_provider_info);
    /// `ioctl(/dev/p2pbuf, P2PBUF_IOCTL_REVOKE, &revoke)` (the kernel only reads it).
    fn p2pbuf_revoke(P2PBUF_IOCTL_REVOKE, p2pbuf_revoke);
    /// `ioctl(/dev/p2pbuf, P2PBUF_IOCTL_REFUSAL, &refusal)`.
    fn p2pbuf_refusal(P2PBUF_IOCTL_REFUSAL, p2pbuf_refusal);
    /// `ioctl(/dev/p2pbuf-dma, P2PBUF_DMA_IOCTL_IMPORT, &import)`.
    fn p2pbuf_dma_import(P2PBUF_DMA_IOCTL_IMPORT, p2pbuf_dma_import);
    /// `ioctl(/dev/p2pbuf-dma, P2PBUF_DMA_IOCTL_RELEASE, &release)` (the kernel only reads it).
    fn p2pbuf_dma_release(P2PBUF_DMA_IOCTL_RELEASE, p2pbuf_dma_release);
}

/// `ioctl(/dev/p2pbuf, P2PBUF_IOCTL_ALLOC, &alloc)`: the new dma-buf fd, owned.
#[cfg(p2pbuf_uapi)]
pub(crate) fn p2pbuf_alloc(
    dev: BorrowedFd<'_>,
    arg: &mut uapi::p2pbuf_alloc,
) -> Result<OwnedFd, Errno> {
    // SAFETY: as in `p2pbuf_ioctls!`, for `struct p2pbuf_alloc`.
    unsafe { update::<P2PBUF_IOCTL_ALLOC, _>(dev, arg) }?;
    if arg.fd < 0 {
        return Err(Errno::BADF);
    }
    // SAFETY: on success the kernel installed a new fd in `arg.fd` for this call, which
    // nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(arg.fd) })
}

/// `ioctl(/dev/p2pbuf-dma, P2PBUF_DMA_IOCTL_COPY, &copy)`: the bytes copied (the ioctl's
/// return value; also in `arg.copied`, which the kernel writes on failure too).
#[cfg(p2pbuf_uapi)]
pub(crate) fn p2pbuf_dma_copy(
    dev: BorrowedFd<'_>,
    arg: &mut uapi::p2pbuf_dma_copy,
) -> Result<u64, Errno> {
    // SAFETY: as in `p2pbuf_ioctls!`, for `struct p2pbuf_dma_copy`.
    unsafe { update::<P2PBUF_DMA_IOCTL_COPY, _>(dev, arg) }?;
    Ok(arg.copied)
}

/// Duplicate a file descriptor number this process inherited (e.g. from a
/// shell redirection `3<...`), with close-on-exec set on the copy.
pub(crate) fn dup_inherited_fd(raw: RawFd) -> Result<OwnedFd, Errno> {
    if raw < 0 {
        return Err(Errno::BADF);
    }
    // SAFETY: the borrow lasts only for the F_DUPFD_CLOEXEC call, which
    // neither closes nor otherwise changes the fd, and fails with EBADF if
    // no such fd is open. The caller owns nothing through the number.
    let fd = unsafe { BorrowedFd::borrow_raw(raw) };
    rustix::io::fcntl_dupfd_cloexec(fd, 0)
}

/// A shared mapping of (part of) a file, unmapped on drop.
#[derive(Debug)]
pub(crate) struct RawMapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this value; moving it to
// another thread is fine, and shared references only give `&[u8]`.
unsafe impl Send for RawMapping {}
// SAFETY: as above.
unsafe impl Sync for RawMapping {}

impl RawMapping {
    /// `mmap(NULL, len, prot, MAP_SHARED, fd, 0)`.
    pub(crate) fn map_shared(fd: BorrowedFd<'_>, len: usize, write: bool) -> Result<Self, Errno> {
        if len == 0 {
            return Err(Errno::INVAL);
        }
        let prot = if write {
            ProtFlags::READ | ProtFlags::WRITE
        } else {
            ProtFlags::READ
        };
        // SAFETY: a new mapping at an address of the kernel's choosing
        // (NULL hint, no MAP_FIXED) cannot alias any existing Rust object.
        let p =
            unsafe { rustix::mm::mmap(std::ptr::null_mut(), len, prot, MapFlags::SHARED, fd, 0) }?;
        let ptr = NonNull::new(p.cast::<u8>()).ok_or(Errno::NOMEM)?;
        Ok(RawMapping { ptr, len })
    }

    /// `mmap(NULL, len, READ | WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)`: zeroed,
    /// page-aligned memory of this process only.
    pub(crate) fn anonymous(len: usize) -> Result<Self, Errno> {
        if len == 0 {
            return Err(Errno::INVAL);
        }
        // SAFETY: a fresh private anonymous mapping at an address of the kernel's choosing
        // (NULL hint, no MAP_FIXED) aliases nothing.
        let p = unsafe {
            rustix::mm::mmap_anonymous(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::PRIVATE,
            )
        }?;
        let ptr = NonNull::new(p.cast::<u8>()).ok_or(Errno::NOMEM)?;
        Ok(RawMapping { ptr, len })
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The first byte, for devices (an RDMA registration) that address the memory.
    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub(crate) fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr..ptr+len` is mapped readable for as long as `self`
        // lives. Other processes or devices may write the memory; the
        // callers bracket access with DMA_BUF_IOCTL_SYNC, the dma-buf
        // protocol for coherent CPU access.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// Only call on a mapping made with `write = true`.
    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as `as_slice`; `&mut self` gives exclusivity within this
        // process, and the mapping was made writable by the caller.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for RawMapping {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly what mmap returned; no slice
        // borrowed from `self` can outlive it.
        let _ = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uapi_values_match_headers() {
        // Values from include/uapi/linux/dma-buf.h and udmabuf.h, as a
        // second check on top of the compile-time opcode assertions.
        assert_eq!(std::mem::size_of::<DmaBufSync>(), 8);
        assert_eq!(std::mem::size_of::<UdmabufCreate>(), 24);
        assert_eq!(DMA_BUF_SYNC_READ | DMA_BUF_SYNC_WRITE, 3);
        assert_eq!(DMA_BUF_SYNC_END, 4);
        assert_eq!(DMA_BUF_MAGIC, 0x444d_4142);
    }

    #[test]
    fn dup_of_closed_fd_is_ebadf() {
        assert_eq!(dup_inherited_fd(-1).unwrap_err(), Errno::BADF);
        assert_eq!(dup_inherited_fd(999_999).unwrap_err(), Errno::BADF);
    }

    #[test]
    fn dup_of_open_fd_works() {
        let f = std::fs::File::open("/proc/self/status").unwrap();
        let d = dup_inherited_fd(std::os::fd::AsRawFd::as_raw_fd(&f)).unwrap();
        drop(f);
        let _ = std::fs::File::from(d);
    }

    #[test]
    fn map_and_unmap_a_memfd() {
        let fd = rustix::fs::memfd_create("t", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        rustix::fs::ftruncate(&fd, 4096).unwrap();
        let mut m = RawMapping::map_shared(std::os::fd::AsFd::as_fd(&fd), 4096, true).unwrap();
        m.as_mut_slice()[10] = 7;
        assert_eq!(m.as_slice()[10], 7);
        assert_eq!(m.len(), 4096);
    }

    #[test]
    fn dma_buf_sync_on_a_non_dmabuf_fails() {
        let f = std::fs::File::open("/proc/self/status").unwrap();
        let e = dma_buf_sync(std::os::fd::AsFd::as_fd(&f), DMA_BUF_SYNC_READ).unwrap_err();
        assert!(e == Errno::NOTTY || e == Errno::INVAL, "{e:?}");
    }
}
