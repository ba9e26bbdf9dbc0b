//! The vm stage: booting what `build` made. `qemu` is the command line (topologies, devices),
//! `vmrun` boots one VM and watches its console and results port, `lab` is the `vm` and `run`
//! commands on one VM, `nodes` runs two VMs on one link.

pub mod lab;
pub mod nodes;
pub mod qemu;
pub mod vmrun;
