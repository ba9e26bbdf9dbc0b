//! The serve/write/read conversation of `p2pbuf rdma`, on top of [`crate::cm`].
//!
//! 1. The server registers its buffer (host memory or a dma-buf) and listens.
//! 2. A client connects; the server's accept carries a [`Hello`] in the CM private data:
//!    address (virtual address or iova), rkey and length of the region, and what it is.
//! 3. The client RDMA-WRITEs a pattern ([`fill_pattern`]: a function of a seed and of the
//!    absolute offset, so writes at several offsets compose) or RDMA-READs a range.
//! 4. The client SENDs a [`Request`] saying what it did; the server checks that range of its
//!    buffer through the CPU (for a dma-buf: its mmap, inside DMA_BUF_IOCTL_SYNC) and SENDs a
//!    [`Reply`]: checksum, and whether the bytes are the pattern.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use p2pbuf::{pattern, Error, Result};
use serde::Serialize;

use crate::cm::{self, Listener, Op, Transfer};
use crate::verbs::{HostBuf, MrAccess, MrInfo, MrKind, Pd};

const MAGIC: u32 = u32::from_le_bytes(*b"P2PB");
const VERSION: u32 = 1;
const NAME_LEN: usize = 32;

/// First 8 bytes of every message: magic and version.
fn header(out: &mut Vec<u8>) {
    out.extend_from_slice(&MAGIC.to_le_bytes());
    out.extend_from_slice(&VERSION.to_le_bytes());
}

struct Reader<'a> {
    b: &'a [u8],
    what: &'static str,
}

impl<'a> Reader<'a> {
    fn new(b: &'a [u8], what: &'static str) -> Result<Self> {
        let mut r = Reader { b, what };
        let m = r.u32()?;
        let v = r.u32()?;
        if m != MAGIC || v != VERSION {
            return Err(Error::Protocol {
                what: format!("decoding a {what}"),
                detail: format!(
                    "magic {m:#x} version {v}: not a p2pbuf rdma peer of version {VERSION}"
                ),
            });
        }
        Ok(r)
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if self.b.len() < n {
            return Err(Error::Protocol {
                what: format!("decoding a {}", self.what),
                detail: "message too short".into(),
            });
        }
        let (h, t) = self.b.split_at(n);
        self.b = t;
        Ok(h)
    }
    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }
    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
}

/// What the server offers, in its accept's private data.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Hello {
    /// Address of the region's first byte, for the peer.
    pub addr: u64,
    /// Length.
    pub len: u64,
    /// Key.
    pub rkey: u32,
    /// Access flags it was registered with.
    pub access: u32,
    /// True for a dma-buf MR, false for host memory.
    pub dmabuf: bool,
    /// What the memory is (`host`, or the dma-buf's exporter: `udmabuf`, `p2pbuf`, ...).
    pub memory: String,
}

impl Hello {
    /// From a registration and a description of the memory.
    pub fn new(mr: &MrInfo, memory: &str) -> Hello {
        Hello {
            addr: mr.addr,
            len: mr.len,
            rkey: mr.rkey,
            access: mr.access.bits(),
            dmabuf: matches!(mr.kind, MrKind::DmaBuf { .. }),
            memory: memory.chars().take(NAME_LEN - 1).collect(),
        }
    }

    /// Wire form (72 bytes).
    pub fn encode(&self) -> Vec<u8> {
        let mut o = Vec::with_capacity(72);
        header(&mut o);
        o.extend_from_slice(&self.addr.to_le_bytes());
        o.extend_from_slice(&self.len.to_le_bytes());
        o.extend_from_slice(&self.rkey.to_le_bytes());
        o.extend_from_slice(&self.access.to_le_bytes());
        o.extend_from_slice(&(self.dmabuf as u32).to_le_bytes());
        o.extend_from_slice(&0u32.to_le_bytes());
        let mut name = [0u8; NAME_LEN];
        let n = self.memory.len().min(NAME_LEN - 1);
        name[..n].copy_from_slice(&self.memory.as_bytes()[..n]);
        o.extend_from_slice(&name);
        o
    }

