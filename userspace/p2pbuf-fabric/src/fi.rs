//! libfabric objects for a connected (FI_EP_MSG) RMA transfer, each closed on drop; a child
//! borrows its parent, so the compiler keeps the close order libfabric wants.

use crate::ffi;
use crate::{Error, Result};
use std::ffi::{c_void, CStr, CString};
use std::marker::PhantomData;
use std::os::fd::RawFd;
use std::ptr::{null, null_mut};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The API version this program asks for (the headers': 2.1).
pub const API_VERSION: u32 = (ffi::FI_MAJOR_VERSION << 16) | ffi::FI_MINOR_VERSION;

// ABI-stable values that bindgen puts into anonymous-enum modules.
const FI_EAVAIL: i32 = 259;
/// `FI_CONNREQ`: a connection request on a passive endpoint.
pub const FI_CONNREQ: u32 = 1;
/// `FI_CONNECTED`.
pub const FI_CONNECTED: u32 = 2;
/// `FI_SHUTDOWN`.
pub const FI_SHUTDOWN: u32 = 3;

static LIB: OnceLock<std::result::Result<ffi::Fabric, String>> = OnceLock::new();

/// The exported functions of `libfabric.so.1`, loaded once.
pub fn lib() -> Result<&'static ffi::Fabric> {
    LIB.get_or_init(|| {
        // SAFETY: loading libfabric runs its constructors, which only set up its globals.
        unsafe { ffi::Fabric::new("libfabric.so.1") }.map_err(|e| {
            format!("{e} (install libfabric 2.x, or in the lab: `cargo xtask libfabric`)")
        })
    })
    .as_ref()
    .map_err(|e| Error::Unavailable(e.clone()))
}

/// `fi_strerror(errno)`.
pub fn strerror(errno: i32) -> String {
    match lib() {
        // SAFETY: fi_strerror returns a static string.
        Ok(l) => unsafe { CStr::from_ptr((l.fi_strerror)(errno)) }
            .to_string_lossy()
            .into_owned(),
        Err(_) => format!("error {errno}"),
    }
}

/// Turns a libfabric return value (negative: -errno) into a result.
pub fn check(call: impl FnOnce() -> String, ret: isize) -> Result<usize> {
    if ret >= 0 {
        return Ok(ret as usize);
    }
    let errno = (-ret) as i32;
    let call = call();
    let hint = match errno {
        e if e == ffi::FI_ENODATA as i32 && call.starts_with("fi_getinfo") => Some(
            "no provider matches: is there an RDMA device with an IPv4 address (`rdma link add rxe0 type rxe netdev eth0`, `fi_info -p verbs`)?".into(),
        ),
        e if e == ffi::FI_ENOSYS as i32 && call.contains("FI_MR_DMABUF") => Some(
            "the provider has no dma-buf MRs (verbs: libfabric built without ibv_reg_dmabuf_mr, or the kernel lacks ib_umem_dmabuf_get in /proc/kallsyms, or FI_VERBS_USE_DMABUF=0)".into(),
        ),
        e if e == ffi::FI_EBADF as i32 => Some("the fd is not open".into()),
        e if e == ffi::FI_ENODEV as i32 && call.contains("FI_MR_DMABUF") => Some(
            "the exporter refused the attachment: the buffer was revoked (or its device unbound)".into(),
        ),
        e if e == ffi::FI_EINVAL as i32 && call.contains("FI_MR_DMABUF") => Some(
            "not a dma-buf fd, or offset + length runs past the end of the dma-buf".into(),
        ),
        e if e == ffi::FI_ECONNREFUSED as i32 => {
            Some("nothing listens there: start `p2pbuf-fabric serve` first".into())
        }
        _ => None,
    };
    Err(Error::Fabric {
        call,
        errno,
        msg: strerror(errno),
        hint,
    })
}

/// An `fi_info` list from `fi_getinfo`, freed on drop. Only its first entry is used.
pub struct Info {
    p: *mut ffi::fi_info,
    owned: bool,
}

