//! Where a buffer's memory comes from, and the one function that gets a buffer of a kind.
//!
//! Every command of the `p2pbuf` CLI that needs memory (`alloc`, `nvme`, `dma`, `rdma
//! serve`/`reg`, `rdma bench`) names it with a [`Source`] and gets it from [`alloc`] (or
//! [`alloc_with`]); the default, the same for every command, is [`Source::DEFAULT`] (device
//! memory from the p2pbuf exporter).
//!
//! ```no_run
//! # fn demo() -> p2pbuf::Result<()> {
//! use p2pbuf::memory::{self, Source};
//! let b = memory::alloc(&"udmabuf".parse::<Source>()?, 1 << 20)?;
//! assert!(b.dmabuf().is_some());
//! # Ok(()) }
//! ```

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use serde::{Serialize, Serializer};

use crate::dmabuf::DmaBuf;
use crate::error::{Error, Result};
use crate::sys::RawMapping;

/// Where a buffer's memory comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// Device memory (a PCI BAR registered as p2pdma memory) from the p2pbuf exporter,
    /// `/dev/p2pbuf`: devices reach it peer-to-peer.
    P2pbuf,
    /// System memory as a dma-buf: memfd pages through `/dev/udmabuf`.
    Udmabuf,
    /// System memory from the system dma-buf heap, `/dev/dma_heap/system`: an exporter that
    /// offers no CPU access attachments, which software RDMA devices (rxe) refuse.
    Heap,
    /// Plain anonymous memory of this process (no dma-buf): the baseline.
    Host,
    /// CUDA device memory exported as a dma-buf (needs the `cuda` feature and a GPU).
    Cuda,
    /// A dma-buf received on this Unix socket from another process (`p2pbuf alloc --send`,
    /// `p2pbuf send`); its size is the sender's.
    FdFrom(PathBuf),
}

impl Source {
    /// The default of every command: device memory from `/dev/p2pbuf`.
    pub const DEFAULT: Source = Source::P2pbuf;
    /// [`Source::DEFAULT`] as the command line spells it.
    pub const DEFAULT_NAME: &'static str = "p2pbuf";
    /// The spellings [`FromStr`] takes, for help texts.
    pub const SPELLINGS: &'static str = "p2pbuf, udmabuf, heap, host, cuda, fd-from:SOCKET";

    /// Whether [`alloc`] allocates the memory, so that it needs a length (all but
    /// [`Source::FdFrom`]).
    pub fn allocates(&self) -> bool {
        !matches!(self, Source::FdFrom(_))
    }

    /// Whether the memory is a dma-buf (all but [`Source::Host`]).
    pub fn is_dmabuf(&self) -> bool {
        !matches!(self, Source::Host)
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::P2pbuf => f.write_str("p2pbuf"),
            Source::Udmabuf => f.write_str("udmabuf"),
            Source::Heap => f.write_str("heap"),
            Source::Host => f.write_str("host"),
            Source::Cuda => f.write_str("cuda"),
            Source::FdFrom(p) => write!(f, "fd-from:{}", p.display()),
        }
    }
}

impl Serialize for Source {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl FromStr for Source {
    type Err = Error;

