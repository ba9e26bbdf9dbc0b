//! Connection setup with rdma_cm, and an RC queue pair to move data on.
//!
//! A server [`Listener::bind`]s a port and [`Listener::accept`]s one client at a time, handing
//! it private data (up to [`MAX_PRIVATE_DATA`] bytes: where the client may write). A client
//! [`connect`]s and gets that private data. Both sides then have a [`Connection`]: RDMA WRITE
//! and READ against the peer's region, and small SEND/RECV messages (through a registered
//! buffer of the connection's own) for the rest of the conversation.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::fmt;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

use p2pbuf::{Error, Result};

use crate::ffi::{libs, rdma_cm_event_type as ev};
use crate::sys::cm::{CmEvent as Event, CmId, EventChannel};
use crate::sys::verbs::CtxId;
use crate::verbs::{errnos::*, os_error, Context, Pd, NO_DEVICE_CHECK};

mod connection;

pub use connection::{Connection, Op, Transfer};

/// Largest private data of an RC connect/accept that fits every transport (IB REP: 196).
pub const MAX_PRIVATE_DATA: usize = 196;
/// Largest message [`Connection::send`] takes.
pub const MAX_MESSAGE: usize = 256;

const RECV_SLOTS: usize = 4;
const RECV_WR_BASE: u64 = 1 << 32;
/// Work requests larger than this are split.
const MAX_WR_BYTES: u64 = 1 << 30;
/// Most RDMA work requests [`Connection::rdma_many`] keeps in flight (the send queue has 16
/// entries; messages need one).
pub const MAX_DEPTH: usize = 12;

/// Name of an event type (`rdma_event_str`).
pub fn event_name(kind: u32) -> String {
    libs()
        .ok()
        .and_then(|l| crate::sys::cm::event_str(l, kind))
        .unwrap_or_else(|| format!("event {kind}"))
}

/// An event channel, and the events that arrived while waiting for another one.
struct Channel {
    raw: Rc<EventChannel>,
    stash: RefCell<VecDeque<Event>>,
}

impl Channel {
    fn new() -> Result<Rc<Channel>> {
        let raw = EventChannel::new(libs()?).map_err(|e| {
            if e == ENODEV || e == 2 {
                // No /dev/infiniband/rdma_cm: no RDMA device (or no rdma_ucm).
                return Error::Unavailable {
                    what: "rdma_create_event_channel".into(),
                    detail: format!("{} (errno {e})", p2pbuf::error::errno_text(e)),
                    check: Some(format!(
                        "{NO_DEVICE_CHECK}; /dev/infiniband/rdma_cm needs CONFIG_INFINIBAND_USER_ACCESS (rdma_ucm)"
                    )),
                };
            }
            os_error("rdma_create_event_channel", e, Some(NO_DEVICE_CHECK.into()))
        })?;
        Ok(Rc::new(Channel {
            raw: Rc::new(raw),
            stash: RefCell::new(VecDeque::new()),
        }))
    }

    /// The next event from librdmacm, waiting at most `timeout` (None: forever; zero: just
    /// look). Ok(None) on timeout.
    fn next(&self, timeout: Option<Duration>) -> Result<Option<Event>> {
        let fd = self.raw.fd();
        let ts = timeout.map(|t| rustix::time::Timespec {
            tv_sec: t.as_secs() as i64,
            tv_nsec: t.subsec_nanos() as i64,
        });
        let mut pfd = [rustix::event::PollFd::from_borrowed_fd(
            fd,
            rustix::event::PollFlags::IN,
        )];
        match rustix::event::poll(&mut pfd, ts.as_ref()) {
            Ok(0) => return Ok(None),
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => return Ok(None),
            Err(e) => {
                return Err(os_error(
                    "poll on the rdma_cm channel",
                    e.raw_os_error(),
                    None,
                ))
            }
        }
        // The channel is readable, so this does not block.
        let ev = self
            .raw
            .next_event()
            .map_err(|e| os_error("rdma_get_cm_event", e, None))?;
        Ok(Some(ev))
    }

