//! KCSAN's data-race reports on the console of the KCSAN kernel (`cargo xtask test --boot
//! kcsan`), read whole: a race in our modules or the series' code fails the run, any other is
//! listed ([`KcsanScan`]).

use crate::ktap::{strip_timestamp, Problem};

/// The heading of every KCSAN report (kernel/kcsan/report.c `print_report`): "BUG: KCSAN:
/// data-race in f1 / f2" for two racing accesses (both functions with `%ps`: no offset, a
/// module's name after its function's, ordered by name), "BUG: KCSAN: data-race in f+0x1/0x2"
/// for a race of unknown origin (`%pS`), "assert: race" instead of "data-race" for a failed
/// `ASSERT_EXCLUSIVE_*()`. Not a failure by itself: [`KcsanScan`] reads the whole report and
/// decides whose race it is.
pub const KCSAN_HEADER: &str = "BUG: KCSAN: ";

/// The line that ends a KCSAN report's body: after it, `dump_stack_print_info` says which
/// task it ran in ("CPU: 1 UID: 0 PID: 231 Comm: udmabuf_sync_ra ..."), and a task's name is
/// not a function of the race (a test named udmabuf_* would make every race ours).
const KCSAN_FOOTER: &str = "Reported by Kernel Concurrency Sanitizer on:";

/// What makes a KCSAN report ours: one of these in its heading's functions or in a frame of
/// either stack. Function names only: the lab kernel has no debug info, so `%pS` prints no
/// file. Rust symbols are printed mangled (v0), where a module path is its identifiers, each
/// after its length: `kernel::dma_buf` is `...6kernel7dma_buf...`, `kernel::pci::p2pdma`
/// `...3pci6p2pdma...`; a loadable module's functions are followed by ` [module]`.
pub const KCSAN_OURS: &[&str] = &[
    // The modules (` [p2pbuf_exporter]`, ` [p2pbuf_dma]`, and their crates' names in
    // their symbols).
    "p2pbuf",
    // drivers/dma-buf/dma-buf.c, dma-buf-mapping.c, the Rust abstractions (kernel::dma_buf),
    // rust/helpers/dma-buf.c (rust_helper_dma_buf_*), the in-tree sample
    // (` [rust_dma_buf_exporter]`).
    "dma_buf",
    // udmabuf (export_udmabuf, begin_cpu_udmabuf, ...), umem_dmabuf (ib_umem_dmabuf_*),
    // rxe's dma-buf memory regions, the dma-buf file system (dmabuffs_dname).
    "dmabuf",
    // The rest of drivers/dma-buf/: fences, reservation objects (and rust_helper_dma_resv_*),
    // heaps, sync_file, sw_sync (with its debugfs listing).
    "dma_fence",
    "dma_resv",
    "dma_heap",
    "system_heap",
    "sync_file",
    "sw_sync",
    "sync_timeline",
    "timeline_fence",
    "sync_pt",
    "sync_print",
    // drivers/infiniband/sw/rxe.
    "rxe_",
    // drivers/pci/p2pdma.c (series 2: pci_p2pdma_*, pci_p2pmem_*, pci_alloc_p2pmem, ...)
    // and the Rust kernel::pci::p2pdma.
    "p2pdma",
    "p2pmem",
];

/// Functions of the series' files whose names carry none of [`KCSAN_OURS`] (static helpers
/// of drivers/dma-buf/udmabuf.c and dma-buf-mapping.c), matched whole.
const KCSAN_OURS_NAMES: &[&str] = &[
    "get_sg_table",
    "put_sg_table",
    "fill_sg_entry",
    "calc_sg_nents",
];

/// One KCSAN report, read whole by [`KcsanScan`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KcsanReport {
    /// The heading after `BUG: KCSAN: `: "data-race in f1 / f2".
    pub title: String,
    /// The functions of the heading, without offsets and module names: "f1/f2" ("f" for a
    /// race of unknown origin).
    pub funcs: String,
    /// The first function (heading, then frames in order) that names our code, or None: not
    /// ours.
    pub ours: Option<String>,
}

