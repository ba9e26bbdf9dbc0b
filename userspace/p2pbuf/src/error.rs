//! The library's error type.
//!
//! Every error says what was asked (`what`), and where the cause is a failed
//! system call it keeps the errno. Most variants also carry a `check`: the
//! thing a person should look at first.

use std::path::PathBuf;

/// Result alias used throughout the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Errno the kernel uses internally for "operation not supported"
/// (`ENOTSUPP`, `include/linux/errno.h`). It is not part of the uAPI errno
/// list, but it leaks to userspace from some drivers; `mmap` of an NVIDIA
/// `nv_dmabuf` returns it.
pub const ENOTSUPP: i32 = 524;

/// Errors returned by this crate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A system call failed.
    #[error("{what}: {} (errno {errno}){}", errno_text(*.errno), check_suffix(.check))]
    Os {
        /// What was asked, e.g. `mmap of dma-buf fd 5 (2097152 bytes)`.
        what: String,
        /// The raw errno.
        errno: i32,
        /// What to check first, if there is something useful to say.
        check: Option<String>,
    },

    /// The file descriptor (or fdinfo file) is not a dma-buf.
    #[error("{what}: not a dma-buf ({detail}){}", check_suffix(.check))]
    NotDmaBuf {
        /// What was asked.
        what: String,
        /// Why it is not one (filesystem magic, missing fdinfo fields).
        detail: String,
        /// What to check.
        check: Option<String>,
    },

    /// An fdinfo text could not be parsed.
    #[error("parsing {source_name}: line {line}: {reason}")]
    Fdinfo {
        /// Where the text came from (a path, or `<string>`).
        source_name: String,
        /// 1-based line number.
        line: usize,
        /// What is wrong with it.
        reason: String,
    },

    /// A file could not be read or opened.
    #[error("{what} ({}): {source}{}", .path.display(), check_suffix(.check))]
    Io {
        /// What was asked.
        what: String,
        /// The path involved.
        path: PathBuf,
        /// The underlying error (it carries the errno).
        #[source]
        source: std::io::Error,
        /// What to check.
        check: Option<String>,
    },

    /// The peer of an fd-passing exchange did not follow the protocol.
    #[error("{what}: {detail}")]
    Protocol {
        /// What was asked.
        what: String,
        /// What went wrong.
        detail: String,
    },

    /// A facility is missing on this machine (a device node, a driver, a
    /// GPU, an RDMA device). Not a bug: the message says what is missing.
    #[error("{what}: {detail}{}", check_suffix(.check))]
    Unavailable {
        /// What was asked.
        what: String,
        /// What is missing.
        detail: String,
        /// What to check.
        check: Option<String>,
    },

    /// An argument is invalid (e.g. a surface description): nothing was asked of the kernel.
    #[error("{what}: {detail}{}", check_suffix(.check))]
    Invalid {
        /// What was asked.
        what: String,
        /// What is wrong with it.
        detail: String,
        /// What to do instead.
        check: Option<String>,
    },

    /// The CUDA driver API returned an error.
    #[error("{what}: CUDA driver error {code} ({name}: {description}){}", check_suffix(.check))]
    Cuda {
        /// The driver call and its arguments.
        what: String,
        /// The `CUresult` value.
        code: i32,
        /// The `CUresult` name, e.g. `CUDA_ERROR_NO_DEVICE`.
        name: String,
        /// The driver's description of it.
        description: String,
        /// What to check.
        check: Option<String>,
    },
}

