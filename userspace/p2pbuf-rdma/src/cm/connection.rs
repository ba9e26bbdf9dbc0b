//! The data path of an RC connection: RDMA WRITE and READ against the peer's region, and
//! small SEND/RECV messages through a registered buffer of the connection's own. Connection
//! set-up (rdma_cm) is the parent module's.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::fmt;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use p2pbuf::{Error, Result};

use super::*;
use crate::ffi;
use crate::verbs::{os_error, Completion, Cq, HostBuf, HostMr, MrInfo, Pd};

/// One RC connection: the QP (on the id), its CQ, and a small registered buffer for messages.
pub struct Connection {
    // Dropped in this order: QP and id, then CQ, then the message buffer, then the PD.
    pub(super) id: Id,
    cq: Cq,
    /// Receive slots, then the send slot (a `RefCell`: `send` writes the send slot).
    ctrl: RefCell<HostMr>,
    pd: Pd,
    peer: Option<SocketAddr>,
    pub(super) peer_data: Vec<u8>,
    pending: RefCell<VecDeque<Completion>>,
    next_wr: std::cell::Cell<u64>,
    pub(super) connected: bool,
}

impl fmt::Debug for Connection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Connection({:?} on {})",
            self.peer,
            self.pd.context().name()
        )
    }
}

/// RDMA WRITE or READ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Local memory to the peer's.
    Write,
    /// The peer's memory to local.
    Read,
}

/// One RDMA WRITE or READ of `len` bytes between a region of ours, `local` at `local_off`,
/// and the peer's region at `remote_addr`/`rkey`.
#[derive(Debug, Clone, Copy)]
pub struct Transfer<'a> {
    /// WRITE (local to remote) or READ (remote to local).
    pub op: Op,
    /// The local region.
    pub local: &'a MrInfo,
    /// Offset in `local` of the first byte.
    pub local_off: u64,
    /// Number of bytes.
    pub len: u64,
    /// The peer's address of the first byte.
    pub remote_addr: u64,
    /// The peer's key for its region.
    pub rkey: u32,
}

impl Transfer<'_> {
    /// Whether the `len` bytes at `local_off` lie inside the local region.
    fn fits(&self) -> bool {
        self.local_off
            .checked_add(self.len)
            .is_some_and(|e| e <= self.local.len)
    }
}

impl Connection {
    pub(super) fn setup(
        mut id: Id,
        pd: Pd,
        peer_data: Vec<u8>,
        peer: Option<SocketAddr>,
    ) -> Result<Connection> {
        let ctx = pd.context().clone();
        if id.verbs() != Some(ctx.id()) {
            return Err(Error::Protocol {
                what: "setting up a connection".into(),
                detail: format!(
                    "the client came in on another RDMA device than the buffer's ({})",
                    ctx.name()
                ),
            });
        }
        let cq = Cq::new(&ctx, 64)?;
        id.raw
            .create_qp(pd.handle(), cq.handle(), 16, RECV_SLOTS as u32 + 1)
            .map_err(|e| os_error(format!("rdma_create_qp on {}", ctx.name()), e, None))?;
        let ctrl = pd.reg_mr(
            HostBuf::new(MAX_MESSAGE * (RECV_SLOTS + 1))?,
            crate::verbs::MrAccess::LOCAL_WRITE,
        )?;
        let c = Connection {
            id,
            cq,
            ctrl: RefCell::new(ctrl),
            pd,
            peer,
            peer_data,
            pending: RefCell::new(VecDeque::new()),
            next_wr: std::cell::Cell::new(1),
            connected: false,
        };
        for slot in 0..RECV_SLOTS {
            c.post_recv(slot)?;
        }
        Ok(c)
    }

    /// The protection domain: register the buffers to move data from and to here.
    pub fn pd(&self) -> &Pd {
        &self.pd
    }

    /// What the peer sent when connecting (for a client: the server's accept).
    pub fn peer_data(&self) -> &[u8] {
        &self.peer_data
    }

    /// The peer's address.
    pub fn peer(&self) -> Option<SocketAddr> {
        self.peer
    }

    fn post_recv(&self, slot: usize) -> Result<()> {
        let info = self.ctrl.borrow().info();
        let sge = ffi::ibv_sge {
            addr: info.addr + (slot * MAX_MESSAGE) as u64,
            length: MAX_MESSAGE as u32,
            lkey: info.lkey,
        };
        self.id
            .raw
            .post_recv(RECV_WR_BASE + slot as u64, sge)
            .map_err(|r| os_error("ibv_post_recv", r, None))
    }

