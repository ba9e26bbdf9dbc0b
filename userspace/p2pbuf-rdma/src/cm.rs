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
use std::net::{IpAddr, SocketAddr};
use std::os::fd::BorrowedFd;
use std::ptr::NonNull;
use std::rc::Rc;
use std::time::{Duration, Instant};

use p2pbuf::{Error, Result};

use crate::ffi::{self, errno, libs, rdma_cm_event_type as ev, Libs};
use crate::verbs::{errnos::*, os_error, Context, Pd, NO_DEVICE_CHECK};

mod connection;

pub use connection::{Connection, Op};

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

/// A CM event, copied out of librdmacm and acknowledged.
#[derive(Clone)]
struct Event {
    kind: u32,
    status: i32,
    id: *mut ffi::rdma_cm_id,
    private_data: Vec<u8>,
}

/// Name of an event type (`rdma_event_str`).
pub fn event_name(kind: u32) -> String {
    match libs() {
        Ok(l) => {
            // SAFETY: returns a static string for any value.
            let p = unsafe { l.cm.rdma_event_str(kind) };
            if p.is_null() {
                return format!("event {kind}");
            }
            // SAFETY: NUL-terminated static string.
            unsafe { std::ffi::CStr::from_ptr(p) }
                .to_string_lossy()
                .into_owned()
        }
        Err(_) => format!("event {kind}"),
    }
}

struct Channel {
    libs: &'static Libs,
    ch: NonNull<ffi::rdma_event_channel>,
    /// Events that arrived while waiting for another one.
    stash: RefCell<VecDeque<Event>>,
}

impl Drop for Channel {
    fn drop(&mut self) {
        // SAFETY: every id on the channel holds an `Rc` of it, so none is left.
        unsafe { self.libs.cm.rdma_destroy_event_channel(self.ch.as_ptr()) }
    }
}

