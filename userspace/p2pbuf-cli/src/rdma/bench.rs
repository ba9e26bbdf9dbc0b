//! `p2pbuf rdma bench`: registration time of `ibv_reg_dmabuf_mr` (p2pbuf device memory) vs
//! `ibv_reg_mr` (anonymous host memory), and RDMA WRITE bandwidth and latency into a dma-buf
//! MR vs a host MR, over one RDMA device's loopback (rxe in the lab). Prints the line protocol
//! of docs/bench.md; docs/rdma.md has the method and the numbers.

use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsFd;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use clap::Args;
use p2pbuf::{DmaBuf, Error};
use p2pbuf_rdma::session::{self, ServerMemory};
use p2pbuf_rdma::{cm, Context, HostBuf, Listener, MrAccess, MrInfo, Op, Pd, Transfer};

/// Host memory of `size` bytes, from [`p2pbuf::memory`] as every command gets its memory.
fn host_mem(size: usize) -> p2pbuf::Result<HostBuf> {
    memory::alloc(&Source::Host, size as u64)?.into_host("rdma bench")
}

/// P2pbuf device memory of `size` bytes.
fn device_mem(size: usize, uninitialized: bool) -> p2pbuf::Result<DmaBuf> {
    let o = memory::Options {
        p2pbuf: p2pbuf::exporter::AllocFlags {
            uninitialized,
            ..Default::default()
        },
        ..Default::default()
    };
    memory::alloc_with(&Source::P2pbuf, size as u64, &o)?.into_dmabuf("rdma bench")
}

use p2pbuf::memory::{self, Source};
use p2pbuf::units::parse_size;

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Repetitions per point.
    #[arg(long, default_value_t = 5)]
    reps: u32,
    /// What to measure: reg (registration time), write (RDMA WRITE), or both.
    #[arg(long, value_delimiter = ',', default_value = "reg,write")]
    what: Vec<String>,
    /// Registration sizes.
    #[arg(long, value_delimiter = ',', value_parser = parse_size,
          default_value = "4k,64k,1M,16M,128M,1G")]
    reg_sizes: Vec<usize>,
    /// Also time ibv_reg_mr of host memory that was not faulted in first (kind host_cold:
    /// registration then allocates and zeroes the pages too).
    #[arg(long)]
    cold: bool,
    /// Host memory (kinds host, host_cold) only up to this size: the guest's RAM bounds it,
    /// device memory is bounded by the BAR.
    #[arg(long, value_parser = parse_size)]
    host_max: Option<usize>,
    /// Allocate the device buffers without zeroing them (P2PBUF_ALLOC_UNINITIALIZED, needs
    /// CAP_SYS_RAWIO): zeroing 64 GiB is minutes of memset_io under TCG. Registration, what
    /// is timed, is the same either way.
    #[arg(long)]
    uninitialized: bool,
    /// RDMA WRITE sizes.
    #[arg(long, value_delimiter = ',', value_parser = parse_size, default_value = "4k,64k,1M,4M")]
    write_sizes: Vec<usize>,
    /// Bytes per bandwidth point (at least 2 writes each).
    #[arg(long, default_value = "4M", value_parser = parse_size)]
    bw_bytes: usize,
    /// RDMA WRITEs kept in flight for bandwidth (1 to 12).
    #[arg(long, default_value_t = 8)]
    depth: usize,
    /// This machine's address on the RDMA device (the loopback servers bind it), e.g. rxe0's
    /// 10.0.2.15.
    #[arg(long)]
    addr: IpAddr,
    /// First rdma_cm port (the host-memory server takes the next one).
    #[arg(long, default_value_t = 18600)]
    port: u16,
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn parse_what(w: &[String]) -> p2pbuf::Result<(bool, bool)> {
    let mut reg = false;
    let mut write = false;
    for x in w {
        match x.as_str() {
            "reg" => reg = true,
            "write" => write = true,
            o => {
                return Err(Error::Protocol {
                    what: "--what".into(),
                    detail: format!("unknown {o:?}: reg, write"),
                })
            }
        }
    }
    Ok((reg, write))
}

pub fn run(a: BenchArgs) -> p2pbuf::Result<()> {
    let (reg, write) = parse_what(&a.what)?;
    if reg {
        bench_reg(&a)?;
    }
    if write {
        bench_write(&a)?;
    }
    Ok(())
}

/// Touch every page so that registration finds them present (pinning is what is timed).
fn fault_in(b: &mut HostBuf) {
    for byte in b.as_mut_slice().iter_mut().step_by(4096) {
        *byte = 1;
    }
}