impl KcsanReport {
    /// The report of heading `title` (after [`KCSAN_HEADER`]) and stack `frames` (both
    /// stacks' lines, trimmed).
    fn new(title: &str, frames: &[String]) -> Self {
        let names: Vec<&str> = title
            .split_once(" in ")
            .map_or("", |(_, f)| f)
            .split(" / ")
            .map(str::trim)
            .filter(|f| !f.is_empty())
            .collect();
        let ours = names
            .iter()
            .copied()
            .chain(frames.iter().map(String::as_str))
            .find(|f| kcsan_ours(f))
            .map(str::to_string);
        KcsanReport {
            title: title.to_string(),
            funcs: names
                .iter()
                .map(|f| symbol_name(f))
                .collect::<Vec<_>>()
                .join("/"),
            ours,
        }
    }

    /// The problem that a race of ours fails the boot with.
    pub fn problem(&self) -> Problem {
        Problem {
            kind: "KCSAN",
            line: format!(
                "{KCSAN_HEADER}{} (ours: {})",
                self.title,
                self.ours.as_deref().unwrap_or("?")
            ),
        }
    }
}

/// A function as `%ps`/`%pS` prints it, without offset and module: "f+0x1a/0x40
/// [p2pbuf_exporter]" -> "f".
fn symbol_name(s: &str) -> &str {
    let name = s.split_whitespace().next().unwrap_or("");
    name.split_once("+0x").map_or(name, |(n, _)| n)
}

/// Whether a function of a heading or a frame line (module name included) names our code.
fn kcsan_ours(f: &str) -> bool {
    KCSAN_OURS.iter().any(|m| f.contains(m)) || KCSAN_OURS_NAMES.contains(&symbol_name(f))
}

/// A frame of a KCSAN report's stacks (`stack_trace_print`: " f+0x1a/0x40", " f+0x1a/0x40
/// [module]"; `print_stack_trace`'s "  +-> reordered to: f+0x1a/0x40"), trimmed; None for
/// any other line.
fn kcsan_frame(line: &str) -> Option<&str> {
    let t = line.trim();
    let t = t.strip_prefix("+-> reordered to: ").unwrap_or(t);
    let sym = t.split_whitespace().next()?;
    let (name, off) = sym.split_once("+0x")?;
    (!name.is_empty() && off.contains("/0x")).then_some(t)
}

/// Reads KCSAN reports off the console, line by line: a report starts at its heading
/// ([`KCSAN_HEADER`]) and ends at [`KCSAN_FOOTER`] (or at the next heading, or at the end of
/// the run, for one cut short). Between them it keeps the stack frames. Lines that other CPUs
/// print in the middle of a report are read as its own if they look like frames: a frame of
/// ours there makes the report ours (a failure to look at, not to miss).
#[derive(Default)]
pub struct KcsanScan {
    /// The report being read: heading and frames so far.
    open: Option<(String, Vec<String>)>,
}

impl KcsanScan {
    /// Feeds one console line; returns the report it ended, if any.
    pub fn feed(&mut self, raw: &str) -> Option<KcsanReport> {
        let line = strip_timestamp(raw);
        if let Some(i) = line.find(KCSAN_HEADER) {
            let ended = self.finish();
            let title = line[i + KCSAN_HEADER.len()..].trim().to_string();
            self.open = Some((title, vec![]));
            return ended;
        }
        self.open.as_ref()?;
        if line.contains(KCSAN_FOOTER) {
            return self.finish();
        }
        if let (Some((_, frames)), Some(f)) = (self.open.as_mut(), kcsan_frame(line)) {
            frames.push(f.to_string());
        }
        None
    }

    /// Ends the run: the report being read, if one was cut short.
    pub fn finish(&mut self) -> Option<KcsanReport> {
        self.open
            .take()
            .map(|(title, frames)| KcsanReport::new(&title, &frames))
    }
}