impl Channel {
    fn new() -> Result<Rc<Channel>> {
        let libs = libs()?;
        // SAFETY: no arguments; a new channel or NULL.
        let ch = unsafe { libs.cm.rdma_create_event_channel() };
        let ch = NonNull::new(ch).ok_or_else(|| {
            let e = errno();
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
            libs,
            ch,
            stash: RefCell::new(VecDeque::new()),
        }))
    }

    /// The next event from librdmacm, waiting at most `timeout` (None: forever; zero: just
    /// look). Ok(None) on timeout.
    fn next(&self, timeout: Option<Duration>) -> Result<Option<Event>> {
        // SAFETY: the channel's fd lives as long as the channel.
        let fd = unsafe { BorrowedFd::borrow_raw((*self.ch.as_ptr()).fd) };
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
        let mut e: *mut ffi::rdma_cm_event = std::ptr::null_mut();
        // SAFETY: the channel is readable, so this does not block; it stores an event that
        // must be acknowledged.
        let r = unsafe { self.libs.cm.rdma_get_cm_event(self.ch.as_ptr(), &mut e) };
        if r != 0 || e.is_null() {
            return Err(os_error("rdma_get_cm_event", errno(), None));
        }
        // SAFETY: `e` is a valid event until acknowledged; the private data (for connection
        // events) is valid for `private_data_len` bytes until then.
        let ev = unsafe {
            let r = &*e;
            let conn = r.param.conn;
            let pd = if matches!(
                r.event,
                ev::RDMA_CM_EVENT_CONNECT_REQUEST
                    | ev::RDMA_CM_EVENT_ESTABLISHED
                    | ev::RDMA_CM_EVENT_REJECTED
                    | ev::RDMA_CM_EVENT_CONNECT_RESPONSE
            ) && !conn.private_data.is_null()
            {
                std::slice::from_raw_parts(
                    conn.private_data.cast::<u8>(),
                    conn.private_data_len as usize,
                )
                .to_vec()
            } else {
                vec![]
            };
            let out = Event {
                kind: r.event,
                status: r.status,
                id: r.id,
                private_data: pd,
            };
            self.libs.cm.rdma_ack_cm_event(e);
            out
        };
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

/// An rdma_cm id with (optionally) its QP; both destroyed on drop.
struct Id {
    ch: Rc<Channel>,
    id: NonNull<ffi::rdma_cm_id>,
    has_qp: bool,
}

impl Id {
    fn new(ch: &Rc<Channel>) -> Result<Id> {
        let mut id = std::ptr::null_mut();
        // SAFETY: a live channel; the new id is stored in `id`.
        let r = unsafe {
            ch.libs.cm.rdma_create_id(
                ch.ch.as_ptr(),
                &mut id,
                std::ptr::null_mut(),
                ffi::rdma_port_space::RDMA_PS_TCP,
            )
        };
        match NonNull::new(id) {
            Some(id) if r == 0 => Ok(Id {
                ch: ch.clone(),
                id,
                has_qp: false,
            }),
            _ => Err(os_error("rdma_create_id", errno(), None)),
        }
    }

    fn ptr(&self) -> *mut ffi::rdma_cm_id {
        self.id.as_ptr()
    }

    fn verbs(&self) -> *mut ffi::ibv_context {
        // SAFETY: a live id.
        unsafe { (*self.ptr()).verbs }
    }
}

impl Drop for Id {
    fn drop(&mut self) {
        // SAFETY: a live id; its QP (if any) was made with rdma_create_qp; all its events
        // were acknowledged when read.
        unsafe {
            if self.has_qp {
                self.ch.libs.cm.rdma_destroy_qp(self.ptr());
            }
            self.ch.libs.cm.rdma_destroy_id(self.ptr());
        }
    }
}

struct SockAddr {
    storage: ffi::sockaddr_in6,
}

impl SockAddr {
    fn new(a: SocketAddr) -> SockAddr {
        let mut storage = ffi::sockaddr_in6::default();
        match a {
            SocketAddr::V4(v4) => {
                let sin = ffi::sockaddr_in {
                    sin_family: rustix::net::AddressFamily::INET.as_raw(),
                    sin_port: v4.port().to_be(),
                    sin_addr: ffi::in_addr {
                        s_addr: u32::from_ne_bytes(v4.ip().octets()),
                    },
                    ..Default::default()
                };
                // SAFETY: sockaddr_in fits in sockaddr_in6; both are plain data.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        (&sin as *const ffi::sockaddr_in).cast::<u8>(),
                        (&mut storage as *mut ffi::sockaddr_in6).cast::<u8>(),
                        std::mem::size_of::<ffi::sockaddr_in>(),
                    )
                };
            }
            SocketAddr::V6(v6) => {
                storage.sin6_family = rustix::net::AddressFamily::INET6.as_raw();
                storage.sin6_port = v6.port().to_be();
                storage.sin6_flowinfo = v6.flowinfo().to_be();
                storage.sin6_scope_id = v6.scope_id();
                storage.sin6_addr.__in6_u.__u6_addr8 = v6.ip().octets();
            }
        }
        SockAddr { storage }
    }

    fn as_ptr(&mut self) -> *mut ffi::sockaddr {
        (&mut self.storage as *mut ffi::sockaddr_in6).cast()
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
        let mut sa = SockAddr::new(addr);
        // SAFETY: a live id and a sockaddr of the family's size.
        if unsafe { ch.libs.cm.rdma_bind_addr(id.ptr(), sa.as_ptr()) } != 0 {
            let e = errno();
            return Err(os_error(
                format!("rdma_bind_addr({addr})"),
                e,
                Some(match e {
                    98 => "the port is in use (another p2pbuf rdma serve?)".into(),
                    99 | 19 => format!("no RDMA device has that address; {NO_DEVICE_CHECK}"),
                    _ => NO_DEVICE_CHECK.into(),
                }),
            ));
        }
        // SAFETY: a bound id.
        if unsafe { ch.libs.cm.rdma_listen(id.ptr(), 8) } != 0 {
            return Err(os_error(format!("rdma_listen({addr})"), errno(), None));
        }
        Ok(Listener { id, ch, addr })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The device the listener is bound to, when bound to a specific address.
    pub fn context(&self) -> Option<Result<Context>> {
        let v = self.id.verbs();
        (!v.is_null()).then(|| Context::of_verbs(v))
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
        let id = Id {
            ch: self.ch.clone(),
            // SAFETY: a CONNECT_REQUEST carries a new id, ours to destroy.
            id: NonNull::new(req.id).expect("connect request without an id"),
            has_qp: false,
        };
        // SAFETY: a live id.
        let peer = unsafe { peer_addr(id.ptr()) };
        let mut conn = Connection::setup(id, pd.clone(), req.private_data, peer)?;
        let mut param = conn_param(private_data)?;
        // SAFETY: a connect-request id with a QP; `param` points into `private_data`,
        // which lives across the call.
        if unsafe { self.ch.libs.cm.rdma_accept(conn.id.ptr(), &mut param) } != 0 {
            return Err(os_error("rdma_accept", errno(), None));
        }
        let idp = conn.id.ptr();
        let e = self.ch.wait(
            "waiting for the connection to be established",
            Some(Duration::from_secs(30)),
            |e| e.id == idp,
        )?;
        if e.kind != ev::RDMA_CM_EVENT_ESTABLISHED {
            return Err(event_error("accepting a client", &e));
        }
        conn.connected = true;
        Ok(conn)
    }

    /// Refuse the next client, telling it why (up to [`MAX_PRIVATE_DATA`] bytes).
    pub fn reject_next(&self, why: &str, timeout: Option<Duration>) -> Result<()> {
        let req = self.ch.wait("waiting for a client", timeout, |e| {
            e.kind == ev::RDMA_CM_EVENT_CONNECT_REQUEST
        })?;
        let why = &why.as_bytes()[..why.len().min(MAX_PRIVATE_DATA)];
        // SAFETY: the request's id; private data of at most 196 bytes.
        unsafe {
            self.ch
                .libs
                .cm
                .rdma_reject(req.id, why.as_ptr().cast(), why.len() as u8);
            self.ch.libs.cm.rdma_destroy_id(req.id);
        }
        Ok(())
    }
}

