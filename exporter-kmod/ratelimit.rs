// SPDX-License-Identifier: GPL-2.0

//! Rate-limited log messages: what `dev_info_ratelimited()` and its kin do in C, which the
//! Rust kernel crate of Linux 7.3 does not offer (`rust/kernel/print.rs` and `device.rs` have
//! no rate-limited printing, and `struct ratelimit_state` cannot be set up from Rust without a
//! C helper: `ratelimit_state_init()` is inline).
//!
//! Every message that a user can cause (any holder of a `/dev/p2pbuf` fd, uid 65534 included)
//! goes through [`dev_ratelimited!`]: per call site at most [`BURST`] messages every
//! [`INTERVAL_MS`], as `DEFAULT_RATELIMIT_INTERVAL` and `DEFAULT_RATELIMIT_BURST` allow; the
//! first message of a later interval says how many were suppressed.

use kernel::{
    sync::atomic::{Atomic, Relaxed},
    time::{ClockSource, Monotonic},
};

/// Messages a call site may print per interval (`DEFAULT_RATELIMIT_BURST`).
pub(crate) const BURST: u32 = 10;

/// The interval (`DEFAULT_RATELIMIT_INTERVAL`, 5 s), in milliseconds.
pub(crate) const INTERVAL_MS: i64 = 5000;

/// Where the count stops, far from wrapping around to "print again".
const SATURATED: u32 = u32::MAX / 2;

/// The state of one call site: a `static` that [`dev_ratelimited!`] declares.
///
/// Lock-free: two callers starting a new interval at once may let a message or two more
/// through, never a flood.
pub(crate) struct RateLimit {
    /// Start of the current interval, in nanoseconds of the monotonic clock (0: none yet).
    begin: Atomic<i64>,
    /// Messages asked for in the current interval, printed or not.
    count: Atomic<u32>,
}

impl RateLimit {
    /// A call site that printed nothing yet.
    pub(crate) const fn new() -> Self {
        Self {
            begin: Atomic::new(0),
            count: Atomic::new(0),
        }
    }

    /// Counts a message: whether to print it, and how many messages the interval that just
    /// ended suppressed (non-zero only for the first message of a new interval).
    pub(crate) fn check(&self) -> (bool, u32) {
        let now = Monotonic::ktime_get();
        let begin = self.begin.load(Relaxed);
        let mut missed = 0;
        if begin == 0 || now.saturating_sub(begin) >= INTERVAL_MS * 1_000_000 {
            // Whoever moves the interval on takes the old count with it.
            if self.begin.cmpxchg(begin, now, Relaxed).is_ok() {
                missed = self.count.xchg(0, Relaxed).saturating_sub(BURST);
            }
        }
        if self.count.load(Relaxed) >= SATURATED {
            return (false, missed);
        }
        (self.count.fetch_add(1, Relaxed) < BURST, missed)
    }
}

/// Prints with `$print` (`dev_info`, `dev_warn`, `dev_dbg`, ...) on device `$dev`, at most
/// [`BURST`] times per [`INTERVAL_MS`] from this call site.
///
/// ```ignore
/// dev_ratelimited!(dev_info, &*pdev, "cannot allocate {} bytes\n", len);
/// ```
macro_rules! dev_ratelimited {
    ($print:ident, $dev:expr, $($f:tt)*) => {{
        static LIMIT: $crate::ratelimit::RateLimit = $crate::ratelimit::RateLimit::new();
        let (print, missed) = LIMIT.check();
        if missed > 0 {
            $print!($dev, "p2pbuf: {} similar message(s) suppressed\n", missed);
        }
        if print {
            $print!($dev, $($f)*);
        }
    }};
}
pub(crate) use dev_ratelimited;
