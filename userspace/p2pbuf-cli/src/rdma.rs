//! `p2pbuf rdma ...`: RDMA with host memory and dma-bufs, through p2pbuf-rdma.

use clap::{Args, Subcommand};
use p2pbuf::units::human_size;
use p2pbuf_rdma::verbs::DeviceAttr;
use p2pbuf_rdma::{Context, MrInfo, Op, Pd};
use serde::Serialize;

use crate::output::print_json;

mod bench;
mod client;
mod memory;
mod serve;

pub use client::ClientArgs;
pub use memory::BufArgs;
pub use serve::ServeArgs;

/// Default rdma_cm port (perftest's).
pub const DEFAULT_PORT: u16 = 18515;

#[derive(Subcommand, Debug)]
pub enum RdmaCmd {
    /// List the RDMA devices librdmacm sees, with their attributes.
    Info,
    /// Register a buffer, print its MR, serve clients that RDMA WRITE into it or READ
    /// from it, and verify what they wrote through the CPU.
    Serve(ServeArgs),
    /// RDMA WRITE a pattern into a server's buffer; the server verifies it.
    Write(ClientArgs),
    /// RDMA READ from a server's buffer (and check it is the pattern, with --pattern).
    Read(ClientArgs),
    /// One registration attempt (no connection): prints the MR, or the error and errno.
    /// For checking what the provider and the kernel accept.
    Reg(RegArgs),
    /// Benchmarks: registration time of ibv_reg_dmabuf_mr (p2pbuf device memory) vs
    /// ibv_reg_mr (host memory), RDMA WRITE bandwidth and latency into a dma-buf MR vs a
    /// host MR over the device's loopback; prints `cargo xtask bench`'s line protocol.
    Bench(bench::BenchArgs),
}

#[derive(Args, Debug)]
pub struct RegArgs {
    #[command(flatten)]
    pub(crate) buf: BufArgs,
    /// Wait this many seconds for fd-from's sender.
    #[arg(long, default_value_t = 60)]
    wait: u64,
    /// With `--mem p2pbuf`: N times, allocate a buffer and revoke it (P2PBUF_IOCTL_REVOKE)
    /// from another thread at a random moment within the time a registration takes, while it
    /// is being registered; print how the attempts ended. Every registration must either succeed (and deregister) or fail with
    /// ENODEV or EINVAL; anything else is an error.
    #[arg(long, value_name = "N")]
    revoke_race: Option<u32>,
}

pub(crate) fn mr_line(m: &MrInfo) -> String {
    format!(
        "addr {:#x} len {} rkey {:#x} lkey {:#x} access {}",
        m.addr,
        human_size(m.len),
        m.rkey,
        m.lkey,
        m.access
    )
}

pub(crate) fn open_device(name: Option<&str>) -> p2pbuf::Result<(Context, Pd)> {
    let ctx = Context::open(name)?;
    let pd = Pd::new(&ctx)?;
    Ok((ctx, pd))
}

pub fn run(cmd: RdmaCmd, json: bool) -> p2pbuf::Result<()> {
    match cmd {
        RdmaCmd::Info => info(json),
        RdmaCmd::Serve(a) => serve::serve(a, json),
        RdmaCmd::Write(a) => client::client(a, Op::Write, json),
        RdmaCmd::Read(a) => client::client(a, Op::Read, json),
        RdmaCmd::Reg(a) => reg(a, json),
        RdmaCmd::Bench(a) => bench::run(a),
    }
}

/// One device in `p2pbuf --json rdma info`.
#[derive(Serialize)]
pub struct DeviceReport {
    /// Its name (`rxe0`, `mlx5_0`).
    pub name: String,
    /// `ibv_query_device`.
    pub attr: DeviceAttr,
}

/// `p2pbuf --json rdma info`.
#[derive(Serialize)]
pub struct InfoReport {
    /// The devices librdmacm sees.
    pub devices: Vec<DeviceReport>,
    /// Where the verbs bindings came from (generated or the pregenerated fallback).
    pub bindings: &'static str,
}

/// `p2pbuf --json rdma reg`.
#[derive(Serialize)]
pub struct RegReport<'a> {
    /// Always true (a failure is an error report).
    pub registered: bool,
    /// The RDMA device.
    pub device: &'a str,
    /// The memory registered.
    pub memory: &'a str,
    /// `ibv_reg_mr` or `ibv_reg_dmabuf_mr`.
    pub verb: &'static str,
    /// The MR.
    pub mr: MrInfo,
}

fn info(json: bool) -> p2pbuf::Result<()> {
    let names = p2pbuf_rdma::device_names()?;
    let mut devices = vec![];
    for n in &names {
        let ctx = Context::open(Some(n))?;
        devices.push(DeviceReport {
            name: n.clone(),
            attr: ctx.query()?,
        });
    }
    if json {
        print_json(&InfoReport {
            devices,
            bindings: p2pbuf_rdma::ffi::BINDINGS,
        });
    } else {
        for d in &devices {
            let a = &d.attr;
            println!(
                "{}: node_guid {} fw {} vendor {:#x}, {} port(s), max_mr_size {}, max_qp {}, max_qp_wr {}",
                d.name,
                a.node_guid,
                a.fw_ver,
                a.vendor_id,
                a.phys_port_cnt,
                a.max_mr_size,
                a.max_qp,
                a.max_qp_wr
            );
        }
        println!("bindings: {}", p2pbuf_rdma::ffi::BINDINGS);
    }
    Ok(())
}

