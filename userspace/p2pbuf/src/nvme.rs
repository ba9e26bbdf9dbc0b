//! NVMe (any block device) with `O_DIRECT`: reads and writes between the drive and a buffer
//! in memory, typically the CPU mapping of a dma-buf ([`crate::CpuMapping`]).
//!
//! When the buffer is the mapping of p2pbuf device memory its pages are p2pdma pages, so the
//! drive DMAs straight into (or out of) the device's BAR: `O_DIRECT` never bounces, and the
//! block layer refuses p2pdma pages with `EREMOTEIO` when the drive and the memory have no
//! peer-to-peer path. That refusal is reported as such ([`is_no_p2p_path`]).
//!
//! ```no_run
//! # fn demo(buf: &p2pbuf::DmaBuf) -> p2pbuf::Result<()> {
//! let drive = p2pbuf::nvme::Drive::open("/dev/nvme0n1", false)?;
//! let mut map = buf.map(p2pbuf::Access::ReadWrite)?;
//! let mut w = map.write()?;
//! let n = drive.read_into(&mut w[..1 << 20], 0)?;
//! # Ok(()) }
//! ```

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags, SeekFrom};
use rustix::io::Errno;

use crate::error::{Error, Result};

/// `EREMOTEIO`: what the block layer answers for p2pdma pages the queue cannot reach.
pub const EREMOTEIO: i32 = 121;

/// True when `e` is the block layer refusing peer-to-peer pages (`EREMOTEIO`).
pub fn is_no_p2p_path(e: &Error) -> bool {
    e.errno() == Some(EREMOTEIO)
}

const NO_P2P_PATH: &str = "the drive and the memory have no peer-to-peer path (PCI topology): the block layer refused the P2P pages; O_DIRECT does not bounce through host memory. Check the exporter's debugfs distances, and that both sit under one PCI switch (or a host bridge on the p2pdma whitelist)";

/// For a transfer whose buffer is device memory (p2pdma pages) with the offset and length
/// aligned: the block layer's answers that mean "no peer-to-peer path". A queue that takes no
/// P2P pages fails the pinning with `EREMOTEIO`; a queue that does (NVMe) but whose DMA
/// mapping finds no path (`pci_p2pdma_state()` = `PCI_P2PDMA_MAP_NOT_SUPPORTED`) completes
/// the request with `BLK_STS_INVAL`, which reaches userspace as `EINVAL`. Such errors get the
/// topology explanation; others are returned unchanged.
pub fn explain_p2p_refusal(e: Error) -> Error {
    match e {
        Error::Os { what, errno, .. }
            if errno == EREMOTEIO || errno == Errno::INVAL.raw_os_error() =>
        {
            Error::Os {
                what,
                errno,
                check: Some(format!(
                    "{NO_P2P_PATH}{}",
                    if errno == EREMOTEIO {
                        ""
                    } else {
                        " (EINVAL: the request's DMA mapping found no P2P path, BLK_STS_INVAL; offset, length and buffer are aligned)"
                    }
                )),
            }
        }
        other => other,
    }
}

/// A block device opened with `O_DIRECT`.
#[derive(Debug)]
pub struct Drive {
    fd: OwnedFd,
    path: PathBuf,
    size: u64,
}

fn check_for(e: Errno, write: bool) -> String {
    if e.raw_os_error() == EREMOTEIO {
        NO_P2P_PATH.into()
    } else if e == Errno::INVAL {
        "O_DIRECT needs the offset, the length and the buffer address aligned to the drive's logical block size (usually 512 or 4096)".into()
    } else if e == Errno::FAULT {
        "O_DIRECT could not pin the buffer's pages: a VM_PFNMAP mapping (udmabuf maps its dma-buf with vmf_insert_pfn: use host memory, or the memfd behind it), or a revoked dma-buf".into()
    } else if e == Errno::NOSPC || e == Errno::NXIO {
        "the range lies past the end of the drive".into()
    } else if e == Errno::IO {
        "dmesg for NVMe errors".into()
    } else if write && e == Errno::BADF {
        "open the drive for writing".into()
    } else {
        "dmesg".into()
    }
}

impl Drive {
    /// Open `path` with `O_DIRECT` (and `O_RDWR` when `write`), and find its size.
    pub fn open(path: impl AsRef<Path>, write: bool) -> Result<Self> {
        let path = path.as_ref();
        let flags =
            OFlags::DIRECT | OFlags::CLOEXEC | if write { OFlags::RDWR } else { OFlags::RDONLY };
        let fd = rustix::fs::open(path, flags, Mode::empty()).map_err(|e| {
            let what = format!(
                "opening {} with O_DIRECT{}",
                path.display(),
                if write { " for writing" } else { "" }
            );
            if e == Errno::NOENT {
                Error::unavailable(
                    what,
                    format!("{} does not exist", path.display()),
                    Some(
                        "is there an NVMe drive (ls /dev/nvme*, lspci) and is its driver loaded?"
                            .into(),
                    ),
                )
            } else {
                Error::os_check(
                    what,
                    e,
                    match e {
                        Errno::ACCESS | Errno::PERM => "permissions of the device node (root)",
                        Errno::INVAL => "the file system or device does not support O_DIRECT",
                        _ => "the path names a block device",
                    },
                )
            }
        })?;
        let size = rustix::fs::seek(&fd, SeekFrom::End(0))
            .map_err(|e| Error::os(format!("lseek(SEEK_END) of {}", path.display()), e))?;
        Ok(Drive {
            fd,
            path: path.to_path_buf(),
            size,
        })
    }

