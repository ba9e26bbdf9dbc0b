//! `p2pbuf rdma ...`: RDMA with host memory and dma-bufs, through p2pbuf-rdma.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, Subcommand};
use p2pbuf::memory::{self, Buffer, Source};
use p2pbuf::units::{human_size, parse_size, parse_u64};
use p2pbuf::{DmaBuf, Error};
use p2pbuf_rdma::session::{self, ServerMemory};
use p2pbuf_rdma::verbs::DeviceAttr;
use p2pbuf_rdma::{Access, Context, Listener, MrInfo, Op, Pd};
use serde::Serialize;

use crate::output::print_json;

mod bench;

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
pub struct BufArgs {
    /// The memory: p2pbuf (device memory from /dev/p2pbuf), udmabuf, host (ibv_reg_mr),
    /// cuda, `fd-from SOCKET` (receive a dma-buf from `p2pbuf alloc --send` or `p2pbuf
    /// send`), and for `reg` only `file PATH` (any fd, to see it refused). Dma-bufs are
    /// registered with ibv_reg_dmabuf_mr. Every command defaults to p2pbuf.
    #[arg(long, num_args = 1..=2, value_names = ["KIND", "PATH"],
          default_values = [Source::DEFAULT_NAME])]
    buf: Vec<String>,
    /// Bytes to allocate (p2pbuf, udmabuf, host, cuda); fd-from takes the sender's size.
    #[arg(long, value_parser = parse_size)]
    size: Option<usize>,
    /// Dma-bufs: where the MR starts in the buffer.
    #[arg(long, default_value = "0", value_parser = parse_size)]
    offset: usize,
    /// Dma-bufs: MR length (default: the rest of the buffer after --offset).
    #[arg(long, value_parser = parse_size)]
    length: Option<usize>,
    /// Dma-bufs: the address peers use for the MR's first byte (default: --offset).
    #[arg(long, value_parser = parse_u64)]
    iova: Option<u64>,
    /// Access flags: lw (LOCAL_WRITE), rw (REMOTE_WRITE), rr (REMOTE_READ), ra, none.
    #[arg(long, default_value = "lw,rw,rr")]
    access: Access,
    /// RDMA device (default: the first, or the one the bind address belongs to).
    #[arg(long)]
    device: Option<String>,
}

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// rdma_cm port.
    #[arg(long, default_value_t = DEFAULT_PORT)]
    port: u16,
    /// Address to listen on (default: all).
    #[arg(long)]
    bind: Option<IpAddr>,
    #[command(flatten)]
    buf: BufArgs,
    /// Clients to serve, one after the other (0: until killed).
    #[arg(long, default_value_t = 1)]
    clients: u32,
    /// Give up when no client comes for this many seconds (0: wait forever).
    #[arg(long, default_value_t = 0)]
    timeout: u64,
}

#[derive(Args, Debug)]
pub struct ClientArgs {
    /// The server, ADDR:PORT (or ADDR, for port 18515).
    #[arg(long)]
    server: String,
    /// Bytes.
    #[arg(long, value_parser = parse_size)]
    size: usize,
    /// Offset into the server's region.
    #[arg(long, default_value = "0", value_parser = parse_size)]
    offset: usize,
    /// Pattern seed: written (write), expected (read).
    #[arg(long)]
    pattern: Option<u64>,
    /// Post even past the end of the server's region (to see the HCA refuse it).
    #[arg(long)]
    unchecked: bool,
    /// Write the lab pattern instead: byte i of the transfer is (i*13 + seed + (i>>12)) &
    /// 0xff, what `cargo xtask test`'s host check looks for in the GPU memory's backing file.
    #[arg(long)]
    lab_pattern: bool,
    /// Do the operation this many times over the same connection (the same bytes), printing
    /// the count done after the 1st, 2nd, 4th, 8th, ...; the first failed completion ends it.
    #[arg(long, default_value_t = 1)]
    repeat: u64,
    /// With --repeat: operations kept in flight (1 to 12).
    #[arg(long, default_value_t = 1)]
    depth: usize,
    /// Seconds to wait for the connection.
    #[arg(long, default_value_t = 20)]
    timeout: u64,
}