/// Unrecorded registrations of each kind before the first sample (see `bench_reg`).
const WARMUP_ROUNDS: u32 = 5;

/// Below this size a registration sample is the median of [`SMALL_ROUNDS`] registrations.
const SMALL_SIZE: usize = 1 << 20;

/// Registrations per sample below [`SMALL_SIZE`].
const SMALL_ROUNDS: usize = 15;

/// The median of `v` (sorts it); `v` is not empty.
/// Times one registration (`reg`) and, when it succeeds, its deregistration (`dereg`, which
/// must succeed), adding both in microseconds to `times` (registration, deregistration).
/// Returns what `dereg` gives back, or the registration's error (nothing is added then).
fn time_reg<M, T, E>(
    times: (&mut Vec<f64>, &mut Vec<f64>),
    reg: impl FnOnce() -> std::result::Result<M, E>,
    dereg: impl FnOnce(M) -> std::result::Result<T, E>,
) -> std::result::Result<std::result::Result<T, E>, E> {
    let t = Instant::now();
    let r = reg();
    let took = t.elapsed();
    let mr = match r {
        Ok(mr) => mr,
        Err(e) => return Ok(Err(e)),
    };
    let t = Instant::now();
    let back = dereg(mr)?;
    times.1.push(us(t.elapsed()));
    times.0.push(us(took));
    Ok(Ok(back))
}

