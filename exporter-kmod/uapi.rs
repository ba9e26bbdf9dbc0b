// SPDX-License-Identifier: GPL-2.0

//! The ioctl argument structs of `include/uapi/linux/p2pbuf.h`, and the copy rules they share.
//!
//! Every struct starts with a `u32` size that the caller sets to the size it was compiled with.
//! [`read_arg`] accepts any size from [`ArgStruct::MIN_SIZE`] upwards: a shorter struct from an
//! older caller is zero-extended, a longer one from a newer caller must have a zero tail
//! (`E2BIG` otherwise), as `copy_struct_from_user()` does. [`write_arg`] writes back at most
//! as many bytes as the caller said it has.
//!
//! The layouts must match the C header exactly; the `const` assertions below check the sizes
//! that the header's comments promise.

use kernel::{
    prelude::*,
    transmute::{AsBytes, FromBytes},
    uaccess::{UserPtr, UserSlice},
};

/// `P2PBUF_API_VERSION`.
pub(crate) const API_VERSION: u32 = 1;
/// `P2PBUF_IOCTL_MAGIC`.
const MAGIC: u32 = 0xBB;
/// `P2PBUF_PCI_NAME_LEN`.
pub(crate) const PCI_NAME_LEN: usize = 32;

/// `_IO(P2PBUF_IOCTL_MAGIC, nr)`.
const fn io(nr: u32) -> u32 {
    kernel::ioctl::_IO(MAGIC, nr)
}

pub(crate) const IOCTL_INFO: u32 = io(0x00);
pub(crate) const IOCTL_PROVIDER_INFO: u32 = io(0x01);
pub(crate) const IOCTL_ALLOC: u32 = io(0x02);
pub(crate) const IOCTL_REVOKE: u32 = io(0x03);

/// `P2PBUF_PROVIDER_PUBLISHED`.
pub(crate) const PROVIDER_PUBLISHED: u32 = 1 << 0;
/// `P2PBUF_PROVIDER_GONE`.
pub(crate) const PROVIDER_GONE: u32 = 1 << 1;

/// `struct p2pbuf_info`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct Info {
    pub(crate) size: u32,
    pub(crate) api_version: u32,
    pub(crate) nr_providers: u32,
    pub(crate) flags: u32,
}

/// `struct p2pbuf_provider_info`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct ProviderInfo {
    pub(crate) size: u32,
    pub(crate) index: u32,
    pub(crate) bar: u32,
    pub(crate) flags: u32,
    pub(crate) bar_size: u64,
    pub(crate) total: u64,
    pub(crate) free: u64,
    pub(crate) pci_name: [u8; PCI_NAME_LEN],
}

impl Default for ProviderInfo {
    fn default() -> Self {
        Self {
            size: 0,
            index: 0,
            bar: 0,
            flags: 0,
            bar_size: 0,
            total: 0,
            free: 0,
            pci_name: [0; PCI_NAME_LEN],
        }
    }
}

/// `struct p2pbuf_alloc`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct Alloc {
    pub(crate) size: u32,
    pub(crate) flags: u32,
    pub(crate) length: u64,
    pub(crate) provider: u32,
    pub(crate) fd: i32,
    pub(crate) offset: u64,
}

/// `struct p2pbuf_revoke`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct Revoke {
    pub(crate) size: u32,
    pub(crate) fd: i32,
    pub(crate) flags: u64,
}

const _: () = assert!(size_of::<Info>() == 16);
const _: () = assert!(size_of::<ProviderInfo>() == 72);
const _: () = assert!(size_of::<Alloc>() == 32);
const _: () = assert!(size_of::<Revoke>() == 16);

// SAFETY: All four are `repr(C)` structs of integers (and a byte array) without padding (the
// sizes are asserted above), so every byte pattern is valid and every byte is initialised.
unsafe impl FromBytes for Info {}
// SAFETY: See above.
unsafe impl AsBytes for Info {}
// SAFETY: See above.
unsafe impl FromBytes for ProviderInfo {}
// SAFETY: See above.
unsafe impl AsBytes for ProviderInfo {}
// SAFETY: See above.
unsafe impl FromBytes for Alloc {}
// SAFETY: See above.
unsafe impl AsBytes for Alloc {}
// SAFETY: See above.
unsafe impl FromBytes for Revoke {}
// SAFETY: See above.
unsafe impl AsBytes for Revoke {}

/// An ioctl argument struct.
pub(crate) trait ArgStruct: FromBytes + AsBytes + Default + Copy {
    /// The size of the first published version of the struct.
    const MIN_SIZE: usize;
}

impl ArgStruct for Info {
    const MIN_SIZE: usize = 16;
}
impl ArgStruct for ProviderInfo {
    const MIN_SIZE: usize = 72;
}
impl ArgStruct for Alloc {
    const MIN_SIZE: usize = 32;
}
impl ArgStruct for Revoke {
    const MIN_SIZE: usize = 16;
}

/// Reads the argument struct at `arg`; returns it and the size the caller declared.
pub(crate) fn read_arg<T: ArgStruct>(arg: usize) -> Result<(T, usize)> {
    let ptr = UserPtr::from_addr(arg);
    let mut size = [0u8; 4];
    UserSlice::new(ptr, 4).reader().read_slice(&mut size)?;
    let size = u32::from_ne_bytes(size) as usize;
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