    /// Parse the wire form.
    pub fn decode(b: &[u8]) -> Result<Hello> {
        let mut r = Reader::new(b, "server hello (rdma_cm private data)")?;
        let addr = r.u64()?;
        let len = r.u64()?;
        let rkey = r.u32()?;
        let access = r.u32()?;
        let dmabuf = r.u32()? != 0;
        r.u32()?;
        let name = r.take(NAME_LEN)?;
        let end = name.iter().position(|c| *c == 0).unwrap_or(NAME_LEN);
        Ok(Hello {
            addr,
            len,
            rkey,
            access,
            dmabuf,
            memory: String::from_utf8_lossy(&name[..end]).into_owned(),
        })
    }
}

/// What the client did, sent after its RDMA operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Request {
    /// Write or read.
    #[serde(serialize_with = "ser_op")]
    pub op: Op,
    /// Offset into the server's region.
    pub offset: u64,
    /// Bytes.
    pub len: u64,
    /// Pattern seed to verify against.
    pub seed: Option<u64>,
    /// With a seed: the lab pattern ([`p2pbuf::pattern`], counted from the transfer's first
    /// byte) instead of [`fill_pattern`]'s.
    pub lab: bool,
    /// Checksum of the bytes on the client's side.
    pub checksum: u64,
}

fn ser_op<S: serde::Serializer>(op: &Op, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_str(match op {
        Op::Write => "write",
        Op::Read => "read",
    })
}

impl Request {
    /// Wire form.
    pub fn encode(&self) -> Vec<u8> {
        let mut o = Vec::with_capacity(48);
        header(&mut o);
        o.extend_from_slice(&(if self.op == Op::Write { 1u32 } else { 2 }).to_le_bytes());
        // 0: no seed, 1: fill_pattern's, 2: the lab pattern.
        let kind: u32 = match (self.seed, self.lab) {
            (None, _) => 0,
            (Some(_), false) => 1,
            (Some(_), true) => 2,
        };
        o.extend_from_slice(&kind.to_le_bytes());
        o.extend_from_slice(&self.offset.to_le_bytes());
        o.extend_from_slice(&self.len.to_le_bytes());
        o.extend_from_slice(&self.seed.unwrap_or(0).to_le_bytes());
        o.extend_from_slice(&self.checksum.to_le_bytes());
        o
    }

    /// Parse the wire form.
    pub fn decode(b: &[u8]) -> Result<Request> {
        let mut r = Reader::new(b, "client request")?;
        let op = match r.u32()? {
            1 => Op::Write,
            2 => Op::Read,
            n => {
                return Err(Error::Protocol {
                    what: "decoding a client request".into(),
                    detail: format!("unknown operation {n}"),
                })
            }
        };
        let kind = r.u32()?;
        let offset = r.u64()?;
        let len = r.u64()?;
        let seed = r.u64()?;
        let checksum = r.u64()?;
        Ok(Request {
            op,
            offset,
            len,
            seed: (kind != 0).then_some(seed),
            lab: kind == 2,
            checksum,
        })
    }
}

/// The server's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Reply {
    /// The range is inside the server's buffer.
    pub in_range: bool,
    /// Checksum of the range, read by the server's CPU.
    pub checksum: u64,
    /// With a seed: offset (into the region) of the first byte that is not the pattern.
    pub first_mismatch: Option<u64>,
}

impl Reply {
    /// Wire form.
    pub fn encode(&self) -> Vec<u8> {
        let mut o = Vec::with_capacity(32);
        header(&mut o);
        o.extend_from_slice(&(self.in_range as u32).to_le_bytes());
        o.extend_from_slice(&(self.first_mismatch.is_some() as u32).to_le_bytes());
        o.extend_from_slice(&self.checksum.to_le_bytes());
        o.extend_from_slice(&self.first_mismatch.unwrap_or(0).to_le_bytes());
        o
    }

    /// Parse the wire form.
    pub fn decode(b: &[u8]) -> Result<Reply> {
        let mut r = Reader::new(b, "server reply")?;
        let in_range = r.u32()? != 0;
        let bad = r.u32()? != 0;
        let checksum = r.u64()?;
        let at = r.u64()?;
        Ok(Reply {
            in_range,
            checksum,
            first_mismatch: bad.then_some(at),
        })
    }
}

fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The pattern's 8-byte word `index` (bytes `8*index ..` of the region) for `seed`.
pub fn pattern_word(seed: u64, index: u64) -> u64 {
    splitmix64(splitmix64(seed) ^ index)
}

/// Byte `pos` (offset into the region) of the pattern.
pub fn pattern_byte(seed: u64, pos: u64) -> u8 {
    pattern_word(seed, pos / 8).to_le_bytes()[(pos % 8) as usize]
}

/// Fill `buf` with the pattern's bytes `start .. start + buf.len()`.
pub fn fill_pattern(buf: &mut [u8], seed: u64, start: u64) {
    // Up to the first 8-byte boundary, whole words, then the tail.
    let head = (((8 - start % 8) % 8) as usize).min(buf.len());
    let body = (buf.len() - head) / 8 * 8;
    for (i, b) in buf[..head].iter_mut().enumerate() {
        *b = pattern_byte(seed, start + i as u64);
    }
    let w0 = (start + head as u64) / 8;
    for (k, c) in buf[head..head + body].chunks_exact_mut(8).enumerate() {
        c.copy_from_slice(&pattern_word(seed, w0 + k as u64).to_le_bytes());
    }
    let t0 = start + (head + body) as u64;
    for (i, b) in buf[head + body..].iter_mut().enumerate() {
        *b = pattern_byte(seed, t0 + i as u64);
    }
}

/// Offset (into `buf`) of the first byte that differs from the pattern at `start`.
pub fn pattern_mismatch(buf: &[u8], seed: u64, start: u64) -> Option<u64> {
    let mut want = vec![0u8; buf.len().min(1 << 20)];
    let mut off = 0usize;
    for chunk in buf.chunks(want.len().max(1)) {
        let w = &mut want[..chunk.len()];
        fill_pattern(w, seed, start + off as u64);
        if chunk != w {
            let i = chunk
                .iter()
                .zip(w.iter())
                .position(|(a, b)| a != b)
                .unwrap_or(0);
            return Some((off + i) as u64);
        }
        off += chunk.len();
    }
    None
}

/// The pattern of a transfer of `buf.len()` bytes at region offset `start`.
fn fill_any(buf: &mut [u8], seed: u64, lab: bool, start: u64) {
    if lab {
        pattern::fill(buf, seed)
    } else {
        fill_pattern(buf, seed, start)
    }
}

/// First byte of a transfer at region offset `start` that is not its pattern.
fn mismatch_any(buf: &[u8], seed: u64, lab: bool, start: u64) -> Option<u64> {
    if lab {
        pattern::first_mismatch(buf, seed)
    } else {
        pattern_mismatch(buf, seed, start)
    }
}

/// The server's buffer, as its CPU sees it.
pub trait ServerMemory {
    /// Call `f` with bytes `off .. off + len` (inside whatever bracket the memory needs,
    /// e.g. DMA_BUF_IOCTL_SYNC for a dma-buf).
    fn with_bytes(&self, off: u64, len: u64, f: &mut dyn FnMut(&[u8])) -> Result<()>;
}

impl ServerMemory for HostBuf {
    fn with_bytes(&self, off: u64, len: u64, f: &mut dyn FnMut(&[u8])) -> Result<()> {
        f(&self.as_slice()[off as usize..(off + len) as usize]);
        Ok(())
    }
}

/// What the server saw of one client.
#[derive(Debug, Clone, Serialize)]
pub struct Served {
    /// The client's address.
    pub peer: Option<String>,
    /// What it did.
    pub request: Request,
    /// What the server answered.
    pub reply: Reply,
}

