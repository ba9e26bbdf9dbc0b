//! Safe Rust types for dma-bufs, for the p2pbuf project.
//!
//! Works with any dma-buf exporter (the p2pbuf exporter, NVIDIA's
//! `nv_dmabuf` from CUDA, udmabuf, vfio-pci, DRM PRIME):
//!
//! - [`DmaBuf`]: an owned fd checked to be a dma-buf, with its size and
//!   exporter from `/proc/self/fdinfo` ([`DmaBufInfo`]).
//! - [`CpuMapping`]: `mmap` of a dma-buf; access goes through guards that
//!   bracket it with `DMA_BUF_IOCTL_SYNC` start/end.
//! - [`fdpass`]: `SCM_RIGHTS` over Unix sockets, and [`Pidfd`]
//!   (`pidfd_open` + `pidfd_getfd`).
//! - [`udmabuf`]: memfd-backed dma-bufs from `/dev/udmabuf`, a foreign
//!   exporter for tests.
//! - [`exporter`]: device memory from the p2pbuf exporter (`/dev/p2pbuf`),
//!   through its uAPI header (bindgen).
//! - [`dma`]: p2pbuf-dma, the DMA engine (`/dev/p2pbuf-dma`) importing dma-bufs and copying
//!   between them.
//! - [`nvme`]: `O_DIRECT` reads and writes between a drive and a mapping (peer-to-peer
//!   when the mapping is device memory).
//! - [`rdma`]: finding RDMA devices (sysfs). Registration, rdma_cm and
//!   RDMA WRITE/READ are in the `p2pbuf-rdma` crate.
//! - [`surface`]: 2D surfaces (width, height, DRM fourcc and modifier, stride): layout,
//!   validation, and a compact form stored as the dma-buf's name (`DMA_BUF_SET_NAME`).
//! - [`memory`]: where a buffer's memory comes from ([`memory::Source`]: p2pbuf device
//!   memory, udmabuf, host, CUDA, a received fd) and the one function that allocates it.
//! - [`dmem`]: the dmem cgroup controller: how much of a provider's BAR this process's cgroup
//!   holds, and its limits.
//! - [`units`]: the size parser and printer of every p2pbuf tool.
//! - `cuda` (feature `cuda`): CUDA device memory exported as a dma-buf.
//!
//! All `unsafe` code is in one private module (`sys`); errors ([`Error`])
//! say what was asked, keep the errno, and say what to check.

#![deny(unsafe_code)]
#![warn(missing_docs)]

/// `AsFd` and `AsRawFd` of a type that owns an fd in its field `$field`.
macro_rules! owns_fd {
    ($t:ty, $field:ident) => {
        impl std::os::fd::AsFd for $t {
            fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
                self.$field.as_fd()
            }
        }

        impl std::os::fd::AsRawFd for $t {
            fn as_raw_fd(&self) -> std::os::fd::RawFd {
                self.$field.as_raw_fd()
            }
        }
    };
}

pub mod dma;
pub mod dmem;
pub mod error;
pub mod exporter;
pub mod fdinfo;
pub mod fdpass;
pub mod heap;
pub mod memory;
pub mod nvme;
pub mod pattern;
pub mod rdma;
pub mod surface;
pub mod udmabuf;
pub mod units;

mod device;
mod dmabuf;
mod mapping;
#[allow(unsafe_code)]
mod sys;

#[cfg(feature = "cuda")]
pub mod cuda;

/// The text of a NUL-terminated C `char` array (a uAPI or verbs struct's name field), up to
/// its first NUL (the whole array if it has none), invalid UTF-8 replaced.
pub fn c_chars_lossy(chars: &[std::ffi::c_char]) -> String {
    let bytes: Vec<u8> = chars
        .iter()
        .map(|c| *c as u8)
        .take_while(|c| *c != 0)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

pub use dmabuf::DmaBuf;
pub use error::{Error, Result};
pub use fdinfo::DmaBufInfo;
pub use fdpass::{recv_dmabuf, send_dmabuf, Pidfd, Received};
pub use mapping::{Access, CpuMapping, ReadGuard, WriteGuard};