/// The `BENCH rdma_reg` line of one sample: the medians of its registrations and
/// deregistrations, when all `rounds` of them succeeded (nothing otherwise).
fn print_reg_sample(
    kind: &str,
    size: usize,
    rep: u32,
    rounds: usize,
    (reg, dereg): (&mut [f64], &mut [f64]),
) {
    if reg.len() == rounds {
        println!(
            "BENCH rdma_reg kind={kind} size={size} rep={rep} reg_us={:.1} dereg_us={:.1}",
            median(reg),
            median(dereg)
        );
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn bench_reg(a: &BenchArgs) -> p2pbuf::Result<()> {
    let ctx = Context::open(None)?;
    let pd = Pd::new(&ctx)?;
    let access = MrAccess::REMOTE_RW;
    println!("BENCHINFO rdma_reg baseline=host title=MR_registration_time x=size");
    println!("BENCHMETRIC rdma_reg reg_us unit=us better=lower");
    println!("BENCHMETRIC rdma_reg dereg_us unit=us better=lower");
    println!(
        "# rdma_reg on {}: time of the ibv_reg_dmabuf_mr / ibv_reg_mr call alone (CLOCK_MONOTONIC), access {access}; \
         kind=dmabuf: a p2pbuf device-memory dma-buf of the size (allocated once per size, registered whole, {} times; below 1 MiB each sample is the median of 15 registrations, after 5 unrecorded ones); \
         kind=host: anonymous memory, every page touched before the timing{}",
        ctx.name(),
        a.reps,
        if a.cold {
            "; kind=host_cold: anonymous memory never touched (registration faults it in)"
        } else {
            ""
        }
    );
    warm_up(a, &pd, access)?;
    for &size in &a.reg_sizes {
        reg_size(a, &pd, access, size)?;
    }
    Ok(())
}

/// WARMUP_ROUNDS unrecorded registrations of each kind first, at the first size when it is
/// small (that is what they are for; a large first size, e.g. tests/vm/tests/large_rdma.sh's
/// 5 or 64 GiB, would pay a second allocation), host memory only where --host-max allows: the first
/// registrations pay for cold caches and first-use setup (the first dma-buf attachment of
/// the rxe device to the provider's memory computes the p2pdma distance, once per client
/// device; under QEMU TCG the first runs of a code path also pay its translation). The
/// times of the first are printed (a diagnostic, not a sample).
fn warm_up(a: &BenchArgs, pd: &Pd, access: MrAccess) -> p2pbuf::Result<()> {
    if let Some(&size) = a.reg_sizes.first().filter(|&&s| s < SMALL_SIZE) {
        if let Ok(d) = device_mem(size, a.uninitialized) {
            for round in 0..WARMUP_ROUNDS {
                let t = Instant::now();
                let Ok(mr) = pd.reg_dmabuf_mr(0, size, 0, d.as_fd(), access) else {
                    break;
                };
                let reg = t.elapsed();
                mr.dereg()?;
                if round == 0 {
                    println!(
                        "# rdma_reg: first (cold, not recorded) dmabuf size={size} registration {:.1} us",
                        us(reg)
                    );
                }
            }
        }
        let host_ok = a.host_max.is_none_or(|m| size <= m);
        if let Some(Ok(mut h)) = host_ok.then(|| host_mem(size)) {
            fault_in(&mut h);
            for round in 0..WARMUP_ROUNDS {
                let t = Instant::now();
                let mr = match pd.reg_mr(h, access) {
                    Ok(mr) => mr,
                    Err(_) => break,
                };
                let reg = t.elapsed();
                h = mr.dereg()?;
                if round == 0 {
                    println!(
                        "# rdma_reg: first (cold, not recorded) host size={size} registration {:.1} us",
                        us(reg)
                    );
                }
            }
        }
    }
    Ok(())
}

/// One size of `rdma_reg`: its buffers, then `--reps` samples of each kind (the kinds
/// alternating which goes first), and of never-touched host memory with `--cold`.
fn reg_size(a: &BenchArgs, pd: &Pd, access: MrAccess, size: usize) -> p2pbuf::Result<()> {
    // The buffers of this size; allocation and faulting-in are not timed.
    let host_ok = a.host_max.is_none_or(|m| size <= m);
    // Large points take seconds to minutes under TCG (allocating 64 GiB of device memory
    // takes its 16 Mi page references; faulting in host memory): say where the run is.
    let long = size >= 1 << 30;
    let progress = |what: &str| {
        if long {
            println!("# progress: rdma_reg size={size}: {what}");
            let _ = std::io::Write::flush(&mut std::io::stdout());
        }
    };
    progress("allocating the buffers (not timed)");
    let dmabuf = match device_mem(size, a.uninitialized) {
        Ok(x) => Some(x),
        Err(e) => {
            println!("# rdma_reg size={size}: no p2pbuf buffer: {e}");
            None
        }
    };
    let mut host = match host_mem(size) {
        _ if !host_ok => None,
        Ok(b) => Some(b),
        Err(e) => {
            println!("# rdma_reg size={size}: no host buffer: {e}");
            None
        }
    };
    if let Some(h) = host.as_mut() {
        fault_in(h);
    }
    // Below SMALL_SIZE a sample is the median of SMALL_ROUNDS back-to-back registrations
    // (registration and deregistration each their own median): one takes tens of
    // microseconds, less than one preemption by the host's other work under TCG.
    let rounds = if size < SMALL_SIZE { SMALL_ROUNDS } else { 1 };
    for rep in 0..a.reps {
        progress(&format!("repetition {}/{}", rep + 1, a.reps));
        // The two kinds alternate which goes first at each repetition.
        for dmabuf_turn in [rep % 2 == 0, rep % 2 != 0] {
            let (kind, mut reg, mut dereg) = (
                if dmabuf_turn { "dmabuf" } else { "host" },
                Vec::new(),
                Vec::new(),
            );
            for _ in 0..rounds {
                if dmabuf_turn {
                    let Some(d) = &dmabuf else { break };
                    let r = time_reg(
                        (&mut reg, &mut dereg),
                        || pd.reg_dmabuf_mr(0, size, 0, d.as_fd(), access),
                        |mr| mr.dereg(),
                    )?;
                    if let Err(e) = r {
                        println!("# rdma_reg kind=dmabuf size={size} rep={rep}: {e}");
                        break;
                    }
                } else {
                    let Some(h) = host.take() else { break };
                    let r = time_reg(
                        (&mut reg, &mut dereg),
                        || pd.reg_mr(h, access),
                        |mr| mr.dereg(),
                    )?;
                    match r {
                        Ok(h) => host = Some(h),
                        Err(e) => {
                            println!("# rdma_reg kind=host size={size} rep={rep}: {e}");
                            break;
                        }
                    }
                }
            }
            print_reg_sample(kind, size, rep, rounds, (&mut reg, &mut dereg));
        }
        if a.cold && host_ok {
            let (mut reg, mut dereg) = (Vec::new(), Vec::new());
            for _ in 0..rounds {
                let h = host_mem(size)?;
                let r = time_reg(
                    (&mut reg, &mut dereg),
                    || pd.reg_mr(h, access),
                    |mr| mr.dereg(),
                )?;
                if let Err(e) = r {
                    println!("# rdma_reg kind=host_cold size={size} rep={rep}: {e}");
                    break;
                }
            }
            print_reg_sample("host_cold", size, rep, rounds, (&mut reg, &mut dereg));
        }
    }
    progress("freeing the buffers (not timed)");
    drop(dmabuf);
    drop(host);

    Ok(())
}

/// The server side's memory, for its verification through the CPU.
enum ServerBuf {
    DmaBuf(DmaBuf),
    Host(p2pbuf_rdma::HostMr),
}

struct Served<'a>(&'a ServerBuf);

impl ServerMemory for Served<'_> {
    fn with_bytes(&self, off: u64, len: u64, f: &mut dyn FnMut(&[u8])) -> p2pbuf::Result<()> {
        match self.0 {
            ServerBuf::Host(m) => m.buf().with_bytes(off, len, f),
            ServerBuf::DmaBuf(b) => {
                let map = b.map(p2pbuf::Access::Read)?;
                let g = map.read()?;
                f(&g[off as usize..(off + len) as usize]);
                g.finish()
            }
        }
    }
}

