//! Verbs objects with owners: [`Context`], [`Pd`], [`Mr`] (host memory or a dma-buf),
//! [`Cq`]. Each frees what it holds on drop, after everything that depends on it (they hold
//! a reference to their parent).

use std::fmt;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::rc::Rc;

use p2pbuf::{Error, Result};
use serde::Serialize;

use crate::ffi::{self, ibv_access_flags as acc, libs};
use crate::sys::verbs::{CqHandle, CtxId, Device, DeviceList, MrHandle, PdHandle};
use crate::wc::WcStatus;

pub use p2pbuf::memory::HostBuf;

/// `ENODEV`, `EOPNOTSUPP`, ... as plain numbers (the values of x86-64 Linux).
pub mod errnos {
    /// Bad file descriptor.
    pub const EBADF: i32 = 9;
    /// Out of memory (or the pin limit).
    pub const ENOMEM: i32 = 12;
    /// Bad address.
    pub const EFAULT: i32 = 14;
    /// No such device.
    pub const ENODEV: i32 = 19;
    /// Invalid argument.
    pub const EINVAL: i32 = 22;
    /// Operation not supported.
    pub const EOPNOTSUPP: i32 = 95;
    /// I/O error (used for a failed work completion).
    pub const EIO: i32 = 5;
    /// Timed out.
    pub const ETIMEDOUT: i32 = 110;
    /// Connection refused.
    pub const ECONNREFUSED: i32 = 111;
}
use errnos::*;

/// What an RDMA device's users should check first when it is missing.
pub const NO_DEVICE_CHECK: &str =
    "no RDMA device: run `rdma link add rxe0 type rxe netdev eth0` (soft-RoCE), or load the NIC's RDMA driver";

bitflags::bitflags! {
    /// Memory region access flags (`IBV_ACCESS_*`); not [`p2pbuf::Access`], which says how the
    /// CPU maps a dma-buf. Bits without a name here (e.g.
    /// `IBV_ACCESS_ON_DEMAND`, 0x40) are kept as they are, to pass through to the provider.
    #[derive(Clone, Copy, PartialEq, Eq, Default)]
    pub struct MrAccess: u32 {
        /// `IBV_ACCESS_LOCAL_WRITE`: the HCA may write it (receive, RDMA READ target).
        const LOCAL_WRITE = acc::IBV_ACCESS_LOCAL_WRITE;
        /// `IBV_ACCESS_REMOTE_WRITE`: peers may RDMA WRITE into it (needs LOCAL_WRITE).
        const REMOTE_WRITE = acc::IBV_ACCESS_REMOTE_WRITE;
        /// `IBV_ACCESS_REMOTE_READ`: peers may RDMA READ from it.
        const REMOTE_READ = acc::IBV_ACCESS_REMOTE_READ;
        /// `IBV_ACCESS_REMOTE_ATOMIC` (needs LOCAL_WRITE).
        const REMOTE_ATOMIC = acc::IBV_ACCESS_REMOTE_ATOMIC;
        /// What a buffer that peers write and read needs.
        const REMOTE_RW = Self::LOCAL_WRITE.bits() | Self::REMOTE_WRITE.bits() | Self::REMOTE_READ.bits();
        // Any other bit is the provider's to judge.
        const _ = !0;
    }
}

impl MrAccess {
    const NAMES: [(&'static str, &'static str, MrAccess); 4] = [
        ("lw", "LOCAL_WRITE", MrAccess::LOCAL_WRITE),
        ("rw", "REMOTE_WRITE", MrAccess::REMOTE_WRITE),
        ("rr", "REMOTE_READ", MrAccess::REMOTE_READ),
        ("ra", "REMOTE_ATOMIC", MrAccess::REMOTE_ATOMIC),
    ];
}

impl fmt::Debug for MrAccess {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for MrAccess {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts: Vec<String> = MrAccess::NAMES
            .iter()
            .filter(|(_, _, a)| self.contains(*a))
            .map(|(_, n, _)| n.to_string())
            .collect();
        let known = MrAccess::NAMES.iter().fold(0, |m, (_, _, a)| m | a.bits());
        if self.bits() & !known != 0 {
            parts.push(format!("{:#x}", self.bits() & !known));
        }
        if parts.is_empty() {
            parts.push("none".into());
        }
        write!(f, "{}", parts.join("|"))
    }
}