#[derive(Args, Debug)]
pub struct RegArgs {
    #[command(flatten)]
    buf: BufArgs,
    /// Wait this many seconds for fd-from's sender.
    #[arg(long, default_value_t = 60)]
    wait: u64,
}

/// `--buf`: memory from [`p2pbuf::memory`], or (for `reg`) any file's fd.
#[derive(Debug, Clone, PartialEq, Eq)]
enum BufSpec {
    Memory(Source),
    File(PathBuf),
}

impl BufSpec {
    /// `KIND`, `KIND PATH` or `KIND:PATH`.
    fn parse(v: &[String]) -> Result<BufSpec, Error> {
        let spec = match v {
            [k] => k.clone(),
            [k, p] => format!("{k}:{p}"),
            _ => {
                return Err(Error::Protocol {
                    what: "--buf".into(),
                    detail: "expected KIND [PATH]".into(),
                })
            }
        };
        match spec.split_once(':') {
            Some(("file", p)) if !p.is_empty() => Ok(BufSpec::File(p.into())),
            None if spec == "file" => Err(Error::Protocol {
                what: "--buf".into(),
                detail: "file needs a path: --buf file PATH".into(),
            }),
            _ => spec
                .parse()
                .map(BufSpec::Memory)
                .map_err(|e: Error| Error::Protocol {
                    what: "--buf".into(),
                    detail: e.to_string(),
                }),
        }
    }
}

/// The memory behind a registration.
enum Memory {
    Buffer(Buffer),
    /// Any other fd (a negative test).
    Other(OwnedFd, PathBuf),
}

impl Memory {
    fn describe(&self) -> String {
        match self {
            Memory::Buffer(Buffer::Host(b)) => {
                format!("host memory, {}", human_size(b.len() as u64))
            }
            Memory::Buffer(m) => match m.dmabuf() {
                Some(b) => format!(
                    "{} dma-buf of {} (fd {}, inode {})",
                    b.exporter(),
                    human_size(b.size()),
                    b.as_raw_fd(),
                    b.info().ino.map_or("?".into(), |i| i.to_string())
                ),
                None => m.describe(),
            },
            Memory::Other(fd, p) => {
                format!("fd {} ({}), not a dma-buf", fd.as_raw_fd(), p.display())
            }
        }
    }

    fn name(&self) -> String {
        match self {
            Memory::Buffer(m) => m
                .dmabuf()
                .map_or_else(|| "host".into(), |b| b.exporter().to_string()),
            Memory::Other(..) => "file".into(),
        }
    }
}

fn io_err(what: &str, path: &Path, source: std::io::Error) -> Error {
    Error::Io {
        what: what.into(),
        path: path.to_path_buf(),
        source,
        check: None,
    }
}

fn get_memory(b: &BufArgs, wait: u64) -> p2pbuf::Result<Memory> {
    Ok(match BufSpec::parse(&b.buf)? {
        BufSpec::Memory(src) => {
            let size = match (src.allocates(), b.size) {
                (false, _) => 0,
                (true, Some(s)) => s as u64,
                (true, None) => {
                    return Err(Error::Protocol {
                        what: "--buf".into(),
                        detail: "--size is needed for this kind of buffer".into(),
                    })
                }
            };
            let opts = memory::Options {
                wait,
                ack: format!("pid {} will register it for RDMA", std::process::id()),
                ..Default::default()
            };
            Memory::Buffer(memory::alloc_with(&src, size, &opts)?)
        }
        BufSpec::File(p) => {
            let f = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&p)
                .map_err(|e| io_err("opening a file to register", &p, e))?;
            if let Some(s) = b.size {
                f.set_len(s as u64)
                    .map_err(|e| io_err("sizing the file", &p, e))?;
            }
            Memory::Other(f.into(), p)
        }
    })
}

/// A registration with what it registers.
struct Registered {
    desc: String,
    name: String,
    mr: RegMr,
}

