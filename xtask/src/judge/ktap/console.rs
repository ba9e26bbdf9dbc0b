//! The console scanner: kernel reports on the console that fail a run, and fault injection's
//! forced failures, which are counted instead.

use super::parse::strip_timestamp;

/// What the console scanner flags.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    pub kind: &'static str,
    pub line: String,
}

/// Patterns in the kernel console log that fail a run, with a name for each. The first match
/// names the problem, so the specific reports come before the generic `BUG:` and `WARNING:`
/// lines that most of them also print. The strings are those of the 7.2 tree.
const PATTERNS: &[(&str, &str)] = &[
    // KASAN (mm/kasan/report.c): "BUG: KASAN: slab-use-after-free in f+0x1/0x2", and for an
    // access through a wild pointer "KASAN: null-ptr-deref in range [...]".
    ("KASAN", "BUG: KASAN:"),
    ("KASAN", "KASAN:"),
    // The page allocator's and the page tables' sanity checks: "BUG: Bad page state in
    // process", "BUG: Bad page map in process", "BUG: Bad page cache in process".
    ("bad page", "BUG: Bad page"),
    // DEBUG_VM: VM_BUG_ON_PAGE/_FOLIO and VM_WARN_ON_*PAGE/_FOLIO dump the page first
    // ("page dumped because: VM_BUG_ON_PAGE(...)", include/linux/mmdebug.h), VM_WARN_ON_VMG
    // the merge state ("vmg ... dumped because: ..."); a plain VM_BUG_ON is a `kernel BUG at`.
    ("DEBUG_VM", "dumped because: "),
    // SLUB_DEBUG (mm/slub.c check_bytes_and_report): "[Poison overwritten] 0x...-0x...
    // @offset=64. First byte 0x0 instead of 0x6b", also for "Left Redzone", "Right Redzone",
    // "kmalloc Redzone", "End Poison", "Alignment padding", "Object padding". The report's
    // heading, "BUG <cache> (<taint>): <reason>", has no colon after BUG: see slub_heading.
    ("SLUB_DEBUG", " overwritten] 0x"),
    // DEBUG_LIST (lib/list_debug.c, through CHECK_DATA_CORRUPTION: a WARN whose message is
    // the line below).
    ("DEBUG_LIST", "list_add corruption"),
    ("DEBUG_LIST", "list_add double add"),
    ("DEBUG_LIST", "list_del corruption"),
    // DEBUG_OBJECTS (lib/debugobjects.c, pr_fmt "ODEBUG: "): "ODEBUG: free active (active
    // state 0) object: ... object type: timer_list hint: ...", the on-stack annotation
    // checks, and "Out of memory. ODEBUG disabled" (the checker is gone for the rest of the
    // run). Its selftest's success line is in ALLOWED. ("ODEBUG: " contains "BUG: ".)
    ("ODEBUG", "ODEBUG: "),
    // lockdep (kernel/locking/lockdep.c): each report's heading, after "WARNING: ".
    ("lockdep", "possible circular locking dependency"),
    ("lockdep", "possible recursive locking"),
    ("lockdep", "inconsistent lock state"),
    ("lockdep", "possible irq lock inversion dependency"),
    ("lockdep", "lock order detected"),
    ("lockdep", "bad unlock balance detected"),
    ("lockdep", "held lock freed"),
    ("lockdep", "still has locks held"),
    ("lockdep", "lock held when returning to user space"),
    ("lockdep", "Invalid wait context"),
    ("lockdep", "suspicious RCU usage"),
    // kernel/hung_task.c: "INFO: task %s:%d blocked%s for more than %ld seconds.", where %s
    // is " in I/O wait" for a task in io_schedule().
    ("hung task", "blocked for more than"),
    ("hung task", "blocked in I/O wait for more than"),
    // kernel/watchdog.c (pr_fmt "watchdog: "): "watchdog: BUG: soft lockup - CPU#%d stuck for
    // %us! [%s:%d]". Before the generic `BUG:`.
    ("soft lockup", "BUG: soft lockup - CPU#"),
    ("Oops", "Oops:"),
    ("Oops", "Oops -"),
    ("BUG", "BUG:"),
    ("BUG", "kernel BUG at"),
    ("WARN", "WARNING:"),
    ("WARN", "------------[ cut here ]------------"),
    // lib/ubsan.c ubsan_prologue(): "UBSAN: %s in %s:%d:%d", e.g. "UBSAN: shift-out-of-bounds
    // in drivers/x.c:12:3", "UBSAN: array-index-out-of-bounds in ...", after a `cut here`
    // line (a WARN of its own above).
    ("UBSAN", "UBSAN:"),
    ("panic", "Kernel panic"),
    ("GPF", "general protection fault"),
    ("kmemleak", "unreferenced object 0x"),
    ("kmemleak", "kmemleak: "),
    // kernel/rcu/tree_stall.h and tree_exp.h (pr_fmt "rcu: "), where %s is the flavour:
    // rcu_sched on the lab kernel (PREEMPT_LAZY), rcu_preempt with PREEMPT_RCU. "rcu:
    // INFO: %s detected stalls on CPUs/tasks:", "... detected expedited stalls on CPUs/tasks:
    // {", "rcu: INFO: %s self-detected stall on CPU", the grace-period kthread's "rcu: %s
    // kthread starved for %ld jiffies!" and "rcu: %s kthread timer wakeup didn't happen for
    // %ld jiffies!", and the reports cut short by a stuck CSD lock; then any other "rcu: INFO:"
    // line ("Stall ended before state dump start", ...).
    ("RCU stall", "stalls on CPUs/tasks:"),
    ("RCU stall", "self-detected stall on CPU"),
    ("RCU stall", "kthread starved for"),
    ("RCU stall", "kthread timer wakeup didn't happen"),
    ("RCU stall", "due to a stuck CSD-lock"),
    ("RCU stall", "rcu: INFO:"),
    // Fault injection's own complaints (lib/fault-inject.c): a `failslab=`-style boot
    // parameter it could not parse, a configfs name cut short. Its report of a failure it
    // forced is not a problem: see FORCED_FAILURE.
    ("fault injection", "FAULT_INJECTION: "),
    ("Rust panic", "rust_kernel: panicked"),
];

