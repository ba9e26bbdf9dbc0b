//! The bench module's tests: the line protocol, the statistics, the tables and plots, the
//! runs of a raw log and the results directory.

use super::*;

fn benches(lines: &[&str]) -> Vec<Bench> {
    let parsed: Vec<Line> = lines.iter().filter_map(|l| parse_line(l)).collect();
    aggregate(&parsed)
}

#[test]
fn parses_the_three_line_kinds() {
    assert_eq!(
        parse_line("BENCHINFO nvme baseline=bounce title=NVMe_read_into_device_memory x=size"),
        Some(Line::Info {
            bench: "nvme".into(),
            baseline: Some("bounce".into()),
            title: Some("NVMe read into device memory".into()),
            x: Some("size".into()),
        })
    );
    assert_eq!(
        parse_line("# BENCHMETRIC nvme bw_mbps unit=MB/s better=higher"),
        Some(Line::Metric {
            bench: "nvme".into(),
            metric: "bw_mbps".into(),
            unit: Some("MB/s".into()),
            better: Some(Better::Higher),
        })
    );
    let Some(Line::Sample(s)) =
        parse_line("BENCH export_map kind=p2pbuf size=4096 rep=0 export_us=12.5")
    else {
        panic!("not a sample");
    };
    assert_eq!(s.bench, "export_map");
    assert_eq!(s.get("kind"), Some("p2pbuf"));
    assert_eq!(s.get("export_us"), Some("12.5"));
}

#[test]
fn ignores_what_is_not_protocol() {
    for l in [
        "ok 1 x",
        "# bench export_map exit 0",
        "BENCHMARK x",
        "BENCH",
        "BENCHMETRIC b",
        "BENCHMETRIC b unit=us",
        "",
        "   ",
    ] {
        assert_eq!(parse_line(l), None, "{l:?}");
    }
    // A bad better= is ignored, the metric is still declared.
    assert!(matches!(
        parse_line("BENCHMETRIC b t_us better=sideways"),
        Some(Line::Metric { better: None, .. })
    ));
}

#[test]
fn stats_are_quartiles_and_extremes() {
    let s = Stats::of(&[5.0, 1.0, 3.0, 2.0, 4.0]).unwrap();
    assert_eq!(
        (s.n, s.min, s.q1, s.median, s.q3, s.max),
        (5, 1.0, 2.0, 3.0, 4.0, 5.0)
    );
    let s = Stats::of(&[4.0, 1.0, 2.0, 3.0]).unwrap();
    assert_eq!((s.q1, s.median, s.q3), (1.75, 2.5, 3.25));
    assert_eq!(Stats::of(&[]), None);
    assert_eq!(Stats::of(&[f64::NAN]), None);
    assert_eq!(Stats::of(&[7.0]).unwrap().median, 7.0);
}

#[test]
fn declared_bench_compares_with_its_baseline() {
    let b = benches(&[
        "BENCHINFO reg baseline=host title=MR_registration x=len",
        "BENCHMETRIC reg reg_us unit=us better=lower",
        "BENCHMETRIC reg bw unit=MB/s better=higher",
        "BENCH reg kind=dmabuf len=65536 rep=0 reg_us=10 bw=200 dev=rxe0",
        "BENCH reg kind=dmabuf len=65536 rep=1 reg_us=30 bw=400",
        "BENCH reg kind=host len=65536 rep=0 reg_us=40 bw=100",
        "BENCH reg kind=host len=65536 rep=1 reg_us=40 bw=100",
        "BENCH reg kind=host len=4096 rep=0 reg_us=4 bw=10",
    ]);
    assert_eq!(b.len(), 1);
    let b = &b[0];
    assert_eq!(b.baseline.as_deref(), Some("host"));
    assert!(b.baseline_declared);
    assert_eq!(b.title, "MR registration");
    assert_eq!(b.xs, vec!["4096", "65536"]);
    assert_eq!(b.compared(), vec!["dmabuf"]);
    // dev=rxe0 is a label, not a metric.
    let names: Vec<&str> = b.metrics.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(names, vec!["reg_us", "bw"]);
    assert_eq!(b.ratio("dmabuf", "65536", "reg_us"), Some(0.5));
    assert_eq!(b.ratio("dmabuf", "65536", "bw"), Some(3.0));
    assert_eq!(b.ratio("dmabuf", "4096", "reg_us"), None);
    let md = markdown(b, "Linux 7.2.13 + test");
    assert!(md.contains("## reg_us (us, lower is better)"), "{md}");
    assert!(
        md.contains("| 64 KiB |") || md.contains("| 65536 |"),
        "len is not a size key: {md}"
    );
    assert!(
        md.contains("| 65536 | 20 [15–25] (10–30) | 40 [40–40] (40–40) | 0.500 (2.0x better) |"),
        "{md}"
    );
    assert!(md.contains("| 3 (3.0x better) |"), "{md}");
    assert!(md.contains("| 4096 | – |"), "{md}");
    let svg = svg(b);
    assert!(svg.contains("stroke-dasharray"), "baseline dashed");
    assert_eq!(
        svg.matches("<polyline").count(),
        2,
        "one line per kind with 2 points: host"
    );
    let sum = summary_lines(std::slice::from_ref(b));
    assert_eq!(
        sum,
        vec![
            "reg reg_us: dmabuf/host = 65536 0.500 (lower is better)",
            "reg bw: dmabuf/host = 65536 3 (higher is better)"
        ]
    );
}

