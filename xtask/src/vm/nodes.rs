//! Two VMs joined by a network (`cargo xtask run --nodes 2`, and the `two-nodes` stage of
//! `cargo xtask test`): node A exports device memory and registers it with
//! `ibv_reg_dmabuf_mr` on rxe, node B RDMA-WRITEs patterns into it over the link and reads
//! them back; node A verifies each write through its CPU mapping, and the host checks node
//! A's ivshmem backing file. The guests run tests/vm/two-nodes.sh (`p2pbuf.mode=node`).
//!
//! The link is a point-to-point Ethernet between the two virtio-net NICs: UDP datagrams on
//! the host's loopback (`-netdev dgram`, QEMU 7.2), one port per end, so neither VM has to
//! start first. Each node has its own backing files (`node-a-gpu-mem.bin`, ...), console
//! log and results file; the guests wait for each other (with timeouts) over TCP on the link.

use crate::hostcheck;
use crate::ktap::{Status, TestResult};
use crate::qemu::{Mode, NodeLink, VmConfig, VmFiles};
use crate::util::{heading, Ctx};
use crate::vmrun;
use anyhow::{bail, Context, Result};
use std::net::UdpSocket;
use std::path::Path;
use std::time::Duration;

/// The name the stage's in-VM test answers to (`--filter`), and the pseudo-boot
/// (`--boot two-nodes`).
pub const TEST_NAME: &str = "two_nodes_rdma";
pub const BOOT_NAME: &str = "two-nodes";

/// Whether `cargo xtask test` runs the two-node stage: when no boot is named or
/// `--boot two-nodes` is, with no `--filter` or one that [`TEST_NAME`] contains, not with
/// `--inject` (the single-VM suite's), and not for a one-off `--topology/--cpu/--iommu` boot.
pub fn selected(names: &[String], filter: Option<&str>, inject: bool, custom: bool) -> bool {
    !custom
        && !inject
        && (names.is_empty() || names.iter().any(|n| n == BOOT_NAME))
        && filter.is_none_or(|f| TEST_NAME.contains(f))
}

/// Console lines of the guests' narration start with this (tests/vm/two-nodes.sh).
const MARK: &str = "p2pbuf-node: ";

/// One node: its name, its role on the kernel command line, its address on the link.
struct Node {
    name: &'static str,
    role: &'static str,
    ip: &'static str,
    mac: &'static str,
    what: &'static str,
}

const NODES: [Node; 2] = [
    Node {
        name: "A",
        role: "a",
        ip: "10.0.3.1",
        mac: "52:54:00:00:0a:01",
        what: "exports 64 MiB of its device memory, registers it with ibv_reg_dmabuf_mr, serves RDMA clients, verifies each write through its mmap; the same with 16 MiB through libfabric (fi_mr_regattr with FI_MR_DMABUF); fabtests servers; UCX (ucp-put-get): ucp_mem_map of device memory without the preload library (refused) and with it, verifies B's ucp_put_nbx through its mmap",
    },
    Node {
        name: "B",
        role: "b",
        ip: "10.0.3.2",
        mac: "52:54:00:00:0a:02",
        what: "waits for A, RDMA-WRITEs patterns at several offsets into A's device memory, reads them back; then fi_write/fi_read through libfabric's verbs provider; fabtests clients; UCX over rc_verbs: ucp_put_nbx into A's device memory, ucp_get_nbx back",
    },
];

/// Two UDP ports on the loopback that nothing listens on now.
fn free_udp_ports() -> Result<(u16, u16)> {
    let a = UdpSocket::bind("127.0.0.1:0").context("finding a free UDP port")?;
    let b = UdpSocket::bind("127.0.0.1:0").context("finding a free UDP port")?;
    Ok((a.local_addr()?.port(), b.local_addr()?.port()))
}

/// What one node's run came to.
struct NodeRun {
    name: &'static str,
    results: Vec<TestResult>,
    fails: Vec<String>,
    counts: (usize, usize, usize),
    console_log: String,
    boot_to_init: Option<Duration>,
    wall: Duration,
}

