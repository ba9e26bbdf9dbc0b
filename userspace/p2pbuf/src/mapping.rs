//! CPU mappings of a dma-buf, with every access bracketed by
//! `DMA_BUF_IOCTL_SYNC` start/end.
//!
//! ```no_run
//! # fn demo(buf: &p2pbuf::DmaBuf) -> p2pbuf::Result<()> {
//! use p2pbuf::Access;
//! let mut map = buf.map(Access::ReadWrite)?;
//! {
//!     let mut w = map.write()?; // DMA_BUF_SYNC_START | RW
//!     w[0] = 0x5a;
//! } // DMA_BUF_SYNC_END | RW
//! let r = map.read()?;
//! assert_eq!(r[0], 0x5a);
//! # Ok(()) }
//! ```
//!
//! Not every exporter supports CPU mappings: NVIDIA's `nv_dmabuf` refuses
//! `mmap` with errno 524 (`ENOTSUPP`); [`CpuMapping::new`] turns that into
//! an error that says so.

use std::ops::{Deref, DerefMut};
use std::os::fd::{AsFd, AsRawFd};

use serde::Serialize;

use crate::dmabuf::DmaBuf;
use crate::error::{Error, Result, ENOTSUPP};
use crate::sys::{self, RawMapping};

/// How a CPU mapping may be used (an RDMA memory region's access flags are
/// `p2pbuf_rdma::MrAccess`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Access {
    /// `PROT_READ`.
    Read,
    /// `PROT_READ | PROT_WRITE`.
    ReadWrite,
}

/// A `MAP_SHARED` mapping of a whole dma-buf, unmapped on drop.
///
/// The memory is reached only through [`read`](Self::read) and
/// [`write`](Self::write) guards, which issue `DMA_BUF_IOCTL_SYNC` with
/// `START` when made and `END` when dropped, so the exporter can flush or
/// invalidate caches around CPU access.
#[derive(Debug)]
pub struct CpuMapping<'a> {
    buf: &'a DmaBuf,
    map: RawMapping,
    access: Access,
}

impl<'a> CpuMapping<'a> {
    /// Map all of `buf`.
    pub fn new(buf: &'a DmaBuf, access: Access) -> Result<Self> {
        let len = usize::try_from(buf.size()).map_err(|_| Error::Protocol {
            what: "mapping a dma-buf".into(),
            detail: format!("size {} does not fit in usize", buf.size()),
        })?;
        let what = format!(
            "mmap of dma-buf fd {} ({} bytes, exporter {})",
            buf.as_raw_fd(),
            len,
            buf.exporter()
        );
        let map = RawMapping::map_shared(buf.as_fd(), len, access == Access::ReadWrite).map_err(
            |e| {
                use rustix::io::Errno;
                let check = if e.raw_os_error() == ENOTSUPP {
                    Some(format!(
                        "exporter {} does not support CPU mmap; use a device importer (RDMA, NVMe, p2pbuf-dma) instead",
                        buf.exporter()
                    ))
                } else if e == Errno::ACCESS {
                    Some("a read-write mapping needs a dma-buf fd opened O_RDWR".into())
                } else if e == Errno::NODEV {
                    Some(
                        "the exporter has no mmap operation, or it revoked the buffer (e.g. its device was unbound)"
                            .into(),
                    )
                } else {
                    None
                };
                Error::Os {
                    what: what.clone(),
                    errno: e.raw_os_error(),
                    check,
                }
            },
        )?;
        Ok(CpuMapping { buf, map, access })
    }

    /// Length of the mapping in bytes.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Always false: dma-bufs are never empty and zero-length maps fail.
    pub fn is_empty(&self) -> bool {
        self.map.len() == 0
    }

    /// How it was mapped.
    pub fn access(&self) -> Access {
        self.access
    }

    /// Start a read: `DMA_BUF_IOCTL_SYNC(START | READ)`.
    pub fn read(&self) -> Result<ReadGuard<'_>> {
        sync(self.buf, sys::DMA_BUF_SYNC_START | sys::DMA_BUF_SYNC_READ)?;
        Ok(ReadGuard { map: self })
    }

    /// Start a read-write access: `DMA_BUF_IOCTL_SYNC(START | RW)`. Needs a
    /// mapping made with [`Access::ReadWrite`].
    pub fn write(&mut self) -> Result<WriteGuard<'_, 'a>> {
        if self.access != Access::ReadWrite {
            return Err(Error::Protocol {
                what: format!("write access to dma-buf fd {}", self.buf.as_raw_fd()),
                detail: "the mapping is read-only; map with Access::ReadWrite".into(),
            });
        }
        sync(
            self.buf,
            sys::DMA_BUF_SYNC_START | sys::DMA_BUF_SYNC_READ | sys::DMA_BUF_SYNC_WRITE,
        )?;
        Ok(WriteGuard { map: self })
    }
}

fn sync(buf: &DmaBuf, flags: u64) -> Result<()> {
    sys::dma_buf_sync(buf.as_fd(), flags).map_err(|e| {
        Error::os(
            format!(
                "DMA_BUF_IOCTL_SYNC({}{}{}) on dma-buf fd {}",
                if flags & sys::DMA_BUF_SYNC_END != 0 {
                    "END"
                } else {
                    "START"
                },
                if flags & sys::DMA_BUF_SYNC_READ != 0 {
                    "|READ"
                } else {
                    ""
                },
                if flags & sys::DMA_BUF_SYNC_WRITE != 0 {
                    "|WRITE"
                } else {
                    ""
                },
                buf.as_raw_fd()
            ),
            e,
        )
    })
}

/// Read access to a mapping; ends with `DMA_BUF_IOCTL_SYNC(END | READ)`.
#[derive(Debug)]
pub struct ReadGuard<'m> {
    map: &'m CpuMapping<'m>,
}

/// What both guards do: `finish`, the mapped bytes through `Deref`, and the END sync with
/// `$end` (the flags the access began with) on drop.
macro_rules! sync_guard {
    ($guard:ty, $end:expr) => {
        impl $guard {
            /// End the access now and report an error from the END sync (dropping
            /// the guard ignores it).
            pub fn finish(self) -> Result<()> {
                let r = sync(self.map.buf, $end);
                std::mem::forget(self);
                r
            }
        }

        impl Deref for $guard {
            type Target = [u8];
            fn deref(&self) -> &[u8] {
                self.map.map.as_slice()
            }
        }

        impl Drop for $guard {
            fn drop(&mut self) {
                let _ = sync(self.map.buf, $end);
            }
        }
    };
}

sync_guard!(
    ReadGuard<'_>,
    sys::DMA_BUF_SYNC_END | sys::DMA_BUF_SYNC_READ
);

/// Read-write access to a mapping; ends with
/// `DMA_BUF_IOCTL_SYNC(END | READ | WRITE)`.
#[derive(Debug)]
pub struct WriteGuard<'m, 'a> {
    map: &'m mut CpuMapping<'a>,
}

const RW_END: u64 = sys::DMA_BUF_SYNC_END | sys::DMA_BUF_SYNC_READ | sys::DMA_BUF_SYNC_WRITE;

sync_guard!(WriteGuard<'_, '_>, RW_END);

impl DerefMut for WriteGuard<'_, '_> {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.map.map.as_mut_slice()
    }
}