#[test]
fn undeclared_export_map_infers_udmabuf_size_and_units() {
    let b = benches(&[
        "BENCH export_map kind=p2pbuf size=1048576 rep=0 export_us=10 import_us=20 ranges=1",
        "BENCH export_map kind=udmabuf size=1048576 rep=0 export_us=30 import_us=40 ranges=256",
        "BENCH export_map kind=p2pbuf size=4096 rep=0 export_us=1 import_us=2 ranges=1",
        "BENCH export_map kind=udmabuf size=4096 rep=0 export_us=1 import_us=2 ranges=1",
    ]);
    let b = &b[0];
    assert_eq!(b.baseline.as_deref(), Some("udmabuf"));
    assert!(!b.baseline_declared);
    assert_eq!(b.x_key.as_deref(), Some("size"));
    assert_eq!(b.xs, vec!["4096", "1048576"]);
    assert_eq!(b.metrics[0].unit, "us");
    assert_eq!(b.metrics[2].name, "ranges");
    let md = markdown(b, "Linux 7.2.13 + test");
    assert!(
        md.contains("| size | p2pbuf | udmabuf (baseline) | p2pbuf / udmabuf |"),
        "{md}"
    );
    assert!(
        md.contains(
            "| 1 MiB | 20 [20–20] (20–20) n=1 | 40 [40–40] (40–40) n=1 | 0.500 (2.0x better) |"
        ),
        "{md}"
    );
    assert!(
        md.contains("| 4 KiB | 1 [1–1] (1–1) n=1 | 1 [1–1] (1–1) n=1 | 1 (same) |"),
        "{md}"
    );
    assert!(md.contains("no BENCHINFO: inferred"));
}

#[test]
fn no_known_baseline_takes_the_first_kind() {
    let b = benches(&[
        "BENCH t kind=fast rep=0 lat_us=1",
        "BENCH t kind=slow rep=0 lat_us=4",
    ]);
    assert_eq!(b[0].baseline.as_deref(), Some("fast"));
    assert_eq!(b[0].x_key, None);
    assert_eq!(b[0].xs, vec!["-"]);
    assert_eq!(b[0].ratio("slow", "-", "lat_us"), Some(4.0));
    assert_eq!(
        summary_lines(&b),
        vec!["t lat_us: slow/fast = 4 (lower is better)"]
    );
}

#[test]
fn missing_baseline_and_bad_lines_are_reported() {
    let b = benches(&[
        "BENCHINFO w baseline=host x=size",
        "BENCHMETRIC w lat_us unit=us better=lower",
        "BENCH w kind=dmabuf size=4096 rep=0 lat_us=fail",
        "BENCH w kind=dmabuf size=4096 rep=1 lat_us=3",
        "BENCH w size=4096 rep=2 lat_us=3",
        "BENCH w kind=dmabuf rep=3 lat_us=3",
    ]);
    let b = &b[0];
    assert!(!b.has_baseline());
    assert_eq!(b.problems.len(), 3, "{:?}", b.problems);
    assert!(b.problems[0].contains("lat_us=fail is not a number"));
    assert!(b.problems[1].contains("no kind="));
    assert!(b.problems[2].contains("no size="));
    let md = markdown(b, "Linux 7.2.13 + test");
    assert!(md.contains("has no samples in this run: no ratios"), "{md}");
    assert!(md.contains("## Problems in the output"));
    assert_eq!(b.stats("dmabuf", "4096", "lat_us").unwrap().n, 1);
    assert!(summary_lines(std::slice::from_ref(b))[0].contains("not measured"));
}

#[test]
fn benches_keep_their_order_and_x_can_be_text() {
    let b = benches(&[
        "BENCHINFO z x=mode",
        "BENCH z kind=a mode=write rep=0 t_us=1",
        "BENCH a kind=a rep=0 t_us=1",
        "BENCH z kind=a mode=read rep=0 t_us=1",
    ]);
    assert_eq!(
        b.iter().map(|b| b.name.as_str()).collect::<Vec<_>>(),
        vec!["z", "a"]
    );
    assert_eq!(b[0].xs, vec!["write", "read"], "first-seen order for text");
}

