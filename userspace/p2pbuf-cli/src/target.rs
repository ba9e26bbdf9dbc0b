//! Naming a dma-buf on the command line: an fd, `PID:FD`, an fdinfo file or a path.

use std::path::PathBuf;

use p2pbuf::{DmaBuf, DmaBufInfo};

/// Where a dma-buf comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// An fd this process inherited (`3`, after `3<...` or from a parent).
    Fd(i32),
    /// Fd `fd` of process `pid`, taken with `pidfd_getfd` (`PID:FD`).
    Process { pid: i32, fd: i32 },
    /// An fdinfo file (`/proc/PID/fdinfo/FD`): read, no fd is obtained.
    FdinfoFile(PathBuf),
    /// Any other path: opened and checked.
    Path(PathBuf),
}

impl std::str::FromStr for Target {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if s.is_empty() {
            return Err("empty target".into());
        }
        if s.bytes().all(|b| b.is_ascii_digit()) {
            return s
                .parse()
                .map(Target::Fd)
                .map_err(|e| format!("fd {s:?}: {e}"));
        }
        if let Some((p, f)) = s.split_once(':') {
            if !p.is_empty()
                && !f.is_empty()
                && p.bytes().all(|b| b.is_ascii_digit())
                && f.bytes().all(|b| b.is_ascii_digit())
            {
                let pid = p.parse().map_err(|e| format!("pid {p:?}: {e}"))?;
                let fd = f.parse().map_err(|e| format!("fd {f:?}: {e}"))?;
                return Ok(Target::Process { pid, fd });
            }
        }
        let path = PathBuf::from(s);
        let is_fdinfo = path
            .parent()
            .and_then(|p| p.file_name())
            .is_some_and(|n| n == "fdinfo");
        Ok(if is_fdinfo {
            Target::FdinfoFile(path)
        } else {
            Target::Path(path)
        })
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Fd(n) => write!(f, "fd {n} of this process"),
            Target::Process { pid, fd } => write!(f, "fd {fd} of pid {pid} (pidfd_getfd)"),
            Target::FdinfoFile(p) => write!(f, "{}", p.display()),
            Target::Path(p) => write!(f, "{}", p.display()),
        }
    }
}

/// A resolved target: the buffer if we got an fd, else only its info.
pub enum Resolved {
    Buf(DmaBuf),
    InfoOnly(DmaBufInfo),
}

impl Resolved {
    pub fn info(&self) -> &DmaBufInfo {
        match self {
            Resolved::Buf(b) => b.info(),
            Resolved::InfoOnly(i) => i,
        }
    }
}

impl Target {
    pub fn resolve(&self) -> p2pbuf::Result<Resolved> {
        Ok(match self {
            Target::Fd(n) => Resolved::Buf(DmaBuf::from_inherited_fd(*n)?),
            Target::Process { pid, fd } => Resolved::Buf(DmaBuf::from_process(*pid, *fd)?),
            Target::FdinfoFile(p) => Resolved::InfoOnly(DmaBufInfo::read(p)?),
            Target::Path(p) => Resolved::Buf(DmaBuf::open(p)?),
        })
    }

    /// Resolve to a buffer; an fdinfo file is refused (there is no fd).
    pub fn open(&self) -> p2pbuf::Result<DmaBuf> {
        match self.resolve()? {
            Resolved::Buf(b) => Ok(b),
            Resolved::InfoOnly(_) => Err(p2pbuf::Error::Unavailable {
                what: format!("getting an fd for {self}"),
                detail: "an fdinfo file describes a buffer but gives no fd".into(),
                check: Some("name it as PID:FD to take the fd with pidfd_getfd".into()),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets() {
        assert_eq!("3".parse::<Target>().unwrap(), Target::Fd(3));
        assert_eq!(
            "1234:5".parse::<Target>().unwrap(),
            Target::Process { pid: 1234, fd: 5 }
        );
        assert_eq!(
            "/proc/1/fdinfo/7".parse::<Target>().unwrap(),
            Target::FdinfoFile("/proc/1/fdinfo/7".into())
        );
        assert_eq!(
            "/dev/null".parse::<Target>().unwrap(),
            Target::Path("/dev/null".into())
        );
        assert_eq!(
            "./a:b".parse::<Target>().unwrap(),
            Target::Path("./a:b".into())
        );
        assert!("".parse::<Target>().is_err());
        assert!("99999999999".parse::<Target>().is_err());
    }

    #[test]
    fn fdinfo_file_gives_no_fd() {
        let t: Target = "/proc/self/fdinfo/0".parse().unwrap();
        // fd 0 of the test runner is not a dma-buf: either way an error.
        assert!(t.open().is_err());
    }
}
