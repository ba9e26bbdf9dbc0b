//! Owned rdma_cm handles: an event channel ([`EventChannel`], its events copied out and
//! acknowledged as [`CmEvent`]s) and an id with its QP ([`CmId`]). Errors are the errno; the
//! caller says what it means.

use std::net::{IpAddr, SocketAddr};
use std::os::fd::BorrowedFd;
use std::ptr::NonNull;
use std::rc::Rc;

use super::ffi::{self, errno, rdma_cm_event_type as ev, Libs};
use super::verbs::{CqHandle, CtxId, PdHandle};

/// Name of an event type (`rdma_event_str`).
pub fn event_str(libs: &Libs, kind: u32) -> Option<String> {
    // SAFETY: returns a static string (or NULL) for any value.
    unsafe { super::static_str(libs.cm.rdma_event_str(kind)) }
}

/// The identity of an rdma_cm id, to match events with ids; never dereferenced outside this
/// module.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IdRef(*mut ffi::rdma_cm_id);

/// A CM event, copied out of librdmacm and acknowledged.
///
/// Not `Clone`: a CONNECT_REQUEST carries a new id, which [`CmId::from_request`] takes over
/// once.
#[derive(Debug)]
pub struct CmEvent {
    /// `RDMA_CM_EVENT_*`.
    pub kind: u32,
    /// Its status (a negative errno for errors).
    pub status: i32,
    /// The id it is about (for a CONNECT_REQUEST: the new id).
    pub id: IdRef,
    /// The peer's private data (connection events).
    pub private_data: Vec<u8>,
}

/// An rdma_cm event channel (`rdma_create_event_channel`), destroyed on drop.
///
/// # Invariants
///
/// `ch` was created and not yet destroyed; every id on it holds an `Rc` of it.
pub struct EventChannel {
    libs: &'static Libs,
    ch: NonNull<ffi::rdma_event_channel>,
}

impl EventChannel {
    /// `rdma_create_event_channel`; `Err(errno)`.
    pub fn new(libs: &'static Libs) -> Result<EventChannel, i32> {
        // SAFETY: no arguments; a new channel or NULL.
        let ch = unsafe { libs.cm.rdma_create_event_channel() };
        let ch = NonNull::new(ch).ok_or_else(errno)?;
        // INVARIANT: just created.
        Ok(EventChannel { libs, ch })
    }

    /// The channel's fd, to poll.
    pub fn fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the channel's fd is open as long as the channel (type invariant).
        unsafe { BorrowedFd::borrow_raw((*self.ch.as_ptr()).fd) }
    }

    /// `rdma_get_cm_event` (blocks unless the fd is readable), copied out and acknowledged;
    /// `Err(errno)`.
    pub fn next_event(&self) -> Result<CmEvent, i32> {
        let mut e: *mut ffi::rdma_cm_event = std::ptr::null_mut();
        // SAFETY: a live channel; it stores an event that must be acknowledged.
        let r = unsafe { self.libs.cm.rdma_get_cm_event(self.ch.as_ptr(), &mut e) };
        if r != 0 || e.is_null() {
            return Err(errno());
        }
        // SAFETY: `e` is a valid event until acknowledged; the private data (for connection
        // events) is valid for `private_data_len` bytes until then; it is acknowledged once,
        // after everything was copied out.
        let out = unsafe {
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
            let out = CmEvent {
                kind: r.event,
                status: r.status,
                id: IdRef(r.id),
                private_data: pd,
            };
            self.libs.cm.rdma_ack_cm_event(e);
            out
        };
        Ok(out)
    }
}

impl Drop for EventChannel {
    fn drop(&mut self) {
        // SAFETY: created once (type invariant); every id on the channel holds an `Rc` of it,
        // so none is left.
        unsafe { self.libs.cm.rdma_destroy_event_channel(self.ch.as_ptr()) }
    }
}

/// A socket address in the storage rdma_cm takes (`struct sockaddr *` of the family's size).
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

/// The most private data an RC connect or accept carries (`private_data_len` is a `u8`).
const MAX_PRIVATE_DATA: usize = u8::MAX as usize;