    /// The device path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    fn range_check(&self, what: &str, offset: u64, len: usize) -> Result<()> {
        match offset.checked_add(len as u64) {
            Some(end) if end <= self.size => Ok(()),
            _ => Err(Error::Os {
                what: format!(
                    "{what} {len} bytes at offset {offset} of {} ({} bytes)",
                    self.path.display(),
                    self.size
                ),
                errno: Errno::INVAL.raw_os_error(),
                check: Some("the range must lie inside the drive".into()),
            }),
        }
    }

    /// `pread` all of `buf` from `offset` (repeated on short reads).
    pub fn read_into(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
        self.range_check("reading", offset, buf.len())?;
        let (len, at) = (buf.len(), buf.as_ptr());
        self.repeat(false, len, offset, at, |done| {
            rustix::io::pread(&self.fd, &mut buf[done..], offset + done as u64)
        })
    }

    /// `pwrite` all of `buf` at `offset` (repeated on short writes), then `fdatasync`.
    pub fn write_from(&self, buf: &[u8], offset: u64) -> Result<usize> {
        self.range_check("writing", offset, buf.len())?;
        let done = self.repeat(true, buf.len(), offset, buf.as_ptr(), |done| {
            rustix::io::pwrite(&self.fd, &buf[done..], offset + done as u64)
        })?;
        rustix::fs::fdatasync(&self.fd)
            .map_err(|e| Error::os(format!("fdatasync of {}", self.path.display()), e))?;
        Ok(done)
    }

    /// `io(done)` (a `pread` or `pwrite` of the rest) until `len` bytes at `offset` are done or
    /// it returns 0; an error names the call, the range and the memory at `at`.
    fn repeat(
        &self,
        write: bool,
        len: usize,
        offset: u64,
        at: *const u8,
        mut io: impl FnMut(usize) -> rustix::io::Result<usize>,
    ) -> Result<usize> {
        let mut done = 0;
        while done < len {
            let n = io(done).map_err(|e| {
                Error::os_check(
                    format!(
                        "O_DIRECT {} of {} bytes at offset {} of {} {} {at:p} ({done} done)",
                        if write { "pwrite" } else { "pread" },
                        len - done,
                        offset + done as u64,
                        self.path.display(),
                        if write { "from" } else { "into" },
                    ),
                    e,
                    check_for(e, write),
                )
            })?;
            if n == 0 {
                break;
            }
            done += n;
        }
        Ok(done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_drive_is_unavailable() {
        let e = Drive::open("/nonexistent/nvme0n1", false).unwrap_err();
        assert!(e.is_unavailable(), "{e:?}");
        assert!(e.to_string().contains("does not exist"), "{e}");
    }

    #[test]
    fn eremoteio_says_no_p2p_path() {
        let e = Error::os_check(
            "x",
            Errno::from_raw_os_error(EREMOTEIO),
            check_for(Errno::from_raw_os_error(EREMOTEIO), false),
        );
        assert!(is_no_p2p_path(&e));
        assert!(e.to_string().contains("no peer-to-peer path"), "{e}");
    }

    #[test]
    fn einval_on_device_memory_is_explained() {
        let e = Error::os_check("pwrite", Errno::INVAL, "alignment");
        let e = explain_p2p_refusal(e);
        assert_eq!(e.errno(), Some(22));
        assert!(e.to_string().contains("no peer-to-peer path"), "{e}");
        let e = explain_p2p_refusal(Error::os_check("pwrite", Errno::IO, "dmesg"));
        assert!(!e.to_string().contains("peer-to-peer"), "{e}");
    }

    #[test]
    fn direct_io_on_a_file() {
        // tmpfs has no O_DIRECT; a file under the target dir usually does. Either way the
        // library must answer with an error or the right bytes, never garbage.
        let dir = std::env::temp_dir().join(format!("p2pbuf-nvme-{}", std::process::id()));
        let p = dir.with_extension("img");
        std::fs::write(&p, vec![7u8; 8192]).unwrap();
        match Drive::open(&p, true) {
            Ok(d) => {
                assert_eq!(d.size(), 8192);
                let e = d.read_into(&mut [0u8; 4096], 8000).unwrap_err();
                assert_eq!(e.errno(), Some(22), "{e}");
            }
            Err(e) => assert_eq!(e.errno(), Some(22), "{e}"),
        }
        let _ = std::fs::remove_file(&p);
    }
}