#[test]
fn metric_inference() {
    assert_eq!(infer_metric("reg_us"), ("us".into(), Better::Lower));
    assert_eq!(infer_metric("bw_mbps"), ("mbps".into(), Better::Higher));
    assert_eq!(infer_metric("iops"), ("iops".into(), Better::Higher));
    assert_eq!(infer_metric("ranges"), (String::new(), Better::Lower));
    assert_eq!(verdict(0.5, Better::Lower), "2.0x better");
    assert_eq!(verdict(0.5, Better::Higher), "2.0x worse");
    assert_eq!(verdict(1.02, Better::Higher), "same");
    assert_eq!(verdict(0.0, Better::Lower), "–");
    assert_eq!(verdict(0.01, Better::Lower), "100x better");
}

#[test]
fn program_exit_statuses() {
    let lines: Vec<String> = [
        "# bench export_map",
        "BENCH x kind=a rep=0 t=1",
        "# bench export_map exit 0",
        "# bench rdma.sh",
        "# bench rdma.sh exit 1",
        "# bench nvme",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    assert_eq!(
        programs(&lines),
        vec![
            Program {
                name: "export_map".into(),
                exit: Some(0)
            },
            Program {
                name: "rdma.sh".into(),
                exit: Some(1)
            },
            Program {
                name: "nvme".into(),
                exit: None
            },
        ]
    );
    let idx = index(
        &benches(&["BENCH x kind=a rep=0 t=1"]),
        &programs(&lines),
        "now",
        3,
        "Linux 7.2.13 + test",
        1,
        &[],
    );
    assert!(idx.contains("| rdma.sh | 1 (failed"), "{idx}");
    assert!(idx.contains("| nvme | did not finish |"), "{idx}");
    assert!(idx.contains("[x.md](x.md)"), "{idx}");
}

/// `run_spread` of a run's lines, as `write_results` computes it.
fn spread_of(lines: &[String]) -> Vec<String> {
    let parsed = parse_all(lines);
    run_spread(&aggregate(&parsed), &per_run_benches(&parsed, &runs(lines)))
}

#[test]
fn runs_are_split_at_their_markers_and_their_ratios_compared() {
    let lines: Vec<String> = [
        "BENCHINFO m baseline=base x=size",
        "# run 1",
        "BENCH m kind=base size=4096 rep=0 t_us=10",
        "BENCH m kind=new size=4096 rep=0 t_us=12",
        "# run 2",
        "[ 1.0] a console line",
        "BENCH m kind=base size=4096 rep=0 t_us=10",
        "BENCH m kind=new size=4096 rep=0 t_us=11",
        "# run 3",
        "# run 4",
        "BENCH m kind=base size=4096 rep=0 t_us=8",
        "BENCH m kind=new size=4096 rep=0 t_us=12",
    ]
    .map(String::from)
    .to_vec();
    // The BENCHINFO line before the first marker holds no samples: not a run; nor is the
    // empty run 3.
    let rs = runs(&lines);
    assert_eq!(rs.len(), 3);
    assert_eq!(rs[1].len(), 3);
    let spread = spread_of(&lines);
    assert_eq!(
        spread,
        ["| `m` | t_us | new/base | 4 KiB | 1.20, 1.10, 1.50 | 1.20 | 1.10–1.50 |"]
    );
    // One run: nothing to compare.
    assert!(spread_of(&lines[..5]).is_empty());
    // A program's own "# run ..." line is not a marker.
    assert!(!is_run_marker("# run 3: test_x"));
    assert!(is_run_marker("# run 3"));

    // The baseline is not the first kind seen and the sweep key is not `size`, declared
    // once before the first run: every run is read with the declaration.
    let lines: Vec<String> = [
        "BENCHINFO n baseline=zzz x=len",
        "# run 1",
        "BENCH n kind=aaa len=8 rep=0 t_us=6",
        "BENCH n kind=zzz len=8 rep=0 t_us=3",
        "BENCH n kind=aaa len=8 rep=1 t_us=6",
        "BENCH n kind=zzz len=8 rep=1 t_us=3",
        "# run 2",
        "BENCH n kind=aaa len=8 rep=0 t_us=4",
        "BENCH n kind=zzz len=8 rep=0 t_us=4",
    ]
    .map(String::from)
    .to_vec();
    assert_eq!(
        spread_of(&lines),
        ["| `n` | t_us | aaa/zzz | 8 | 2, 1 | 1.50 | 1–2 |"]
    );
    // --from-raw: repetitions per point within one run (2), not over all runs (3).
    let out = std::env::temp_dir().join(format!("p2pbuf-bench-runs-{}", std::process::id()));
    let _ = fs::remove_dir_all(&out);
    write_results(&lines, &out, 0, None).unwrap();
    let idx = fs::read_to_string(out.join("README.md")).unwrap();
    assert!(idx.contains("2 repetitions per point, 2 VM runs"), "{idx}");
    let _ = fs::remove_dir_all(&out);
    let idx = index(
        &benches(&["BENCH x kind=a rep=0 t=1"]),
        &[],
        "now",
        1,
        "k",
        3,
        &spread,
    );
    assert!(idx.contains("3 VM runs"), "{idx}");
    let progs = [
        ("p", Some(0)),
        ("p", Some(0)),
        ("q", Some(0)),
        ("q", Some(2)),
    ]
    .map(|(n, e)| Program {
        name: n.into(),
        exit: e,
    });
    let idx = index(
        &benches(&["BENCH x kind=a rep=0 t=1"]),
        &progs,
        "now",
        1,
        "k",
        2,
        &spread,
    );
    assert!(idx.contains("| p | 0 (all 2 runs) |"), "{idx}");
    assert!(idx.contains("| q | run 1: 0; run 2: 2 (failed"), "{idx}");
    assert!(idx.contains("## Ratio per VM run"), "{idx}");
}

#[test]
fn results_say_which_kernel_and_raw_txt_keeps_it() {
    let out = std::env::temp_dir().join(format!("p2pbuf-bench-kernel-{}", std::process::id()));
    let _ = fs::remove_dir_all(&out);
    let kernel = "Linux 7.2.13 + the p2pbuf series (9 patches), bench config (x), .config sha256 0123456789ab";
    let lines: Vec<String> = [
        "# bench export_map",
        "BENCH x kind=a size=4096 rep=0 t_us=1",
        "[   40.1] unrelated console line",
        "# bench export_map exit 0",
    ]
    .map(String::from)
    .to_vec();
    let rep = write_results(&lines, &out, 1, Some(kernel)).unwrap();
    assert_eq!(rep.kernel, kernel);
    for f in ["README.md", "x.md"] {
        let md = fs::read_to_string(out.join(f)).unwrap();
        assert!(md.contains(&format!("Kernel: {kernel}.")), "{f}: {md}");
    }
    let raw = fs::read_to_string(out.join("raw.txt")).unwrap();
    assert_eq!(
        raw.lines().next(),
        Some(format!("# kernel {kernel}").as_str())
    );
    assert!(!raw.contains("unrelated"));
    // Re-rendered from raw.txt (--from-raw): the recorded kernel, written once.
    let raw_lines: Vec<String> = raw.lines().map(String::from).collect();
    let again = out.join("again");
    let rep = write_results(&raw_lines, &again, 0, None).unwrap();
    assert_eq!(rep.kernel, kernel);
    let raw2 = fs::read_to_string(again.join("raw.txt")).unwrap();
    assert_eq!(raw2, raw);
    // Raw lines from before: said so.
    let old = out.join("old");
    let rep = write_results(&lines, &old, 0, None).unwrap();
    assert_eq!(rep.kernel, KERNEL_UNKNOWN);
    assert!(fs::read_to_string(old.join("README.md"))
        .unwrap()
        .contains("Kernel: not recorded"));
    fs::remove_dir_all(&out).unwrap();
}

#[test]
fn human_sizes_and_numbers() {
    assert_eq!(human(4096), "4 KiB");
    assert_eq!(human(1536), "1.5 KiB");
    assert_eq!(human(64 << 20), "64 MiB");
    assert_eq!(human(100), "100 B");
    assert_eq!(num(1234.4), "1234");
    assert_eq!(num(12.34), "12.3");
    assert_eq!(num(0.1234), "0.123");
    assert_eq!(num(0.000244), "0.000244");
    assert_eq!(num(1.0), "1");
    assert_eq!(num(20.0), "20");
    assert_eq!(num(20.5), "20.5");
    assert_eq!(si(10_000_000.0), "10M");
    assert_eq!(si(1500.0), "1.50k");
    assert_eq!(si(0.25), "0.250");
    assert_eq!(file_stem("a/b c"), "a_b_c");
}

#[test]
fn utc_now_is_the_minute_in_utc() {
    let t = utc_now();
    assert_eq!(t.len(), "2026-11-25 04:10 UTC".len(), "{t}");
    assert!(
        t.ends_with(" UTC") && &t[4..5] == "-" && &t[13..14] == ":",
        "{t}"
    );
}
