//! libfabric RMA on p2pbuf device memory.
//!
//! - [`fi`] (with libfabric's headers at build time): the objects a connected RMA transfer
//!   needs ([`fi::Info`], [`fi::Fabric`], [`fi::Domain`], [`fi::Eq`], [`fi::Cq`], [`fi::Mr`],
//!   [`fi::Pep`], [`fi::Ep`]), closed on drop, and [`fi::Domain::reg_dmabuf`]:
//!   `fi_mr_regattr(..., FI_MR_DMABUF)` with a dma-buf fd, offset and length.
//! - [`session`]: `p2pbuf-fabric serve` / `write` / `read`: the server registers device
//!   memory and hands out (key, address, length) in the connection's accept data; the client
//!   `fi_write`s or `fi_read`s, then the server checks the bytes through the dma-buf's mmap.
//! - [`proto`]: the few bytes they exchange.
//!
//! Errors ([`Error`]) keep libfabric's error number (`-FI_E...`, the errno value for the
//! errno-like ones) and say what to check.

#![warn(missing_docs)]

pub mod proto;

#[cfg(p2pbuf_fabric)]
pub mod ffi;
#[cfg(p2pbuf_fabric)]
pub mod fi;
#[cfg(p2pbuf_fabric)]
pub mod session;

/// What went wrong.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A libfabric call returned an error.
    #[error("{call} failed: {msg} (errno {errno}){}", hint.as_ref().map(|h| format!("; {h}")).unwrap_or_default())]
    Fabric {
        /// The call and its main arguments.
        call: String,
        /// The error number (positive; libfabric returns it negated).
        errno: i32,
        /// `fi_strerror`.
        msg: String,
        /// What to check.
        hint: Option<String>,
    },
    /// An operation completed with an error (`fi_cq_readerr` / `fi_eq_readerr`).
    #[error("{what} completed with an error: {msg} (errno {errno}, provider error {prov_errno})")]
    Completion {
        /// The operation.
        what: String,
        /// The error number.
        errno: i32,
        /// The provider's own error number (a verbs work-completion status for verbs).
        prov_errno: i32,
        /// The provider's description.
        msg: String,
    },
    /// Nothing happened in time.
    #[error("{0}: timed out")]
    Timeout(String),
    /// libfabric cannot be used.
    #[error("libfabric is not available: {0}")]
    Unavailable(String),
    /// The peer sent something else than expected.
    #[error("protocol: {0}")]
    Protocol(String),
    /// From the p2pbuf library (allocation, mapping).
    #[error(transparent)]
    P2pbuf(#[from] p2pbuf::Error),
}

impl Error {
    /// The errno of a failed call or completion, if there is one.
    pub fn errno(&self) -> Option<i32> {
        match self {
            Error::Fabric { errno, .. } | Error::Completion { errno, .. } => Some(*errno),
            Error::P2pbuf(e) => e.errno(),
            _ => None,
        }
    }
}

/// Result of this crate.
pub type Result<T> = std::result::Result<T, Error>;

/// How this build found libfabric (headers at build time).
pub fn bindings() -> &'static str {
    option_env!("P2PBUF_FABRIC_BINDINGS").unwrap_or(
        "none: built without libfabric's headers (run `cargo xtask libfabric`, then build again)",
    )
}