enum RegMr {
    Host(p2pbuf_rdma::HostMr),
    DmaBuf {
        mr: p2pbuf_rdma::Mr,
        /// None for an fd that is not a dma-buf.
        buf: Option<Buffer>,
        offset: u64,
    },
}

impl Registered {
    fn info(&self) -> MrInfo {
        match &self.mr {
            RegMr::Host(m) => m.info(),
            RegMr::DmaBuf { mr, .. } => mr.info(),
        }
    }

    fn verb(&self) -> &'static str {
        match &self.mr {
            RegMr::Host(_) => "ibv_reg_mr",
            RegMr::DmaBuf { .. } => "ibv_reg_dmabuf_mr",
        }
    }

    /// `ibv_dereg_mr`, then free or close the memory.
    fn dereg(self) -> p2pbuf::Result<()> {
        match self.mr {
            RegMr::Host(m) => m.dereg().map(drop),
            RegMr::DmaBuf { mr, buf, .. } => {
                mr.dereg()?;
                drop(buf);
                Ok(())
            }
        }
    }
}

impl ServerMemory for Registered {
    fn with_bytes(&self, off: u64, len: u64, f: &mut dyn FnMut(&[u8])) -> p2pbuf::Result<()> {
        match &self.mr {
            RegMr::Host(m) => m.buf().with_bytes(off, len, f),
            RegMr::DmaBuf {
                buf: Some(m),
                offset,
                ..
            } => {
                let b = m.require_dmabuf("reading the registered memory")?;
                // Through the exporter's mmap, inside DMA_BUF_IOCTL_SYNC(START/END | READ).
                let map = b.map(p2pbuf::Access::Read)?;
                let g = map.read()?;
                let s = (offset + off) as usize;
                f(&g[s..s + len as usize]);
                g.finish()
            }
            RegMr::DmaBuf { buf: None, .. } => Err(Error::Protocol {
                what: "reading the registered memory".into(),
                detail: "it is not a dma-buf".into(),
            }),
        }
    }
}

fn register(pd: &Pd, mem: Memory, b: &BufArgs) -> p2pbuf::Result<Registered> {
    let desc = mem.describe();
    let name = mem.name();
    let offset = b.offset as u64;
    let iova = b.iova.unwrap_or(offset);
    let mr = match mem {
        Memory::Buffer(Buffer::Host(buf)) => RegMr::Host(pd.reg_mr(buf, b.access)?),
        Memory::Buffer(m) => {
            let d: &DmaBuf = m.require_dmabuf("registering a dma-buf")?;
            let len = b
                .length
                .unwrap_or_else(|| d.size().saturating_sub(offset) as usize);
            let mr = pd
                .reg_dmabuf_mr(offset, len, iova, d.as_fd(), b.access)
                .map_err(|e| crate::p2ppath::explain_dmabuf_refusal(e, pd, d))?;
            RegMr::DmaBuf {
                mr,
                buf: Some(m),
                offset,
            }
        }
        Memory::Other(fd, _) => {
            let len = b.length.or(b.size).unwrap_or(4096);
            let mr = pd.reg_dmabuf_mr(offset, len, iova, fd.as_fd(), b.access)?;
            RegMr::DmaBuf {
                mr,
                buf: None,
                offset,
            }
        }
    };
    Ok(Registered { desc, name, mr })
}

fn mr_line(m: &MrInfo) -> String {
    format!(
        "addr {:#x} len {} rkey {:#x} lkey {:#x} access {}",
        m.addr,
        human_size(m.len),
        m.rkey,
        m.lkey,
        m.access
    )
}

fn open_device(name: Option<&str>) -> p2pbuf::Result<(Context, Pd)> {
    let ctx = Context::open(name)?;
    let pd = Pd::new(&ctx)?;
    Ok((ctx, pd))
}