/// Benign kernel lines that contain a pattern.
const ALLOWED: &[&str] = &[
    // kmemleak's own informational lines at boot.
    "kmemleak: Kernel memory leak detector initialized",
    "kmemleak: Automatic memory scanning thread",
    // Said when kmemleak is switched off, by `echo off > /sys/kernel/debug/kmemleak`
    // (tests/bench/trace-small.sh) or after an internal error; an error is reported first on a
    // `kmemleak: ` line of its own (mm/kmemleak.c, kmemleak_stop()), which is still caught.
    "kmemleak: Kernel memory leak detector disabled",
    // DEBUG_OBJECTS_SELFTEST's result at boot (lib/debugobjects.c).
    "ODEBUG: selftest passed",
];

/// What fault injection prints for each failure it forces (lib/fault-inject.c `fail_dump`,
/// KERN_NOTICE, when the capability's debugfs `verbose` is 1 or more; the printk's second line,
/// "name failslab, interval 1, probability 0, space 0, times 1", matches no pattern). The
/// fail-nth test (tests/selftests/fail_nth.c) forces them on purpose, with `verbose` 1, so
/// that a report after one says which injected failure it followed: counted by the run
/// ([`is_forced_failure`], [`forced_failures_note`]), never a failure. Allocations made with
/// `__GFP_NOWARN` fail without this line, so the count is at most the test's own.
const FORCED_FAILURE: &str = "FAULT_INJECTION: forcing a failure.";

/// Whether a console line is fault injection's report of a failure it forced.
pub fn is_forced_failure(raw: &str) -> bool {
    strip_timestamp(raw).contains(FORCED_FAILURE)
}

/// The run summary's words for `n` forced failures, or None for none.
pub fn forced_failures_note(n: usize) -> Option<String> {
    (n > 0).then(|| {
        format!(
            "fault injection: {n} forced failure{}",
            if n == 1 { "" } else { "s" }
        )
    })
}

/// The prefix of every line of the DMA-API debugging code (kernel/dma/debug.c, `pr_fmt`).
const DMA_API: &str = "DMA-API: ";

