//! `p2pbuf-fabric serve` / `write` / `read` / `reg`.
//!
//! The server allocates device memory from `/dev/p2pbuf`, maps it (for its own checks and as
//! the RMA base address), registers it with `fi_mr_regattr(..., FI_MR_DMABUF)` and listens on
//! a passive endpoint. A client connects with its [`Request`] as connection data; the server
//! accepts with its [`Region`] (key, iova, length). The client `fi_write`s the lab pattern
//! from host memory into the range (or `fi_read`s the range into host memory), then sends the
//! FNV-1a of its buffer; the server reads the range through the dma-buf's mmap (inside
//! `DMA_BUF_IOCTL_SYNC`), compares it with the seed's lab pattern, and answers with a
//! [`Verdict`].

use crate::fi::{access, Domain, Ep, Eq, Fabric, Info, FI_CONNECTED, FI_CONNREQ, FI_SHUTDOWN};
use crate::proto::{Op, Region, Request, Verdict};
use crate::{ffi, Error, Result};
use p2pbuf::pattern;
use p2pbuf::{Access, DmaBuf};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// The provider: rxe is a verbs device.
pub const PROVIDER: &str = "verbs";

/// Bytes of the message buffers.
const MSG: usize = 64;

/// What the server saw of one client.
#[derive(Debug, Clone)]
pub struct Served {
    /// What the client asked for.
    pub request: Request,
    /// What the server found.
    pub verdict: Verdict,
}

impl Served {
    /// The bytes are the pattern and in range.
    pub fn ok(&self) -> bool {
        self.verdict.in_range && self.verdict.first_mismatch.is_none()
    }

    /// One line for the log: "fi_write of N bytes at offset O (seed S): verified".
    pub fn line(&self) -> String {
        let r = &self.request;
        let what = format!(
            "{} of {} bytes at offset {} (seed {})",
            r.op.call(),
            r.len,
            r.offset,
            r.seed
        );
        match (self.verdict.in_range, self.verdict.first_mismatch) {
            (false, _) => format!("{what}: out of the region"),
            (true, None) => format!(
                "{what}: verified through the dma-buf's mmap (FNV-1a {:#018x})",
                self.verdict.checksum
            ),
            (true, Some(m)) => format!("{what}: MISMATCH at offset {}", r.offset + m),
        }
    }
}

/// Options of the server.
pub struct ServeOpts {
    /// Local address to listen on (the RDMA device's IPv4 address).
    pub addr: String,
    /// Port.
    pub port: u16,
    /// Bytes of device memory.
    pub size: u64,
    /// Clients to serve before exiting.
    pub clients: u32,
    /// How long to wait for each client.
    pub timeout: Duration,
}

/// [`Info::get`] for [`PROVIDER`] at `node`:`port` (with `source`, the local address to
/// listen on); says what it got.
fn get_info(node: &str, port: u16, source: bool, say: &mut dyn FnMut(&str)) -> Result<Info> {
    let info = Info::get(PROVIDER, Some(node), Some(&port.to_string()), source)?;
    say(&format!("fi_getinfo: {}", info.describe()));
    Ok(info)
}

