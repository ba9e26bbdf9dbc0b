//! udmabuf: dma-bufs backed by a sealed memfd, from `/dev/udmabuf`
//! (`CONFIG_UDMABUF`). A foreign exporter for tests that runs anywhere the
//! module is present; its buffers support CPU mmap.

use std::os::fd::AsFd;
use std::path::Path;

use rustix::fs::{MemfdFlags, SealFlags};

use crate::dmabuf::DmaBuf;
use crate::error::{Error, Result};
use crate::sys;

/// The device node.
pub const UDMABUF_DEV: &str = "/dev/udmabuf";

/// Whether `/dev/udmabuf` exists.
pub fn available() -> bool {
    Path::new(UDMABUF_DEV).exists()
}

/// Allocate a udmabuf of at least `size` bytes (rounded up to the page
/// size): a memfd sized and sealed with `F_SEAL_SHRINK`, turned into a
/// dma-buf with `UDMABUF_CREATE`.
///
/// Returns [`Error::Unavailable`] when `/dev/udmabuf` does not exist.
pub fn alloc(size: u64) -> Result<DmaBuf> {
    if size == 0 {
        return Err(Error::protocol("allocating a udmabuf", "size must be > 0"));
    }
    let page = rustix::param::page_size() as u64;
    let size = size.div_ceil(page) * page;
    let dev = match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(UDMABUF_DEV)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(Error::unavailable(
                "allocating a udmabuf",
                format!("{UDMABUF_DEV} does not exist"),
                Some("a kernel with CONFIG_UDMABUF (modprobe udmabuf)".into()),
            ))
        }
        Err(e) => {
            return Err(Error::Io {
                what: "opening the udmabuf device".into(),
                path: UDMABUF_DEV.into(),
                check: Some("permissions of /dev/udmabuf (root, or a udev rule)".into()),
                source: e,
            })
        }
    };
    let memfd = rustix::fs::memfd_create(
        "p2pbuf-udmabuf",
        MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
    )
    .map_err(|e| Error::os("memfd_create(MFD_ALLOW_SEALING)", e))?;
    rustix::fs::ftruncate(&memfd, size)
        .map_err(|e| Error::os(format!("ftruncate(memfd, {size})"), e))?;
    rustix::fs::fcntl_add_seals(&memfd, SealFlags::SHRINK)
        .map_err(|e| Error::os("fcntl(memfd, F_ADD_SEALS, F_SEAL_SHRINK)", e))?;
    let fd = sys::udmabuf_create(dev.as_fd(), memfd.as_fd(), 0, size).map_err(|e| {
        Error::os_check(
            format!("UDMABUF_CREATE({size} bytes)"),
            e,
            "size within /sys/module/udmabuf/parameters/size_limit_mb, memfd sealed F_SEAL_SHRINK",
        )
    })?;
    DmaBuf::from_fd(fd)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mapping::Access;

    #[test]
    fn zero_size_is_refused() {
        assert!(alloc(0).is_err());
    }

    #[test]
    fn alloc_map_and_pass_when_available() {
        if !available() {
            let e = alloc(4096).unwrap_err();
            assert!(e.is_unavailable(), "{e:?}");
            assert!(e.to_string().contains("/dev/udmabuf"), "{e}");
            eprintln!("skipping udmabuf test: {e}");
            return;
        }
        let buf = match alloc(5000) {
            Ok(b) => b,
            Err(e) if e.errno() == Some(13) => {
                eprintln!("skipping udmabuf test: {e}");
                return;
            }
            Err(e) => panic!("{e}"),
        };
        assert_eq!(buf.exporter(), "udmabuf");
        assert_eq!(buf.size() % rustix::param::page_size() as u64, 0);
        assert!(buf.size() >= 5000);
        {
            let mut m = buf.map(Access::ReadWrite).unwrap();
            {
                let mut w = m.write().unwrap();
                w[0] = 0xa5;
                w[4999] = 0x5a;
                w.finish().unwrap();
            }
            let r = m.read().unwrap();
            assert_eq!((r[0], r[4999]), (0xa5, 0x5a));
        }
        // Read-only mapping refuses write access.
        let mut ro = buf.map(Access::Read).unwrap();
        assert!(ro.write().is_err());
        // Pass it over a socket and check the receiver sees the same inode.
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        crate::fdpass::send_dmabuf(&a, &buf).unwrap();
        let got = crate::fdpass::recv_dmabuf(&b).unwrap();
        assert_eq!(got.buf.info().ino, buf.info().ino);
        assert_eq!(got.header.exporter, "udmabuf");
        let r = got.buf.map(Access::Read).unwrap();
        assert_eq!(r.read().unwrap()[4999], 0x5a);
    }
}
