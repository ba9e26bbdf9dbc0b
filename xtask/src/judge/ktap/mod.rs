//! A streaming KTAP (and TAP 13) parser for the in-VM suite, and the console scanner that
//! turns kernel oopses, WARNs, BUGs, lockdep and kmemleak reports, and those of the debug lab
//! kernel's checkers (DMA-API debugging, SLUB_DEBUG, DEBUG_OBJECTS, DEBUG_LIST, DEBUG_VM,
//! KASAN, the hung-task and soft-lockup detectors, RCU stall warnings, UBSAN), into failures;
//! fault injection's forced failures (the fail-nth test's) are counted, not failed. KCSAN's
//! data-race reports (the KCSAN kernel's) are read whole, in `crate::kcsan`.

mod console;
mod parse;

pub use console::{dma_api_lost, forced_failures_note, is_forced_failure, scan_console, Problem};
pub use parse::{strip_timestamp, Parser, Status, TestResult};
