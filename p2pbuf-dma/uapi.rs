// SPDX-License-Identifier: GPL-2.0

//! The uAPI of `include/uapi/linux/p2pbuf-dma.h`: its structs and constants (ioctl numbers
//! included) are generated from the header by bindgen when the module is built, with bindgen's
//! layout checks on every size and field offset; see `exporter-kmod/uapi.rs`, which is built the
//! same way. The copy rules ([`read_arg`], [`write_arg`]) live in `include/uapi/uapi_arg.rs`,
//! shared with the exporter.

#[path = "../include/uapi/uapi_arg.rs"]
mod arg;
pub(crate) use arg::{read_arg, write_arg};

arg::generated_bindings!();

arg::arg_structs! {
    p2pbuf_dma_import: P2PBUF_DMA_IOCTL_IMPORT,
    p2pbuf_dma_release: P2PBUF_DMA_IOCTL_RELEASE,
    p2pbuf_dma_copy: P2PBUF_DMA_IOCTL_COPY,
}