fn reg(a: RegArgs, json: bool) -> p2pbuf::Result<()> {
    if let Some(n) = a.revoke_race {
        return revoke_race(&a, n, json);
    }
    let mem = memory::get_memory(&a.buf, a.wait)?;
    let (ctx, pd) = open_device(a.buf.device.as_deref())?;
    let r = memory::register(&pd, mem, &a.buf)?;
    let m = r.info();
    if json {
        print_json(&RegReport {
            registered: true,
            device: ctx.name(),
            memory: &r.desc,
            verb: r.verb(),
            mr: m,
        });
    } else {
        println!("registered {} on {} with {}", r.desc, ctx.name(), r.verb());
        println!("  mr: {}", mr_line(&m));
    }
    Ok(())
}

/// `p2pbuf --json rdma reg --revoke-race N`.
#[derive(Serialize)]
pub struct RevokeRaceReport<'a> {
    /// The RDMA device.
    pub device: &'a str,
    /// Registrations attempted.
    pub attempts: u32,
    /// The revokes landed within this many microseconds of a registration's start.
    pub spread_us: u64,
    /// How the attempts ended, with their counts.
    pub outcomes: &'a std::collections::BTreeMap<String, u32>,
}

/// `reg --revoke-race N`: registrations racing a revoke of their buffer. The kernel must
/// answer each with a registered MR (revoked later) or a documented errno, and say nothing
/// on the console (xtask's scan): no WARN from a revoke that lands inside the registration.
///
/// Over 100 lines on purpose: the calibration, the racing loop and the tally share the device,
/// the exporter and the outcomes, in the order the race runs.
fn revoke_race(a: &RegArgs, n: u32, json: bool) -> p2pbuf::Result<()> {
    use std::collections::BTreeMap;
    use std::os::fd::AsFd;
    use std::time::{Duration, Instant};

    if !memory::is_p2pbuf(&a.buf) {
        return Err(p2pbuf::Error::Protocol {
            what: "--revoke-race".into(),
            detail: "needs --mem p2pbuf (a buffer the exporter can revoke)".into(),
        });
    }
    let size = a.buf.size.ok_or_else(|| p2pbuf::Error::Protocol {
        what: "--revoke-race".into(),
        detail: "needs --size".into(),
    })?;
    let (ctx, pd) = open_device(a.buf.device.as_deref())?;
    let ex = p2pbuf::exporter::Exporter::open()?;
    let reg = |buf: &p2pbuf::DmaBuf| pd.reg_dmabuf_mr(0, size, 0, buf.as_fd(), a.buf.access);

    // How long a registration takes here (the fastest of 5, deregistration not counted): the
    // revokes are spread over that, so that they land inside registrations.
    let mut span = u64::MAX;
    for _ in 0..5 {
        let al = p2pbuf::exporter::alloc(size as u64)?;
        let t0 = Instant::now();
        let mr = reg(&al.buf)?;
        span = span.min(
            u64::try_from(t0.elapsed().as_micros())
                .unwrap_or(u64::MAX)
                .max(1),
        );
        mr.dereg()?;
    }
    let mut seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64)
        | 1;
    let mut outcomes: BTreeMap<String, u32> = BTreeMap::new();
    let mut unexpected = None;
    for _ in 0..n {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let delay = Duration::from_micros(seed % span);
        let al = p2pbuf::exporter::alloc(size as u64)?;
        let buf = &al.buf;
        let (r, rv) = std::thread::scope(|s| {
            let h = s.spawn(|| {
                let t = Instant::now();
                while t.elapsed() < delay {
                    std::hint::spin_loop();
                }
                ex.revoke(buf)
            });
            let r = reg(buf);
            (r, h.join())
        });
        if let Ok(Err(e)) = rv {
            return Err(e);
        }
        let key = match r {
            Ok(mr) => {
                mr.dereg()?;
                "registered, then deregistered".to_string()
            }
            Err(e) => match e.errno() {
                // ENODEV: the exporter refused the attachment or the mapping; EINVAL: the
                // umem was invalidated between attach and map.
                Some(c @ (19 | 22)) => format!("refused: {}", p2pbuf::error::errno_text(c)),
                _ => {
                    unexpected.get_or_insert_with(|| e.to_string());
                    format!("unexpected: {e}")
                }
            },
        };
        *outcomes.entry(key).or_default() += 1;
    }
    if json {
        print_json(&RevokeRaceReport {
            device: ctx.name(),
            attempts: n,
            spread_us: span,
            outcomes: &outcomes,
        });
    } else {
        println!(
            "revoke race on {}: {n} registrations of {} of p2pbuf device memory, each revoked within {span} us of its start",
            ctx.name(),
            human_size(size as u64)
        );
        for (k, v) in &outcomes {
            println!("  {v:5}  {k}");
        }
    }
    match unexpected {
        None => Ok(()),
        Some(e) => Err(p2pbuf::Error::Protocol {
            what: "revoke race".into(),
            detail: format!("a registration failed with an undocumented error: {e}"),
        }),
    }
}