impl Serialize for MrAccess {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl std::str::FromStr for MrAccess {
    type Err = String;
    /// `lw,rw,rr` (or the long names, or `none`, or a number).
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let mut a = MrAccess::empty();
        for w in s.split([',', '|']).map(str::trim).filter(|w| !w.is_empty()) {
            if w.eq_ignore_ascii_case("none") {
                continue;
            }
            if let Some((_, _, x)) = MrAccess::NAMES.iter().find(|(short, long, _)| {
                w.eq_ignore_ascii_case(short)
                    || w.eq_ignore_ascii_case(long)
                    || w.eq_ignore_ascii_case(&format!("IBV_ACCESS_{long}"))
            }) {
                a |= *x;
            } else if let Some(n) = w
                .strip_prefix("0x")
                .and_then(|h| u32::from_str_radix(h, 16).ok())
                .or_else(|| w.parse().ok())
            {
                a |= MrAccess::from_bits_retain(n);
            } else {
                return Err(format!(
                    "unknown access flag {w:?} (lw, rw, rr, ra, none, or a number)"
                ));
            }
        }
        Ok(a)
    }
}

pub(crate) fn os_error(what: impl Into<String>, errno: i32, check: Option<String>) -> Error {
    Error::Os {
        what: what.into(),
        errno,
        check,
    }
}

/// librdmacm's device list, or the error that says there is no RDMA device.
fn device_list() -> Result<DeviceList> {
    DeviceList::get(libs()?).map_err(|(n, e)| {
        let sysfs = p2pbuf::rdma::status()
            .map(|s| s.summary())
            .unwrap_or_default();
        Error::Unavailable {
            what: "listing RDMA devices (rdma_get_devices)".into(),
            detail: format!(
                "{} (errno {}; {sysfs})",
                if n == 0 && e == 0 {
                    "none found".to_string()
                } else {
                    p2pbuf::error::errno_text(if e == 0 { ENODEV } else { e })
                },
                if e == 0 { ENODEV } else { e }
            ),
            check: Some(NO_DEVICE_CHECK.into()),
        }
    })
}

/// What `ibv_query_device` says, the parts a user looks at.
#[derive(Debug, Clone, Serialize)]
pub struct DeviceAttr {
    /// Firmware version string.
    pub fw_ver: String,
    /// Node GUID (big-endian, as printed by ibv_devinfo).
    pub node_guid: String,
    /// IEEE vendor id.
    pub vendor_id: u32,
    /// Largest MR.
    pub max_mr_size: u64,
    /// Page sizes the device supports (bit mask).
    pub page_size_cap: u64,
    /// Physical ports.
    pub phys_port_cnt: u8,
    /// Max QPs.
    pub max_qp: i32,
    /// Max outstanding work requests per QP.
    pub max_qp_wr: i32,
    /// Max MRs.
    pub max_mr: i32,
}

/// An RDMA device's verbs context (one of librdmacm's, so it serves rdma_cm ids too).
#[derive(Clone)]
pub struct Context(Rc<Device>);

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Context({})", self.0.name())
    }
}

/// Names of the RDMA devices that librdmacm sees.
pub fn device_names() -> Result<Vec<String>> {
    let l = device_list()?;
    Ok(l.contexts().filter_map(|c| l.name(c)).collect())
}

impl Context {
    /// Open device `name`, or the first one.
    pub fn open(name: Option<&str>) -> Result<Context> {
        let list = device_list()?;
        let found = list
            .contexts()
            .find(|c| name.is_none_or(|n| list.name(*c).as_deref() == Some(n)));
        let Some(ctx) = found else {
            let names: Vec<String> = list.contexts().filter_map(|c| list.name(c)).collect();
            return Err(Error::Unavailable {
                what: format!("opening RDMA device {:?}", name.unwrap_or("(first)")),
                detail: format!("no such device; there are: {}", names.join(", ")),
                check: Some("rdma link show; ibv_devices".into()),
            });
        };
        Context::of(list, ctx)
    }

    fn of(list: DeviceList, ctx: CtxId) -> Result<Context> {
        let dev = Device::new(list, ctx).ok_or_else(|| Error::Protocol {
            what: "finding the RDMA device of a connection".into(),
            detail: "librdmacm bound it to a context that rdma_get_devices does not list".into(),
        })?;
        Ok(Context(Rc::new(dev)))
    }

