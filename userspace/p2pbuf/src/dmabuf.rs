//! [`DmaBuf`]: an owned dma-buf file descriptor with its size and exporter.

use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::path::Path;

use crate::error::{Error, Result};
use crate::fdinfo::DmaBufInfo;
use crate::mapping::{Access, CpuMapping};
use crate::sys;

/// An owned dma-buf file descriptor, checked to be one, with what the
/// kernel's fdinfo says about it.
#[derive(Debug)]
pub struct DmaBuf {
    fd: OwnedFd,
    info: DmaBufInfo,
}

impl DmaBuf {
    /// Take ownership of `fd` after checking that it is a dma-buf (its
    /// filesystem is the dma-buf one and its fdinfo has `exp_name` and
    /// `size`). On error the fd is closed.
    pub fn from_fd(fd: OwnedFd) -> Result<Self> {
        let raw = fd.as_raw_fd();
        let what = format!("checking fd {raw}");
        let st = rustix::fs::fstatfs(&fd).map_err(|e| Error::os(what.clone(), e))?;
        // `f_type` is signed on some targets; compare as the 32-bit magic.
        #[allow(clippy::unnecessary_cast)]
        let ftype = (st.f_type as i64 as u64) & 0xffff_ffff;
        if ftype != sys::DMA_BUF_MAGIC {
            return Err(Error::NotDmaBuf {
                what,
                detail: format!(
                    "its filesystem magic is {ftype:#x} ({}), a dma-buf's is {:#x}",
                    fs_name(ftype),
                    sys::DMA_BUF_MAGIC
                ),
                check: Some(
                    "pass an fd from a dma-buf exporter (CUDA, udmabuf, DRM PRIME, vfio-pci, the p2pbuf exporter), not a file or device node"
                        .into(),
                ),
            });
        }
        let info = DmaBufInfo::read(format!("/proc/self/fdinfo/{raw}"))?;
        Ok(DmaBuf { fd, info })
    }

    /// Duplicate a file descriptor this process inherited (e.g. `3` after
    /// a shell redirection) and check it is a dma-buf. The original fd is
    /// left open.
    pub fn from_inherited_fd(raw: RawFd) -> Result<Self> {
        let fd = sys::dup_inherited_fd(raw).map_err(|e| {
            Error::os_check(
                format!("duplicating inherited fd {raw}"),
                e,
                "is that fd open in this process (ls -l /proc/self/fd)?",
            )
        })?;
        Self::from_fd(fd).map_err(|e| e.with_what(format!("checking inherited fd {raw}")))
    }

    /// Open `path` read-write (read-only if that is refused) and check the
    /// result is a dma-buf. Device nodes and regular files are rejected;
    /// this is mostly useful for `/proc/<pid>/fd/<n>` style paths on
    /// kernels that allow reopening them.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .or_else(|_| std::fs::File::open(path))
            .map_err(|e| Error::io("opening a dma-buf", path, e))?;
        Self::from_fd(f.into()).map_err(|e| e.with_what(format!("opening {}", path.display())))
    }

    /// Size in bytes.
    pub fn size(&self) -> u64 {
        self.info.size
    }

    /// Exporter name (`exp_name` in fdinfo), e.g. `nv_dmabuf`.
    pub fn exporter(&self) -> &str {
        &self.info.exporter
    }

    /// What fdinfo said when this value was made (or last refreshed).
    pub fn info(&self) -> &DmaBufInfo {
        &self.info
    }

    /// Read fdinfo again (e.g. to see `count` change).
    pub fn refresh_info(&mut self) -> Result<&DmaBufInfo> {
        self.info = DmaBufInfo::read(format!("/proc/self/fdinfo/{}", self.fd.as_raw_fd()))?;
        Ok(&self.info)
    }

    /// A second fd for the same buffer.
    pub fn try_clone(&self) -> Result<Self> {
        let fd = rustix::io::fcntl_dupfd_cloexec(&self.fd, 0)
            .map_err(|e| Error::os(format!("duplicating dma-buf fd {}", self.fd.as_raw_fd()), e))?;
        Ok(DmaBuf {
            fd,
            info: self.info.clone(),
        })
    }

    /// Give up the checks and take the fd.
    pub fn into_fd(self) -> OwnedFd {
        self.fd
    }

    /// Name the buffer (`DMA_BUF_SET_NAME`): every process holding it sees the name in its
    /// fdinfo (`name:`). At most 31 bytes, no NUL. Refreshes [`DmaBuf::info`].
    pub fn set_name(&mut self, name: &str) -> Result<()> {
        let what = format!(
            "naming dma-buf fd {} {name:?} (DMA_BUF_SET_NAME)",
            self.fd.as_raw_fd()
        );
        if name.len() > crate::surface::NAME_MAX {
            return Err(Error::Invalid {
                what,
                detail: format!(
                    "{} bytes; a dma-buf name has at most {} (DMA_BUF_NAME_LEN 32 with the NUL)",
                    name.len(),
                    crate::surface::NAME_MAX
                ),
                check: None,
            });
        }
        let c = std::ffi::CString::new(name).map_err(|_| Error::Invalid {
            what: what.clone(),
            detail: "the name contains a NUL byte".into(),
            check: None,
        })?;
        sys::dma_buf_set_name(self.fd.as_fd(), &c).map_err(|e| {
            Error::os_check(
                what,
                e,
                "EBUSY on kernels before 5.15 while the buffer is attached: name it before attaching",
            )
        })?;
        self.refresh_info()?;
        Ok(())
    }

    /// The surface this buffer's name describes, if it carries one (see
    /// [`crate::surface`]).
    pub fn surface(&self) -> Option<Result<crate::surface::Surface>> {
        self.info.surface()
    }

    /// Map the whole buffer for CPU access. See [`CpuMapping`].
    pub fn map(&self, access: Access) -> Result<CpuMapping<'_>> {
        CpuMapping::new(self, access)
    }
}