impl Info {
    /// `fi_getinfo` for a connected endpoint (FI_EP_MSG) with messages and RMA on
    /// `provider` (`verbs`), with the memory-registration modes of a verbs NIC. With
    /// `source`, `node`/`service` are the local address to listen on (`FI_SOURCE`).
    pub fn get(
        provider: &str,
        node: Option<&str>,
        service: Option<&str>,
        source: bool,
    ) -> Result<Info> {
        let l = lib()?;
        let prov = CString::new(provider).map_err(|_| Error::Protocol("NUL in provider".into()))?;
        let node_c = node
            .map(CString::new)
            .transpose()
            .map_err(|_| Error::Protocol("NUL in node".into()))?;
        let service_c = service
            .map(CString::new)
            .transpose()
            .map_err(|_| Error::Protocol("NUL in service".into()))?;
        // SAFETY: fi_dupinfo(NULL) allocates zeroed hints with their attribute structs.
        let hints = unsafe { (l.fi_dupinfo)(null()) };
        if hints.is_null() {
            return Err(Error::Protocol("fi_dupinfo(NULL): out of memory".into()));
        }
        let mut info: *mut ffi::fi_info = null_mut();
        // SAFETY: hints is a valid fi_info with non-NULL attribute pointers. prov_name points
        // at our CString only for the call and is reset before fi_freeinfo, which would free it.
        let ret = unsafe {
            let h = &mut *hints;
            h.caps = (ffi::FI_MSG | ffi::FI_RMA) as u64;
            (*h.ep_attr).type_ = ffi::fi_ep_type::FI_EP_MSG;
            (*h.domain_attr).mr_mode = (ffi::FI_MR_LOCAL
                | ffi::FI_MR_VIRT_ADDR
                | ffi::FI_MR_ALLOCATED
                | ffi::FI_MR_PROV_KEY) as i32;
            (*h.fabric_attr).prov_name = prov.as_ptr() as *mut _;
            let r = (l.fi_getinfo)(
                API_VERSION,
                node_c.as_ref().map_or(null(), |c| c.as_ptr()),
                service_c.as_ref().map_or(null(), |c| c.as_ptr()),
                if source { ffi::FI_SOURCE } else { 0 },
                hints,
                &mut info,
            );
            (*h.fabric_attr).prov_name = null_mut();
            (l.fi_freeinfo)(hints);
            r
        };
        check(
            || {
                format!(
                    "fi_getinfo(provider {provider}, FI_EP_MSG, FI_MSG|FI_RMA, node {}, service {}{})",
                    node.unwrap_or("-"),
                    service.unwrap_or("-"),
                    if source { ", FI_SOURCE" } else { "" }
                )
            },
            ret as isize,
        )?;
        Ok(Info {
            p: info,
            owned: true,
        })
    }

    /// Takes ownership of an `fi_info` that libfabric handed out (a connection request's).
    ///
    /// # Safety
    /// `p` must come from libfabric and be freed by nobody else.
    pub unsafe fn from_raw(p: *mut ffi::fi_info) -> Info {
        Info { p, owned: true }
    }

    /// The raw pointer.
    pub fn as_ptr(&self) -> *mut ffi::fi_info {
        self.p
    }

    /// "provider, fabric, domain" of the first entry.
    pub fn describe(&self) -> String {
        // SAFETY: an fi_info from fi_getinfo has fabric and domain attributes; names may be NULL.
        unsafe {
            let s = |p: *const std::os::raw::c_char| {
                if p.is_null() {
                    "?".to_string()
                } else {
                    CStr::from_ptr(p).to_string_lossy().into_owned()
                }
            };
            let i = &*self.p;
            format!(
                "provider {}, fabric {}, domain {}",
                s((*i.fabric_attr).prov_name),
                s((*i.fabric_attr).name),
                s((*i.domain_attr).name)
            )
        }
    }
}

impl Drop for Info {
    fn drop(&mut self) {
        if self.owned && !self.p.is_null() {
            if let Ok(l) = lib() {
                // SAFETY: ours, freed once.
                unsafe { (l.fi_freeinfo)(self.p) };
            }
        }
    }
}

/// Closes a fid (every libfabric object starts with one).
fn close(fid: *mut ffi::fid) {
    // SAFETY: called once, from the owner's drop, on a fid libfabric opened.
    unsafe { ffi::fi_close(fid) };
}

macro_rules! object {
    ($name:ident, $raw:ty, $parent:ident) => {
        #[doc = concat!("An open `", stringify!($raw), "`, closed on drop.")]
        pub struct $name<'a> {
            p: *mut $raw,
            _parent: PhantomData<&'a $parent<'a>>,
        }
        impl Drop for $name<'_> {
            fn drop(&mut self) {
                // SAFETY: p is a valid object whose first member is its fid.
                close(unsafe { &mut (*self.p).fid });
            }
        }
        impl $name<'_> {
            /// The raw pointer.
            pub fn as_ptr(&self) -> *mut $raw {
                self.p
            }
        }
    };
}

