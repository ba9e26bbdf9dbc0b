//! The build stage: what a VM boots, from a bare Debian machine. `setup` installs the tools and
//! the kernel source, `kernel` applies the series and builds Linux, `modules` the two Rust
//! modules, `rdma_core`, `fabric` and `ucx` the userspace stacks the guest runs, and `initramfs`
//! packs all of it.

pub mod fabric;
pub mod initramfs;
pub mod kernel;
pub mod modules;
pub mod rdma_core;
pub mod setup;
pub mod ucx;