    /// `p2pbuf`, `udmabuf`, `heap`, `host`, `cuda`, `fd-from:SOCKET`.
    fn from_str(s: &str) -> Result<Source> {
        let (kind, path) = match s.split_once(':') {
            Some((k, p)) => (k, Some(p)),
            None => (s, None),
        };
        let bad = |detail: String| Error::Invalid {
            what: format!("memory {s:?}"),
            detail,
            check: Some(format!("one of: {}", Source::SPELLINGS)),
        };
        let simple = |src: Source| match path {
            None => Ok(src),
            Some(p) => Err(bad(format!("{kind} takes no path (got {p:?})"))),
        };
        match kind {
            "p2pbuf" => simple(Source::P2pbuf),
            "udmabuf" => simple(Source::Udmabuf),
            "heap" => simple(Source::Heap),
            "host" => simple(Source::Host),
            "cuda" => simple(Source::Cuda),
            "fd-from" => match path {
                Some(p) if !p.is_empty() => Ok(Source::FdFrom(p.into())),
                _ => Err(bad("fd-from needs a path: fd-from:SOCKET".into())),
            },
            k => Err(bad(format!("unknown kind {k:?}"))),
        }
    }
}

/// How [`alloc_with`] gets the memory, beyond its kind and length.
#[derive(Debug, Clone)]
pub struct Options {
    /// [`Source::P2pbuf`]: how the exporter hands the memory out (uninitialized, PFN-mapped).
    pub p2pbuf: crate::exporter::AllocFlags,
    /// [`Source::FdFrom`]: seconds to wait for the sender.
    pub wait: u64,
    /// [`Source::FdFrom`]: the answer sent back to the sender (`ok <ack>`).
    pub ack: String,
    /// [`Source::Cuda`]: the device ordinal.
    pub cuda_device: i32,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            p2pbuf: Default::default(),
            wait: 600,
            ack: format!("pid {} took it", std::process::id()),
            cuda_device: 0,
        }
    }
}

/// Where a [`Source::P2pbuf`] buffer lies in its provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Placement {
    /// Id of the provider (a PCI BAR) it came from.
    pub provider: u32,
    /// Where it starts inside the BAR.
    pub bar_offset: u64,
}

/// Page-aligned anonymous host memory (mmap), unmapped on drop.
pub struct HostBuf {
    map: RawMapping,
}

impl fmt::Debug for HostBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HostBuf({} bytes)", self.map.len())
    }
}

impl HostBuf {
    /// `len` zeroed bytes.
    pub fn new(len: usize) -> Result<HostBuf> {
        if len == 0 {
            return Err(Error::Protocol {
                what: "allocating host memory".into(),
                detail: "size must be > 0".into(),
            });
        }
        let map = RawMapping::anonymous(len).map_err(|e| Error::Os {
            what: format!("mmap({len} bytes)"),
            errno: e.raw_os_error(),
            check: None,
        })?;
        Ok(HostBuf { map })
    }

    /// Length.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Never: zero-length buffers are refused.
    pub fn is_empty(&self) -> bool {
        self.map.len() == 0
    }

    /// The first byte, for the HCA and for copies that must not assume exclusive access.
    pub fn as_ptr(&self) -> *mut u8 {
        self.map.as_ptr()
    }

    /// The bytes. Peers may change them through RDMA at any time while the buffer is
    /// registered with remote write access: read them when the protocol says the peer is
    /// done.
    pub fn as_slice(&self) -> &[u8] {
        self.map.as_slice()
    }

    /// The bytes, writable (see [`as_slice`](Self::as_slice)).
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        self.map.as_mut_slice()
    }
}

/// A buffer of some [`Source`].
#[derive(Debug)]
pub enum Buffer {
    /// [`Source::Host`].
    Host(HostBuf),
    /// [`Source::P2pbuf`], [`Source::Udmabuf`], [`Source::Heap`], [`Source::FdFrom`].
    DmaBuf {
        /// The dma-buf.
        buf: DmaBuf,
        /// Where it lies in its provider ([`Source::P2pbuf`] only).
        placement: Option<Placement>,
    },
    /// [`Source::Cuda`]: the device memory and its dma-buf.
    #[cfg(feature = "cuda")]
    Cuda(Box<crate::cuda::CudaExport>),
}

/// What a [`Buffer`] is, for reports (`--json` output of the CLI).
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// Where the memory came from.
    pub kind: Source,
    /// The dma-buf's exporter (`p2pbuf`, `udmabuf`, `nv_dmabuf`...); null for host memory.
    pub exporter: Option<String>,
    /// Bytes.
    pub size: u64,
    /// Device memory (peer-to-peer for the devices that reach it).
    pub device_memory: bool,
    /// The dma-buf's fd in this process; null for host memory.
    pub fd: Option<i32>,
    /// [`Placement::provider`].
    pub provider: Option<u32>,
    /// [`Placement::bar_offset`].
    pub bar_offset: Option<u64>,
}

