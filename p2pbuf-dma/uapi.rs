// SPDX-License-Identifier: GPL-2.0

//! The ioctl argument structs of the `include/uapi/linux/p2pbuf-dma.h`, and
//! the copy rules they share with the exporter's.
//!
//! The copy rules ([`read_arg`], [`write_arg`]) live in `include/uapi/uapi_arg.rs`, shared by
//! both modules.

pub(crate) use crate::uapi_arg::{read_arg, write_arg, ArgStruct};
use kernel::{
    prelude::*,
    transmute::{AsBytes, FromBytes},
};

/// `P2PBUF_IOCTL_MAGIC`.
const MAGIC: u32 = 0xBB;

// The numbers encode the size of the struct's first version ([`ArgStruct::MIN_SIZE`], which
// the assertions below tie to `size_of`): when a struct grows, its number must not.

/// `P2PBUF_DMA_IOCTL_IMPORT`: `_IOWR(P2PBUF_IOCTL_MAGIC, 0x10, struct p2pbuf_dma_import)`.
pub(crate) const IOCTL_IMPORT: u32 = kernel::ioctl::_IOWR::<Import>(MAGIC, 0x10);
/// `P2PBUF_DMA_IOCTL_RELEASE`: `_IOW(..., 0x11, struct p2pbuf_dma_release)`.
pub(crate) const IOCTL_RELEASE: u32 = kernel::ioctl::_IOW::<Release>(MAGIC, 0x11);
/// `P2PBUF_DMA_IOCTL_COPY`: `_IOWR(..., 0x12, struct p2pbuf_dma_copy)`.
pub(crate) const IOCTL_COPY: u32 = kernel::ioctl::_IOWR::<Copy>(MAGIC, 0x12);

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

const _: () = assert!(size_of::<Import>() == 32 && Import::MIN_SIZE == 32);
const _: () = assert!(size_of::<Release>() == 16 && Release::MIN_SIZE == 16);
const _: () = assert!(size_of::<Copy>() == 56 && Copy::MIN_SIZE == 56);

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

impl ArgStruct for Import {
    const MIN_SIZE: usize = 32;
}
impl ArgStruct for Release {
    const MIN_SIZE: usize = 16;
}
impl ArgStruct for Copy {
    const MIN_SIZE: usize = 56;
}
