// SPDX-License-Identifier: GPL-2.0

//! The ioctl argument structs of `include/uapi/linux/p2pbuf.h`, and the copy rules they share.
//!
//! The copy rules ([`read_arg`], [`write_arg`]) live in `include/uapi/uapi_arg.rs`, shared by
//! both modules.
//!
//! The layouts must match the C header exactly; the `const` assertions below check the sizes
//! that the header's comments promise.

pub(crate) use crate::uapi_arg::{read_arg, write_arg, ArgStruct};
use kernel::{
    prelude::*,
    transmute::{AsBytes, FromBytes},
};

/// `P2PBUF_API_VERSION`.
pub(crate) const API_VERSION: u32 = 3;
/// `P2PBUF_IOCTL_MAGIC`.
const MAGIC: u32 = 0xBB;
/// `P2PBUF_PCI_NAME_LEN`.
pub(crate) const PCI_NAME_LEN: usize = 32;
/// `P2PBUF_DEVICE_NAME_LEN`.
pub(crate) const DEVICE_NAME_LEN: usize = 64;
/// `P2PBUF_REASON_LEN`.
pub(crate) const REASON_LEN: usize = 128;

// The numbers encode the size of the struct's first version ([`ArgStruct::MIN_SIZE`], which
// the assertions below tie to `size_of`): when a struct grows, its number must not.

/// `P2PBUF_IOCTL_INFO`: `_IOWR(P2PBUF_IOCTL_MAGIC, 0x00, struct p2pbuf_info)`.
pub(crate) const IOCTL_INFO: u32 = kernel::ioctl::_IOWR::<Info>(MAGIC, 0x00);
/// `P2PBUF_IOCTL_PROVIDER_INFO`: `_IOWR(..., 0x01, struct p2pbuf_provider_info)`.
pub(crate) const IOCTL_PROVIDER_INFO: u32 = kernel::ioctl::_IOWR::<ProviderInfo>(MAGIC, 0x01);
/// `P2PBUF_IOCTL_ALLOC`: `_IOWR(..., 0x02, struct p2pbuf_alloc)`.
pub(crate) const IOCTL_ALLOC: u32 = kernel::ioctl::_IOWR::<Alloc>(MAGIC, 0x02);
/// `P2PBUF_IOCTL_REVOKE`: `_IOW(..., 0x03, struct p2pbuf_revoke)`.
pub(crate) const IOCTL_REVOKE: u32 = kernel::ioctl::_IOW::<Revoke>(MAGIC, 0x03);
/// `P2PBUF_IOCTL_REFUSAL`: `_IOWR(..., 0x04, struct p2pbuf_refusal)`.
pub(crate) const IOCTL_REFUSAL: u32 = kernel::ioctl::_IOWR::<Refusal>(MAGIC, 0x04);
/// `P2PBUF_IOCTL_ATTACHMENT`: `_IOWR(..., 0x05, struct p2pbuf_attachment)`.
pub(crate) const IOCTL_ATTACHMENT: u32 = kernel::ioctl::_IOWR::<AttachmentInfo>(MAGIC, 0x05);

/// `P2PBUF_REFUSAL_NO_P2P_PATH`.
pub(crate) const REFUSAL_NO_P2P_PATH: u32 = 1;

/// `P2PBUF_ALLOC_UNINITIALIZED`.
pub(crate) const ALLOC_UNINITIALIZED: u32 = 1 << 0;
/// `P2PBUF_ALLOC_PFNMAP`.
pub(crate) const ALLOC_PFNMAP: u32 = 1 << 1;

/// `P2PBUF_PROVIDER_PUBLISHED`.
pub(crate) const PROVIDER_PUBLISHED: u32 = 1 << 0;
/// `P2PBUF_PROVIDER_GONE`.
pub(crate) const PROVIDER_GONE: u32 = 1 << 1;
/// `P2PBUF_PROVIDER_INFO_NEXT`.
pub(crate) const PROVIDER_INFO_NEXT: u32 = 1 << 0;

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
    pub(crate) id: u32,
    pub(crate) flags: u32,
    pub(crate) state: u32,
    pub(crate) bar: u32,
    pub(crate) reserved: u32,
    pub(crate) bar_size: u64,
    pub(crate) total: u64,
    pub(crate) free: u64,
    pub(crate) pci_name: [u8; PCI_NAME_LEN],
}