/// An open `fid_fabric`, closed on drop.
pub struct Fabric<'a> {
    p: *mut ffi::fid_fabric,
    _info: PhantomData<&'a Info>,
}

impl Drop for Fabric<'_> {
    fn drop(&mut self) {
        // SAFETY: as in the object macro.
        close(unsafe { &mut (*self.p).fid });
    }
}

impl<'a> Fabric<'a> {
    /// `fi_fabric` of the info's fabric.
    pub fn open(info: &'a Info) -> Result<Fabric<'a>> {
        let l = lib()?;
        let mut p = null_mut();
        // SAFETY: the info's fabric_attr is valid.
        let r = unsafe { (l.fi_fabric)((*info.p).fabric_attr, &mut p, null_mut()) };
        check(|| "fi_fabric".into(), r as isize)?;
        Ok(Fabric {
            p,
            _info: PhantomData,
        })
    }

    /// `fi_domain`.
    pub fn domain(&'a self, info: &Info) -> Result<Domain<'a>> {
        let mut p = null_mut();
        // SAFETY: valid fabric and info.
        let r = unsafe { ffi::fi_domain(self.p, info.p, &mut p, null_mut()) };
        check(|| format!("fi_domain({})", info.describe()), r as isize)?;
        Ok(Domain {
            p,
            _parent: PhantomData,
        })
    }

    /// `fi_eq_open` with a wait object (for `fi_eq_sread`).
    pub fn eq(&'a self) -> Result<Eq<'a>> {
        let mut attr = ffi::fi_eq_attr {
            size: 16,
            wait_obj: ffi::fi_wait_obj::FI_WAIT_UNSPEC,
            ..Default::default()
        };
        let mut p = null_mut();
        // SAFETY: valid fabric, attr on the stack.
        let r = unsafe { ffi::fi_eq_open(self.p, &mut attr, &mut p, null_mut()) };
        check(|| "fi_eq_open".into(), r as isize)?;
        Ok(Eq {
            p,
            _parent: PhantomData,
        })
    }

    /// `fi_passive_ep` on the info's source address, bound to `eq`, listening.
    pub fn listen(&'a self, info: &Info, eq: &Eq<'a>) -> Result<Pep<'a>> {
        let mut p = null_mut();
        // SAFETY: valid fabric and info.
        let r = unsafe { ffi::fi_passive_ep(self.p, info.p, &mut p, null_mut()) };
        check(|| "fi_passive_ep".into(), r as isize)?;
        let pep = Pep {
            p,
            _parent: PhantomData,
        };
        // SAFETY: valid objects.
        let r = unsafe { ffi::fi_pep_bind(pep.p, &mut (*eq.p).fid, 0) };
        check(|| "fi_pep_bind(eq)".into(), r as isize)?;
        // SAFETY: a bound passive endpoint.
        let r = unsafe { ffi::fi_listen(pep.p) };
        check(|| "fi_listen".into(), r as isize)?;
        Ok(pep)
    }
}

object!(Domain, ffi::fid_domain, Fabric);
object!(Eq, ffi::fid_eq, Fabric);
object!(Pep, ffi::fid_pep, Fabric);
object!(Mr, ffi::fid_mr, Domain);
object!(Ep, ffi::fid_ep, Domain);

/// Access flags of [`Domain::reg_host`] and [`Domain::reg_dmabuf`] (`FI_*`).
pub mod access {
    use crate::ffi;
    /// Source of local `fi_write` / `fi_send`.
    pub const LOCAL: u64 = (ffi::FI_WRITE | ffi::FI_READ | ffi::FI_SEND | ffi::FI_RECV) as u64;
    /// Target of remote writes and reads.
    pub const REMOTE: u64 = (ffi::FI_REMOTE_WRITE | ffi::FI_REMOTE_READ) as u64;
}

impl<'a> Domain<'a> {
    /// `fi_cq_open`: message-format completions, polled.
    pub fn cq(&'a self) -> Result<Cq<'a>> {
        let mut attr = ffi::fi_cq_attr {
            size: 64,
            format: ffi::fi_cq_format::FI_CQ_FORMAT_MSG,
            wait_obj: ffi::fi_wait_obj::FI_WAIT_NONE,
            ..Default::default()
        };
        let mut p = null_mut();
        // SAFETY: valid domain, attr on the stack.
        let r = unsafe { ffi::fi_cq_open(self.p, &mut attr, &mut p, null_mut()) };
        check(|| "fi_cq_open".into(), r as isize)?;
        Ok(Cq {
            p,
            _parent: PhantomData,
            seen: Default::default(),
        })
    }

    /// `fi_mr_reg` of host memory. The memory must outlive the MR (the caller keeps both).
    pub fn reg_host(&'a self, buf: &mut [u8], acs: u64) -> Result<Mr<'a>> {
        let mut p = null_mut();
        // SAFETY: buf is valid for its length; the caller keeps it while the MR lives.
        let r = unsafe {
            ffi::fi_mr_reg(
                self.p,
                buf.as_mut_ptr() as *const c_void,
                buf.len(),
                acs,
                0,
                0,
                0,
                &mut p,
                null_mut(),
            )
        };
        check(
            || format!("fi_mr_reg({} bytes of host memory)", buf.len()),
            r as isize,
        )?;
        Ok(Mr {
            p,
            _parent: PhantomData,
        })
    }

    /// `fi_mr_regattr(..., FI_MR_DMABUF)`: `len` bytes of the dma-buf `fd` from `offset`,
    /// addressed for RMA from `base_addr` (the iova of its first byte is `base_addr +
    /// offset`). The verbs provider calls `ibv_reg_dmabuf_mr(pd, offset, len, base_addr +
    /// offset, fd, access)`.
    pub fn reg_dmabuf(
        &'a self,
        fd: RawFd,
        offset: u64,
        len: u64,
        base_addr: u64,
        acs: u64,
    ) -> Result<Mr<'a>> {
        let dmabuf = ffi::fi_mr_dmabuf {
            fd,
            offset,
            len: len as usize,
            base_addr: base_addr as *mut c_void,
        };
        let mut attr = ffi::fi_mr_attr {
            iov_count: 1,
            access: acs,
            iface: ffi::fi_hmem_iface::FI_HMEM_SYSTEM,
            ..Default::default()
        };
        attr.__bindgen_anon_1.dmabuf = &dmabuf;
        let mut p = null_mut();
        // SAFETY: attr and dmabuf live across the call.
        let r = unsafe { ffi::fi_mr_regattr(self.p, &attr, ffi::FI_MR_DMABUF, &mut p) };
        check(
            || {
                format!(
                    "fi_mr_regattr(FI_MR_DMABUF, fd {fd}, offset {offset:#x}, length {len}, base {base_addr:#x})"
                )
            },
            r as isize,
        )?;
        Ok(Mr {
            p,
            _parent: PhantomData,
        })
    }

    /// `fi_endpoint` for `info` (a client's, or a connection request's), bound to `eq` and
    /// `cq` (transmit and receive), enabled.
    pub fn endpoint(&'a self, info: &Info, eq: &Eq<'_>, cq: &Cq<'a>) -> Result<Ep<'a>> {
        let mut p = null_mut();
        // SAFETY: valid domain and info.
        let r = unsafe { ffi::fi_endpoint(self.p, info.p, &mut p, null_mut()) };
        check(|| "fi_endpoint".into(), r as isize)?;
        let ep = Ep {
            p,
            _parent: PhantomData,
        };
        // SAFETY: valid objects.
        unsafe {
            let r = ffi::fi_ep_bind(ep.p, &mut (*eq.p).fid, 0);
            check(|| "fi_ep_bind(eq)".into(), r as isize)?;
            let r = ffi::fi_ep_bind(
                ep.p,
                &mut (*cq.p).fid,
                (ffi::FI_TRANSMIT | ffi::FI_RECV) as u64,
            );
            check(|| "fi_ep_bind(cq)".into(), r as isize)?;
            let r = ffi::fi_enable(ep.p);
            check(|| "fi_enable".into(), r as isize)?;
        }
        Ok(ep)
    }
}

impl Mr<'_> {
    /// `fi_mr_key`: what a peer names the region with.
    pub fn key(&self) -> u64 {
        // SAFETY: valid MR.
        unsafe { ffi::fi_mr_key(self.p) }
    }

    /// `fi_mr_desc`: the local descriptor for operations on it (FI_MR_LOCAL).
    pub fn desc(&self) -> *mut c_void {
        // SAFETY: valid MR.
        unsafe { ffi::fi_mr_desc(self.p) }
    }
}

/// A connection-management event.
pub struct CmEvent {
    /// `FI_CONNREQ`, `FI_CONNECTED`, `FI_SHUTDOWN`.
    pub event: u32,
    /// A connection request's info (for [`Domain::endpoint`]).
    pub info: Option<Info>,
    /// The peer's connection data.
    pub data: Vec<u8>,
}

impl Eq<'_> {
    /// `fi_eq_sread` for up to `timeout`; an error event becomes [`Error::Completion`].
    pub fn wait(&self, what: &str, timeout: Duration) -> Result<CmEvent> {
        const HDR: usize = std::mem::size_of::<ffi::fi_eq_cm_entry>();
        let mut buf = vec![0u64; (HDR + 256).div_ceil(8)];
        let mut event = 0u32;
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: buf is large enough for a CM entry and 256 bytes of data.
        let r = unsafe {
            ffi::fi_eq_sread(
                self.p,
                &mut event,
                buf.as_mut_ptr() as *mut c_void,
                buf.len() * 8,
                ms,
                0,
            )
        };
        if r == -(ffi::FI_EAGAIN as isize) || r == -(ffi::FI_ETIMEDOUT as isize) {
            return Err(Error::Timeout(format!("{what} ({} s)", timeout.as_secs())));
        }
        if r == -(FI_EAVAIL as isize) {
            let mut e = ffi::fi_eq_err_entry::default();
            // SAFETY: valid EQ and entry.
            unsafe { ffi::fi_eq_readerr(self.p, &mut e, 0) };
            return Err(error_entry(what, e.err, e.prov_errno, |buf, len| {
                // SAFETY: valid EQ; the provider writes at most len bytes and returns a C
                // string.
                unsafe { ffi::fi_eq_strerror(self.p, e.prov_errno, e.err_data, buf, len) }
            }));
        }
        let n = check(|| format!("fi_eq_sread ({what})"), r)?;
        // SAFETY: the provider wrote a CM entry followed by n - HDR bytes of data.
        let (info, data) = unsafe {
            let e = &*(buf.as_ptr() as *const ffi::fi_eq_cm_entry);
            let bytes = std::slice::from_raw_parts(buf.as_ptr() as *const u8, n.max(HDR));
            (
                (!e.info.is_null()).then(|| Info::from_raw(e.info)),
                bytes[HDR..].to_vec(),
            )
        };
        Ok(CmEvent { event, info, data })
    }

    /// Waits for `want` ([`FI_CONNECTED`], ...); any other event is an error.
    pub fn expect(&self, want: u32, what: &str, timeout: Duration) -> Result<CmEvent> {
        let e = self.wait(what, timeout)?;
        if e.event != want {
            return Err(Error::Protocol(format!(
                "{what}: event {} instead of {want} (1 CONNREQ, 2 CONNECTED, 3 SHUTDOWN)",
                e.event
            )));
        }
        Ok(e)
    }
}

/// The error of an event or completion of `what` read with `fi_eq_readerr`/`fi_cq_readerr`:
/// its errno and the provider's text (`fi_eq_strerror`/`fi_cq_strerror`, given a buffer).
fn error_entry(
    what: &str,
    err: i32,
    prov_errno: i32,
    provider_text: impl FnOnce(*mut std::os::raw::c_char, usize) -> *const std::os::raw::c_char,
) -> Error {
    let mut text = [0 as std::os::raw::c_char; 128];
    let s = provider_text(text.as_mut_ptr(), text.len());
    let msg = if s.is_null() {
        String::new()
    } else {
        // SAFETY: a NUL-terminated string, in `text` or the provider's own.
        unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
    };
    Error::Completion {
        what: what.into(),
        errno: err,
        prov_errno,
        msg: format!("{} ({msg})", strerror(err)),
    }
}

/// A completion queue (`fid_cq`), closed on drop; remembers completions read while waiting
/// for another kind.
pub struct Cq<'a> {
    p: *mut ffi::fid_cq,
    _parent: PhantomData<&'a Domain<'a>>,
    seen: std::cell::RefCell<Vec<u64>>,
}

impl Drop for Cq<'_> {
    fn drop(&mut self) {
        // SAFETY: as in the object macro.
        close(unsafe { &mut (*self.p).fid });
    }
}