pub fn run(cmd: RdmaCmd, json: bool) -> p2pbuf::Result<()> {
    match cmd {
        RdmaCmd::Info => info(json),
        RdmaCmd::Serve(a) => serve(a, json),
        RdmaCmd::Write(a) => client(a, Op::Write, json),
        RdmaCmd::Read(a) => client(a, Op::Read, json),
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

/// The lines of `p2pbuf --json rdma serve`, one per event, told apart by `event`.
#[derive(Serialize)]
#[serde(tag = "event", rename_all = "lowercase")]
pub enum ServeEvent<'a> {
    /// The memory is registered and the server listens.
    Registered {
        /// The RDMA device.
        device: &'a str,
        /// The memory registered.
        memory: &'a str,
        /// `ibv_reg_mr` or `ibv_reg_dmabuf_mr`.
        verb: &'static str,
        /// The MR.
        mr: MrInfo,
        /// The address listened on.
        listen: String,
    },
    /// A client was served (or failed).
    Client {
        /// 1 for the first client.
        n: u32,
        /// What happened.
        outcome: &'a ClientOutcome,
    },
    /// All clients were served.
    Done {
        /// Clients whose operation verified.
        verified: u32,
        /// Clients that failed.
        failed: u32,
        /// Checksum of the whole region (null: unreadable).
        region_checksum: Option<String>,
        /// Why the region could not be read (e.g. revoked).
        region_error: Option<String>,
    },
    /// The MR is deregistered.
    Deregistered {
        /// `ibv_reg_mr` or `ibv_reg_dmabuf_mr`.
        verb: &'static str,
    },
}

/// `p2pbuf --json rdma write/read`.
#[derive(Serialize)]
pub struct ClientReportJson<'a> {
    /// Every check passed.
    pub ok: bool,
    /// What was done and found.
    pub report: &'a session::ClientReport,
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
    let mem = get_memory(&a.buf, a.wait)?;
    let (ctx, pd) = open_device(a.buf.device.as_deref())?;
    let r = register(&pd, mem, &a.buf)?;
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

/// A client of `rdma serve`, in its `client` event.
#[derive(Serialize)]
pub struct ClientOutcome {
    /// The client's address.
    pub peer: Option<String>,
    /// Its operation verified.
    pub ok: bool,
    /// Why it failed.
    pub error: Option<String>,
    /// The errno of the failure.
    pub errno: Option<i32>,
    /// What it did and what the server found.
    pub served: Option<session::Served>,
}

fn serve(a: ServeArgs, json: bool) -> p2pbuf::Result<()> {
    // The device first (without one there is nothing to serve), then the memory.
    let bind = SocketAddr::new(a.bind.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED)), a.port);
    let listener = Listener::bind(bind)?;
    let (ctx, pd) = match (listener.context(), &a.buf.device) {
        (Some(c), None) => {
            let c = c?;
            let pd = Pd::new(&c)?;
            (c, pd)
        }
        (_, d) => open_device(d.as_deref())?,
    };
    let mem = get_memory(&a.buf, 600)?;
    let r = register(&pd, mem, &a.buf)?;
    let m = r.info();
    if json {
        print_json(&ServeEvent::Registered {
            device: ctx.name(),
            memory: &r.desc,
            verb: r.verb(),
            mr: m,
            listen: bind.to_string(),
        });
    } else {
        println!(
            "rdma serve: {} registered on {} with {}",
            r.desc,
            ctx.name(),
            r.verb()
        );
        println!("  mr:     {}", mr_line(&m));
        println!(
            "  listening on {bind} (rdma_cm, RC); {}",
            if a.clients == 0 {
                "serving clients until killed".to_string()
            } else {
                format!("{} client(s) to serve", a.clients)
            }
        );
    }
    let timeout = (a.timeout > 0).then(|| Duration::from_secs(a.timeout));
    let (mut good, mut bad) = (0u32, 0u32);
    let mut n = 0;
    while a.clients == 0 || n < a.clients {
        n += 1;
        let out = match session::serve_one(&listener, &pd, &m, &r.name, &r, timeout) {
            Ok(s) => {
                let ok = s.reply.in_range
                    && s.reply.first_mismatch.is_none()
                    && s.reply.checksum == s.request.checksum;
                ClientOutcome {
                    peer: s.peer.clone(),
                    ok,
                    error: None,
                    errno: None,
                    served: Some(s),
                }
            }
            Err(e) => {
                // No client in time ends the loop; other failures are the client's.
                let timed_out = e.errno() == Some(p2pbuf_rdma::verbs::errnos::ETIMEDOUT)
                    && e.to_string().contains("waiting for a client");
                let o = ClientOutcome {
                    peer: None,
                    ok: false,
                    error: Some(e.to_string()),
                    errno: e.errno(),
                    served: None,
                };
                if timed_out {
                    if !json {
                        println!("client {n}: {e}");
                    }
                    bad += 1;
                    break;
                }
                o
            }
        };
        if out.ok {
            good += 1;
        } else {
            bad += 1;
        }
        if json {
            print_json(&ServeEvent::Client { n, outcome: &out });
        } else {
            println!("{}", client_line(n, &out));
        }
    }
    // The region may be gone (the exporter revoked it): say so, and still deregister.
    let mut sum = 0;
    let unreadable = r
        .with_bytes(0, m.len, &mut |b| sum = session::checksum(b))
        .err()
        .map(|e| e.to_string());
    let region = match &unreadable {
        None => format!("checksum of the whole region {sum:#018x}"),
        Some(e) => format!("the region cannot be read any more: {e}"),
    };
    if json {
        print_json(&ServeEvent::Done {
            verified: good,
            failed: bad,
            region_checksum: unreadable.is_none().then(|| format!("{sum:#018x}")),
            region_error: unreadable.clone(),
        });
    } else {
        println!("done: {good} client(s) verified, {bad} failed; {region}");
    }
    // Deregister here rather than on drop, so that a failure (e.g. after a revoke) shows.
    let verb = r.verb();
    r.dereg()?;
    if json {
        print_json(&ServeEvent::Deregistered { verb });
    } else {
        println!("deregistered the MR (ibv_dereg_mr) and closed the buffer");
    }
    if bad > 0 || unreadable.is_some() {
        return Err(Error::Protocol {
            what: "rdma serve".into(),
            detail: format!("{bad} client(s) failed"),
        });
    }
    Ok(())
}

