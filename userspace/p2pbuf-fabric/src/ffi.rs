//! Raw bindings (build.rs): the types and constants of libfabric's headers, its `static inline`
//! functions through bindgen's C wrappers (`wrap_static_fns`, linked statically), and the
//! exported functions as [`Fabric`], a table loaded from `libfabric.so.1` at run time.
// Generated code: its names, its unused items, its unsafe fns.
#![allow(nonstandard_style, dead_code, missing_docs)]
#![allow(unsafe_op_in_unsafe_fn, clippy::all)]
include!(concat!(env!("OUT_DIR"), "/fabric.rs"));
include!(concat!(env!("OUT_DIR"), "/fabric_dyn.rs"));
