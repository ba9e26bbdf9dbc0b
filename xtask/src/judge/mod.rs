//! The judge stage: what a boot's output means. `suite` runs `cargo xtask test` (host tests,
//! then each boot of `boots`); `ktap` parses the suite's results and scans the console,
//! `kunit` has kunit.py read the KUnit blocks, `kcsan` reads the KCSAN kernel's race reports,
//! `hostcheck` checks from the host what the guest wrote into the emulated devices, and
//! `tree` holds the host tests of the source tree itself (formatting, lib.sh's KTAP counter).

pub mod boots;
pub mod hostcheck;
pub mod kcsan;
pub mod ktap;
pub mod kunit;
pub mod suite;
#[cfg(test)]
mod tree;