/// Allocates and registers device memory, then serves `clients` clients; `say` gets one line
/// per step and per client. Returns what each client got.
pub fn serve(o: &ServeOpts, say: &mut dyn FnMut(&str)) -> Result<Vec<Served>> {
    let alloc = p2pbuf::exporter::alloc(o.size)?;
    let buf = alloc.buf;
    say(&format!(
        "device memory: {} bytes from /dev/p2pbuf (fd {}, BAR offset {:#x}, provider {})",
        buf.size(),
        buf.as_raw_fd(),
        alloc.offset,
        alloc.provider
    ));
    let map = buf.map(Access::ReadWrite)?;
    let base = map.read()?.as_ptr() as u64;
    let info = get_info(&o.addr, o.port, true, say)?;
    let fabric = Fabric::open(&info)?;
    let domain = fabric.domain(&info)?;
    let eq = fabric.eq()?;
    let mr = domain.reg_dmabuf(buf.as_raw_fd(), 0, buf.size(), base, access::REMOTE)?;
    let region = Region {
        key: mr.key(),
        addr: base,
        len: buf.size(),
    };
    say(&format!(
        "mr: fi_mr_regattr(FI_MR_DMABUF, fd {}, offset 0, length {}, base {:#x}): key {:#x}",
        buf.as_raw_fd(),
        buf.size(),
        base,
        region.key
    ));
    let _pep = fabric.listen(&info, &eq)?;
    say(&format!("listening on {}:{}", o.addr, o.port));
    let mut served = vec![];
    for n in 1..=o.clients {
        let s = serve_one(&domain, &eq, &region, &buf, &map, o.timeout);
        match &s {
            Ok(s) => say(&format!("client {n}: {}", s.line())),
            Err(e) => say(&format!("client {n}: failed: {e}")),
        }
        served.push(s?);
    }
    drop(mr);
    Ok(served)
}

fn serve_one(
    domain: &Domain<'_>,
    eq: &Eq<'_>,
    region: &Region,
    buf: &DmaBuf,
    map: &p2pbuf::CpuMapping<'_>,
    timeout: Duration,
) -> Result<Served> {
    // A previous client's FI_SHUTDOWN may come late: skip it.
    let req_ev = loop {
        let e = eq.wait("waiting for a connection request", timeout)?;
        match e.event {
            FI_CONNREQ => break e,
            FI_SHUTDOWN => continue,
            other => {
                return Err(Error::Protocol(format!(
                    "event {other} while waiting for a connection request"
                )))
            }
        }
    };
    let request = Request::decode(&req_ev.data)?;
    let info = req_ev
        .info
        .ok_or_else(|| Error::Protocol("a connection request without fi_info".into()))?;
    let cq = domain.cq()?;
    let ep = domain.endpoint(&info, eq, &cq)?;
    let mut msg = vec![0u8; 2 * MSG];
    let msg_mr = domain.reg_host(&mut msg, access::LOCAL)?;
    let (rx, tx) = msg.split_at_mut(MSG);
    ep.post_recv(rx, &msg_mr)?;
    ep.accept(&region.encode())?;
    eq.expect(FI_CONNECTED, "accepting", timeout)?;
    let long = Duration::from_secs(600);
    cq.wait(ffi::FI_RECV as u64, "the client's done message", long)?;
    let in_range = request
        .offset
        .checked_add(request.len)
        .is_some_and(|e| e <= buf.size());
    let mut verdict = Verdict {
        in_range,
        checksum: 0,
        first_mismatch: None,
    };
    if in_range {
        let g = map.read()?;
        let r = &g[request.offset as usize..(request.offset + request.len) as usize];
        verdict.checksum = pattern::checksum(r);
        verdict.first_mismatch = pattern::first_mismatch(r, request.seed);
    }
    tx[..Verdict::SIZE].copy_from_slice(&verdict.encode());
    ep.post_send(&tx[..Verdict::SIZE], &msg_mr)?;
    cq.wait(ffi::FI_SEND as u64, "sending the verdict", long)?;
    // The client shuts down once it has the verdict.
    let _ = eq.wait("the client's shutdown", Duration::from_secs(10));
    drop(ep);
    Ok(Served { request, verdict })
}

/// What a client did and saw.
#[derive(Debug, Clone)]
pub struct ClientReport {
    /// The server's region.
    pub region: Region,
    /// The request.
    pub request: Request,
    /// The server's verdict.
    pub verdict: Verdict,
    /// FNV-1a of the client's buffer after the operation.
    pub checksum: u64,
    /// For a read: the first byte read that is not the pattern.
    pub local_mismatch: Option<u64>,
    /// Seconds from posting the RMA operation to its completion.
    pub seconds: f64,
}