    /// The context librdmacm bound `verbs` (an id's `verbs`) to.
    pub(crate) fn of_verbs(verbs: CtxId) -> Result<Context> {
        Context::of(device_list()?, verbs)
    }

    /// Device name, e.g. `rxe0`.
    pub fn name(&self) -> &str {
        self.0.name()
    }

    /// Its identity (to compare with an id's `verbs`).
    pub(crate) fn id(&self) -> CtxId {
        self.0.id()
    }

    /// `ibv_query_device`.
    pub fn query(&self) -> Result<DeviceAttr> {
        let a = self
            .0
            .query()
            .map_err(|r| os_error(format!("ibv_query_device({})", self.name()), r, None))?;
        let g = u64::from_be(a.node_guid).to_be_bytes();
        Ok(DeviceAttr {
            fw_ver: p2pbuf::c_chars_lossy(&a.fw_ver),
            node_guid: format!(
                "{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}",
                g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7]
            ),
            vendor_id: a.vendor_id,
            max_mr_size: a.max_mr_size,
            page_size_cap: a.page_size_cap,
            phys_port_cnt: a.phys_port_cnt,
            max_qp: a.max_qp,
            max_qp_wr: a.max_qp_wr,
            max_mr: a.max_mr,
        })
    }
}

struct PdInner {
    ctx: Context,
    pd: Rc<PdHandle>,
}

/// A protection domain.
#[derive(Clone)]
pub struct Pd(Rc<PdInner>);

impl fmt::Debug for Pd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Pd({})", self.0.ctx.name())
    }
}

/// What an `ibv_reg_dmabuf_mr` failure means, by errno.
pub fn dmabuf_mr_check(errno: i32) -> Option<String> {
    Some(
        match errno {
            EOPNOTSUPP => "the rxe provider/kernel lacks dma-buf MR support: libibverbs' rxe provider needs linux/rdma-core's patch (the lab's rdma-core has it) and the kernel's rxe needs reg_user_mr_dmabuf (the linux/ series); on hardware, a NIC driver with dma-buf support (mlx5, efa, irdma, bnxt_re, mana, ionic)",
            EINVAL => "offset + length within the dma-buf, offset and iova at the same offset in a page, REMOTE_WRITE/REMOTE_ATOMIC need LOCAL_WRITE, and the fd must be a dma-buf",
            EBADF => "the fd is not open",
            ENODEV => "the exporter revoked the buffer, or its device is gone",
            ENOMEM => "out of memory, or the exporter cannot map the buffer for this device",
            EFAULT => "the exporter could not map the buffer for the device (p2pdma path refused?): dmesg",
            _ => return None,
        }
        .to_string(),
    )
}

fn reg_mr_check(errno: i32) -> Option<String> {
    Some(
        match errno {
            EINVAL => {
                "REMOTE_WRITE/REMOTE_ATOMIC need LOCAL_WRITE; unknown access bits are refused"
            }
            ENOMEM => "RLIMIT_MEMLOCK (ulimit -l) too small to pin the buffer",
            EFAULT => "the address range is not mapped in this process",
            _ => return None,
        }
        .to_string(),
    )
}

impl Pd {
    /// `ibv_alloc_pd`.
    pub fn new(ctx: &Context) -> Result<Pd> {
        let pd = PdHandle::alloc(&ctx.0)
            .map_err(|e| os_error(format!("ibv_alloc_pd({})", ctx.name()), e, None))?;
        Ok(Pd(Rc::new(PdInner {
            ctx: ctx.clone(),
            pd: Rc::new(pd),
        })))
    }

    /// Its device.
    pub fn context(&self) -> &Context {
        &self.0.ctx
    }

    pub(crate) fn handle(&self) -> &PdHandle {
        &self.0.pd
    }

    /// Register host memory (`ibv_reg_mr`); the region owns `buf`.
    pub fn reg_mr(&self, buf: HostBuf, access: MrAccess) -> Result<HostMr> {
        let mr = MrHandle::reg_host(&self.0.pd, &buf, access.bits()).map_err(|e| {
            os_error(
                format!(
                    "ibv_reg_mr({} bytes of host memory, access {access}) on {}",
                    buf.len(),
                    self.context().name()
                ),
                e,
                reg_mr_check(e),
            )
        })?;
        Ok(HostMr {
            mr: Mr {
                pd: self.clone(),
                mr,
                access,
                kind: MrKind::Host,
            },
            buf,
        })
    }

