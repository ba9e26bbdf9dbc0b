//! A file descriptor for the dma-buf behind a CPU mapping.
//!
//! `ibv_reg_dmabuf_mr` wants the dma-buf's fd; `ibv_reg_mr` only gets an address. The mapping's
//! file *is* the dma-buf, so:
//!
//! 1. [`scan_fds`]: an fd of this process whose `fstat` has the mapping's device and inode
//!    (`/proc/self/maps` gives both). It is duplicated (`F_DUPFD_CLOEXEC`) and the duplicate is
//!    checked again, so that a concurrent `close` + reuse of the number cannot hand over another
//!    file. This needs no privilege, only that the program still holds the fd it mapped.
//! 2. [`open_map_files`]: `/proc/self/map_files/START-END`, the kernel's link to a mapping's
//!    file. Its lookup needs `CAP_SYS_ADMIN` (or `CAP_CHECKPOINT_RESTORE`), and opening it
//!    opens the file again through its inode, which a dma-buf's inode refuses (its `i_fop` is
//!    the kernel's `no_open_fops`: `ENXIO`). So this only helps for files that can be reopened;
//!    for a dma-buf whose fd the program closed after `mmap` it reports why not.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// `(st_dev, st_ino)` of an open fd.
fn ids(fd: RawFd) -> Option<(u64, u64)> {
    // SAFETY: fstat writes a `struct stat`; a closed or invalid fd is an error return.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        (libc::fstat(fd, &mut st) == 0).then_some((st.st_dev, st.st_ino))
    }
}

/// An fd found for a file.
#[derive(Debug)]
pub struct Found {
    /// Our own duplicate (close-on-exec).
    pub fd: OwnedFd,
    /// The program's fd it was duplicated from.
    pub original: RawFd,
}

/// Looks through `/proc/self/fd` for an fd of the file `(dev, ino)` and duplicates it. On
/// failure, the number of fds looked at.
pub fn scan_fds(dev: u64, ino: u64) -> Result<Found, usize> {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return Err(0);
    };
    let mut fds: Vec<RawFd> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    fds.sort_unstable();
    for &fd in &fds {
        if ids(fd) != Some((dev, ino)) {
            continue;
        }
        // SAFETY: F_DUPFD_CLOEXEC returns a new fd (ours) or -1.
        let d = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
        if d < 0 {
            continue;
        }
        // SAFETY: `d` was just returned by fcntl and is owned by nobody else.
        let dup = unsafe { OwnedFd::from_raw_fd(d) };
        // The program may have closed `fd` and opened something else under the same number
        // between the fstat and the dup: check what we hold.
        if ids(dup.as_raw_fd()) == Some((dev, ino)) {
            return Ok(Found {
                fd: dup,
                original: fd,
            });
        }
    }
    Err(fds.len())
}

/// The `/proc/self/map_files` entry of the mapping `[start, end)`.
pub fn map_files_path(start: u64, end: u64) -> String {
    format!("/proc/self/map_files/{start:x}-{end:x}")
}

/// Opens the file of the mapping `[start, end)` through `/proc/self/map_files` and checks that
/// it is `(dev, ino)`.
pub fn open_map_files(start: u64, end: u64, dev: u64, ino: u64) -> io::Result<OwnedFd> {
    let path = std::ffi::CString::new(map_files_path(start, end)).expect("no NUL");
    // SAFETY: a NUL-terminated path; open returns a new fd or -1.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by open.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    if ids(fd.as_raw_fd()) != Some((dev, ino)) {
        return Err(io::Error::other(
            "the mapping changed while it was being opened",
        ));
    }
    Ok(fd)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::maps;

    /// A shared mapping of a memfd, with its fd.
    struct Memfd {
        fd: OwnedFd,
        addr: *mut libc::c_void,
        len: usize,
    }

    impl Memfd {
        fn new(len: usize) -> Memfd {
            // SAFETY: plain syscalls on our own fd and a new mapping.
            unsafe {
                let fd = libc::memfd_create(c"peermem-test".as_ptr(), libc::MFD_CLOEXEC);
                assert!(fd >= 0);
                let fd = OwnedFd::from_raw_fd(fd);
                assert_eq!(libc::ftruncate(fd.as_raw_fd(), len as i64), 0);
                let addr = libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED,
                    fd.as_raw_fd(),
                    0,
                );
                assert_ne!(addr, libc::MAP_FAILED);
                Memfd { fd, addr, len }
            }
        }
    }

    impl Drop for Memfd {
        fn drop(&mut self) {
            // SAFETY: our own mapping.
            unsafe { libc::munmap(self.addr, self.len) };
        }
    }

    /// The maps line of a shared memfd mapping (`/memfd:peermem-test (deleted)`): not a
    /// dma-buf, but a file mapping whose fd the process holds, as a dma-buf's would be.
    #[test]
    fn finds_the_fd_behind_a_mapping() {
        let m = Memfd::new(1 << 20);
        let (dev, ino) = ids(m.fd.as_raw_fd()).unwrap();
        let l = maps::lookup_self(m.addr as u64 + 4096, 4096).unwrap();
        let maps::Lookup::Other {
            start, end, path, ..
        } = l
        else {
            panic!("{l:?}")
        };
        assert!(path.starts_with("/memfd:peermem-test"), "{path}");
        assert_eq!(start, m.addr as u64);
        assert_eq!(end, m.addr as u64 + (1 << 20));
        // The device and inode of the maps line are what fstat says.
        let line = std::fs::read_to_string("/proc/self/maps").unwrap();
        let ml = line
            .lines()
            .filter_map(maps::parse_line)
            .find(|x| x.start == start)
            .unwrap();
        assert_eq!((ml.dev(), ml.inode), (dev, ino));
        let f = scan_fds(dev, ino).unwrap();
        assert_eq!(f.original, m.fd.as_raw_fd());
        assert_ne!(f.fd.as_raw_fd(), m.fd.as_raw_fd());
        assert_eq!(ids(f.fd.as_raw_fd()), Some((dev, ino)));
        // A file nobody holds.
        assert!(scan_fds(dev, ino + 1_000_000_007).is_err());
    }

    #[test]
    fn map_files_opens_a_reopenable_file_or_says_why_not() {
        let m = Memfd::new(1 << 16);
        let (dev, ino) = ids(m.fd.as_raw_fd()).unwrap();
        let (s, e) = (m.addr as u64, m.addr as u64 + (1 << 16));
        match open_map_files(s, e, dev, ino) {
            // Root (CAP_SYS_ADMIN): a memfd can be reopened.
            Ok(fd) => assert_eq!(ids(fd.as_raw_fd()), Some((dev, ino))),
            // Without the capability the lookup is refused.
            Err(err) => assert_eq!(err.raw_os_error(), Some(libc::EPERM), "{err}"),
        }
        assert!(open_map_files(s, e + 4096, dev, ino).is_err());
    }
}