impl ClientReport {
    /// In range, the server read what the client wrote (or the client read the pattern the
    /// server holds), and the server's bytes are the pattern.
    pub fn ok(&self) -> bool {
        self.verdict.in_range
            && self.verdict.checksum == self.checksum
            && self.verdict.first_mismatch.is_none()
            && self.local_mismatch.is_none()
    }
}

/// Options of a client.
pub struct ClientOpts {
    /// The server's address.
    pub server: String,
    /// Its port.
    pub port: u16,
    /// The request.
    pub request: Request,
    /// How long to wait for the connection and the verdict.
    pub timeout: Duration,
}

/// Connects, does the operation, gets the verdict.
pub fn client(o: &ClientOpts, say: &mut dyn FnMut(&str)) -> Result<ClientReport> {
    let info = get_info(&o.server, o.port, false, say)?;
    let fabric = Fabric::open(&info)?;
    let domain = fabric.domain(&info)?;
    let eq = fabric.eq()?;
    let cq = domain.cq()?;
    let ep: Ep<'_> = domain.endpoint(&info, &eq, &cq)?;
    let r = &o.request;
    let len = usize::try_from(r.len).map_err(|_| Error::Protocol("length too large".into()))?;
    let mut data = vec![0u8; len];
    if r.op == Op::Write {
        pattern::fill(&mut data, r.seed);
    }
    let data_mr = domain.reg_host(&mut data, access::LOCAL)?;
    // Receive into the first half, send from the second: one registration for both.
    let mut msg = vec![0u8; 2 * MSG];
    let msg_mr = domain.reg_host(&mut msg, access::LOCAL)?;
    let (rx, tx) = msg.split_at_mut(MSG);
    ep.post_recv(rx, &msg_mr)?;
    ep.connect(&info, &r.encode())?;
    let ev = eq.expect(FI_CONNECTED, "connecting", o.timeout)?;
    let region = Region::decode(&ev.data)?;
    say(&format!(
        "connected: region of {} bytes at {:#x}, key {:#x}",
        region.len, region.addr, region.key
    ));
    let addr = region.addr.checked_add(r.offset).ok_or_else(|| {
        Error::Protocol(format!(
            "offset {} overflows the region's address",
            r.offset
        ))
    })?;
    let t0 = Instant::now();
    ep.post_rma(r.op == Op::Read, &mut data, &data_mr, addr, region.key)?;
    let flag = match r.op {
        Op::Write => ffi::FI_WRITE,
        Op::Read => ffi::FI_READ,
    } as u64;
    cq.wait(flag, r.op.call(), o.timeout)?;
    let seconds = t0.elapsed().as_secs_f64();
    let local_mismatch = match r.op {
        Op::Read => pattern::first_mismatch(&data, r.seed),
        Op::Write => None,
    };
    let sum = pattern::checksum(&data);
    // "Done": one byte; the server computes its own checksum of the range.
    tx[0] = 1;
    ep.post_send(&tx[..1], &msg_mr)?;
    cq.wait(ffi::FI_SEND as u64, "sending done", o.timeout)?;
    cq.wait(ffi::FI_RECV as u64, "the server's verdict", o.timeout)?;
    let verdict = Verdict::decode(rx)?;
    ep.shutdown();
    drop(data_mr);
    Ok(ClientReport {
        region,
        request: *r,
        verdict,
        checksum: sum,
        local_mismatch,
        seconds,
    })
}

/// Registers `len` bytes at `offset` of `fd` with `FI_MR_DMABUF` on the device with address
/// `addr` and deregisters it: for the negative tests. Returns the key.
pub fn reg_only(addr: &str, fd: i32, offset: u64, len: u64) -> Result<u64> {
    let info = Info::get(PROVIDER, Some(addr), None, true)?;
    let fabric = Fabric::open(&info)?;
    let domain = fabric.domain(&info)?;
    let mr = domain.reg_dmabuf(fd, offset, len, 0, access::REMOTE)?;
    Ok(mr.key())
}