    /// Post one signaled work request of `opcode` from or into `sge` (against the peer's
    /// `remote` address and rkey for RDMA operations); its work request id.
    fn post_send(&self, opcode: u32, sge: ffi::ibv_sge, remote: Option<(u64, u32)>) -> Result<u64> {
        let id = self.next_wr.get();
        self.next_wr.set(id + 1);
        self.id.raw.post_send(id, opcode, sge, remote).map_err(|r| {
            os_error(
                "ibv_post_send",
                r,
                Some("the QP is in the error state after an earlier failure, or the send queue is full".into()),
            )
        })?;
        Ok(id)
    }

    /// Whether the peer has gone (a DISCONNECTED event for this id).
    fn peer_gone(&self) -> Result<bool> {
        let idp = self.id.raw.id_ref();
        let ch = &self.id.ch;
        if ch
            .stash
            .borrow()
            .iter()
            .any(|e| e.id == idp && e.kind == ev::RDMA_CM_EVENT_DISCONNECTED)
        {
            return Ok(true);
        }
        while let Some(e) = ch.next(Some(Duration::ZERO))? {
            let gone = e.id == idp && e.kind == ev::RDMA_CM_EVENT_DISCONNECTED;
            ch.stash.borrow_mut().push_back(e);
            if gone {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Wait for the completion of work request `want`.
    fn wait(
        &self,
        what: &str,
        timeout: Duration,
        want: impl Fn(&Completion) -> bool,
    ) -> Result<Completion> {
        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            {
                let mut p = self.pending.borrow_mut();
                if let Some(i) = p.iter().position(&want) {
                    return Ok(p.remove(i).expect("index in range"));
                }
            }
            let got = self.cq.poll(16)?;
            if got.is_empty() {
                spins += 1;
                if start.elapsed() > timeout {
                    return Err(os_error(
                        format!("{what}: no completion in {} s", timeout.as_secs()),
                        ETIMEDOUT,
                        Some("the peer (or rxe) is stuck: dmesg".into()),
                    ));
                }
                if spins % 1024 == 0 && self.peer_gone()? {
                    return Err(os_error(
                        format!("{what}: the peer disconnected"),
                        ECONNREFUSED,
                        None,
                    ));
                }
                if spins > 256 {
                    std::thread::sleep(Duration::from_micros(50));
                } else {
                    std::thread::yield_now();
                }
                continue;
            }
            self.pending.borrow_mut().extend(got);
        }
    }

    fn check(&self, what: String, c: Completion) -> Result<Completion> {
        if c.status.is_success() {
            return Ok(c);
        }
        Err(os_error(
            format!(
                "{what}: completed with {} ({}, vendor error {:#x})",
                c.status.name(),
                c.status.describe(),
                c.vendor_err
            ),
            EIO,
            Some(c.status.check().into()),
        ))
    }

    /// Post one RDMA WRITE or READ `t` (of at most 1 GiB); its work request id.
    fn post_rdma(&self, t: &Transfer) -> Result<u64> {
        let sge = ffi::ibv_sge {
            addr: t.local.addr + t.local_off,
            length: t.len as u32,
            lkey: t.local.lkey,
        };
        let opcode = match t.op {
            Op::Write => ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE,
            Op::Read => ffi::ibv_wr_opcode::IBV_WR_RDMA_READ,
        };
        self.post_send(opcode, sge, Some((t.remote_addr, t.rkey)))
    }

    /// RDMA WRITE (`Op::Write`: local to remote) or READ (remote to local) `t`, of any
    /// length that fits the local region. Waits for the completion.
    pub fn rdma(&self, t: Transfer) -> Result<()> {
        if !t.fits() {
            return Err(Error::Protocol {
                what: format!("RDMA {:?}", t.op),
                detail: format!(
                    "{} bytes at local offset {} do not fit the local region of {} bytes",
                    t.len, t.local_off, t.local.len
                ),
            });
        }
        let mut done = 0u64;
        while done < t.len {
            let n = (t.len - done).min(MAX_WR_BYTES);
            let what = format!(
                "RDMA {} of {n} bytes {} remote address {:#x} (rkey {:#x})",
                if t.op == Op::Write { "WRITE" } else { "READ" },
                if t.op == Op::Write { "to" } else { "from" },
                t.remote_addr.wrapping_add(done),
                t.rkey
            );
            let id = self.post_rdma(&Transfer {
                local_off: t.local_off + done,
                len: n,
                remote_addr: t.remote_addr.wrapping_add(done),
                ..t
            })?;
            let c = self.wait(&what, Duration::from_secs(120), |c| c.wr_id == id)?;
            self.check(what, c)?;
            done += n;
        }
        Ok(())
    }

    /// `count` RDMA WRITEs (or READs) of the same transfer `t` (at most 1 GiB), keeping up
    /// to `depth` (1 to [`MAX_DEPTH`]) in flight. `on_done` is called with the number
    /// completed so far after each completion. The first completion in error ends it: the
    /// error names its status (e.g. `IBV_WC_REM_ACCESS_ERR`) and how many had completed
    /// before.
    pub fn rdma_many(
        &self,
        t: Transfer,
        count: u64,
        depth: usize,
        on_done: &mut dyn FnMut(u64),
    ) -> Result<()> {
        if t.len == 0 || t.len > MAX_WR_BYTES || !t.fits() {
            return Err(Error::Protocol {
                what: format!("RDMA {:?} x{count}", t.op),
                detail: format!(
                    "{} bytes at local offset {}: must be 1 byte to 1 GiB inside the local region of {} bytes",
                    t.len, t.local_off, t.local.len
                ),
            });
        }
        let depth = depth.clamp(1, MAX_DEPTH) as u64;
        let name = if t.op == Op::Write { "WRITE" } else { "READ" };
        let (mut posted, mut done) = (0u64, 0u64);
        let mut in_flight: VecDeque<u64> = VecDeque::new();
        while done < count {
            while posted < count && posted - done < depth {
                in_flight.push_back(self.post_rdma(&t)?);
                posted += 1;
            }
            let what = format!(
                "RDMA {name} {} of {count} ({} bytes at remote address {:#x}, rkey {:#x}; {done} completed before it)",
                done + 1,
                t.len,
                t.remote_addr,
                t.rkey
            );
            let c = self.wait(&what, Duration::from_secs(120), |c| {
                in_flight.contains(&c.wr_id)
            })?;
            in_flight.retain(|id| *id != c.wr_id);
            self.check(what, c)?;
            done += 1;
            on_done(done);
        }
        Ok(())
    }

    /// Send a message of at most [`MAX_MESSAGE`] bytes; waits for its completion.
    pub fn send(&self, msg: &[u8]) -> Result<()> {
        if msg.len() > MAX_MESSAGE {
            return Err(Error::Protocol {
                what: "sending a message".into(),
                detail: format!("{} bytes, at most {MAX_MESSAGE}", msg.len()),
            });
        }
        // The send slot is after the receive slots; only one send is in flight at a time.
        let off = RECV_SLOTS * MAX_MESSAGE;
        self.ctrl.borrow_mut().buf_mut().as_mut_slice()[off..off + msg.len()].copy_from_slice(msg);
        let info = self.ctrl.borrow().info();
        let sge = ffi::ibv_sge {
            addr: info.addr + off as u64,
            length: msg.len() as u32,
            lkey: info.lkey,
        };
        let id = self.post_send(ffi::ibv_wr_opcode::IBV_WR_SEND, sge, None)?;
        let c = self.wait("SEND", Duration::from_secs(60), |c| c.wr_id == id)?;
        self.check("SEND of a message".into(), c)?;
        Ok(())
    }

    /// Receive the next message.
    pub fn recv(&self, timeout: Duration) -> Result<Vec<u8>> {
        let c = self.wait("waiting for a message", timeout, |c| {
            c.wr_id >= RECV_WR_BASE
        })?;
        let c = self.check("receiving a message".into(), c)?;
        let slot = (c.wr_id - RECV_WR_BASE) as usize;
        let off = slot * MAX_MESSAGE;
        let msg = self.ctrl.borrow().buf().as_slice()
            [off..off + (c.byte_len as usize).min(MAX_MESSAGE)]
            .to_vec();
        self.post_recv(slot)?;
        Ok(msg)
    }

    /// `rdma_disconnect`, and wait (briefly) for the DISCONNECTED event.
    pub fn disconnect(&mut self) -> Result<()> {
        if !self.connected {
            return Ok(());
        }
        self.connected = false;
        self.id
            .raw
            .disconnect()
            .map_err(|e| os_error("rdma_disconnect", e, None))?;
        let idp = self.id.raw.id_ref();
        let _ = self
            .id
            .ch
            .wait("disconnecting", Some(Duration::from_secs(5)), |e| {
                e.id == idp && e.kind == ev::RDMA_CM_EVENT_DISCONNECTED
            });
        // Forget events of this id: the id is going away.
        self.id.ch.stash.borrow_mut().retain(|e| e.id != idp);
        Ok(())
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        let _ = self.disconnect();
    }
}