impl Cq<'_> {
    /// Polls until a completion with flag `want` (`FI_SEND`, `FI_RECV`, `FI_WRITE`,
    /// `FI_READ`) comes, for up to `timeout`; an error completion is an
    /// [`Error::Completion`] of `what`.
    pub fn wait(&self, want: u64, what: &str, timeout: Duration) -> Result<()> {
        let start = Instant::now();
        let mut idle = 0u32;
        loop {
            {
                let mut seen = self.seen.borrow_mut();
                if let Some(i) = seen.iter().position(|f| f & want != 0) {
                    seen.remove(i);
                    return Ok(());
                }
            }
            let mut e = ffi::fi_cq_msg_entry::default();
            // SAFETY: valid CQ, one entry of the CQ's format.
            let r = unsafe { ffi::fi_cq_read(self.p, &mut e as *mut _ as *mut c_void, 1) };
            if r == 1 {
                self.seen.borrow_mut().push(e.flags);
                idle = 0;
                continue;
            }
            if r == -(FI_EAVAIL as isize) {
                let mut e = ffi::fi_cq_err_entry::default();
                // SAFETY: valid CQ and entry.
                unsafe { ffi::fi_cq_readerr(self.p, &mut e, 0) };
                return Err(error_entry(what, e.err, e.prov_errno, |buf, len| {
                    // SAFETY: valid CQ; as in Eq::wait.
                    unsafe { ffi::fi_cq_strerror(self.p, e.prov_errno, e.err_data, buf, len) }
                }));
            }
            if r != -(ffi::FI_EAGAIN as isize) {
                check(|| format!("fi_cq_read ({what})"), r)?;
            }
            if start.elapsed() > timeout {
                return Err(Error::Timeout(format!("{what} ({} s)", timeout.as_secs())));
            }
            // Spin a little, then sleep: under TCG the provider's progress needs the vCPU.
            idle += 1;
            if idle > 64 {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
    }
}

impl<'a> Ep<'a> {
    /// `fi_connect` to the info's destination with `data`.
    pub fn connect(&self, info: &Info, data: &[u8]) -> Result<()> {
        // SAFETY: the info's dest_addr is the server's address.
        let r = unsafe {
            ffi::fi_connect(
                self.p,
                (*info.p).dest_addr,
                data.as_ptr() as *const c_void,
                data.len(),
            )
        };
        check(|| "fi_connect".into(), r as isize).map(|_| ())
    }

    /// `fi_accept` with `data`.
    pub fn accept(&self, data: &[u8]) -> Result<()> {
        // SAFETY: valid endpoint.
        let r = unsafe { ffi::fi_accept(self.p, data.as_ptr() as *const c_void, data.len()) };
        check(|| "fi_accept".into(), r as isize).map(|_| ())
    }

    /// `fi_shutdown`.
    pub fn shutdown(&self) {
        // SAFETY: valid endpoint.
        unsafe { ffi::fi_shutdown(self.p, 0) };
    }

    /// `fi_recv` into `buf` (registered as `mr`).
    pub fn post_recv(&self, buf: &mut [u8], mr: &Mr<'_>) -> Result<()> {
        // SAFETY: buf is registered and outlives the completion (the caller waits for it).
        let r = unsafe {
            ffi::fi_recv(
                self.p,
                buf.as_mut_ptr() as *mut c_void,
                buf.len(),
                mr.desc(),
                0,
                null_mut(),
            )
        };
        check(|| "fi_recv".into(), r).map(|_| ())
    }

    /// `fi_send` of `buf` (registered as `mr`).
    pub fn post_send(&self, buf: &[u8], mr: &Mr<'_>) -> Result<()> {
        // SAFETY: as post_recv.
        let r = unsafe {
            ffi::fi_send(
                self.p,
                buf.as_ptr() as *const c_void,
                buf.len(),
                mr.desc(),
                0,
                null_mut(),
            )
        };
        check(|| "fi_send".into(), r).map(|_| ())
    }

    /// `fi_write` (or `fi_read` with `read`) of `buf` (registered as `mr`) to the peer's
    /// `addr` with `key`.
    pub fn post_rma(
        &self,
        read: bool,
        buf: &mut [u8],
        mr: &Mr<'_>,
        addr: u64,
        key: u64,
    ) -> Result<()> {
        // SAFETY: as post_recv.
        let r = unsafe {
            if read {
                ffi::fi_read(
                    self.p,
                    buf.as_mut_ptr() as *mut c_void,
                    buf.len(),
                    mr.desc(),
                    0,
                    addr,
                    key,
                    null_mut(),
                )
            } else {
                ffi::fi_write(
                    self.p,
                    buf.as_ptr() as *const c_void,
                    buf.len(),
                    mr.desc(),
                    0,
                    addr,
                    key,
                    null_mut(),
                )
            }
        };
        check(
            || {
                format!(
                    "{}({} bytes, remote address {addr:#x}, key {key:#x})",
                    if read { "fi_read" } else { "fi_write" },
                    buf.len()
                )
            },
            r,
        )
        .map(|_| ())
    }
}