/// Accept one client on `listener`, let it do its operation on the region `mr` (of memory
/// `mem`, described as `memory`), verify, and answer.
pub fn serve_one(
    listener: &Listener,
    pd: &Pd,
    mr: &MrInfo,
    memory: &str,
    mem: &dyn ServerMemory,
    timeout: Option<Duration>,
) -> Result<Served> {
    let hello = Hello::new(mr, memory);
    let mut conn = listener.accept(pd, &hello.encode(), timeout)?;
    let peer = conn.peer().map(|p| p.to_string());
    let msg = conn.recv(Duration::from_secs(600))?;
    let request = Request::decode(&msg)?;
    let in_range = request
        .offset
        .checked_add(request.len)
        .is_some_and(|e| e <= mr.len);
    let mut reply = Reply {
        in_range,
        checksum: 0,
        first_mismatch: None,
    };
    if in_range {
        mem.with_bytes(request.offset, request.len, &mut |b| {
            reply.checksum = pattern::checksum(b);
            if let Some(seed) = request.seed {
                reply.first_mismatch = mismatch_any(b, seed, request.lab, request.offset);
            }
        })?;
    }
    conn.send(&reply.encode())?;
    // The client disconnects when it has the reply.
    let _ = conn.disconnect();
    Ok(Served {
        peer,
        request,
        reply,
    })
}

/// What a client did and what both sides saw.
#[derive(Debug, Clone, Serialize)]
pub struct ClientReport {
    /// The server.
    pub server: String,
    /// Its region.
    pub hello: Hello,
    /// What was done.
    pub request: Request,
    /// The server's verdict.
    pub reply: Reply,
    /// For a read with a seed: first local byte that is not the pattern.
    pub local_mismatch: Option<u64>,
    /// How many times the operation was done (`ClientOpts::repeat`).
    pub repeat: u64,
    /// Seconds the RDMA operations took (first post to last completion).
    pub seconds: f64,
    /// MiB/s of the operations (all repetitions).
    pub mib_per_s: f64,
    /// Registration of the local buffer.
    pub local_mr: MrInfo,
}

impl ClientReport {
    /// Both sides agree and, with a seed, the bytes are the pattern.
    pub fn ok(&self) -> bool {
        self.reply.in_range
            && self.reply.checksum == self.request.checksum
            && self.reply.first_mismatch.is_none()
            && self.local_mismatch.is_none()
    }
}

/// Options of a client run.
#[derive(Debug, Clone)]
pub struct ClientOpts {
    /// The server.
    pub server: SocketAddr,
    /// Write or read.
    pub op: Op,
    /// Offset into the server's region.
    pub offset: u64,
    /// Bytes.
    pub len: u64,
    /// Pattern seed (written; or expected on a read).
    pub seed: Option<u64>,
    /// The lab pattern ([`p2pbuf::pattern`]) instead of [`fill_pattern`]'s.
    pub lab: bool,
    /// Do the operation this many times (the same bytes), before telling the server.
    pub repeat: u64,
    /// With `repeat`: how many to keep in flight.
    pub depth: usize,
    /// Called after each completed operation with the number completed so far.
    pub progress: Option<fn(u64)>,
    /// Refuse ranges past the end of the server's region before posting (off: let the
    /// server's HCA refuse them).
    pub check_bounds: bool,
    /// Connection timeout.
    pub timeout: Duration,
}

