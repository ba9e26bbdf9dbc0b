//! The library's state: one dma-buf fd per buffer (a duplicate of the program's fd, or a CUDA
//! export), shared by the memory regions registered from it and closed with the last one; and
//! which memory region came from which fd.

use std::collections::BTreeMap;
use std::fmt;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

/// What an fd stands for.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Key {
    /// A dma-buf that the program mapped: its `(st_dev, st_ino)`, unique while it exists (and
    /// the fd held here keeps it existing).
    Mapped {
        /// `st_dev`.
        dev: u64,
        /// `st_ino`.
        ino: u64,
    },
    /// An export of (the whole of) one CUDA allocation, or of one mapping of CUDA VMM memory.
    Cuda {
        /// The owning context.
        ctx: usize,
        /// The allocation's buffer id: another allocation at the same address is another key.
        buffer_id: u64,
        /// For VMM memory, the physical allocation's id (0 where unknown): another allocation
        /// mapped at the same address is another key.
        block_id: u64,
        /// Start of the exported range.
        start: u64,
        /// Its length.
        len: u64,
    },
}

struct Entry {
    fd: OwnedFd,
    refs: usize,
    what: String,
}

/// An fd handed out by [`Registry::acquire`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acquired {
    /// The fd to register.
    pub fd: RawFd,
    /// Whether it was cached (another memory region uses it).
    pub reused: bool,
    /// What it is (from when it was opened).
    pub what: String,
}

/// What [`Registry::release`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Released {
    /// The last user went: the fd was closed.
    Closed {
        /// The fd that was closed.
        fd: RawFd,
        /// What it was.
        what: String,
    },
    /// Others still use it.
    Kept {
        /// The fd.
        fd: RawFd,
        /// How many memory regions still use it.
        refs: usize,
    },
    /// Nothing was held under that key.
    Unknown,
}

impl fmt::Display for Released {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Released::Closed { fd, what } => write!(f, "closed fd {fd} ({what})"),
            Released::Kept { fd, refs } => {
                write!(f, "fd {fd} stays open for {refs} other memory region(s)")
            }
            Released::Unknown => write!(f, "no fd was held for it"),
        }
    }
}

/// The fd cache and the memory regions made from it.
pub struct Registry {
    fds: BTreeMap<Key, Entry>,
    mrs: BTreeMap<usize, Key>,
}

impl Registry {
    /// Empty.
    pub const fn new() -> Registry {
        Registry {
            fds: BTreeMap::new(),
            mrs: BTreeMap::new(),
        }
    }

    /// A reference on the fd of `key`; `open` makes it (and says what it is) if none is cached.
    pub fn acquire<E>(
        &mut self,
        key: &Key,
        open: impl FnOnce() -> Result<(OwnedFd, String), E>,
    ) -> Result<Acquired, E> {
        if let Some(e) = self.fds.get_mut(key) {
            e.refs += 1;
            return Ok(Acquired {
                fd: e.fd.as_raw_fd(),
                reused: true,
                what: e.what.clone(),
            });
        }
        let (fd, what) = open()?;
        let a = Acquired {
            fd: fd.as_raw_fd(),
            reused: false,
            what: what.clone(),
        };
        self.fds.insert(key.clone(), Entry { fd, refs: 1, what });
        Ok(a)
    }

    /// Drops a reference taken by [`acquire`](Self::acquire); the last one closes the fd.
    pub fn release(&mut self, key: &Key) -> Released {
        let Some(e) = self.fds.get_mut(key) else {
            return Released::Unknown;
        };
        e.refs -= 1;
        if e.refs > 0 {
            return Released::Kept {
                fd: e.fd.as_raw_fd(),
                refs: e.refs,
            };
        }
        let e = self.fds.remove(key).expect("present");
        Released::Closed {
            fd: e.fd.as_raw_fd(),
            what: e.what,
        }
    }

    /// Records that the memory region `mr` holds a reference on `key`'s fd.
    pub fn add_mr(&mut self, mr: usize, key: Key) {
        self.mrs.insert(mr, key);
    }

    /// Forgets `mr` (about to be deregistered), returning its key if it is one of ours.
    pub fn take_mr(&mut self, mr: usize) -> Option<Key> {
        self.mrs.remove(&mr)
    }

    /// Open fds and live memory regions.
    pub fn counts(&self) -> (usize, usize) {
        (self.fds.len(), self.mrs.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::FromRawFd;

    fn open_fd() -> OwnedFd {
        // SAFETY: a new fd of /dev/null, owned by the caller.
        unsafe {
            let fd = libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
            assert!(fd >= 0);
            OwnedFd::from_raw_fd(fd)
        }
    }

    fn is_open(fd: RawFd) -> bool {
        // SAFETY: F_GETFD only queries.
        unsafe { libc::fcntl(fd, libc::F_GETFD) >= 0 }
    }

    #[test]
    fn one_fd_per_buffer_closed_with_the_last_region() {
        let mut r = Registry::new();
        let k = Key::Mapped { dev: 14, ino: 12 };
        let mut opened = 0;
        let a = r
            .acquire::<()>(&k, || {
                opened += 1;
                Ok((open_fd(), "buffer A".into()))
            })
            .unwrap();
        assert!(!a.reused);
        r.add_mr(0x1000, k.clone());
        let b = r
            .acquire::<()>(&k, || {
                opened += 1;
                Ok((open_fd(), "again".into()))
            })
            .unwrap();
        assert!(b.reused);
        assert_eq!(b.fd, a.fd);
        assert_eq!(b.what, "buffer A");
        r.add_mr(0x2000, k.clone());
        assert_eq!(opened, 1);
        assert_eq!(r.counts(), (1, 2));

        assert_eq!(r.take_mr(0x1000), Some(k.clone()));
        assert_eq!(r.release(&k), Released::Kept { fd: a.fd, refs: 1 });
        assert!(is_open(a.fd));
        assert_eq!(r.take_mr(0x1000), None);
        assert_eq!(r.take_mr(0x2000), Some(k.clone()));
        assert_eq!(
            r.release(&k),
            Released::Closed {
                fd: a.fd,
                what: "buffer A".into()
            }
        );
        assert!(!is_open(a.fd));
        assert_eq!(r.counts(), (0, 0));
        assert_eq!(r.release(&k), Released::Unknown);
    }

    #[test]
    fn a_failed_open_caches_nothing() {
        let mut r = Registry::new();
        let k = Key::Cuda {
            ctx: 1,
            buffer_id: 7,
            block_id: 0,
            start: 0x7f00_0000_0000,
            len: 1 << 21,
        };
        assert_eq!(r.acquire(&k, || Err("no export")), Err("no export"));
        assert_eq!(r.counts(), (0, 0));
        // Another allocation at the same address is another buffer.
        let k2 = Key::Cuda {
            ctx: 1,
            buffer_id: 8,
            block_id: 0,
            start: 0x7f00_0000_0000,
            len: 1 << 21,
        };
        r.acquire::<()>(&k, || Ok((open_fd(), "7".into()))).unwrap();
        let b = r
            .acquire::<()>(&k2, || Ok((open_fd(), "8".into())))
            .unwrap();
        assert!(!b.reused);
        // Another physical allocation mapped at the same address (VMM) is another buffer too.
        let k3 = Key::Cuda {
            ctx: 1,
            buffer_id: 7,
            block_id: 9,
            start: 0x7f00_0000_0000,
            len: 1 << 21,
        };
        let c = r
            .acquire::<()>(&k3, || Ok((open_fd(), "9".into())))
            .unwrap();
        assert!(!c.reused);
        assert_eq!(r.counts(), (3, 0));
    }
}
