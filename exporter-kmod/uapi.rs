// SPDX-License-Identifier: GPL-2.0

//! The uAPI of `include/uapi/linux/p2pbuf.h`: its structs and constants (ioctl numbers included)
//! are generated from the header by bindgen when the module is built, as the kernel's `uapi`
//! crate is for in-tree drivers; bindgen's layout checks assert each struct's size, alignment
//! and field offsets against the C compiler's. `cargo xtask modules` writes the bindings into
//! the module's build directory and names the file in `P2PBUF_UAPI_BINDINGS`.
//!
//! What is written here is logic over the generated structs: which ioctl passes each (its first
//! version's size is the one the ioctl number encodes), and [`copy_cstr`]. The copy rules
//! ([`read_arg`], [`write_arg`]) live in `include/uapi/uapi_arg.rs`, shared with p2pbuf-dma.

#[path = "../include/uapi/uapi_arg.rs"]
mod arg;
pub(crate) use arg::{read_arg, write_arg};

arg::generated_bindings!();

arg::arg_structs! {
    p2pbuf_info: P2PBUF_IOCTL_INFO,
    p2pbuf_provider_info: P2PBUF_IOCTL_PROVIDER_INFO,
    p2pbuf_alloc: P2PBUF_IOCTL_ALLOC,
    p2pbuf_revoke: P2PBUF_IOCTL_REVOKE,
    p2pbuf_refusal: P2PBUF_IOCTL_REFUSAL,
    p2pbuf_attachment: P2PBUF_IOCTL_ATTACHMENT,
}

/// Copies `src` into `dst` as a NUL-terminated string, cut to fit.
pub(crate) fn copy_cstr(dst: &mut [u8], src: &[u8]) {
    let n = src.len().min(dst.len().saturating_sub(1));
    dst[..n].copy_from_slice(&src[..n]);
    if let Some(rest) = dst.get_mut(n..) {
        rest.fill(0);
    }
}
