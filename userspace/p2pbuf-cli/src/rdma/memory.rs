//! `--mem`: the memory `rdma serve` and `rdma reg` register, from [`p2pbuf::memory`] (or any
//! file's fd, `file:PATH`), and its registration.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use clap::Args;
use p2pbuf::memory::{self, Buffer, Source};
use p2pbuf::units::{human_size, parse_size, parse_u64};
use p2pbuf::{DmaBuf, Error};
use p2pbuf_rdma::session::ServerMemory;
use p2pbuf_rdma::{MrAccess, MrInfo, Pd};

use crate::mem::MemSpec;

#[derive(Args, Debug)]
pub struct BufArgs {
    /// The memory: p2pbuf (device memory from /dev/p2pbuf), udmabuf, heap (the system
    /// dma-buf heap), host (registered with ibv_reg_mr), cuda, fd-from:SOCKET (a dma-buf
    /// received from `p2pbuf alloc --send` or `p2pbuf send`), or file:PATH (any file's fd, to
    /// see it refused). Dma-bufs are registered with ibv_reg_dmabuf_mr. Every command
    /// defaults to p2pbuf.
    #[arg(long, default_value = Source::DEFAULT_NAME, value_name = "SOURCE")]
    pub mem: MemSpec,
    /// Bytes to allocate (p2pbuf, udmabuf, heap, host, cuda); fd-from takes the sender's size.
    #[arg(long, value_parser = parse_size)]
    pub size: Option<usize>,
    /// Dma-bufs: where the MR starts in the buffer.
    #[arg(long, default_value = "0", value_parser = parse_size)]
    pub offset: usize,
    /// Dma-bufs: MR length (default: the rest of the buffer after --offset).
    #[arg(long, value_parser = parse_size)]
    pub length: Option<usize>,
    /// Dma-bufs: the address peers use for the MR's first byte (default: --offset).
    #[arg(long, value_parser = parse_u64)]
    pub iova: Option<u64>,
    /// Access flags: lw (LOCAL_WRITE), rw (REMOTE_WRITE), rr (REMOTE_READ), ra, none.
    #[arg(long, default_value = "lw,rw,rr")]
    pub access: MrAccess,
    /// RDMA device (default: the first, or the one the bind address belongs to).
    #[arg(long)]
    pub device: Option<String>,
}

/// The memory behind a registration.
pub enum Memory {
    Buffer(Buffer),
    /// Any other fd (a negative test).
    Other(OwnedFd, PathBuf),
}

impl Memory {
    fn describe(&self) -> String {
        match self {
            Memory::Buffer(Buffer::Host(b)) => {
                format!("host memory, {}", human_size(b.len() as u64))
            }
            Memory::Buffer(m) => match m.dmabuf() {
                Some(b) => format!(
                    "{} dma-buf of {} (fd {}, inode {})",
                    b.exporter(),
                    human_size(b.size()),
                    b.as_raw_fd(),
                    b.info().ino.map_or("?".into(), |i| i.to_string())
                ),
                None => m.describe(),
            },
            Memory::Other(fd, p) => {
                format!("fd {} ({}), not a dma-buf", fd.as_raw_fd(), p.display())
            }
        }
    }

    fn name(&self) -> String {
        match self {
            Memory::Buffer(m) => m
                .dmabuf()
                .map_or_else(|| "host".into(), |b| b.exporter().to_string()),
            Memory::Other(..) => "file".into(),
        }
    }
}

fn io_err(what: &str, path: &Path, source: std::io::Error) -> Error {
    Error::Io {
        what: what.into(),
        path: path.to_path_buf(),
        source,
        check: None,
    }
}

/// Whether `--mem` asks for p2pbuf device memory.
pub fn is_p2pbuf(b: &BufArgs) -> bool {
    b.mem == MemSpec::Memory(Source::P2pbuf)
}