impl Default for ProviderInfo {
    fn default() -> Self {
        Self {
            size: 0,
            id: 0,
            flags: 0,
            state: 0,
            bar: 0,
            reserved: 0,
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

/// `struct p2pbuf_refusal`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct Refusal {
    pub(crate) size: u32,
    pub(crate) fd: i32,
    pub(crate) flags: u32,
    pub(crate) reason: u32,
    pub(crate) nr_refused: u64,
    pub(crate) provider: u32,
    pub(crate) reserved: u32,
    pub(crate) device: [u8; DEVICE_NAME_LEN],
    pub(crate) text: [u8; REASON_LEN],
}

impl Default for Refusal {
    fn default() -> Self {
        Self {
            size: 0,
            fd: 0,
            flags: 0,
            reason: 0,
            nr_refused: 0,
            provider: 0,
            reserved: 0,
            device: [0; DEVICE_NAME_LEN],
            text: [0; REASON_LEN],
        }
    }
}

/// `struct p2pbuf_attachment`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct AttachmentInfo {
    pub(crate) size: u32,
    pub(crate) fd: i32,
    pub(crate) flags: u32,
    pub(crate) index: u32,
    pub(crate) nr_attachments: u32,
    pub(crate) reserved: u32,
    pub(crate) device: [u8; DEVICE_NAME_LEN],
}

impl Default for AttachmentInfo {
    fn default() -> Self {
        Self {
            size: 0,
            fd: 0,
            flags: 0,
            index: 0,
            nr_attachments: 0,
            reserved: 0,
            device: [0; DEVICE_NAME_LEN],
        }
    }
}

/// Copies `src` into `dst` as a NUL-terminated string, cut to fit.
pub(crate) fn copy_cstr(dst: &mut [u8], src: &[u8]) {
    let n = src.len().min(dst.len().saturating_sub(1));
    dst[..n].copy_from_slice(&src[..n]);
    if let Some(rest) = dst.get_mut(n..) {
        rest.fill(0);
    }
}

const _: () = assert!(size_of::<Info>() == 16 && Info::MIN_SIZE == 16);
const _: () = assert!(size_of::<ProviderInfo>() == 80 && ProviderInfo::MIN_SIZE == 80);
const _: () = assert!(size_of::<Alloc>() == 32 && Alloc::MIN_SIZE == 32);
const _: () = assert!(size_of::<Revoke>() == 16 && Revoke::MIN_SIZE == 16);
const _: () = assert!(size_of::<Refusal>() == 224 && Refusal::MIN_SIZE == 224);
const _: () = assert!(size_of::<AttachmentInfo>() == 88 && AttachmentInfo::MIN_SIZE == 88);

// SAFETY: All six are `repr(C)` structs of integers (and a byte array) without padding (the
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
// SAFETY: See above.
unsafe impl FromBytes for Refusal {}
// SAFETY: See above.
unsafe impl AsBytes for Refusal {}
// SAFETY: See above.
unsafe impl FromBytes for AttachmentInfo {}
// SAFETY: See above.
unsafe impl AsBytes for AttachmentInfo {}

impl ArgStruct for Info {
    const MIN_SIZE: usize = 16;
}
impl ArgStruct for ProviderInfo {
    const MIN_SIZE: usize = 80;
}
impl ArgStruct for Alloc {
    const MIN_SIZE: usize = 32;
}
impl ArgStruct for Revoke {
    const MIN_SIZE: usize = 16;
}
impl ArgStruct for Refusal {
    const MIN_SIZE: usize = 224;
}
impl ArgStruct for AttachmentInfo {
    const MIN_SIZE: usize = 88;
}
