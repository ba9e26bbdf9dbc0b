//! Opening the project's misc devices (`/dev/p2pbuf`, `/dev/p2pbuf-dma`): one place for the
//! open and for the errors that say what to load or rebuild.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// One of the project's devices, as its errors name it.
pub(crate) struct Device {
    /// What is opened, e.g. "the p2pbuf exporter".
    pub name: &'static str,
    /// What to do when the device node does not exist.
    pub missing: &'static str,
    /// What to check when opening it is not permitted.
    pub denied: &'static str,
}

impl Device {
    fn what(&self, path: &Path) -> String {
        format!("opening {} ({})", self.name, path.display())
    }

    /// The error of a failed open (or stat) of `path`.
    pub fn open_error(&self, path: &Path, e: std::io::Error) -> Error {
        let what = self.what(path);
        match e.kind() {
            std::io::ErrorKind::NotFound => Error::unavailable(
                what,
                format!("{} does not exist", path.display()),
                Some(self.missing.into()),
            ),
            std::io::ErrorKind::PermissionDenied => Error::Io {
                what,
                path: path.to_path_buf(),
                source: e,
                check: Some(self.denied.into()),
            },
            _ => Error::io(what, path, e),
        }
    }

    /// Open `path` read-write.
    #[cfg(p2pbuf_uapi)]
    pub fn open(&self, path: &Path) -> Result<Opened> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| self.open_error(path, e))?;
        Ok(Opened {
            path: path.to_path_buf(),
            file,
        })
    }

    /// Without the uAPI header nothing can be asked of the device: say so (or that it is
    /// missing).
    #[cfg(not(p2pbuf_uapi))]
    pub fn open(&self, path: &Path) -> Result<Opened> {
        if let Err(e) = std::fs::metadata(path) {
            return Err(self.open_error(path, e));
        }
        Err(Error::unavailable(
            self.what(path),
            format!(
                "this p2pbuf library was built without the uAPI header: {}",
                env!("P2PBUF_NO_UAPI")
            ),
            Some("rebuild with include/uapi/ present and libclang (cargo xtask setup)".into()),
        ))
    }
}

/// An open device: its path, and its file (a library built without the uAPI header opens
/// none: `never`).
#[derive(Debug)]
pub(crate) struct Opened {
    /// Where it was opened.
    pub path: PathBuf,
    #[cfg(p2pbuf_uapi)]
    pub file: std::fs::File,
    #[cfg(not(p2pbuf_uapi))]
    pub never: std::convert::Infallible,
}

#[cfg(p2pbuf_uapi)]
impl std::os::fd::AsFd for Opened {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.file.as_fd()
    }
}

#[cfg(p2pbuf_uapi)]
impl Opened {
    /// The error of a failed ioctl `what` on this device. ENOTTY means the node does not
    /// answer the uAPI of `module` (e.g. "p2pbuf exporter") this library speaks; any other
    /// errno says to `check`.
    pub fn ioctl_error(
        &self,
        module: &str,
        what: String,
        e: rustix::io::Errno,
        check: String,
    ) -> Error {
        let check = if e == rustix::io::Errno::NOTTY {
            format!(
                "{} does not answer this uAPI: is it the {module}, of the same version as this library?",
                self.path.display()
            )
        } else {
            check
        };
        Error::os_check(what, e, check)
    }
}

/// The size of uAPI struct `T`, for its `size` field (the extensible-struct rule).
#[cfg(p2pbuf_uapi)]
pub(crate) fn struct_size<T>() -> u32 {
    std::mem::size_of::<T>() as u32
}

/// A device handle type `$handle { dev: Opened }` (with the doc comment given) whose open
/// errors are those of the [`Device`] `$device`, with its `open()` (of the module's
/// `DEVICE`), `open_at()` and `path()`.
macro_rules! device_handle {
    ($(#[$doc:meta])* $handle:ident, $device:expr) => {
        $(#[$doc])*
        #[derive(Debug)]
        pub struct $handle {
            dev: $crate::device::Opened,
        }

        impl $handle {
            const DEVICE_NODE: $crate::device::Device = $device;

            /// Open [`DEVICE`].
            pub fn open() -> Result<Self> {
                Self::open_at(DEVICE)
            }

            /// Open the device at `path`.
            pub fn open_at(path: impl AsRef<Path>) -> Result<Self> {
                let dev = Self::DEVICE_NODE.open(path.as_ref())?;
                Ok($handle { dev })
            }

            /// The device path.
            pub fn path(&self) -> &Path {
                &self.dev.path
            }
        }
    };
}
pub(crate) use device_handle;

#[cfg(test)]
mod tests {
    use crate::dma::Engine;
    use crate::exporter::Exporter;

    /// A missing node is [`Error::Unavailable`](crate::Error::Unavailable), saying that it
    /// does not exist and which module to load.
    #[test]
    fn missing_device_is_unavailable() {
        for (e, module) in [
            (
                Exporter::open_at("/nonexistent/p2pbuf").unwrap_err(),
                "insmod p2pbuf_exporter",
            ),
            (
                Engine::open_at("/nonexistent/p2pbuf-dma").unwrap_err(),
                "p2pbuf_dma",
            ),
        ] {
            assert!(e.is_unavailable(), "{e:?}");
            assert!(e.to_string().contains("does not exist"), "{e}");
            assert!(e.check().unwrap().contains(module), "{e}");
        }
    }
}