    /// Wait for an event that `want` accepts, stashing the others.
    fn wait(
        &self,
        what: &str,
        timeout: Option<Duration>,
        want: impl Fn(&Event) -> bool,
    ) -> Result<Event> {
        {
            let mut st = self.stash.borrow_mut();
            if let Some(i) = st.iter().position(&want) {
                return Ok(st.remove(i).expect("index in range"));
            }
        }
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            if left == Some(Duration::ZERO) {
                return Err(os_error(
                    format!(
                        "{what}: no answer in {} s",
                        timeout.unwrap_or_default().as_secs()
                    ),
                    ETIMEDOUT,
                    Some("is the server running and reachable (same rxe/RoCE network)?".into()),
                ));
            }
            if let Some(e) = self.next(left)? {
                if want(&e) {
                    return Ok(e);
                }
                self.stash.borrow_mut().push_back(e);
            }
        }
    }
}

/// An rdma_cm id with (optionally) its QP, and the channel its events come on.
struct Id {
    // Dropped first: the id goes before its channel.
    raw: CmId,
    ch: Rc<Channel>,
}

impl Id {
    fn new(ch: &Rc<Channel>) -> Result<Id> {
        let raw = CmId::create(&ch.raw).map_err(|e| os_error("rdma_create_id", e, None))?;
        Ok(Id {
            raw,
            ch: ch.clone(),
        })
    }

    fn verbs(&self) -> Option<CtxId> {
        self.raw.verbs()
    }
}

fn event_error(what: &str, e: &Event) -> Error {
    let name = event_name(e.kind);
    let (errno, check) = match e.kind {
        ev::RDMA_CM_EVENT_REJECTED => (
            ECONNREFUSED,
            if e.private_data.is_empty() {
                "nobody listens on that port (is `p2pbuf rdma serve` running there?)".to_string()
            } else {
                format!(
                    "the server said: {}",
                    String::from_utf8_lossy(&e.private_data).trim_end_matches('\0')
                )
            },
        ),
        ev::RDMA_CM_EVENT_ADDR_ERROR => (
            if e.status < 0 { -e.status } else { ENODEV },
            format!("no RDMA device serves a route to that address; {NO_DEVICE_CHECK}"),
        ),
        ev::RDMA_CM_EVENT_ROUTE_ERROR | ev::RDMA_CM_EVENT_UNREACHABLE => (
            if e.status < 0 { -e.status } else { ETIMEDOUT },
            "the address is not reachable over RDMA (rxe on both ends, same network?)".to_string(),
        ),
        _ => (
            if e.status < 0 { -e.status } else { EIO },
            "an unexpected rdma_cm event".to_string(),
        ),
    };
    os_error(
        format!("{what}: {name} (status {})", e.status),
        errno,
        Some(check),
    )
}

/// A server's listening id.
pub struct Listener {
    id: Id,
    ch: Rc<Channel>,
    addr: SocketAddr,
}

impl fmt::Debug for Listener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Listener({})", self.addr)
    }
}