fn conn_param(private_data: &[u8]) -> Result<ffi::rdma_conn_param> {
    if private_data.len() > MAX_PRIVATE_DATA {
        return Err(Error::Protocol {
            what: "rdma_cm private data".into(),
            detail: format!("{} bytes, at most {MAX_PRIVATE_DATA}", private_data.len()),
        });
    }
    Ok(ffi::rdma_conn_param {
        private_data: private_data.as_ptr().cast(),
        private_data_len: private_data.len() as u8,
        responder_resources: 1,
        initiator_depth: 1,
        retry_count: 7,
        rnr_retry_count: 7,
        ..Default::default()
    })
}

/// The peer's address of a connected (or connecting) id.
///
/// # Safety
///
/// `id` must point to a live `rdma_cm_id` (not destroyed) whose route librdmacm has filled
/// in (a connect request's id, or an id after address resolution).
unsafe fn peer_addr(id: *mut ffi::rdma_cm_id) -> Option<SocketAddr> {
    let sa = &(*id).route.addr.__bindgen_anon_2;
    let fam = sa.dst_addr.sa_family;
    if fam == rustix::net::AddressFamily::INET.as_raw() {
        let sin = sa.dst_sin;
        Some(SocketAddr::new(
            IpAddr::from(sin.sin_addr.s_addr.to_ne_bytes()),
            u16::from_be(sin.sin_port),
        ))
    } else if fam == rustix::net::AddressFamily::INET6.as_raw() {
        let s6 = sa.dst_sin6;
        Some(SocketAddr::new(
            IpAddr::from(s6.sin6_addr.__in6_u.__u6_addr8),
            u16::from_be(s6.sin6_port),
        ))
    } else {
        None
    }
}

/// Connect to a server, sending `private_data`; the server's private data is in
/// [`Connection::peer_data`].
pub fn connect(addr: SocketAddr, private_data: &[u8], timeout: Duration) -> Result<Connection> {
    let ch = Channel::new()?;
    let id = Id::new(&ch)?;
    let mut dst = SockAddr::new(addr);
    let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    // SAFETY: a live id and a sockaddr; the result comes as an event.
    if unsafe {
        ch.libs
            .cm
            .rdma_resolve_addr(id.ptr(), std::ptr::null_mut(), dst.as_ptr(), ms)
    } != 0
    {
        let e = errno();
        return Err(os_error(
            format!("rdma_resolve_addr({addr})"),
            e,
            Some(NO_DEVICE_CHECK.into()),
        ));
    }
    let idp = id.ptr();
    let e = ch.wait("resolving the address", Some(timeout), |e| e.id == idp)?;
    if e.kind != ev::RDMA_CM_EVENT_ADDR_RESOLVED {
        return Err(event_error(&format!("resolving {addr}"), &e));
    }
    // SAFETY: an id with a resolved address.
    if unsafe { ch.libs.cm.rdma_resolve_route(id.ptr(), ms) } != 0 {
        return Err(os_error(
            format!("rdma_resolve_route({addr})"),
            errno(),
            None,
        ));
    }
    let e = ch.wait("resolving the route", Some(timeout), |e| e.id == idp)?;
    if e.kind != ev::RDMA_CM_EVENT_ROUTE_RESOLVED {
        return Err(event_error(&format!("resolving a route to {addr}"), &e));
    }
    let ctx = Context::of_verbs(id.verbs())?;
    let pd = Pd::new(&ctx)?;
    let mut conn = Connection::setup(id, pd, vec![], Some(addr))?;
    let mut param = conn_param(private_data)?;
    // SAFETY: a routed id with a QP; `param` points into `private_data`.
    if unsafe { ch.libs.cm.rdma_connect(conn.id.ptr(), &mut param) } != 0 {
        return Err(os_error(format!("rdma_connect({addr})"), errno(), None));
    }
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
    fn sockaddr_v4_layout() {
        let mut s = SockAddr::new("10.0.2.15:18515".parse().unwrap());
        // SAFETY: reading back what `new` wrote.
        let sin = unsafe { *(s.as_ptr() as *const ffi::sockaddr_in) };
        assert_eq!(sin.sin_family, 2);
        assert_eq!(u16::from_be(sin.sin_port), 18515);
        assert_eq!(sin.sin_addr.s_addr.to_ne_bytes(), [10, 0, 2, 15]);
    }

    #[test]
    fn private_data_limit() {
        assert!(conn_param(&[0; MAX_PRIVATE_DATA]).is_ok());
        assert!(conn_param(&[0; MAX_PRIVATE_DATA + 1]).is_err());
    }
}