impl Buffer {
    /// The dma-buf, if the memory is one.
    pub fn dmabuf(&self) -> Option<&DmaBuf> {
        match self {
            Buffer::Host(_) => None,
            Buffer::DmaBuf { buf, .. } => Some(buf),
            #[cfg(feature = "cuda")]
            Buffer::Cuda(x) => Some(x.dmabuf()),
        }
    }

    /// The dma-buf, writable (to name it), if the memory is one.
    pub fn dmabuf_mut(&mut self) -> Option<&mut DmaBuf> {
        match self {
            Buffer::Host(_) => None,
            Buffer::DmaBuf { buf, .. } => Some(buf),
            #[cfg(feature = "cuda")]
            Buffer::Cuda(x) => Some(x.dmabuf_mut()),
        }
    }

    /// Where a p2pbuf buffer lies in its provider.
    pub fn placement(&self) -> Option<Placement> {
        match self {
            Buffer::DmaBuf { placement, .. } => *placement,
            _ => None,
        }
    }

    /// Bytes.
    pub fn len(&self) -> u64 {
        match self {
            Buffer::Host(h) => h.len() as u64,
            _ => self.dmabuf().map_or(0, |b| b.size()),
        }
    }

    /// Never: zero-length buffers are refused.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Device memory: p2pbuf or CUDA memory, or a received dma-buf of the p2pbuf exporter.
    pub fn is_device_memory(&self) -> bool {
        match self {
            Buffer::Host(_) => false,
            Buffer::DmaBuf { buf, .. } => buf.exporter() == "p2pbuf",
            #[cfg(feature = "cuda")]
            Buffer::Cuda(_) => true,
        }
    }

    /// The dma-buf, or an error saying that `what` needs one.
    pub fn require_dmabuf(&self, what: &str) -> Result<&DmaBuf> {
        self.dmabuf().ok_or_else(|| Error::Invalid {
            what: what.into(),
            detail: "host memory is not a dma-buf".into(),
            check: Some("choose p2pbuf, udmabuf, cuda or fd-from:SOCKET".into()),
        })
    }

    /// The dma-buf, taken out (a CUDA buffer keeps its device memory only as long as the
    /// [`Buffer`]: use [`Buffer::dmabuf`] there).
    pub fn into_dmabuf(self, what: &str) -> Result<DmaBuf> {
        match self {
            Buffer::DmaBuf { buf, .. } => Ok(buf),
            other => Err(Error::Invalid {
                what: what.into(),
                detail: format!("{} cannot be taken out as a bare dma-buf", other.describe()),
                check: Some("choose p2pbuf, udmabuf or fd-from:SOCKET".into()),
            }),
        }
    }

    /// The host memory, taken out.
    pub fn into_host(self, what: &str) -> Result<HostBuf> {
        match self {
            Buffer::Host(h) => Ok(h),
            other => Err(Error::Invalid {
                what: what.into(),
                detail: format!("{} is not host memory", other.describe()),
                check: Some("choose host".into()),
            }),
        }
    }

    /// What it is, for reports.
    pub fn summary(&self, kind: &Source) -> Summary {
        let d = self.dmabuf();
        let p = self.placement();
        Summary {
            kind: kind.clone(),
            exporter: d.map(|b| b.exporter().to_string()),
            size: self.len(),
            device_memory: self.is_device_memory(),
            fd: d.map(std::os::fd::AsRawFd::as_raw_fd),
            provider: p.map(|p| p.provider),
            bar_offset: p.map(|p| p.bar_offset),
        }
    }

    /// One line for humans.
    pub fn describe(&self) -> String {
        self.summary(&Source::Host).describe()
    }
}

impl Summary {
    /// One line for humans: device, system or host memory, with the exporter and size.
    pub fn describe(&self) -> String {
        let size = crate::units::human_size(self.size);
        match (&self.exporter, self.device_memory) {
            (Some(e), true) => format!(
                "device memory ({e} dma-buf of {size}{})",
                self.provider.map_or(String::new(), |p| format!(
                    ", provider {p}, BAR offset {:#x}",
                    self.bar_offset.unwrap_or(0)
                ))
            ),
            (Some(e), false) => format!("system memory ({e} dma-buf of {size})"),
            (None, _) => "host memory of this process (no dma-buf)".to_string(),
        }
    }
}