impl Error {
    /// The errno behind this error, when there is one.
    pub fn errno(&self) -> Option<i32> {
        match self {
            Error::Os { errno, .. } => Some(*errno),
            Error::Io { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }

    /// What to check first, when the error has a suggestion.
    pub fn check(&self) -> Option<&str> {
        match self {
            Error::Os { check, .. }
            | Error::NotDmaBuf { check, .. }
            | Error::Io { check, .. }
            | Error::Unavailable { check, .. }
            | Error::Invalid { check, .. }
            | Error::Cuda { check, .. } => check.as_deref(),
            _ => None,
        }
    }

    /// True when the error means "this machine lacks the facility" rather
    /// than "the call went wrong" (useful to skip tests).
    pub fn is_unavailable(&self) -> bool {
        matches!(self, Error::Unavailable { .. })
    }

    /// For a [`Error::NotDmaBuf`], replace what was asked by a description
    /// the caller knows better (the fd number it was given rather than a
    /// duplicate's); other errors are returned unchanged.
    pub(crate) fn with_what(self, what: String) -> Self {
        match self {
            Error::NotDmaBuf { detail, check, .. } => Error::NotDmaBuf {
                what,
                detail,
                check,
            },
            other => other,
        }
    }

    pub(crate) fn os(what: impl Into<String>, errno: rustix::io::Errno) -> Self {
        Error::Os {
            what: what.into(),
            errno: errno.raw_os_error(),
            check: None,
        }
    }

    pub(crate) fn os_check(
        what: impl Into<String>,
        errno: rustix::io::Errno,
        check: impl Into<String>,
    ) -> Self {
        Error::Os {
            what: what.into(),
            errno: errno.raw_os_error(),
            check: Some(check.into()),
        }
    }

    pub(crate) fn io(
        what: impl Into<String>,
        path: impl Into<PathBuf>,
        source: std::io::Error,
    ) -> Self {
        Error::Io {
            what: what.into(),
            path: path.into(),
            source,
            check: None,
        }
    }

    pub(crate) fn protocol(what: impl Into<String>, detail: impl Into<String>) -> Self {
        Error::Protocol {
            what: what.into(),
            detail: detail.into(),
        }
    }

    pub(crate) fn unavailable(
        what: impl Into<String>,
        detail: impl Into<String>,
        check: Option<String>,
    ) -> Self {
        Error::Unavailable {
            what: what.into(),
            detail: detail.into(),
            check,
        }
    }
}

fn check_suffix(check: &Option<String>) -> String {
    match check {
        Some(c) => format!("; check: {c}"),
        None => String::new(),
    }
}

/// Text for an errno, including the kernel-internal ones that
/// `strerror` does not know.
pub fn errno_text(errno: i32) -> String {
    match errno {
        ENOTSUPP => "ENOTSUPP, operation not supported by the driver".to_string(),
        _ => {
            let s = std::io::Error::from_raw_os_error(errno).to_string();
            // std appends " (os error N)"; we print the errno ourselves.
            match s.rfind(" (os error") {
                Some(i) => s[..i].to_string(),
                None => s,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn os_error_keeps_errno_what_and_check() {
        let e = Error::os_check(
            "mmap of dma-buf fd 7",
            rustix::io::Errno::from_raw_os_error(ENOTSUPP),
            "the exporter has no CPU mmap",
        );
        assert_eq!(e.errno(), Some(524));
        assert_eq!(e.check(), Some("the exporter has no CPU mmap"));
        let s = e.to_string();
        assert!(s.contains("mmap of dma-buf fd 7"), "{s}");
        assert!(s.contains("errno 524"), "{s}");
        assert!(s.contains("ENOTSUPP"), "{s}");
        assert!(s.contains("check: the exporter has no CPU mmap"), "{s}");
    }

    #[test]
    fn errno_text_strips_os_error_suffix() {
        let t = errno_text(2);
        assert!(!t.contains("os error"), "{t}");
        assert!(t.to_lowercase().contains("no such file"), "{t}");
    }

    #[test]
    fn io_error_errno() {
        let e = Error::io(
            "read fdinfo",
            "/proc/self/fdinfo/999",
            std::io::Error::from_raw_os_error(2),
        );
        assert_eq!(e.errno(), Some(2));
        assert!(e.to_string().contains("/proc/self/fdinfo/999"));
    }

    #[test]
    fn unavailable_is_flagged() {
        let e = Error::unavailable("RDMA registration", "no RDMA device", None);
        assert!(e.is_unavailable());
        assert_eq!(e.errno(), None);
    }
}