/// Connection parameters (one outstanding RDMA READ each way, 7 retries) with
/// `private_data`; the result points into it. `Err(EINVAL)` when it is longer than a `u8`
/// can say.
fn conn_param(private_data: &[u8]) -> Result<ffi::rdma_conn_param, i32> {
    if private_data.len() > MAX_PRIVATE_DATA {
        return Err(22);
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

/// An rdma_cm id (`RDMA_PS_TCP`), with its QP once [`CmId::create_qp`] made one; both
/// destroyed on drop.
///
/// # Invariants
///
/// `id` was created on `ch` (or came with a CONNECT_REQUEST on it) and not yet destroyed;
/// it has a QP made with `rdma_create_qp` when `has_qp`.
pub struct CmId {
    ch: Rc<EventChannel>,
    id: NonNull<ffi::rdma_cm_id>,
    has_qp: bool,
}

impl CmId {
    /// `rdma_create_id` on `ch`; `Err(errno)`.
    pub fn create(ch: &Rc<EventChannel>) -> Result<CmId, i32> {
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
            // INVARIANT: just created on `ch`.
            Some(id) if r == 0 => Ok(CmId {
                ch: ch.clone(),
                id,
                has_qp: false,
            }),
            _ => Err(errno()),
        }
    }

    /// The new id a CONNECT_REQUEST event of `ch` carries, now ours to destroy, and the
    /// client's private data; `None` for any other event.
    pub fn from_request(ch: &Rc<EventChannel>, e: CmEvent) -> Option<(CmId, Vec<u8>)> {
        if e.kind != ev::RDMA_CM_EVENT_CONNECT_REQUEST {
            return None;
        }
        // INVARIANT: a CONNECT_REQUEST carries a new id, live until destroyed; `e` is
        // consumed and events are not `Clone`, so it is taken over once.
        let id = NonNull::new(e.id.0)?;
        Some((
            CmId {
                ch: ch.clone(),
                id,
                has_qp: false,
            },
            e.private_data,
        ))
    }

    /// Its identity, as events name it.
    pub fn id_ref(&self) -> IdRef {
        IdRef(self.id.as_ptr())
    }

    /// The verbs context librdmacm bound it to (after binding to an address, resolving one,
    /// or for a connect request); `None` before.
    pub fn verbs(&self) -> Option<CtxId> {
        // SAFETY: a live id (type invariant); `verbs` is a plain field librdmacm fills in.
        let v = unsafe { (*self.id.as_ptr()).verbs };
        (!v.is_null()).then_some(CtxId(v))
    }

    fn result(r: i32) -> Result<(), i32> {
        if r != 0 {
            return Err(errno());
        }
        Ok(())
    }

    /// `rdma_bind_addr`; `Err(errno)`.
    pub fn bind_addr(&self, addr: SocketAddr) -> Result<(), i32> {
        let mut sa = SockAddr::new(addr);
        // SAFETY: a live id and a sockaddr of the family's size, read during the call.
        Self::result(unsafe {
            self.ch
                .libs
                .cm
                .rdma_bind_addr(self.id.as_ptr(), sa.as_ptr())
        })
    }

    /// `rdma_listen` with a backlog of `backlog`; `Err(errno)`.
    pub fn listen(&self, backlog: i32) -> Result<(), i32> {
        // SAFETY: a live id.
        Self::result(unsafe { self.ch.libs.cm.rdma_listen(self.id.as_ptr(), backlog) })
    }

    /// `rdma_resolve_addr` of `dst` within `ms` milliseconds (the result comes as an event);
    /// `Err(errno)`.
    pub fn resolve_addr(&self, dst: SocketAddr, ms: i32) -> Result<(), i32> {
        let mut sa = SockAddr::new(dst);
        // SAFETY: a live id, no source address, and a sockaddr read during the call.
        Self::result(unsafe {
            self.ch.libs.cm.rdma_resolve_addr(
                self.id.as_ptr(),
                std::ptr::null_mut(),
                sa.as_ptr(),
                ms,
            )
        })
    }

    /// `rdma_resolve_route` within `ms` milliseconds (the result comes as an event);
    /// `Err(errno)`.
    pub fn resolve_route(&self, ms: i32) -> Result<(), i32> {
        // SAFETY: a live id (librdmacm refuses one without a resolved address).
        Self::result(unsafe { self.ch.libs.cm.rdma_resolve_route(self.id.as_ptr(), ms) })
    }

    /// `rdma_connect` with `private_data`; `Err(errno)`.
    pub fn connect(&self, private_data: &[u8]) -> Result<(), i32> {
        let mut param = conn_param(private_data)?;
        // SAFETY: a live id; `param` points into `private_data`, which lives across the call.
        Self::result(unsafe { self.ch.libs.cm.rdma_connect(self.id.as_ptr(), &mut param) })
    }

    /// `rdma_accept` with `private_data`; `Err(errno)`.
    pub fn accept(&self, private_data: &[u8]) -> Result<(), i32> {
        let mut param = conn_param(private_data)?;
        // SAFETY: a live id; `param` points into `private_data`, which lives across the call.
        Self::result(unsafe { self.ch.libs.cm.rdma_accept(self.id.as_ptr(), &mut param) })
    }

    /// `rdma_reject` with `why` (at most 255 bytes are sent), then the id is destroyed.
    pub fn reject(self, why: &[u8]) {
        let why = &why[..why.len().min(MAX_PRIVATE_DATA)];
        // SAFETY: a live id of a connect request; private data of at most 255 bytes, read
        // during the call. Drop destroys the id after.
        unsafe {
            self.ch
                .libs
                .cm
                .rdma_reject(self.id.as_ptr(), why.as_ptr().cast(), why.len() as u8)
        };
    }

    /// `rdma_disconnect`; `Err(errno)`.
    pub fn disconnect(&self) -> Result<(), i32> {
        // SAFETY: a live id.
        Self::result(unsafe { self.ch.libs.cm.rdma_disconnect(self.id.as_ptr()) })
    }

    /// The peer's address (of a connect request's id, or after address resolution).
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        // SAFETY: a live id; its route is plain data librdmacm fills in (zeroes before, whose
        // family is neither of these).
        let sa = unsafe { &(*self.id.as_ptr()).route.addr.__bindgen_anon_2 };
        // SAFETY: reading the family of the union, then the member it names.
        unsafe {
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
    }

    /// `rdma_create_qp`: an RC QP on `pd` whose sends and receives complete on `cq`, with
    /// room for `send_wr` and `recv_wr` work requests of one SGE each; `Err(errno)`. The
    /// caller drops this id before `cq` (the QP goes with the id); the PD and the CQ are
    /// also referenced by the kernel, which refuses to free them while the QP lives.
    pub fn create_qp(
        &mut self,
        pd: &PdHandle,
        cq: &CqHandle,
        send_wr: u32,
        recv_wr: u32,
    ) -> Result<(), i32> {
        if self.has_qp {
            return Err(17);
        }
        let mut attr = ffi::ibv_qp_init_attr {
            send_cq: cq.ptr(),
            recv_cq: cq.ptr(),
            qp_type: ffi::ibv_qp_type::IBV_QPT_RC,
            sq_sig_all: 1,
            ..Default::default()
        };
        attr.cap.max_send_wr = send_wr;
        attr.cap.max_recv_wr = recv_wr;
        attr.cap.max_send_sge = 1;
        attr.cap.max_recv_sge = 1;
        // SAFETY: a live id, a live PD, an attr naming a live CQ, read during the call.
        Self::result(unsafe {
            self.ch
                .libs
                .cm
                .rdma_create_qp(self.id.as_ptr(), pd.ptr(), &mut attr)
        })?;
        // INVARIANT: it has a QP now.
        self.has_qp = true;
        Ok(())
    }

    /// The QP, when there is one.
    fn qp(&self) -> Result<*mut ffi::ibv_qp, i32> {
        if !self.has_qp {
            return Err(22);
        }
        // SAFETY: a live id with a QP (type invariant).
        Ok(unsafe { (*self.id.as_ptr()).qp })
    }

    /// Calls the provider's post op that `pick` names (`ibv_post_send` and `ibv_post_recv`
    /// are static inlines that do this) with the one work request `wr`; `Err(errno)`.
    fn post<W>(
        &self,
        wr: &mut W,
        pick: impl FnOnce(&ffi::ibv_context_ops) -> Option<PostOp<W>>,
    ) -> Result<(), i32> {
        let qp = self.qp()?;
        let mut bad = std::ptr::null_mut();
        // SAFETY: a live QP (`qp` checked it has one) and its context's op table; `wr` and
        // the SGE it points to are valid during the call (the provider copies them).
        let r = unsafe {
            let f = pick(&(*(*qp).context).ops).expect("provider without the post op");
            f(qp, wr, &mut bad)
        };
        if r != 0 {
            return Err(r);
        }
        Ok(())
    }

    /// `ibv_post_recv` of one receive (`wr_id`) into `sge`; `Err(errno)`. The HCA checks
    /// `sge` against the local key's region.
    pub fn post_recv(&self, wr_id: u64, mut sge: ffi::ibv_sge) -> Result<(), i32> {
        let mut wr = ffi::ibv_recv_wr {
            wr_id,
            next: std::ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
        };
        self.post(&mut wr, |ops| ops.post_recv)
    }

    /// `ibv_post_send` of one signaled work request (`wr_id`, `opcode`) from or into `sge`,
    /// against the peer's `remote` (address, rkey) for RDMA operations; `Err(errno)`. The
    /// HCA checks `sge` against the local key's region and the remote side against its own.
    pub fn post_send(
        &self,
        wr_id: u64,
        opcode: u32,
        mut sge: ffi::ibv_sge,
        remote: Option<(u64, u32)>,
    ) -> Result<(), i32> {
        let mut wr = ffi::ibv_send_wr {
            wr_id,
            sg_list: &mut sge,
            num_sge: 1,
            opcode,
            send_flags: ffi::ibv_send_flags::IBV_SEND_SIGNALED,
            ..Default::default()
        };
        if let Some((remote_addr, rkey)) = remote {
            wr.wr.rdma = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 { remote_addr, rkey };
        }
        self.post(&mut wr, |ops| ops.post_send)
    }
}

/// A provider's `post_send` or `post_recv` op, for work requests `W`.
type PostOp<W> = unsafe extern "C" fn(*mut ffi::ibv_qp, *mut W, *mut *mut W) -> std::ffi::c_int;

impl Drop for CmId {
    fn drop(&mut self) {
        // SAFETY: a live id (type invariant), destroyed once; its QP (if any) was made with
        // rdma_create_qp; all its events were acknowledged when read.
        unsafe {
            if self.has_qp {
                self.ch.libs.cm.rdma_destroy_qp(self.id.as_ptr());
            }
            self.ch.libs.cm.rdma_destroy_id(self.id.as_ptr());
        }
    }
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
    fn private_data_fits_its_length_field() {
        assert!(conn_param(&[0; 255]).is_ok());
        assert_eq!(conn_param(&[0; 256]).unwrap_err(), 22);
    }
}