/// The configurations of the two nodes, linked to each other.
fn configs(base: &VmConfig, ports: (u16, u16)) -> Vec<VmConfig> {
    NODES
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let peer = &NODES[1 - i];
            let (local, remote) = if i == 0 { ports } else { (ports.1, ports.0) };
            let mut c = base.clone();
            c.mode = Mode::Node;
            // One vCPU each: two TCG guests share this machine's cores.
            c.smp = 1;
            c.link = Some(NodeLink {
                local_port: local,
                remote_port: remote,
                mac: n.mac.into(),
            });
            c.append.push(format!("p2pbuf.node={}", n.role));
            c.append.push(format!("p2pbuf.ip={}", n.ip));
            c.append.push(format!("p2pbuf.peer={}", peer.ip));
            c
        })
        .collect()
}

fn boot_node(
    ctx: &Ctx,
    n: &Node,
    cfg: &VmConfig,
    files: &VmFiles,
    timeout: Duration,
    narrate: bool,
) -> Result<NodeRun> {
    let w = vmrun::Watch::new(format!("node-{}", n.role), timeout, vmrun::Show::Nothing);
    let name = n.name;
    let mut on_line = |l: &str| {
        if let Some(i) = l.find(MARK) {
            if narrate {
                println!("  [{name}] {}", &l[i + MARK.len()..]);
            }
        } else if let Some(p) = crate::ktap::scan_console(l) {
            println!("  [{name}] \x1b[31mconsole: {}\x1b[0m: {}", p.kind, p.line);
        }
    };
    let o = vmrun::boot_and_watch_with(ctx, cfg, files, &w, &mut on_line)?;
    let (mut p, mut f, mut s) = o.parser.counts();
    let mut fails = vmrun::failures(&o, timeout);
    let mut results: Vec<TestResult> = o
        .parser
        .results
        .iter()
        .filter(|r| r.leaf)
        .cloned()
        .collect();
    for (cname, status, note) in hostcheck::checks(&o.parser, files) {
        match status {
            Status::Pass => p += 1,
            Status::Fail => {
                f += 1;
                fails.push(format!("{cname}: {note}"));
            }
            Status::Skip => s += 1,
        }
        results.push(TestResult::new(cname, status, note));
    }
    Ok(NodeRun {
        name,
        results,
        fails,
        counts: (p, f, s),
        console_log: o.console_log.display().to_string(),
        boot_to_init: o.boot_to_init,
        wall: o.wall,
    })
}

fn tag(s: Status) -> &'static str {
    match s {
        Status::Pass => "\x1b[32mok  \x1b[0m",
        Status::Fail => "\x1b[31mFAIL\x1b[0m",
        Status::Skip => "\x1b[33mskip\x1b[0m",
    }
}