/// The informational lines kernel/dma/debug.c prints at boot, after [`DMA_API`]; `{n}` stands
/// for a decimal number. Any other `DMA-API: ` line is a report of a driver bug (`err_printk`:
/// a WARN whose message is that line, then "DMA-API: Mapped at:" and a stack), or says that
/// the checker lost track (out of memory, "dma_debug_entry pool grown to" more entries than
/// were preallocated: mappings pile up), or that a driver filter now hides the other drivers'
/// reports: a run with any of those has not been checked.
const DMA_API_INFO: &[&str] = &[
    "preallocated {n} debug entries",
    "debugging enabled by kernel config",
    "debugging disabled on kernel command line",
];

/// Whether `msg` (a `DMA-API: ` line without the prefix) is one of [`DMA_API_INFO`].
fn dma_api_info(msg: &str) -> bool {
    let msg = msg.trim_end();
    DMA_API_INFO.iter().any(|t| match t.split_once("{n}") {
        None => msg == *t,
        Some((pre, post)) => msg
            .strip_prefix(pre)
            .and_then(|r| r.strip_suffix(post))
            .is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit())),
    })
}

/// Whether a line (without its timestamp) is the heading of a SLUB_DEBUG report (mm/slub.c
/// `__slab_bug`): `BUG <cache> (<taint>): <reason>`, e.g. "BUG kmalloc-64 (Not tainted):
/// Object already free". Unlike every other report it has no colon after `BUG`.
fn slub_heading(line: &str) -> bool {
    line.strip_prefix("BUG ")
        .and_then(|r| r.split_once(" ("))
        .is_some_and(|(cache, rest)| {
            !cache.is_empty() && !cache.contains(' ') && rest.contains("): ")
        })
}

/// 7.3 deprecates `system_wq` and `system_unbound_wq` and says so once per boot, naming the
/// first work function queued on one (kernel/workqueue.c, `__queue_work()`): "workqueue: work
/// func %ps enqueued on deprecated workqueue. Use system_{percpu|dfl}_wq instead." A problem
/// when that function is ours (the dma-buf abstractions, their KUnit suite or our modules);
/// another driver being first is upstream's business, and the message comes only once, so it
/// cannot hide ours behind theirs reliably either way: the KUnit suite runs at boot, first.
fn deprecated_workqueue_ours(line: &str) -> bool {
    line.contains("enqueued on deprecated workqueue")
        && ["dma_buf", "p2pbuf"].iter().any(|o| line.contains(o))
}

/// The entry of [`PATTERNS`] that names the problem on a line without its timestamp.
fn first_pattern(line: &str) -> Option<&'static (&'static str, &'static str)> {
    PATTERNS.iter().find(|(_, p)| line.contains(p))
}

/// What kernel/dma/debug.c says when one of its own allocations fails and it switches itself
/// off (after [`DMA_API`]). Fault injection (`tests/selftests/fail_nth.c`) fails those too,
/// since they are made inside the operations it sweeps: a boot that forced failures may print
/// one, and the fail-nth test runs last on its boot so that no test runs unchecked after it.
const DMA_API_LOST: &[&str] = &[
    "cacheline tracking ENOMEM, dma-debug disabled",
    "debugging out of memory - disabling",
];

/// Whether `raw` says that DMA-API debugging switched itself off for want of memory (see
/// [`DMA_API_LOST`]): expected only once fault injection has forced a failure.
pub fn dma_api_lost(raw: &str) -> bool {
    let line = strip_timestamp(raw);
    line.find(DMA_API)
        .is_some_and(|i| DMA_API_LOST.contains(&line[i + DMA_API.len()..].trim_end()))
}