/// A loopback server in a thread of its own (verbs objects stay in the thread that made them):
/// registers `size` bytes of `kind` memory and accepts one client (`ready` gets the outcome).
/// While the client measures, it sleeps on `go` (no CQ polling that would take CPU from rxe);
/// then it receives the client's request and verifies those bytes through its CPU mapping.
fn server(
    kind: &'static str,
    addr: SocketAddr,
    size: usize,
    ready: mpsc::Sender<Result<(), String>>,
    go: mpsc::Receiver<()>,
) -> Result<String, String> {
    let setup = || -> p2pbuf::Result<_> {
        let l = Listener::bind(addr)?;
        let ctx = match l.context() {
            Some(c) => c?,
            None => Context::open(None)?,
        };
        let pd = Pd::new(&ctx)?;
        let (buf, info, mr) = if kind == "dmabuf" {
            let d = device_mem(size, false)?;
            let mr = pd.reg_dmabuf_mr(0, size, 0, d.as_fd(), MrAccess::REMOTE_RW)?;
            let info = mr.info();
            (ServerBuf::DmaBuf(d), info, Some(mr))
        } else {
            let m = pd.reg_mr(host_mem(size)?, MrAccess::REMOTE_RW)?;
            let info = m.info();
            (ServerBuf::Host(m), info, None)
        };
        Ok((l, pd, buf, info, mr))
    };
    let (l, pd, buf, info, mr) = match setup() {
        Ok(x) => {
            let _ = ready.send(Ok(()));
            x
        }
        Err(e) => {
            let _ = ready.send(Err(e.to_string()));
            return Err(e.to_string());
        }
    };
    let hello = session::Hello::new(&info, kind);
    let mut conn = l
        .accept(&pd, &hello.encode(), Some(Duration::from_secs(120)))
        .map_err(|e| e.to_string())?;
    if go.recv().is_err() {
        return Err(format!("{kind}: the client gave up"));
    }
    let msg = conn
        .recv(Duration::from_secs(120))
        .map_err(|e| e.to_string())?;
    let q = session::Request::decode(&msg).map_err(|e| e.to_string())?;
    let mut reply = session::Reply {
        in_range: q.offset.checked_add(q.len).is_some_and(|e| e <= info.len),
        checksum: 0,
        first_mismatch: None,
    };
    if reply.in_range {
        Served(&buf)
            .with_bytes(q.offset, q.len, &mut |b| {
                reply.checksum = p2pbuf::pattern::checksum(b);
                reply.first_mismatch = q
                    .seed
                    .and_then(|seed| session::pattern_mismatch(b, seed, q.offset));
            })
            .map_err(|e| e.to_string())?;
    }
    conn.send(&reply.encode()).map_err(|e| e.to_string())?;
    let _ = conn.disconnect();
    drop(conn);
    if let Some(mr) = mr {
        mr.dereg().map_err(|e| e.to_string())?;
    }
    if reply.in_range && reply.first_mismatch.is_none() && reply.checksum == q.checksum {
        Ok(format!(
            "{kind}: the last {} bytes written verified by the server through its CPU mapping",
            q.len
        ))
    } else {
        Err(format!(
            "{kind}: the server found other bytes than written (in range {}, first mismatch {:?})",
            reply.in_range, reply.first_mismatch
        ))
    }
}