    /// Register `len` bytes of a dma-buf, starting `offset` bytes into it, as seen by peers
    /// at `iova` (`ibv_reg_dmabuf_mr`). The fd may be closed afterwards: the kernel keeps
    /// its own reference to the dma-buf. Nothing is checked here: the provider and the
    /// kernel answer (and their errno is what this returns).
    pub fn reg_dmabuf_mr(
        &self,
        offset: u64,
        len: usize,
        iova: u64,
        fd: BorrowedFd<'_>,
        access: MrAccess,
    ) -> Result<Mr> {
        let raw = fd.as_raw_fd();
        let mr = MrHandle::reg_dmabuf(&self.0.pd, offset, len, iova, fd, access.bits())
            .map_err(|e| {
                let what = match p2pbuf::DmaBufInfo::read(format!("/proc/self/fdinfo/{raw}")) {
                    Ok(i) => format!("{} dma-buf of {} bytes", i.exporter, i.size),
                    Err(_) => "not a dma-buf".into(),
                };
                os_error(
                    format!(
                        "ibv_reg_dmabuf_mr(offset {offset}, length {len}, iova {iova:#x}, fd {raw} ({what}), access {access}) on {}",
                        self.context().name()
                    ),
                    e,
                    dmabuf_mr_check(e),
                )
            })?;
        Ok(Mr {
            pd: self.clone(),
            mr,
            access,
            kind: MrKind::DmaBuf { offset, iova },
        })
    }
}

/// What a region's memory is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum MrKind {
    /// Host memory (`ibv_reg_mr`).
    Host,
    /// A dma-buf (`ibv_reg_dmabuf_mr`).
    DmaBuf {
        /// Offset into the dma-buf.
        offset: u64,
        /// Address peers use for its first byte.
        iova: u64,
    },
}

/// A registered memory region; deregistered on drop (or by [`Mr::dereg`], which reports).
pub struct Mr {
    pd: Pd,
    mr: MrHandle,
    access: MrAccess,
    kind: MrKind,
}

/// The parts of an MR that a peer needs, and some for reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct MrInfo {
    /// Address peers use for the first byte (virtual address, or the iova).
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// Key peers use.
    pub rkey: u32,
    /// Key for local work requests.
    pub lkey: u32,
    /// Access flags.
    pub access: MrAccess,
    /// Host memory or dma-buf.
    #[serde(flatten)]
    pub kind: MrKind,
}

impl Mr {
    /// Keys, address, length.
    pub fn info(&self) -> MrInfo {
        let m = self.mr.fields();
        MrInfo {
            addr: match self.kind {
                MrKind::Host => m.addr,
                MrKind::DmaBuf { iova, .. } => iova,
            },
            len: m.length,
            rkey: m.rkey,
            lkey: m.lkey,
            access: self.access,
            kind: self.kind,
        }
    }

    /// The protection domain.
    pub fn pd(&self) -> &Pd {
        &self.pd
    }

    /// `ibv_dereg_mr` now, with its errno (dropping the region does the same silently).
    /// For a dma-buf MR this detaches from the dma-buf, also after the exporter revoked it.
    pub fn dereg(self) -> Result<()> {
        let Mr { pd, mr, .. } = self;
        mr.dereg().map_err(|r| {
            os_error(
                format!("ibv_dereg_mr on {}", pd.context().name()),
                r,
                Some("work requests may still use the MR, or its memory windows are bound".into()),
            )
        })
    }
}

impl fmt::Debug for Mr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.info().fmt(f)
    }
}

/// Host memory and its registration (the registration is dropped first).
pub struct HostMr {
    mr: Mr,
    buf: HostBuf,
}

impl HostMr {
    /// The registration.
    pub fn mr(&self) -> &Mr {
        &self.mr
    }
    /// The memory.
    pub fn buf(&self) -> &HostBuf {
        &self.buf
    }
    /// The memory, writable.
    pub fn buf_mut(&mut self) -> &mut HostBuf {
        &mut self.buf
    }
    /// Keys, address, length.
    pub fn info(&self) -> MrInfo {
        self.mr.info()
    }