/// Connect, do the operation, tell the server, get its verdict.
pub fn client(o: &ClientOpts) -> Result<ClientReport> {
    let mut conn = cm::connect(o.server, b"p2pbuf rdma client", o.timeout)?;
    let hello = Hello::decode(conn.peer_data())?;
    if o.check_bounds && o.offset.checked_add(o.len).is_none_or(|e| e > hello.len) {
        return Err(Error::Protocol {
            what: format!(
                "RDMA {} of {} bytes at offset {}",
                if o.op == Op::Write { "WRITE" } else { "READ" },
                o.len,
                o.offset
            ),
            detail: format!("past the end of the server's region ({} bytes)", hello.len),
        });
    }
    if o.len == 0 {
        return Err(Error::Protocol {
            what: "RDMA operation".into(),
            detail: "size must be > 0".into(),
        });
    }
    let mut buf = HostBuf::new(o.len as usize)?;
    if let (Op::Write, Some(seed)) = (o.op, o.seed) {
        fill_any(buf.as_mut_slice(), seed, o.lab, o.offset);
    }
    let local = conn.pd().reg_mr(buf, MrAccess::LOCAL_WRITE)?;
    let info = local.info();
    let repeat = o.repeat.max(1);
    let remote = hello.addr.wrapping_add(o.offset);
    let xfer = Transfer {
        op: o.op,
        local: &info,
        local_off: 0,
        len: o.len,
        remote_addr: remote,
        rkey: hello.rkey,
    };
    let t = Instant::now();
    if repeat == 1 && o.progress.is_none() {
        conn.rdma(xfer)?;
    } else {
        let mut cb = |n: u64| {
            if let Some(f) = o.progress {
                f(n)
            }
        };
        conn.rdma_many(xfer, repeat, o.depth, &mut cb)?;
    }
    let seconds = t.elapsed().as_secs_f64();
    let bytes = local.buf().as_slice();
    let sum = pattern::checksum(bytes);
    let local_mismatch = match (o.op, o.seed) {
        (Op::Read, Some(seed)) => mismatch_any(bytes, seed, o.lab, o.offset),
        _ => None,
    };
    let request = Request {
        op: o.op,
        offset: o.offset,
        len: o.len,
        seed: o.seed,
        lab: o.lab,
        checksum: sum,
    };
    conn.send(&request.encode())?;
    let reply = Reply::decode(&conn.recv(Duration::from_secs(600))?)?;
    let _ = conn.disconnect();
    Ok(ClientReport {
        server: o.server.to_string(),
        hello,
        request,
        reply,
        local_mismatch,
        repeat,
        seconds,
        mib_per_s: (o.len * repeat) as f64 / 1048576.0 / seconds.max(1e-9),
        local_mr: info,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_composes_across_offsets() {
        let mut whole = vec![0u8; 1000];
        fill_pattern(&mut whole, 7, 0);
        for start in [0u64, 1, 3, 8, 13, 500] {
            for len in [0usize, 1, 7, 8, 9, 100] {
                let s = start as usize;
                if s + len > whole.len() {
                    continue;
                }
                let mut part = vec![0u8; len];
                fill_pattern(&mut part, 7, start);
                assert_eq!(&part[..], &whole[s..s + len], "start {start} len {len}");
                assert_eq!(pattern_mismatch(&part, 7, start), None);
            }
        }
        for (i, b) in whole.iter().enumerate() {
            assert_eq!(*b, pattern_byte(7, i as u64));
        }
    }

    #[test]
    fn seeds_differ_and_mismatch_is_found() {
        let mut a = vec![0u8; 4096];
        let mut b = vec![0u8; 4096];
        fill_pattern(&mut a, 1, 0);
        fill_pattern(&mut b, 2, 0);
        assert_ne!(a, b);
        a[1234] ^= 1;
        assert_eq!(pattern_mismatch(&a, 1, 0), Some(1234));
        let big = {
            let mut v = vec![0u8; 3 << 20];
            fill_pattern(&mut v, 9, 4096);
            v[(2 << 20) + 5] = !v[(2 << 20) + 5];
            v
        };
        assert_eq!(pattern_mismatch(&big, 9, 4096), Some((2 << 20) + 5));
    }

    #[test]
    fn messages_round_trip() {
        let h = Hello {
            addr: 0x7f00_0000_1000,
            len: 8 << 20,
            rkey: 0x1234,
            access: 7,
            dmabuf: true,
            memory: "udmabuf".into(),
        };
        let e = h.encode();
        assert_eq!(e.len(), 72);
        assert!(e.len() <= crate::cm::MAX_PRIVATE_DATA);
        assert_eq!(Hello::decode(&e).unwrap(), h);
        let r = Request {
            op: Op::Read,
            offset: 4096,
            len: 1 << 20,
            seed: Some(42),
            lab: false,
            checksum: 99,
        };
        assert_eq!(Request::decode(&r.encode()).unwrap(), r);
        let r2 = Request { seed: None, ..r };
        assert_eq!(Request::decode(&r2.encode()).unwrap(), r2);
        let r3 = Request { lab: true, ..r };
        assert_eq!(Request::decode(&r3.encode()).unwrap(), r3);
        let y = Reply {
            in_range: true,
            checksum: 5,
            first_mismatch: Some(17),
        };
        assert_eq!(Reply::decode(&y.encode()).unwrap(), y);
        assert!(Hello::decode(b"garbage!").is_err());
        assert!(Hello::decode(&e[..20]).is_err());
    }
}