/// Boots both nodes at once and waits for both; prints each node's results (and, with
/// `narrate`, the guests' narration as it comes) and a final table. Returns the counts of
/// both nodes together; an error when anything failed.
pub fn two_nodes(
    ctx: &Ctx,
    base: &VmConfig,
    kernel: &Path,
    initrd: &Path,
    timeout: Duration,
    narrate: bool,
) -> Result<(usize, usize, usize)> {
    let ports = free_udp_ports()?;
    let cfgs = configs(base, ports);
    let files: Vec<VmFiles> = NODES
        .iter()
        .map(|n| {
            VmFiles::new(
                ctx,
                kernel.to_path_buf(),
                initrd.to_path_buf(),
                &format!("node-{}-", n.role),
            )
        })
        .collect();
    heading(&format!(
        "two nodes: A ({}) and B ({}) on one Ethernet link (UDP 127.0.0.1:{} <-> :{}), rxe on each NIC; timeout {}s",
        NODES[0].ip,
        NODES[1].ip,
        ports.0,
        ports.1,
        timeout.as_secs()
    ));
    for n in &NODES {
        println!("    node {}: {}", n.name, n.what);
    }
    let runs: Vec<Result<NodeRun>> = std::thread::scope(|s| {
        let hs: Vec<_> = NODES
            .iter()
            .zip(cfgs.iter().zip(files.iter()))
            .map(|(n, (c, f))| s.spawn(move || boot_node(ctx, n, c, f, timeout, narrate)))
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("the node's thread panicked")))
            })
            .collect()
    });
    let mut total = (0, 0, 0);
    let mut fails = vec![];
    let mut done = vec![];
    for (n, r) in NODES.iter().zip(runs) {
        match r {
            Ok(r) => done.push(r),
            Err(e) => fails.push(format!("node {}: {e:#}", n.name)),
        }
    }
    heading("two nodes: results");
    for r in &done {
        println!(
            "  node {}: {} passed, {} failed, {} skipped (boot to init {}, whole run {:.0}s; console log {})",
            r.name,
            r.counts.0,
            r.counts.1,
            r.counts.2,
            r.boot_to_init
                .map_or("?".into(), |b| format!("{:.1}s", b.as_secs_f64())),
            r.wall.as_secs_f64(),
            r.console_log
        );
        // `run` shows them once, in the final table.
        for t in r.results.iter().filter(|_| !narrate) {
            let d = if t.directive.is_empty() {
                String::new()
            } else {
                format!("  # {}", t.directive)
            };
            println!("    [{}] {} {}{d}", r.name, tag(t.status), t.path);
        }
        total.0 += r.counts.0;
        total.1 += r.counts.1;
        total.2 += r.counts.2;
        fails.extend(r.fails.iter().map(|f| format!("node {}: {f}", r.name)));
    }
    if narrate {
        print_table(&done);
    }
    println!(
        "\x1b[1mtwo nodes: {} passed, {} failed, {} skipped\x1b[0m",
        total.0, total.1, total.2
    );
    if !fails.is_empty() {
        for f in &fails {
            eprintln!("\x1b[31merror\x1b[0m: {f}");
        }
        bail!("{} problem(s) in the two-node run", fails.len());
    }
    Ok(total)
}

/// The final table of `run --nodes 2`: one row per step of each node.
fn print_table(runs: &[NodeRun]) {
    heading("two nodes: summary");
    println!("    {:<4} {:<6} step", "node", "result");
    for r in runs {
        for t in &r.results {
            let res = match t.status {
                Status::Pass => "ok",
                Status::Fail => "FAILED",
                Status::Skip => "skip",
            };
            println!("    {:<4} {:<6} {}", r.name, res, t.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_point_at_each_other() {
        let c = configs(&VmConfig::default(), (40001, 40002));
        let (a, b) = (c[0].link.as_ref().unwrap(), c[1].link.as_ref().unwrap());
        assert_eq!((a.local_port, a.remote_port), (40001, 40002));
        assert_eq!((b.local_port, b.remote_port), (40002, 40001));
        assert_ne!(a.mac, b.mac);
        assert!(c[0].append.contains(&"p2pbuf.node=a".to_string()));
        assert!(c[1].append.contains(&"p2pbuf.peer=10.0.3.1".to_string()));
        assert!(c.iter().all(|c| c.mode == Mode::Node && c.smp == 1));
    }

    #[test]
    fn stage_selection() {
        let none: Vec<String> = vec![];
        let two = vec![BOOT_NAME.to_string()];
        let main = vec!["main".to_string()];
        assert!(selected(&none, None, false, false));
        assert!(selected(&two, None, false, false));
        assert!(!selected(&main, None, false, false));
        assert!(selected(&none, Some("rdma"), false, false));
        assert!(selected(&none, Some("two_nodes"), false, false));
        assert!(!selected(&none, Some("topo_"), false, false));
        assert!(!selected(&none, None, true, false));
        assert!(!selected(&none, None, false, true));
    }

    #[test]
    fn free_ports_differ() {
        let (a, b) = free_udp_ports().unwrap();
        assert_ne!(a, b);
    }
}