/// Returns the problem on this console line, if any.
pub fn scan_console(raw: &str) -> Option<Problem> {
    let line = strip_timestamp(raw);
    if ALLOWED.iter().any(|a| line.contains(a)) || line.contains(FORCED_FAILURE) {
        return None;
    }
    // Not the generic `BUG:`: whose race it is takes the whole report (KcsanScan).
    if line.contains(crate::kcsan::KCSAN_HEADER) {
        return None;
    }
    let problem = |kind| {
        Some(Problem {
            kind,
            line: line.to_string(),
        })
    };
    if let Some(i) = line.find(DMA_API) {
        return if dma_api_info(&line[i + DMA_API.len()..]) {
            None
        } else {
            problem("DMA-API")
        };
    }
    if slub_heading(line) {
        return problem("SLUB_DEBUG");
    }
    if deprecated_workqueue_ours(line) {
        return problem("deprecated workqueue");
    }
    // kmemleak prints "kmemleak: N new suspected memory leaks": the interesting one.
    first_pattern(line).and_then(|(k, _)| problem(k))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn our_work_on_a_deprecated_workqueue() {
        // The 2026-11-25 CI run (9dff212): the KUnit race tests queued on system_unbound_wq.
        let ours = "[   14.735106] workqueue: work func _RNvXsb_NtCs1EKtwoKEMO2_6kernel9workqueueINtNtCs1peUGmbrgHn_4core3pin3PinINtNtNtB7_5alloc4kbox3BoxINtB5_11ClosureWorkNCNvNtNtNtB7_7dma_buf5tests5kunit23revoke_races_last_close0ENtNtB1d_9allocator7KmallocEEINtB5_15WorkItemPointerKy0_E3runB7_ enqueued on deprecated workqueue. Use system_{percpu|dfl}_wq instead.";
        assert_eq!(
            scan_console(ours).map(|p| p.kind),
            Some("deprecated workqueue")
        );
        let theirs = "[    3.1] workqueue: work func e1000_watchdog enqueued on deprecated workqueue. Use system_{percpu|dfl}_wq instead.";
        assert!(scan_console(theirs).is_none());
    }

    #[test]
    fn console_scanner_flags_and_allows() {
        assert!(scan_console("[    0.100000] kmemleak: Kernel memory leak detector initialized (mempool available: 16000)").is_none());
        assert!(
            scan_console("[   41.200000] kmemleak: Kernel memory leak detector disabled").is_none()
        );
        assert_eq!(
            kind("[   41.100000] kmemleak: Cannot allocate a kmemleak_object structure"),
            Some("kmemleak")
        );
        assert_eq!(
            kind("[   12.1] WARNING: CPU: 0 PID: 1 at mm/x.c:1 f+0x1/0x2"),
            Some("WARN")
        );
        assert_eq!(
            kind("[   3.0] BUG: kernel NULL pointer dereference, address: 0"),
            Some("BUG")
        );
        assert_eq!(
            kind("unreferenced object 0xffff888003d1e000 (size 64):"),
            Some("kmemleak")
        );
        assert!(scan_console("[    1.0] nvme nvme0: 1/0/0 default/read/poll queues").is_none());
    }

    /// Each of `lines` is flagged as `want` (None: passes).
    fn assert_kind(lines: &[&str], want: Option<&str>) {
        for l in lines {
            assert_eq!(kind(l), want, "{l}");
        }
    }

    fn kind(line: &str) -> Option<&'static str> {
        scan_console(line).map(|p| p.kind)
    }

    #[test]
    fn warning_in_the_7_2_format_fails() {
        assert_eq!(
            kind("[   41.207380] WARNING: kernel/dma/debug.c:1048 at check_unmap+0x6f4/0x8c0, CPU#1: p2pbuf_dma_large/231"),
            Some("WARN")
        );
    }

    #[test]
    fn dma_api_driver_bug_reports_fail() {
        assert_kind(
            &[
                // err_printk: the WARN's message, then where the mapping was made.
                "[   41.207365] DMA-API: p2pbuf_dma 0000:03:00.0: device driver tries to free DMA memory it has not allocated [device address=0x00000000fe800000] [size=4096 bytes]",
                "[   41.207402] DMA-API: Mapped at:",
                "[   52.118730] DMA-API: p2pbuf_exporter 0000:01:00.0: device driver has pending DMA allocations while released from device [count=1]",
                "[   12.031337] DMA-API: nvme 0000:02:00.0: device driver syncs DMA memory with different direction [device address=0x0000000004a1f000] [size=512 bytes] [mapped with DMA_FROM_DEVICE] [synced with DMA_TO_DEVICE]",
                "[   30.500000] DMA-API: p2pbuf_dma 0000:03:00.0: device driver failed to check map error[device address=0x00000000fe800000] [size=65536 bytes] [mapped as single]",
                "[   30.600000] DMA-API: exceeded 7 overlapping mappings of cacheline 0x0000000001234560",
                // The checker lost track: what follows is unchecked.
                "[   60.000000] DMA-API: dma_debug_entry pool grown to 131072 (200%)",
                "[    0.400000] DMA-API: 65536 debug entries requested but only 32768 allocated",
                "[   70.000000] DMA-API: debugging out of memory - disabling",
                "[   70.000000] DMA-API: cacheline tracking ENOMEM, dma-debug disabled",
                "[   80.000000] DMA-API: enable driver filter for driver [nvme]",
            ],
            Some("DMA-API"),
        );
    }

    #[test]
    fn dma_api_boot_lines_pass() {
        assert_kind(
            &[
                "[    0.412345] DMA-API: preallocated 65536 debug entries",
                "[    0.412350] DMA-API: debugging enabled by kernel config",
                "[    0.000000] DMA-API: debugging disabled on kernel command line",
            ],
            None,
        );
        // Exactly those: the same words around something else are not the boot line.
        assert_eq!(
            kind("[    0.4] DMA-API: preallocated some debug entries"),
            Some("DMA-API")
        );
        assert_eq!(
            kind(
                "[    0.4] DMA-API: debugging enabled by kernel config; p2pbuf_dma 0000:03:00.0: x"
            ),
            Some("DMA-API")
        );
    }

    #[test]
    fn dmabuf_debug_catches_fail() {
        // DMABUF_DEBUG prints nothing itself: dma_buf_map_attachment hands importers a copy
        // of the sg_table whose page links are NULL, so an importer that peeks at the pages
        // dereferences NULL (or a non-canonical address computed from it, or with KASAN the
        // shadow of NULL).
        for (l, k) in [
            (
                "[   33.120001] BUG: kernel NULL pointer dereference, address: 0000000000000008",
                "BUG",
            ),
            (
                "[   33.120107] Oops: Oops: 0000 [#1] SMP",
                "Oops",
            ),
            (
                "[   33.120001] Oops: general protection fault, probably for non-canonical address 0xdffffc0000000001: 0000 [#1] SMP KASAN",
                "Oops",
            ),
            (
                "[   33.120009] KASAN: null-ptr-deref in range [0x0000000000000008-0x000000000000000f]",
                "KASAN",
            ),
        ] {
            assert_eq!(kind(l), Some(k), "{l}");
        }
    }

    #[test]
    fn kasan_reports_fail_and_its_boot_line_passes() {
        assert_eq!(
            kind("[   20.5] BUG: KASAN: slab-use-after-free in p2pbuf_release+0x2c/0x90 [p2pbuf_exporter]"),
            Some("KASAN")
        );
        assert_eq!(
            kind("[    0.000000] kasan: KernelAddressSanitizer initialized (generic)"),
            None
        );
    }

    #[test]
    fn debug_objects_reports_fail() {
        assert_kind(
            &[
                "[   44.000001] ODEBUG: free active (active state 0) object: 00000000a1b2c3d4 object type: timer_list hint: p2pbuf_revoke_timer+0x0/0x40 [p2pbuf_exporter]",
                "[   44.000001] ODEBUG: activate destroyed (active state 0) object: 00000000a1b2c3d4 object type: work_struct hint: p2pbuf_work+0x0/0x30 [p2pbuf_dma]",
                "[   44.000002] ODEBUG: object 00000000a1b2c3d4 is on stack 00000000deadbeef, but NOT annotated.",
                "[    0.300000] ODEBUG: Out of memory. ODEBUG disabled",
            ],
            Some("ODEBUG"),
        );
        assert_eq!(kind("[    0.2] ODEBUG: selftest passed"), None);
    }

    #[test]
    fn slub_debug_reports_fail() {
        assert_kind(
            &[
                "[   55.1] BUG kmalloc-64 (Tainted: G           O      ): Object already free",
                "[   55.1] BUG kmalloc-rnd-03-128 (Not tainted): Object corrupt",
                "[   55.1] BUG p2pbuf_buffer (Tainted: G    B      O      ): Padding overwritten. 0x00000000c0ffee00-0x00000000c0ffee3f @offset=4032",
                "[   55.1] BUG <unknown> (Not tainted): No slab cache for object 0x00000000c0ffee00",
                "[   55.1] [Poison overwritten] 0x00000000c0ffee40-0x00000000c0ffee40 @offset=64. First byte 0x0 instead of 0x6b",
                "[   55.1] [Right Redzone overwritten] 0x00000000c0ffee80-0x00000000c0ffee87 @offset=128. First byte 0x0 instead of 0xcc",
            ],
            Some("SLUB_DEBUG"),
        );
        // Its boot line, and a kernel BUG that is not SLUB's.
        assert_eq!(
            kind("[    0.1] SLUB: HWalign=64, Order=0-3, MinObjects=0, CPUs=2, Nodes=1"),
            None
        );
        assert_eq!(
            kind("[    3.0] BUG: kernel NULL pointer dereference, address: 0"),
            Some("BUG")
        );
    }

    #[test]
    fn debug_list_corruption_fails() {
        assert_kind(
            &[
                "[   50.1] list_add corruption. next->prev should be prev (ffff888004a1c0a8), but was 0000000000000000. (next=ffff888004a1c0a8).",
                "[   50.1] list_add corruption. prev is NULL.",
                "[   50.1] list_add double add: new=ffff888004a1c0a8, prev=ffff888004a1c0a8, next=ffff888004b00010.",
                "[   50.1] list_del corruption, ffff888004a1c0a8->next is LIST_POISON1 (dead000000000100)",
                "[   50.1] list_del corruption. prev->next should be ffff888004a1c0a8, but was ffff888004a1c000. (prev=ffff888004b00010)",
            ],
            Some("DEBUG_LIST"),
        );
    }

    #[test]
    fn debug_vm_reports_fail() {
        for (l, k) in [
            (
                "[   61.0] page dumped because: VM_BUG_ON_PAGE(page_ref_count(page) == 0)",
                "DEBUG_VM",
            ),
            (
                "[   61.0] page dumped because: VM_WARN_ON_ONCE_FOLIO(!folio_test_locked(folio))",
                "DEBUG_VM",
            ),
            (
                "[   61.0] vmg ffffc90000a3fc38 dumped because: VM_WARN_ON_VMG(start >= end)",
                "DEBUG_VM",
            ),
            (
                "[   61.0] BUG: Bad page state in process p2pbuf  pfn:1f4a0",
                "bad page",
            ),
            (
                "[   61.0] BUG: Bad page map in process nvme_p2p  pte:8000000004a1f067 pmd:04b2c067",
                "bad page",
            ),
            ("[   61.0] kernel BUG at mm/memremap.c:512!", "BUG"),
        ] {
            assert_eq!(kind(l), Some(k), "{l}");
        }
    }

    #[test]
    fn lockdep_reports_fail() {
        assert_kind(
            &[
                "[   70.0] WARNING: possible circular locking dependency detected",
                "[   70.0] WARNING: possible recursive locking detected",
                "[   70.0] WARNING: inconsistent lock state",
                "[   70.0] WARNING: possible irq lock inversion dependency detected",
                "[   70.0] WARNING: HARDIRQ-safe -> HARDIRQ-unsafe lock order detected",
                "[   70.0] WARNING: bad unlock balance detected!",
                "[   70.0] WARNING: held lock freed!",
                "[   70.0] WARNING: p2pbuf/231 still has locks held!",
                "[   70.0] WARNING: lock held when returning to user space!",
                "[   70.0] [ BUG: Invalid wait context ]",
                "[   70.0] WARNING: suspicious RCU usage",
            ],
            Some("lockdep"),
        );
    }

    #[test]
    fn hung_task_reports_fail() {
        assert_kind(
            &[
                "[  245.3] INFO: task p2pbuf_dma_large:231 blocked for more than 30 seconds.",
                "[  245.3] INFO: task nvme_p2p:240 blocked in I/O wait for more than 30 seconds.",
            ],
            Some("hung task"),
        );
    }

    #[test]
    fn soft_lockups_fail_as_such() {
        assert_kind(
            &[
                "[  312.118203] watchdog: BUG: soft lockup - CPU#0 stuck for 22s! [x:123]",
                "[  312.118203] watchdog: BUG: soft lockup - CPU#1 stuck for 48s! [p2pbuf_exporter:231]",
            ],
            Some("soft lockup"),
        );
        // Other BUGs of the same prefix stay BUGs.
        assert_eq!(
            kind("[   3.0] BUG: kernel NULL pointer dereference, address: 0"),
            Some("BUG")
        );
    }

    #[test]
    fn rcu_stalls_of_every_flavour_fail() {
        assert_kind(
            &[
                "[  140.231002] rcu: INFO: rcu_preempt detected stalls on CPUs/tasks:",
                "[  140.231002] rcu: INFO: rcu_preempt self-detected stall on CPU",
                "[  140.231002] rcu: INFO: rcu_sched self-detected stall on CPU",
                "[  140.231002] rcu: INFO: rcu_sched detected stalls on CPUs/tasks:",
                "[  140.231002] rcu: INFO: rcu_preempt detected expedited stalls on CPUs/tasks: {",
                "[  140.231002] rcu: rcu_preempt kthread starved for 10502 jiffies! g1234 f0x0 RCU_GP_WAIT_FQS(5) ->state=0x0 ->cpu=1",
                "[  140.231002] rcu: rcu_preempt kthread timer wakeup didn't happen for 10499 jiffies! g1234 f0x0 RCU_GP_WAIT_FQS(5) ->state=0x402",
                "[  140.231002] rcu: INFO: rcu_preempt detected stall, but suppressed full report due to a stuck CSD-lock.",
                "[  140.231002] rcu: INFO: Stall ended before state dump start",
            ],
            Some("RCU stall"),
        );
        // Its boot lines say what it is set to.
        assert_kind(
            &[
                "[    0.000000] rcu: Preemptible hierarchical RCU implementation.",
                "[    0.000000] rcu: \tRCU CPU stall warnings timeout set to 20 (rcu_cpu_stall_timeout).",
            ],
            None,
        );
    }

    #[test]
    fn ubsan_reports_fail() {
        assert_kind(
            &[
                "[   77.312001] UBSAN: shift-out-of-bounds in drivers/dma-buf/dma-buf.c:1234:15",
                "[   77.312001] UBSAN: array-index-out-of-bounds in drivers/pci/p2pdma.c:512:9",
            ],
            Some("UBSAN"),
        );
        // The details that follow are not reports of their own; the `cut here` before is a WARN.
        assert_kind(
            &[
                "[   77.312010] shift exponent 64 is too large for 64-bit type 'unsigned long'",
                "[   77.312010] index 16 is out of range for type 'u32[16]'",
            ],
            None,
        );
        assert_eq!(
            kind("[   77.312000] ------------[ cut here ]------------"),
            Some("WARN")
        );
    }

    /// Forced failures are counted, not failed; fault injection's complaints fail.
    #[test]
    fn fault_injection_is_counted_and_its_complaints_fail() {
        // The two lines of one `fail_dump` (verbose 1), as a fail-nth run prints them.
        let forced = "[  201.004512] FAULT_INJECTION: forcing a failure.";
        let second = "[  201.004512] name failslab, interval 1, probability 0, space 0, times 1";
        assert!(is_forced_failure(forced));
        assert!(!is_forced_failure(second));
        assert_kind(&[forced, second], None);
        assert_kind(
            &[
                "[    0.000000] FAULT_INJECTION: failed to parse arguments",
                "[   10.000000] FAULT_INJECTION: name 'p2pbuf_very_long_name' truncated to 'p2pbuf_very_lon'",
            ],
            Some("fault injection"),
        );
        let console = [
            forced,
            second,
            "[  201.010000] fail_nth: page allocation failure: order:0, mode:0xcc0(GFP_KERNEL), nodemask=(null)",
            forced,
            "[  201.020000] name fail_page_alloc, interval 1, probability 0, space 0, times 1",
        ];
        let n = console.iter().filter(|l| is_forced_failure(l)).count();
        assert_eq!(n, 2);
        assert!(console.iter().all(|l| scan_console(l).is_none()));
        assert_eq!(
            forced_failures_note(n).as_deref(),
            Some("fault injection: 2 forced failures")
        );
        assert_eq!(
            forced_failures_note(1).as_deref(),
            Some("fault injection: 1 forced failure")
        );
        assert_eq!(forced_failures_note(0), None);
    }

    /// Every pattern is the one that names some recorded line above: none is dead, shadowed
    /// by an earlier one, or untested.
    #[test]
    fn every_pattern_names_a_recorded_line() {
        let lines = [
            "BUG: KASAN: slab-use-after-free in f+0x1/0x2",
            "KASAN: null-ptr-deref in range [0x0000000000000008-0x000000000000000f]",
            "BUG: Bad page state in process p2pbuf  pfn:1f4a0",
            "page dumped because: VM_BUG_ON_PAGE(page_ref_count(page) == 0)",
            "[Left Redzone overwritten] 0x00000000c0ffee00-0x00000000c0ffee07 @offset=0. First byte 0x0 instead of 0xbb",
            "list_add corruption. prev is NULL.",
            "list_add double add: new=ffff888004a1c0a8, prev=ffff888004a1c0a8, next=ffff888004b00010.",
            "list_del corruption, ffff888004a1c0a8->next is NULL",
            "ODEBUG: free active (active state 0) object: 00000000a1b2c3d4 object type: timer_list hint: f+0x0/0x40",
            "WARNING: possible circular locking dependency detected",
            "WARNING: possible recursive locking detected",
            "WARNING: inconsistent lock state",
            "WARNING: possible irq lock inversion dependency detected",
            "WARNING: SOFTIRQ-safe -> SOFTIRQ-unsafe lock order detected",
            "WARNING: bad unlock balance detected!",
            "WARNING: held lock freed!",
            "WARNING: p2pbuf/231 still has locks held!",
            "WARNING: lock held when returning to user space!",
            "[ BUG: Invalid wait context ]",
            "WARNING: suspicious RCU usage",
            "INFO: task p2pbuf_dma_large:231 blocked for more than 30 seconds.",
            "INFO: task nvme_p2p:240 blocked in I/O wait for more than 30 seconds.",
            "Oops: Oops: 0000 [#1] SMP",
            "Oops - BUG: 0000 [#1] SMP",
            "BUG: kernel NULL pointer dereference, address: 0000000000000008",
            "kernel BUG at mm/memremap.c:512!",
            "WARNING: kernel/dma/debug.c:1048 at check_unmap+0x6f4/0x8c0, CPU#1: p2pbuf_dma_large/231",
            "------------[ cut here ]------------",
            "UBSAN: array-index-out-of-bounds in drivers/p2pbuf/x.c:12:3",
            "Kernel panic - not syncing: Fatal exception",
            "traps: p2pbuf[231] general protection fault ip:4011d6 sp:7ffd0 error:0 in p2pbuf[401000+93000]",
            "unreferenced object 0xffff888003d1e000 (size 64):",
            "kmemleak: 2 new suspected memory leaks (see /sys/kernel/debug/kmemleak)",
            "watchdog: BUG: soft lockup - CPU#0 stuck for 22s! [x:123]",
            "rcu: INFO: rcu_preempt detected stalls on CPUs/tasks:",
            "rcu: INFO: rcu_preempt self-detected stall on CPU",
            "rcu: rcu_preempt kthread starved for 10502 jiffies! g1234 f0x0 RCU_GP_WAIT_FQS(5) ->state=0x0 ->cpu=1",
            "rcu: rcu_preempt kthread timer wakeup didn't happen for 10499 jiffies! g1234 f0x0 RCU_GP_WAIT_FQS(5) ->state=0x402",
            "rcu: INFO: rcu_preempt detected stall, but suppressed full report due to a stuck CSD-lock.",
            "rcu: INFO: Stall ended before state dump start",
            "FAULT_INJECTION: failed to parse arguments",
            "rust_kernel: panicked at rust/kernel/dma_buf.rs:120:9:",
        ];
        let named: Vec<&str> = lines
            .iter()
            .filter_map(|l| first_pattern(l).map(|(_, p)| *p))
            .collect();
        for (i, (_, p)) in PATTERNS.iter().enumerate() {
            assert!(!PATTERNS[..i].iter().any(|(_, q)| q == p), "{p:?} twice");
            assert!(named.contains(p), "no recorded line is named by {p:?}");
        }
    }

    #[test]
    fn dma_api_switching_itself_off_is_recognised() {
        // kernel/dma/debug.c, pr_err_once() and pr_err(), as 7.3.4 prints them.
        let a = "[  201.734417] DMA-API: cacheline tracking ENOMEM, dma-debug disabled";
        let b = "[  201.734417] DMA-API: debugging out of memory - disabling";
        assert!(dma_api_lost(a) && dma_api_lost(b));
        // Still a problem for the plain scan: only a boot that forced failures forgives it.
        assert!(scan_console(a).is_some());
        assert!(!dma_api_lost(
            "[    1.0] DMA-API: preallocated 65536 debug entries"
        ));
        assert!(!dma_api_lost(
            "[ 5.1] DMA-API: misc udmabuf: device driver tries to sync DMA memory it has not allocated"
        ));
    }
}