/// One measured point: latency (one write in flight, median) and bandwidth (`depth` in flight).
fn point(
    conn: &cm::Connection,
    local: &MrInfo,
    size: u64,
    hello: &session::Hello,
    a: &BenchArgs,
) -> p2pbuf::Result<(f64, f64)> {
    // `count` writes of `size` bytes from the start of `local` to the server's buffer.
    let writes = |count, depth, on_done: &mut dyn FnMut(u64)| {
        let xfer = Transfer {
            op: Op::Write,
            local,
            local_off: 0,
            len: size,
            remote_addr: hello.addr,
            rkey: hello.rkey,
        };
        conn.rdma_many(xfer, count, depth, on_done)
    };
    let lat_n = (2u64 << 20).checked_div(size).unwrap_or(1).clamp(2, 32);
    let mut times = Vec::with_capacity(lat_n as usize);
    let mut last = Instant::now();
    writes(lat_n, 1, &mut |_| {
        let now = Instant::now();
        times.push(us(now - last));
        last = now;
    })?;
    times.sort_by(f64::total_cmp);
    let lat = times[times.len() / 2];
    let bw_n = (a.bw_bytes as u64 / size).clamp(2, 1024);
    let t = Instant::now();
    writes(bw_n, a.depth, &mut |_| {})?;
    let mibps = (bw_n * size) as f64 / 1048576.0 / t.elapsed().as_secs_f64().max(1e-9);
    Ok((mibps, lat))
}

fn bench_write(a: &BenchArgs) -> p2pbuf::Result<()> {
    let max = *a.write_sizes.iter().max().unwrap_or(&4096);
    println!("BENCHINFO rdma_write baseline=host title=RDMA_WRITE_over_rxe x=size");
    println!("BENCHMETRIC rdma_write MiBps unit=MiB/s better=higher");
    println!("BENCHMETRIC rdma_write lat_us unit=us better=lower");
    println!(
        "# rdma_write: loopback on one RDMA device ({}), a client QP writes from a host MR into a server's \
         dma-buf MR (kind=dmabuf, p2pbuf device memory) or host MR (kind=host); lat_us: median time from \
         post to completion of single writes; MiBps: {} bytes per point (at least 2 writes), {} in flight",
        a.addr,
        a.bw_bytes,
        a.depth.clamp(1, cm::MAX_DEPTH)
    );
    let mut handles = vec![];
    let mut conns = vec![];
    for (i, kind) in ["dmabuf", "host"].into_iter().enumerate() {
        let addr = SocketAddr::new(a.addr, a.port + i as u16);
        let (tx, rx) = mpsc::channel();
        let (go_tx, go_rx) = mpsc::channel();
        handles.push((
            go_tx,
            std::thread::spawn(move || server(kind, addr, max, tx, go_rx)),
        ));
        match rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                return Err(Error::Protocol {
                    what: format!("rdma_write: the {kind} server"),
                    detail: e,
                })
            }
            Err(_) => {
                return Err(Error::Protocol {
                    what: format!("rdma_write: the {kind} server"),
                    detail: "its thread ended".into(),
                })
            }
        }
        let conn = cm::connect(addr, b"p2pbuf rdma bench", Duration::from_secs(30))?;
        let hello = session::Hello::decode(conn.peer_data())?;
        let mut buf = host_mem(max)?;
        session::fill_pattern(buf.as_mut_slice(), 0xbe4c, 0);
        let local = conn.pd().reg_mr(buf, MrAccess::LOCAL_WRITE)?;
        conns.push((kind, conn, hello, local));
    }
    for rep in 0..a.reps {
        for &size in &a.write_sizes {
            for (kind, conn, hello, local) in &conns {
                let (mibps, lat) = point(conn, &local.info(), size as u64, hello, a)?;
                println!(
                    "BENCH rdma_write kind={kind} size={size} rep={rep} MiBps={mibps:.2} lat_us={lat:.1}"
                );
            }
        }
    }
    // The last write of every connection covered the largest size: the server checks it.
    let mut bad = vec![];
    for ((kind, conn, _, local), (go, h)) in conns.into_iter().zip(handles) {
        let _ = go.send(());
        let bytes = &local.buf().as_slice()[..max];
        let req = session::Request {
            op: Op::Write,
            offset: 0,
            len: max as u64,
            seed: Some(0xbe4c),
            lab: false,
            checksum: p2pbuf::pattern::checksum(bytes),
        };
        conn.send(&req.encode())?;
        let _ = session::Reply::decode(&conn.recv(Duration::from_secs(600))?)?;
        drop(conn);
        match h.join() {
            Ok(Ok(msg)) => println!("# rdma_write {msg}"),
            Ok(Err(e)) => bad.push(e),
            Err(_) => bad.push(format!("{kind}: the server thread panicked")),
        }
    }
    if !bad.is_empty() {
        return Err(Error::Protocol {
            what: "rdma_write verification".into(),
            detail: bad.join("; "),
        });
    }
    Ok(())
}