fn client_line(n: u32, o: &ClientOutcome) -> String {
    match &o.served {
        Some(s) => {
            let q = &s.request;
            let verdict = if !s.reply.in_range {
                "range past the end of the region".to_string()
            } else if let Some(at) = s.reply.first_mismatch {
                format!("MISMATCH at offset {}", q.offset + at)
            } else if s.reply.checksum != q.checksum {
                format!("checksum differs (client {:#018x})", q.checksum)
            } else if q.seed.is_some() {
                "verified (pattern)".into()
            } else {
                "checksums agree".into()
            };
            format!(
                "client {n} ({}): {} of {} at offset {}{}: {verdict}, checksum {:#018x}",
                s.peer.as_deref().unwrap_or("?"),
                if q.op == Op::Write {
                    "RDMA WRITE"
                } else {
                    "RDMA READ"
                },
                human_size(q.len),
                q.offset,
                q.seed.map_or(String::new(), |s| format!(" (seed {s})")),
                s.reply.checksum
            )
        }
        None => format!("client {n}: failed: {}", o.error.as_deref().unwrap_or("?")),
    }
}

fn resolve(server: &str) -> p2pbuf::Result<SocketAddr> {
    let with_port = if server.parse::<IpAddr>().is_ok() || !server.contains(':') {
        format!("{server}:{DEFAULT_PORT}")
    } else {
        server.to_string()
    };
    with_port
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| Error::Protocol {
            what: format!("--server {server}"),
            detail: "not an ADDR:PORT this machine can resolve".into(),
        })
}

/// `--repeat`'s progress lines: after operation 1, 2, 4, 8, ... (stdout is line-buffered, so
/// a script sees them as they come).
fn progress(n: u64) {
    if n.is_power_of_two() {
        println!("completed {n}");
    }
}