impl Listener {
    /// `rdma_bind_addr` + `rdma_listen`. Bind to a specific address to tie the listener to
    /// the RDMA device that serves it ([`Listener::context`]).
    pub fn bind(addr: SocketAddr) -> Result<Listener> {
        let ch = Channel::new()?;
        let id = Id::new(&ch)?;
        id.raw.bind_addr(addr).map_err(|e| {
            os_error(
                format!("rdma_bind_addr({addr})"),
                e,
                Some(match e {
                    98 => "the port is in use (another p2pbuf rdma serve?)".into(),
                    99 | 19 => format!("no RDMA device has that address; {NO_DEVICE_CHECK}"),
                    _ => NO_DEVICE_CHECK.into(),
                }),
            )
        })?;
        id.raw
            .listen(8)
            .map_err(|e| os_error(format!("rdma_listen({addr})"), e, None))?;
        Ok(Listener { id, ch, addr })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The device the listener is bound to, when bound to a specific address.
    pub fn context(&self) -> Option<Result<Context>> {
        self.id.verbs().map(Context::of_verbs)
    }

    /// Wait for a client, give it `private_data`, and set up the connection with a QP on
    /// `pd` (which must be on the device the client came in on).
    pub fn accept(
        &self,
        pd: &Pd,
        private_data: &[u8],
        timeout: Option<Duration>,
    ) -> Result<Connection> {
        let req = self.ch.wait("waiting for a client", timeout, |e| {
            e.kind == ev::RDMA_CM_EVENT_CONNECT_REQUEST
        })?;
        let (raw, client_data) = CmId::from_request(&self.ch.raw, req)
            .expect("waited for a connect request, which carries an id");
        let id = Id {
            raw,
            ch: self.ch.clone(),
        };
        let peer = id.raw.peer_addr();
        let conn = Connection::setup(id, pd.clone(), client_data, peer)?;
        check_private_data(private_data)?;
        conn.id
            .raw
            .accept(private_data)
            .map_err(|e| os_error("rdma_accept", e, None))?;
        let idp = conn.id.raw.id_ref();
        let e = self.ch.wait(
            "waiting for the connection to be established",
            Some(Duration::from_secs(30)),
            |e| e.id == idp,
        )?;
        if e.kind != ev::RDMA_CM_EVENT_ESTABLISHED {
            return Err(event_error("accepting a client", &e));
        }
        let mut conn = conn;
        conn.connected = true;
        Ok(conn)
    }

    /// Refuse the next client, telling it why (up to [`MAX_PRIVATE_DATA`] bytes).
    pub fn reject_next(&self, why: &str, timeout: Option<Duration>) -> Result<()> {
        let req = self.ch.wait("waiting for a client", timeout, |e| {
            e.kind == ev::RDMA_CM_EVENT_CONNECT_REQUEST
        })?;
        let why = &why.as_bytes()[..why.len().min(MAX_PRIVATE_DATA)];
        if let Some((id, _)) = CmId::from_request(&self.ch.raw, req) {
            id.reject(why);
        }
        Ok(())
    }
}

/// Private data fits every transport ([`MAX_PRIVATE_DATA`]).
fn check_private_data(private_data: &[u8]) -> Result<()> {
    if private_data.len() > MAX_PRIVATE_DATA {
        return Err(Error::Protocol {
            what: "rdma_cm private data".into(),
            detail: format!("{} bytes, at most {MAX_PRIVATE_DATA}", private_data.len()),
        });
    }
    Ok(())
}

/// Connect to a server, sending `private_data`; the server's private data is in
/// [`Connection::peer_data`].
pub fn connect(addr: SocketAddr, private_data: &[u8], timeout: Duration) -> Result<Connection> {
    let ch = Channel::new()?;
    let id = Id::new(&ch)?;
    let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    id.raw.resolve_addr(addr, ms).map_err(|e| {
        os_error(
            format!("rdma_resolve_addr({addr})"),
            e,
            Some(NO_DEVICE_CHECK.into()),
        )
    })?;
    let idp = id.raw.id_ref();
    let e = ch.wait("resolving the address", Some(timeout), |e| e.id == idp)?;
    if e.kind != ev::RDMA_CM_EVENT_ADDR_RESOLVED {
        return Err(event_error(&format!("resolving {addr}"), &e));
    }
    id.raw
        .resolve_route(ms)
        .map_err(|e| os_error(format!("rdma_resolve_route({addr})"), e, None))?;
    let e = ch.wait("resolving the route", Some(timeout), |e| e.id == idp)?;
    if e.kind != ev::RDMA_CM_EVENT_ROUTE_RESOLVED {
        return Err(event_error(&format!("resolving a route to {addr}"), &e));
    }
    let verbs = id.verbs().ok_or_else(|| Error::Protocol {
        what: format!("resolving a route to {addr}"),
        detail: "librdmacm bound the id to no RDMA device".into(),
    })?;
    let ctx = Context::of_verbs(verbs)?;
    let pd = Pd::new(&ctx)?;
    let mut conn = Connection::setup(id, pd, vec![], Some(addr))?;
    check_private_data(private_data)?;
    conn.id
        .raw
        .connect(private_data)
        .map_err(|e| os_error(format!("rdma_connect({addr})"), e, None))?;
    let e = ch.wait("connecting", Some(timeout), |e| e.id == idp)?;
    if e.kind != ev::RDMA_CM_EVENT_ESTABLISHED {
        return Err(event_error(&format!("connecting to {addr}"), &e));
    }
    conn.peer_data = e.private_data;
    conn.connected = true;
    Ok(conn)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_data_limit() {
        assert!(check_private_data(&[0; MAX_PRIVATE_DATA]).is_ok());
        assert!(check_private_data(&[0; MAX_PRIVATE_DATA + 1]).is_err());
    }
}