pub fn get_memory(b: &BufArgs, wait: u64) -> p2pbuf::Result<Memory> {
    Ok(match &b.mem {
        MemSpec::Memory(src) => {
            let size = match (src.allocates(), b.size) {
                (false, _) => 0,
                (true, Some(s)) => s as u64,
                (true, None) => {
                    return Err(Error::Protocol {
                        what: format!("--mem {src}"),
                        detail: "--size is needed for this kind of memory".into(),
                    })
                }
            };
            let opts = memory::Options {
                wait,
                ack: format!("pid {} will register it for RDMA", std::process::id()),
                ..Default::default()
            };
            Memory::Buffer(memory::alloc_with(src, size, &opts)?)
        }
        MemSpec::File(p) => {
            let f = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(p)
                .map_err(|e| io_err("opening a file to register", p, e))?;
            if let Some(s) = b.size {
                f.set_len(s as u64)
                    .map_err(|e| io_err("sizing the file", p, e))?;
            }
            Memory::Other(f.into(), p.clone())
        }
    })
}

/// A registration with what it registers.
pub struct Registered {
    pub desc: String,
    pub name: String,
    mr: RegMr,
}

enum RegMr {
    Host(p2pbuf_rdma::HostMr),
    DmaBuf {
        mr: p2pbuf_rdma::Mr,
        /// None for an fd that is not a dma-buf.
        buf: Option<Buffer>,
        offset: u64,
    },
}

impl Registered {
    pub fn info(&self) -> MrInfo {
        match &self.mr {
            RegMr::Host(m) => m.info(),
            RegMr::DmaBuf { mr, .. } => mr.info(),
        }
    }

    pub fn verb(&self) -> &'static str {
        match &self.mr {
            RegMr::Host(_) => "ibv_reg_mr",
            RegMr::DmaBuf { .. } => "ibv_reg_dmabuf_mr",
        }
    }

    /// `ibv_dereg_mr`, then free or close the memory.
    pub fn dereg(self) -> p2pbuf::Result<()> {
        match self.mr {
            RegMr::Host(m) => m.dereg().map(drop),
            RegMr::DmaBuf { mr, buf, .. } => {
                mr.dereg()?;
                drop(buf);
                Ok(())
            }
        }
    }
}

impl ServerMemory for Registered {
    fn with_bytes(&self, off: u64, len: u64, f: &mut dyn FnMut(&[u8])) -> p2pbuf::Result<()> {
        match &self.mr {
            RegMr::Host(m) => m.buf().with_bytes(off, len, f),
            RegMr::DmaBuf {
                buf: Some(m),
                offset,
                ..
            } => {
                let b = m.require_dmabuf("reading the registered memory")?;
                // Through the exporter's mmap, inside DMA_BUF_IOCTL_SYNC(START/END | READ).
                let map = b.map(p2pbuf::Access::Read)?;
                let g = map.read()?;
                let s = (offset + off) as usize;
                f(&g[s..s + len as usize]);
                g.finish()
            }
            RegMr::DmaBuf { buf: None, .. } => Err(Error::Protocol {
                what: "reading the registered memory".into(),
                detail: "it is not a dma-buf".into(),
            }),
        }
    }
}

pub fn register(pd: &Pd, mem: Memory, b: &BufArgs) -> p2pbuf::Result<Registered> {
    let desc = mem.describe();
    let name = mem.name();
    let offset = b.offset as u64;
    let iova = b.iova.unwrap_or(offset);
    let mr = match mem {
        Memory::Buffer(Buffer::Host(buf)) => RegMr::Host(pd.reg_mr(buf, b.access)?),
        Memory::Buffer(m) => {
            let d: &DmaBuf = m.require_dmabuf("registering a dma-buf")?;
            let len = b
                .length
                .unwrap_or_else(|| d.size().saturating_sub(offset) as usize);
            let mr = pd
                .reg_dmabuf_mr(offset, len, iova, d.as_fd(), b.access)
                .map_err(|e| crate::p2ppath::explain_dmabuf_refusal(e, pd, d))?;
            RegMr::DmaBuf {
                mr,
                buf: Some(m),
                offset,
            }
        }
        Memory::Other(fd, _) => {
            let len = b.length.or(b.size).unwrap_or(4096);
            let mr = pd.reg_dmabuf_mr(offset, len, iova, fd.as_fd(), b.access)?;
            RegMr::DmaBuf {
                mr,
                buf: None,
                offset,
            }
        }
    };
    Ok(Registered { desc, name, mr })
}
