//! All of the crate's `unsafe` code: the raw bindings and the loaded libraries ([`ffi`]), and
//! the handles that own what libibverbs and librdmacm hand out ([`verbs`], [`cm`]), each with a
//! safe interface and a `// SAFETY:` comment on every `unsafe` block. The rest of the crate
//! is `#![deny(unsafe_code)]`: it decides what to do and how to report it, and reaches the
//! libraries only through these handles.
//!
//! Invariants the handles keep: every pointer they hold is one the library returned and has
//! not freed yet; each frees it once, on drop, after everything made from it (children hold
//! an `Rc` of their parent). Raw pointers leave this module only as opaque identities
//! ([`verbs::CtxId`], [`cm::IdRef`]) that are compared, never dereferenced.

pub mod cm;
pub mod ffi;
pub mod verbs;

use std::ffi::{c_char, CStr};

/// The text of a static C string a library function returned (NULL: `None`).
///
/// # Safety
///
/// `p` is NULL or points to a NUL-terminated string that lives for the rest of the process.
unsafe fn static_str(p: *const c_char) -> Option<String> {
    if p.is_null() {
        return None;
    }
    // SAFETY: the caller's guarantee.
    Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}