/// A buffer of `len` bytes (rounded up to the page size for dma-bufs) from `source`, with the
/// default [`Options`]. For [`Source::FdFrom`], `len` is not used: the buffer is the sender's.
pub fn alloc(source: &Source, len: u64) -> Result<Buffer> {
    alloc_with(source, len, &Options::default())
}

/// As [`alloc`], with [`Options`].
pub fn alloc_with(source: &Source, len: u64, o: &Options) -> Result<Buffer> {
    Ok(match source {
        Source::P2pbuf => {
            let a = crate::exporter::alloc_with(len, o.p2pbuf)?;
            Buffer::DmaBuf {
                buf: a.buf,
                placement: Some(Placement {
                    provider: a.provider,
                    bar_offset: a.offset,
                }),
            }
        }
        Source::Udmabuf => Buffer::DmaBuf {
            buf: crate::udmabuf::alloc(len)?,
            placement: None,
        },
        Source::Heap => Buffer::DmaBuf {
            buf: crate::heap::alloc(len)?,
            placement: None,
        },
        Source::Host => {
            Buffer::Host(HostBuf::new(usize::try_from(len).map_err(|_| {
                Error::protocol("allocating host memory", format!("{len} bytes"))
            })?)?)
        }
        Source::FdFrom(socket) => Buffer::DmaBuf {
            buf: crate::fdpass::receive_one(socket, o.wait, &o.ack)?,
            placement: None,
        },
        #[cfg(feature = "cuda")]
        Source::Cuda => Buffer::Cuda(Box::new(crate::cuda::export(
            &crate::cuda::ExportOptions {
                device: o.cuda_device,
                size: usize::try_from(len).map_err(|_| {
                    Error::protocol("allocating CUDA memory", format!("{len} bytes"))
                })?,
                ..Default::default()
            },
        )?)),
        #[cfg(not(feature = "cuda"))]
        Source::Cuda => {
            return Err(Error::Unavailable {
                what: "allocating CUDA memory".into(),
                detail: "this p2pbuf was built without the `cuda` feature".into(),
                check: Some("cargo build -p p2pbuf-cli --features cuda".into()),
            })
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_parse_and_print_back() {
        for s in [
            "p2pbuf",
            "udmabuf",
            "heap",
            "host",
            "cuda",
            "fd-from:/tmp/s",
        ] {
            assert_eq!(s.parse::<Source>().unwrap().to_string(), s);
        }
        assert_eq!(
            "fd-from:/tmp/s".parse::<Source>().unwrap(),
            Source::FdFrom("/tmp/s".into())
        );
        assert!("fd-from".parse::<Source>().is_err());
        assert!("host:/x".parse::<Source>().is_err());
        assert!("gpu".parse::<Source>().is_err());
        assert_eq!(
            Source::DEFAULT_NAME.parse::<Source>().unwrap(),
            Source::DEFAULT
        );
    }

    #[test]
    fn host_buffer_is_aligned_and_zeroed() {
        let mut b = HostBuf::new(8192).unwrap();
        assert_eq!(b.as_ptr() as usize % 4096, 0);
        assert_eq!(b.len(), 8192);
        assert!(b.as_slice().iter().all(|x| *x == 0));
        b.as_mut_slice()[8191] = 1;
        assert_eq!(b.as_slice()[8191], 1);
        assert!(HostBuf::new(0).is_err());
    }

    #[test]
    fn host_memory_through_alloc() {
        let b = alloc(&Source::Host, 4096).unwrap();
        assert_eq!(b.len(), 4096);
        assert!(b.dmabuf().is_none());
        assert!(!b.is_device_memory());
        let s = b.summary(&Source::Host);
        assert_eq!(s.describe(), "host memory of this process (no dma-buf)");
        assert!(b.require_dmabuf("x").is_err());
    }
}