    /// Deregister ([`Mr::dereg`]) and give the memory back.
    pub fn dereg(self) -> Result<HostBuf> {
        let HostMr { mr, buf } = self;
        mr.dereg()?;
        Ok(buf)
    }
}

impl fmt::Debug for HostMr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.mr.fmt(f)
    }
}

/// A completion queue (polled, no completion channel).
pub struct Cq {
    ctx: Context,
    cq: CqHandle,
}

/// One work completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    /// The work request's id.
    pub wr_id: u64,
    /// Its status.
    pub status: WcStatus,
    /// `IBV_WC_*` opcode.
    pub opcode: u32,
    /// Bytes received (receives).
    pub byte_len: u32,
    /// Vendor error.
    pub vendor_err: u32,
}

impl Cq {
    /// `ibv_create_cq` with `cqe` entries.
    pub fn new(ctx: &Context, cqe: i32) -> Result<Cq> {
        let cq = CqHandle::create(&ctx.0, cqe)
            .map_err(|e| os_error(format!("ibv_create_cq({cqe}) on {}", ctx.name()), e, None))?;
        Ok(Cq {
            ctx: ctx.clone(),
            cq,
        })
    }

    pub(crate) fn handle(&self) -> &CqHandle {
        &self.cq
    }

    /// `ibv_poll_cq` for up to `max` completions.
    pub fn poll(&self, max: usize) -> Result<Vec<Completion>> {
        let mut wc = vec![ffi::ibv_wc::default(); max.max(1)];
        let n = self
            .cq
            .poll(&mut wc)
            .map_err(|e| os_error(format!("ibv_poll_cq on {}", self.ctx.name()), e, None))?;
        Ok(wc[..n]
            .iter()
            .map(|w| Completion {
                wr_id: w.wr_id,
                status: WcStatus(w.status),
                opcode: w.opcode,
                byte_len: w.byte_len,
                vendor_err: w.vendor_err,
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_parses_and_prints() {
        let a: MrAccess = "lw,rw,rr".parse().unwrap();
        assert_eq!(a, MrAccess::REMOTE_RW);
        assert_eq!(a.to_string(), "LOCAL_WRITE|REMOTE_WRITE|REMOTE_READ");
        assert_eq!("none".parse::<MrAccess>().unwrap(), MrAccess::empty());
        assert_eq!(MrAccess::empty().to_string(), "none");
        assert_eq!(
            "IBV_ACCESS_REMOTE_READ".parse::<MrAccess>().unwrap(),
            MrAccess::REMOTE_READ
        );
        assert_eq!(
            "0x3".parse::<MrAccess>().unwrap(),
            MrAccess::LOCAL_WRITE | MrAccess::REMOTE_WRITE
        );
        assert!("bogus".parse::<MrAccess>().is_err());
        assert_eq!(
            MrAccess::from_bits_retain(1 << 30).to_string(),
            "0x40000000"
        );
    }

    #[test]
    fn access_values_are_the_headers() {
        assert_eq!(MrAccess::LOCAL_WRITE.bits(), 1);
        assert_eq!(MrAccess::REMOTE_WRITE.bits(), 2);
        assert_eq!(MrAccess::REMOTE_READ.bits(), 4);
        assert_eq!(MrAccess::REMOTE_ATOMIC.bits(), 8);
    }

    #[test]
    fn dmabuf_errors_say_what_to_check() {
        assert!(dmabuf_mr_check(EOPNOTSUPP)
            .unwrap()
            .contains("lacks dma-buf MR support"));
        assert!(dmabuf_mr_check(EINVAL).unwrap().contains("LOCAL_WRITE"));
        assert!(dmabuf_mr_check(1234).is_none());
    }

    /// On a machine with rdma-core and an RDMA device this registers host memory; without,
    /// the error must be the "unavailable" kind that says what to do.
    #[test]
    fn open_first_device_or_explain() {
        match Context::open(None) {
            Ok(ctx) => {
                let pd = Pd::new(&ctx).unwrap();
                let mr = pd
                    .reg_mr(HostBuf::new(4096).unwrap(), MrAccess::REMOTE_RW)
                    .unwrap();
                assert_eq!(mr.info().len, 4096);
            }
            Err(e) => {
                assert!(e.is_unavailable(), "{e:?}");
                let s = e.to_string();
                assert!(s.contains("rdma") || s.contains("RDMA"), "{s}");
            }
        }
    }
}
