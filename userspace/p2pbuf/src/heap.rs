//! dma-buf heaps (`/dev/dma_heap/NAME`, `CONFIG_DMABUF_HEAPS`): the system heap's buffers
//! are system memory from another exporter than udmabuf, one that does not accept
//! attachments for CPU access (`dma_buf_cpu_attach()`), which the tests of soft-RoCE's
//! dma-buf MRs need.

use std::os::fd::AsFd;

use crate::dmabuf::DmaBuf;
use crate::error::{Error, Result};
use crate::sys;

/// The system heap's device node.
pub const SYSTEM_HEAP: &str = "/dev/dma_heap/system";

/// Allocate at least `size` bytes (rounded up to the page size) from the system heap.
pub fn alloc(size: u64) -> Result<DmaBuf> {
    if size == 0 {
        return Err(Error::protocol(
            "allocating from a dma-buf heap",
            "size must be > 0",
        ));
    }
    let page = rustix::param::page_size() as u64;
    let size = size.div_ceil(page) * page;
    let heap = std::fs::File::open(SYSTEM_HEAP).map_err(|e| Error::Io {
        what: "opening the system dma-buf heap".into(),
        path: SYSTEM_HEAP.into(),
        check: Some("a kernel with CONFIG_DMABUF_HEAPS_SYSTEM".into()),
        source: e,
    })?;
    let fd = sys::dma_heap_alloc(heap.as_fd(), size).map_err(|e| {
        Error::os(
            format!("DMA_HEAP_IOCTL_ALLOC({size} bytes) on {SYSTEM_HEAP}"),
            e,
        )
    })?;
    DmaBuf::from_fd(fd)
}
