// SPDX-License-Identifier: GPL-2.0

//! The copy rules of the ioctl argument structs of `include/uapi/linux/p2pbuf.h`, shared by the
//! exporter and the importer module (the importer includes this file with `#[path]`).
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

/// An ioctl argument struct.
pub(crate) trait ArgStruct: FromBytes + AsBytes + Default + core::marker::Copy {
    /// The size of the first published version of the struct.
    const MIN_SIZE: usize;
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