fn client(a: ClientArgs, op: Op, json: bool) -> p2pbuf::Result<()> {
    let server = resolve(&a.server)?;
    if op == Op::Write && a.pattern.is_none() {
        return Err(Error::Protocol {
            what: "rdma write".into(),
            detail: "--pattern SEED is needed (what to write)".into(),
        });
    }
    let rep = session::client(&session::ClientOpts {
        server,
        op,
        offset: a.offset as u64,
        len: a.size as u64,
        seed: a.pattern,
        lab: a.lab_pattern,
        repeat: a.repeat,
        depth: a.depth,
        progress: (a.repeat > 1).then_some(progress as fn(u64)),
        check_bounds: !a.unchecked,
        timeout: Duration::from_secs(a.timeout),
    })?;
    let ok = rep.ok();
    if json {
        print_json(&ClientReportJson { ok, report: &rep });
    } else {
        let h = &rep.hello;
        println!(
            "server {}: {} region ({}), addr {:#x} len {} rkey {:#x}",
            rep.server,
            h.memory,
            if h.dmabuf { "dma-buf MR" } else { "host MR" },
            h.addr,
            human_size(h.len),
            h.rkey
        );
        println!(
            "RDMA {} of {} at offset {}{}{}: {:.3} s, {:.1} MiB/s",
            if op == Op::Write { "WRITE" } else { "READ" },
            human_size(rep.request.len),
            rep.request.offset,
            rep.request.seed.map_or(String::new(), |s| format!(
                " ({}pattern seed {s})",
                if rep.request.lab { "lab " } else { "" }
            )),
            if rep.repeat > 1 {
                format!(", {} times", rep.repeat)
            } else {
                String::new()
            },
            rep.seconds,
            rep.mib_per_s
        );
        println!(
            "checksum: here {:#018x}, server {:#018x}{}",
            rep.request.checksum,
            rep.reply.checksum,
            if rep.reply.checksum == rep.request.checksum {
                " (equal)"
            } else {
                " (DIFFERENT)"
            }
        );
        if let Some(at) = rep.local_mismatch {
            println!(
                "read data is not the pattern from offset {}",
                rep.request.offset + at
            );
        }
        match rep.reply.first_mismatch {
            Some(at) => println!(
                "server: not the pattern from offset {}",
                rep.request.offset + at
            ),
            None if rep.request.seed.is_some() && rep.reply.in_range => {
                println!("server: verified the pattern through its CPU mapping")
            }
            _ => {}
        }
        println!("{}", if ok { "OK" } else { "FAILED" });
    }
    if !ok {
        return Err(Error::Protocol {
            what: format!("rdma {}", if op == Op::Write { "write" } else { "read" }),
            detail: "verification failed".into(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(v: &[&str]) -> Result<BufSpec, Error> {
        BufSpec::parse(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn buf_specs() {
        assert_eq!(spec(&["host"]).unwrap(), BufSpec::Memory(Source::Host));
        assert_eq!(
            spec(&["udmabuf"]).unwrap(),
            BufSpec::Memory(Source::Udmabuf)
        );
        assert_eq!(spec(&["p2pbuf"]).unwrap(), BufSpec::Memory(Source::P2pbuf));
        assert_eq!(
            spec(&["fd-from", "/tmp/s"]).unwrap(),
            BufSpec::Memory(Source::FdFrom("/tmp/s".into()))
        );
        assert_eq!(
            spec(&["fd-from:/tmp/s"]).unwrap(),
            BufSpec::Memory(Source::FdFrom("/tmp/s".into()))
        );
        assert_eq!(
            spec(&["file", "/tmp/f"]).unwrap(),
            BufSpec::File("/tmp/f".into())
        );
        assert!(spec(&["fd-from"]).is_err());
        assert!(spec(&["host", "/x"]).is_err());
        assert!(spec(&["gpu"]).is_err());
    }

    #[test]
    fn servers() {
        assert_eq!(resolve("10.0.2.15:7000").unwrap().port(), 7000);
        assert_eq!(resolve("10.0.2.15").unwrap().port(), DEFAULT_PORT);
        assert_eq!(
            resolve("127.0.0.1").unwrap().ip(),
            IpAddr::V4(Ipv4Addr::LOCALHOST)
        );
        assert!(resolve("not an address:x").is_err());
    }
}