/// The run summary's words for the KCSAN reports that were not ours (None for none): "KCSAN
/// (not ours): 3 reports: f1/f2 (x2), f3/f4", each pair of functions once, in the order seen.
pub fn kcsan_not_ours_note(reports: &[KcsanReport]) -> Option<String> {
    let theirs: Vec<&KcsanReport> = reports.iter().filter(|r| r.ours.is_none()).collect();
    if theirs.is_empty() {
        return None;
    }
    let mut pairs: Vec<(&str, usize)> = vec![];
    for r in &theirs {
        match pairs.iter_mut().find(|(f, _)| *f == r.funcs) {
            Some((_, n)) => *n += 1,
            None => pairs.push((&r.funcs, 1)),
        }
    }
    let list: Vec<String> = pairs
        .iter()
        .map(|(f, n)| {
            if *n > 1 {
                format!("{f} (x{n})")
            } else {
                f.to_string()
            }
        })
        .collect();
    let n = theirs.len();
    Some(format!(
        "KCSAN (not ours): {n} report{}: {}",
        if n == 1 { "" } else { "s" },
        list.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A console as the KCSAN kernel prints it (kernel/kcsan/report.c, 7.3.4): one race in
    /// udmabuf (issue 27's N2, two first SYNCs), one between two functions of the scheduler
    /// in a task whose name is a test's, one of the lab's module through the Rust
    /// abstractions, a race of unknown origin, the scheduler's race again, and one cut
    /// short by the end of the run.
    const KCSAN_CONSOLE: &str = "\
[    0.512301] kcsan: enabled early
[    0.512338] kcsan: non-strict mode configured - use CONFIG_KCSAN_STRICT=y to see all data races
[    1.802114] kcsan: selftest: 3/3 tests passed
[   48.120551] ==================================================================
[   48.121032] BUG: KCSAN: data-race in begin_cpu_udmabuf / begin_cpu_udmabuf
[   48.121460] 
[   48.121650] write to 0xffff888006b4c3a8 of 8 bytes by task 291 on cpu 1:
[   48.122127]  begin_cpu_udmabuf+0x8e/0x1b0
[   48.122470]  dma_buf_begin_cpu_access+0x4f/0x110
[   48.122851]  dma_buf_ioctl+0x1d6/0x2e0
[   48.123168]  __x64_sys_ioctl+0xc4/0x120
[   48.123490]  x64_sys_call+0x1a2d/0x1e90
[   48.123812]  do_syscall_64+0x8c/0x1c0
[   48.124122]  entry_SYSCALL_64_after_hwframe+0x76/0x7e
[   48.124528] 
[   48.124710] read to 0xffff888006b4c3a8 of 8 bytes by task 292 on cpu 0:
[   48.125179]  begin_cpu_udmabuf+0x31/0x1b0
[   48.125520]  dma_buf_begin_cpu_access+0x4f/0x110
[   48.125901]  dma_buf_ioctl+0x1d6/0x2e0
[   48.126219]  __x64_sys_ioctl+0xc4/0x120
[   48.126540]  x64_sys_call+0x1a2d/0x1e90
[   48.126861]  do_syscall_64+0x8c/0x1c0
[   48.127170]  entry_SYSCALL_64_after_hwframe+0x76/0x7e
[   48.127576] 
[   48.127760] value changed: 0x0000000000000000 -> 0xffff888005e2a000
[   48.128210] 
[   48.128391] Reported by Kernel Concurrency Sanitizer on:
[   48.128790] CPU: 0 UID: 0 PID: 292 Comm: udmabuf_sync_ra Not tainted 7.3.4 #1 PREEMPT(lazy) 
[   48.129431] Hardware name: QEMU Standard PC (Q35 + ICH9, 2009), BIOS 1.16.3-debian-1.16.3-2 04/01/2014
[   48.130122] ==================================================================
[   50.200113] ==================================================================
[   50.200601] BUG: KCSAN: data-race in tick_nohz_idle_stop_tick / tick_nohz_next_event
[   50.201122] 
[   50.201310] write to 0xffffffff83a1f2e8 of 4 bytes by interrupt on cpu 1:
[   50.201790]  tick_nohz_idle_stop_tick+0x2c4/0x4f0
[   50.202170]  do_idle+0x1a1/0x230
[   50.202470]  cpu_startup_entry+0x25/0x30
[   50.202790]  start_secondary+0x105/0x120
[   50.203110]  common_startup_64+0x13e/0x148
[   50.203440] 
[   50.203620] read to 0xffffffff83a1f2e8 of 4 bytes by task 0 on cpu 0:
[   50.204090]  tick_nohz_next_event+0x3c/0x1d0
[   50.204450]  tick_nohz_get_sleep_length+0x8e/0x110
[   50.204840]  do_idle+0x1a1/0x230
[   50.205140]  cpu_startup_entry+0x25/0x30
[   50.205460]  rest_init+0x104/0x110
[   50.205760]  start_kernel+0x6e4/0x6f0
[   50.206070] 
[   50.206250] Reported by Kernel Concurrency Sanitizer on:
[   50.206650] CPU: 0 UID: 0 PID: 0 Comm: udmabuf_sync_ra Not tainted 7.3.4 #1 PREEMPT(lazy) 
[   50.207290] Hardware name: QEMU Standard PC (Q35 + ICH9, 2009), BIOS 1.16.3-debian-1.16.3-2 04/01/2014
[   50.207980] ==================================================================
[   61.004411] ==================================================================
[   61.004902] BUG: KCSAN: data-race in __rb_insert_augmented / rb_next
[   61.005380] 
[   61.005560] read-write to 0xffff888007a0c9c0 of 8 bytes by task 340 on cpu 1:
[   61.006061]  __rb_insert_augmented+0x6d/0x2a0
[   61.006420]  interval_tree_insert+0xb2/0xd0
[   61.006770]  _RNvMs0_NtCsk2sXz9Ua8hG_15p2pbuf_exporter6bufferNtB5_6Buffer6revoke+0x1c2/0x4a0 [p2pbuf_exporter]
[   61.007520]  _RNvXs_NtCsk2sXz9Ua8hG_15p2pbuf_exporter4uapiNtB4_4FileNtNtCs1EKtwoKEMO2_6kernel10miscdevice10MiscDevice5ioctl+0x3a1/0x9c0 [p2pbuf_exporter]
[   61.008402]  __x64_sys_ioctl+0xc4/0x120
[   61.008720]  do_syscall_64+0x8c/0x1c0
[   61.009030]  entry_SYSCALL_64_after_hwframe+0x76/0x7e
[   61.009430] 
[   61.009610] read to 0xffff888007a0c9c0 of 8 bytes by task 341 on cpu 0:
[   61.010080]  rb_next+0x21/0x90
[   61.010370]  unmap_mapping_range+0x1f4/0x2c0
[   61.010720]  _RNvMs3_NtNtCs1EKtwoKEMO2_6kernel7dma_buf6exportINtB5_8ExportedNtNtCsk2sXz9Ua8hG_15p2pbuf_exporter6buffer6BufferE6revoke+0x2e1/0x6b0
[   61.011580]  __x64_sys_ioctl+0xc4/0x120
[   61.011900] 
[   61.012080] Reported by Kernel Concurrency Sanitizer on:
[   61.012480] CPU: 0 UID: 0 PID: 341 Comm: races Not tainted 7.3.4 #1 PREEMPT(lazy) 
[   61.013100] ==================================================================
[   70.300111] ==================================================================
[   70.300612] BUG: KCSAN: data-race in ktime_get_coarse_real_ts64+0x2a/0x130
[   70.301110] 
[   70.301290] race at unknown origin, with read to 0xffffffff83c05a40 of 8 bytes by task 377 on cpu 1:
[   70.301920]  ktime_get_coarse_real_ts64+0x2a/0x130
[   70.302310]  current_time+0x3b/0x130
[   70.302630]  atime_needs_update+0x10c/0x1c0
[   70.302980]  touch_atime+0x4d/0x2b0
[   70.303290] 
[   70.303470] value changed: 0x0000000000a1b2c3 -> 0x0000000000a1b2c4
[   70.303910] 
[   70.304090] Reported by Kernel Concurrency Sanitizer on:
[   70.304490] CPU: 1 UID: 0 PID: 377 Comm: odirect_revoke Not tainted 7.3.4 #1 PREEMPT(lazy) 
[   70.305120] ==================================================================
[   80.200113] ==================================================================
[   80.200601] BUG: KCSAN: data-race in tick_nohz_idle_stop_tick / tick_nohz_next_event
[   80.201310] write to 0xffffffff83a1f2e8 of 4 bytes by interrupt on cpu 1:
[   80.201790]  tick_nohz_idle_stop_tick+0x2c4/0x4f0
[   80.206250] Reported by Kernel Concurrency Sanitizer on:
[   90.100001] ==================================================================
[   90.100502] BUG: KCSAN: data-race in rxe_completer / rxe_requester
[   90.100910] 
[   90.101090] write (marked) to 0xffff888009c1e0b8 of 4 bytes by task 402 on cpu 0:
[   90.101610]  rxe_requester+0x8f1/0x1290
";

    #[test]
    fn kcsan_reports_ours_fail_and_others_are_listed() {
        let mut scan = KcsanScan::default();
        let mut reports = vec![];
        for l in KCSAN_CONSOLE.lines() {
            // No line of a report is a problem by itself: the generic `BUG:` does not take
            // the heading, and the task line after the footer is not read as a function.
            assert_eq!(crate::ktap::scan_console(l).map(|p| p.kind), None, "{l}");
            reports.extend(scan.feed(l));
        }
        reports.extend(scan.finish());
        assert!(scan.finish().is_none());
        let got: Vec<(&str, Option<&str>)> = reports
            .iter()
            .map(|r| (r.funcs.as_str(), r.ours.as_deref()))
            .collect();
        assert_eq!(
            got,
            [
                ("begin_cpu_udmabuf/begin_cpu_udmabuf", Some("begin_cpu_udmabuf")),
                // The task is named like a test of udmabuf: not a function of the race.
                ("tick_nohz_idle_stop_tick/tick_nohz_next_event", None),
                // Ours by the module's frame ([p2pbuf_exporter], its crate's name).
                (
                    "__rb_insert_augmented/rb_next",
                    Some("_RNvMs0_NtCsk2sXz9Ua8hG_15p2pbuf_exporter6bufferNtB5_6Buffer6revoke+0x1c2/0x4a0 [p2pbuf_exporter]")
                ),
                ("ktime_get_coarse_real_ts64", None),
                ("tick_nohz_idle_stop_tick/tick_nohz_next_event", None),
                // Cut short by the end of the run: read with what came.
                ("rxe_completer/rxe_requester", Some("rxe_completer")),
            ]
        );
        assert_eq!(
            reports[0].problem(),
            Problem {
                kind: "KCSAN",
                line: "BUG: KCSAN: data-race in begin_cpu_udmabuf / begin_cpu_udmabuf (ours: begin_cpu_udmabuf)".into(),
            }
        );
        assert_eq!(
            kcsan_not_ours_note(&reports).as_deref(),
            Some("KCSAN (not ours): 3 reports: tick_nohz_idle_stop_tick/tick_nohz_next_event (x2), ktime_get_coarse_real_ts64")
        );
        assert_eq!(kcsan_not_ours_note(&reports[..1]), None);
        assert_eq!(
            kcsan_not_ours_note(&reports[3..4]).as_deref(),
            Some("KCSAN (not ours): 1 report: ktime_get_coarse_real_ts64")
        );
    }

    /// Each kind of our code, by the names the kernel prints for it (Rust v0 symbols, module
    /// tags, the series' C functions); and what is not ours.
    #[test]
    fn kcsan_ours_by_name() {
        let report = |title: &str, frames: &[&str]| {
            let frames: Vec<String> = frames.iter().map(|f| f.to_string()).collect();
            KcsanReport::new(title, &frames).ours
        };
        for (title, frame) in [
            // The Rust abstractions (kernel::dma_buf, kernel::pci::p2pdma), by a frame.
            ("data-race in rb_next / rb_erase", "_RNvMs3_NtNtCs1EKtwoKEMO2_6kernel7dma_buf6exportINtB5_8ExportedNtNtCsk2sXz9Ua8hG_15foo6buffer6BufferE6revoke+0x2e1/0x6b0"),
            ("data-race in gen_pool_alloc_algo_owner / gen_pool_free_owner", "_RNvXs1_NtNtCs1EKtwoKEMO2_6kernel3pci6p2pdmaNtB5_8ProviderNtNtCsdkZ4lMZ6x2b_4core3ops4drop4Drop4drop+0x5e/0x120"),
            // The importer, by its module tag in a `%ps` heading.
            ("data-race in _RNvNtCs9x_10p2pbuf_dma6engine4kick [p2pbuf_dma] / edu_irq", ""),
            // The in-tree sample, the Rust helpers.
            ("data-race in rb_next / rb_erase", "_RNvXs_CsAb_21rust_dma_buf_exporterNtB4_6Sample5probe+0x10/0x90 [rust_dma_buf_exporter]"),
            ("data-race in rust_helper_dma_resv_lock / ww_mutex_unlock", ""),
            // drivers/dma-buf/, umem_dmabuf, rxe, p2pdma.c, sw_sync, udmabuf's helpers.
            ("data-race in dma_fence_signal_timestamp_locked / dma_fence_add_callback", ""),
            ("data-race in ib_umem_dmabuf_map_pages / ib_umem_dmabuf_revoke", ""),
            ("data-race in rxe_mr_copy / rxe_rcv", ""),
            ("data-race in pci_alloc_p2pmem / pci_free_p2pmem", ""),
            ("data-race in timeline_fence_signaled / sw_sync_ioctl_inc", ""),
            ("data-race in get_sg_table / put_sg_table", ""),
            ("assert: race in dma_buf_vmap", ""),
            // A frame of the series' C code deep in another subsystem's stack.
            ("data-race in __filemap_add_folio / filemap_read", "dma_buf_mmap_internal+0x5e/0x120"),
        ] {
            let frames: &[&str] = if frame.is_empty() { &[] } else { &[frame] };
            assert!(report(title, frames).is_some(), "{title} {frame}");
        }
        for (title, frame) in [
            (
                "data-race in tick_nohz_idle_stop_tick / tick_nohz_next_event",
                "do_idle+0x1a1/0x230",
            ),
            (
                "data-race in __filemap_add_folio / filemap_read",
                "ksys_read+0x9e/0x170",
            ),
            // A static of the same name as udmabuf's, as part of a longer name: not matched.
            ("data-race in foo_get_sg_table_len / bar", ""),
        ] {
            assert_eq!(report(title, &[frame]), None, "{title} {frame}");
        }
        // Headings name the functions without offsets and module tags.
        let r = KcsanReport::new(
            "data-race in _RNvNtCs9x_10p2pbuf_dma6engine4kick [p2pbuf_dma] / edu_irq",
            &[],
        );
        assert_eq!(r.funcs, "_RNvNtCs9x_10p2pbuf_dma6engine4kick/edu_irq");
    }

    #[test]
    fn kcsan_frames_are_read_and_other_lines_are_not() {
        for (l, f) in [
            (
                " begin_cpu_udmabuf+0x8e/0x1b0",
                Some("begin_cpu_udmabuf+0x8e/0x1b0"),
            ),
            (
                " _RNvNtCs9x_10p2pbuf_dma6engine4kick+0x3/0x40 [p2pbuf_dma]",
                Some("_RNvNtCs9x_10p2pbuf_dma6engine4kick+0x3/0x40 [p2pbuf_dma]"),
            ),
            // CONFIG_KCSAN_WEAK_MEMORY's note under a frame.
            (
                "  +-> reordered to: dma_buf_put+0x1c/0x60",
                Some("dma_buf_put+0x1c/0x60"),
            ),
            ("  |", None),
            (
                "write to 0xffff888006b4c3a8 of 8 bytes by task 291 on cpu 1:",
                None,
            ),
            (
                "value changed: 0x0000000000000000 -> 0xffff888005e2a000",
                None,
            ),
            (
                "CPU: 0 UID: 0 PID: 292 Comm: udmabuf_sync_ra Not tainted 7.3.4 #1",
                None,
            ),
        ] {
            assert_eq!(kcsan_frame(l), f, "{l}");
        }
    }
}
