//! Raw bindings (bindgen, see build.rs) and the loaded libraries.
//!
//! libibverbs and librdmacm are opened at run time (`dlopen`), once per process, so that a
//! binary built with this crate starts on a machine without rdma-core and reports that
//! instead.

// Generated code: its names, its unused items, its unsafe fns.
#![allow(nonstandard_style, dead_code, missing_docs)]
#![allow(unsafe_op_in_unsafe_fn, clippy::all)]

use std::sync::OnceLock;

use p2pbuf::Error;

include!(concat!(env!("OUT_DIR"), "/verbs.rs"));

/// librdmacm's functions (the types are above).
pub mod cm {
    use super::*;
    include!(concat!(env!("OUT_DIR"), "/rdmacm.rs"));
}

/// Where the bindings were generated from (headers, or the pregenerated copy).
pub const BINDINGS: &str = env!("P2PBUF_RDMA_BINDINGS");

/// The shared objects, by soname.
pub const LIBIBVERBS: &str = "libibverbs.so.1";
/// See [`LIBIBVERBS`].
pub const LIBRDMACM: &str = "librdmacm.so.1";

/// Both libraries, loaded.
pub struct Libs {
    /// libibverbs.
    pub v: Ibverbs,
    /// librdmacm.
    pub cm: cm::Rdmacm,
}

static LIBS: OnceLock<Result<Libs, String>> = OnceLock::new();

/// The loaded libraries, or [`Error::Unavailable`] saying which one is missing.
pub fn libs() -> p2pbuf::Result<&'static Libs> {
    let r = LIBS.get_or_init(|| {
        // SAFETY: loading libibverbs/librdmacm runs their constructors, which only set up
        // their own state; every symbol this crate declares is resolved here (bindgen's
        // `dynamic_link_require_all`) with the signature from the same library's headers.
        unsafe {
            let v = Ibverbs::new(LIBIBVERBS).map_err(|e| format!("{LIBIBVERBS}: {e}"))?;
            let cm = cm::Rdmacm::new(LIBRDMACM).map_err(|e| format!("{LIBRDMACM}: {e}"))?;
            Ok(Libs { v, cm })
        }
    });
    r.as_ref().map_err(|e| Error::Unavailable {
        what: "loading rdma-core".into(),
        detail: format!("cannot load {e}"),
        check: Some(
            "install rdma-core's libraries (Debian: libibverbs1 librdmacm1 ibverbs-providers), or use the lab VM, which has the project's build"
                .into(),
        ),
    })
}

/// `errno` of the calling thread, right after a failed call.
pub fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}
