// SPDX-License-Identifier: GPL-2.0

//! What the uAPI modules of both kernel modules (`exporter-kmod/uapi.rs`, `p2pbuf-dma/uapi.rs`)
//! are built on, each as its submodule `arg` (`#[path = "../include/uapi/uapi_arg.rs"]`): the
//! copy rules of the ioctl argument structs of `include/uapi/linux/p2pbuf.h` and
//! `include/uapi/linux/p2pbuf-dma.h`, and the macros that bring in the module's generated
//! bindings ([`generated_bindings`]) and make its structs argument structs ([`arg_structs`]).
//!
//! Every struct starts with a `u32` size that the caller sets to the size it was compiled with.
//! [`read_arg`] accepts any size from [`ArgStruct::MIN_SIZE`] up to [`MAX_SIZE`] (a page): a
//! shorter struct from an older caller is zero-extended, a longer one from a newer caller must
//! have a zero tail (`E2BIG` otherwise), as `copy_struct_from_user()` does; a size above a page
//! is `E2BIG` before anything past the size field is read, as `openat2()` and `clone3()` answer.
//! The size is read from user memory once: the struct handed back carries that value, whatever
//! the caller's memory holds by the time the rest is read. [`write_arg`] writes back at most as
//! many bytes as the caller said it has.

use kernel::{
    page::PAGE_SIZE,
    prelude::*,
    transmute::{AsBytes, FromBytes},
    uaccess::{UserPtr, UserSlice},
};

/// The largest size field accepted: no struct will grow past a page.
pub(crate) const MAX_SIZE: usize = PAGE_SIZE;

/// Bytes of the size field that starts every struct.
const SIZE_FIELD: usize = size_of::<u32>();

/// An ioctl argument struct.
pub(crate) trait ArgStruct: FromBytes + AsBytes + Default + core::marker::Copy {
    /// The size of the first published version of the struct.
    const MIN_SIZE: usize;
}

/// Reads the argument struct at `arg`; returns it and the size the caller declared.
pub(crate) fn read_arg<T: ArgStruct>(arg: usize) -> Result<(T, usize)> {
    let ptr = UserPtr::from_addr(arg);
    let mut size_field = [0u8; SIZE_FIELD];
    UserSlice::new(ptr, SIZE_FIELD)
        .reader()
        .read_slice(&mut size_field)?;
    let size = usize::try_from(u32::from_ne_bytes(size_field))?;
    if size < T::MIN_SIZE || size < SIZE_FIELD {
        return Err(EINVAL);
    }
    if size > MAX_SIZE {
        return Err(E2BIG);
    }
    let ours = size_of::<T>();
    let mut val = T::default();
    // The size field as validated above, not as a second read would find it.
    val.as_bytes_mut()
        .get_mut(..SIZE_FIELD)
        .ok_or(EINVAL)?
        .copy_from_slice(&size_field);
    let mut reader = UserSlice::new(ptr, size).reader();
    reader.skip(SIZE_FIELD)?;
    if let Some(rest) = val.as_bytes_mut().get_mut(SIZE_FIELD..size.min(ours)) {
        reader.read_slice(rest)?;
    }
    // A newer caller's extension must be all zeros: we do not know what it asks for. At most a
    // page minus our struct, so no reschedule is needed on the way.
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

/// Makes each generated uAPI struct the [`ArgStruct`] of the ioctl that passes it: the size of
/// its first version is the one the ioctl number encodes (`_IOC_SIZE`), and the struct has not
/// grown past it yet (asserted: when one grows, its number must not, and this assertion is what
/// changes). `FromBytes` and `AsBytes` hold because the uAPI structs are integers and byte
/// arrays without padding: the header lays them out so, and bindgen's layout checks pin every
/// field's offset and the size to what the C compiler makes of the header.
macro_rules! arg_structs {
    ($($t:ident: $ioctl:ident),* $(,)?) => {$(
        // SAFETY: See the macro's documentation: integers and byte arrays without padding, so
        // every byte pattern is valid.
        unsafe impl kernel::transmute::FromBytes for $t {}
        // SAFETY: See the macro's documentation: no padding, so every byte is initialised.
        unsafe impl kernel::transmute::AsBytes for $t {}
        impl $crate::uapi::arg::ArgStruct for $t {
            const MIN_SIZE: usize = kernel::ioctl::_IOC_SIZE($ioctl);
        }
        const _: () = assert!(core::mem::size_of::<$t>() == kernel::ioctl::_IOC_SIZE($ioctl));
    )*};
}
pub(crate) use arg_structs;

/// Brings in the module's uAPI bindings: the file that `cargo xtask modules` generated with
/// bindgen from the module's header and names in `P2PBUF_UAPI_BINDINGS` (xtask/src/modules.rs),
/// as the kernel's `uapi` crate includes its `uapi_generated.rs`.
macro_rules! generated_bindings {
    () => {
        /// The bindings bindgen generated from the module's uAPI header.
        #[allow(
            clippy::all,
            clippy::undocumented_unsafe_blocks,
            dead_code,
            missing_docs,
            non_camel_case_types,
            non_upper_case_globals,
            unreachable_pub
        )]
        mod generated {
            include!(env!("P2PBUF_UAPI_BINDINGS"));
        }
        pub(crate) use generated::*;
    };
}
pub(crate) use generated_bindings;
