// SPDX-License-Identifier: GPL-2.0

//! The ioctl argument structs of the DMA engine section of `include/uapi/linux/p2pbuf.h`, and
//! the copy rules they share with the exporter's.
//!
//! Every struct starts with a `u32` size that the caller sets to the size it was compiled with.
//! [`read_arg`] accepts any size from [`ArgStruct::MIN_SIZE`] upwards: a shorter struct from an
//! older caller is zero-extended, a longer one from a newer caller must have a zero tail
//! (`E2BIG` otherwise), as `copy_struct_from_user()` does. [`write_arg`] writes back at most
//! as many bytes as the caller said it has.

use kernel::{
    prelude::*,
    transmute::{AsBytes, FromBytes},
    uaccess::{UserPtr, UserSlice},
};

/// `P2PBUF_IOCTL_MAGIC`.
const MAGIC: u32 = 0xBB;

/// `_IO(P2PBUF_IOCTL_MAGIC, nr)`.
const fn io(nr: u32) -> u32 {
    kernel::ioctl::_IO(MAGIC, nr)
}

/// `P2PBUF_DMA_IOCTL_IMPORT`.
pub(crate) const IOCTL_IMPORT: u32 = io(0x10);
/// `P2PBUF_DMA_IOCTL_RELEASE`.
pub(crate) const IOCTL_RELEASE: u32 = io(0x11);
/// `P2PBUF_DMA_IOCTL_COPY`.
pub(crate) const IOCTL_COPY: u32 = io(0x12);

/// `P2PBUF_DMA_MAP_UNKNOWN`.
pub(crate) const MAP_UNKNOWN: u32 = 0;
/// `P2PBUF_DMA_MAP_HOST_MEMORY`.
pub(crate) const MAP_HOST_MEMORY: u32 = 1;
/// `P2PBUF_DMA_MAP_BUS_ADDR`.
pub(crate) const MAP_BUS_ADDR: u32 = 2;
/// `P2PBUF_DMA_MAP_THRU_HOST_BRIDGE`.
pub(crate) const MAP_THRU_HOST_BRIDGE: u32 = 3;

/// `P2PBUF_DMA_COPY_MAX`.
pub(crate) const COPY_MAX: u64 = 1 << 30;

/// `struct p2pbuf_dma_import`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct Import {
    pub(crate) size: u32,
    pub(crate) fd: i32,
    pub(crate) flags: u32,
    pub(crate) handle: u32,
    pub(crate) length: u64,
    pub(crate) map_type: u32,
    pub(crate) nr_ranges: u32,
}

/// `struct p2pbuf_dma_release`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct Release {
    pub(crate) size: u32,
    pub(crate) handle: u32,
    pub(crate) flags: u32,
    pub(crate) reserved: u32,
}

/// `struct p2pbuf_dma_copy`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct Copy {
    pub(crate) size: u32,
    pub(crate) flags: u32,
    pub(crate) src_handle: u32,
    pub(crate) dst_handle: u32,
    pub(crate) src_offset: u64,
    pub(crate) dst_offset: u64,
    pub(crate) len: u64,
    pub(crate) copied: u64,
    pub(crate) timeout_ms: u32,
    pub(crate) nr_transfers: u32,
}

const _: () = assert!(size_of::<Import>() == 32);
const _: () = assert!(size_of::<Release>() == 16);
const _: () = assert!(size_of::<Copy>() == 56);

// SAFETY: All three are `repr(C)` structs of integers without padding (the sizes are asserted
// above), so every byte pattern is valid and every byte is initialised.
unsafe impl FromBytes for Import {}
// SAFETY: See above.
unsafe impl AsBytes for Import {}
// SAFETY: See above.
unsafe impl FromBytes for Release {}
// SAFETY: See above.
unsafe impl AsBytes for Release {}
// SAFETY: See above.
unsafe impl FromBytes for Copy {}
// SAFETY: See above.
unsafe impl AsBytes for Copy {}

/// An ioctl argument struct.
pub(crate) trait ArgStruct: FromBytes + AsBytes + Default + core::marker::Copy {
    /// The size of the first published version of the struct.
    const MIN_SIZE: usize;
}

impl ArgStruct for Import {
    const MIN_SIZE: usize = 32;
}
impl ArgStruct for Release {
    const MIN_SIZE: usize = 16;
}
impl ArgStruct for Copy {
    const MIN_SIZE: usize = 56;
}

/// Reads the argument struct at `arg`; returns it and the size the caller declared.
pub(crate) fn read_arg<T: ArgStruct>(arg: usize) -> Result<(T, usize)> {
    let ptr = UserPtr::from_addr(arg);
    let mut size = [0u8; 4];
    UserSlice::new(ptr, 4).reader().read_slice(&mut size)?;
    let size = usize::try_from(u32::from_ne_bytes(size))?;
    if size < T::MIN_SIZE {
        return Err(EINVAL);
    }
    let ours = size_of::<T>();
    let mut reader = UserSlice::new(ptr, size).reader();
    let mut val = T::default();
    reader.read_slice(&mut val.as_bytes_mut()[..size.min(ours)])?;
    // A newer caller's extension must be all zeros: we do not know what it asks for.
    let mut tail = [0u8; 64];
    let mut left = size.saturating_sub(ours);
    while left > 0 {
        let n = left.min(tail.len());
        reader.read_slice(&mut tail[..n])?;
        if tail[..n].iter().any(|&b| b != 0) {
            return Err(E2BIG);
        }
        left -= n;
    }
    Ok((val, size))
}

/// Writes `val` back to `arg`, at most `size` bytes of it.
pub(crate) fn write_arg<T: ArgStruct>(arg: usize, size: usize, val: &T) -> Result {
    let bytes = val.as_bytes();
    let n = size.min(bytes.len());
    UserSlice::new(UserPtr::from_addr(arg), n)
        .writer()
        .write_slice(&bytes[..n])
}