owns_fd!(DmaBuf, fd);

fn fs_name(magic: u64) -> &'static str {
    use linux_raw_sys::general as g;
    const NAMES: &[(u32, &str)] = &[
        (
            g::TMPFS_MAGIC,
            "tmpfs: a memfd, a shm file or a device node on devtmpfs",
        ),
        (g::PROC_SUPER_MAGIC, "procfs"),
        (g::SYSFS_MAGIC, "sysfs"),
        (g::EXT4_SUPER_MAGIC, "ext2/3/4"),
        (
            g::ANON_INODE_FS_MAGIC,
            "anon_inodefs, e.g. an eventfd or DRM sync file",
        ),
        (g::SOCKFS_MAGIC, "a socket"),
        (g::PIPEFS_MAGIC, "a pipe"),
        (g::DEVPTS_SUPER_MAGIC, "a pty"),
        (g::OVERLAYFS_SUPER_MAGIC, "overlayfs"),
    ];
    let m = magic as u32;
    NAMES
        .iter()
        .find(|(k, _)| *k == m)
        .map_or("not the dma-buf filesystem", |(_, n)| n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regular_file_is_rejected_by_magic() {
        let f = std::fs::File::open("/proc/self/status").unwrap();
        let e = DmaBuf::from_fd(f.into()).unwrap_err();
        match &e {
            Error::NotDmaBuf { detail, .. } => {
                assert!(detail.contains("procfs"), "{detail}");
                assert!(detail.contains("0x444d4142"), "{detail}");
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(e.check().is_some());
    }

    #[test]
    fn memfd_is_rejected() {
        let fd = rustix::fs::memfd_create("not-a-dmabuf", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        let e = DmaBuf::from_fd(fd).unwrap_err();
        assert!(e.to_string().contains("not a dma-buf"), "{e}");
        assert!(e.to_string().contains("memfd"), "{e}");
    }

    #[test]
    fn closed_inherited_fd_is_ebadf() {
        let e = DmaBuf::from_inherited_fd(987_654).unwrap_err();
        assert_eq!(e.errno(), Some(9));
        assert!(e.to_string().contains("fd 987654"), "{e}");
    }

    #[test]
    fn open_of_device_node_is_rejected() {
        let e = DmaBuf::open("/dev/null").unwrap_err();
        assert!(matches!(e, Error::NotDmaBuf { .. }), "{e:?}");
        assert!(e.to_string().contains("/dev/null"), "{e}");
    }

    #[test]
    fn open_of_missing_path_keeps_errno() {
        let e = DmaBuf::open("/nonexistent/p2pbuf").unwrap_err();
        assert_eq!(e.errno(), Some(2));
    }
}
