//! `libp2pbuf_peermem.so`: plain `ibv_reg_mr()` on device memory, with no kernel hook.
//!
//! ```sh
//! LD_PRELOAD=/path/to/libp2pbuf_peermem.so ./unmodified-verbs-program
//! ```
//!
//! A peer-memory client (nvidia-peermem) let a program call `ibv_reg_mr` on GPU memory by
//! hooking the kernel's pinning. This library does the same from user space, with the
//! upstream mechanism: it interposes the registration entry points that programs link
//! against, `ibv_reg_mr` (IBVERBS_1.1), `ibv_reg_mr_iova` (IBVERBS_1.7) and `ibv_reg_mr_iova2`
//! (IBVERBS_1.8; `verbs.h` turns an `ibv_reg_mr(...)` call into it when the access flags are
//! not a compile-time constant or carry optional flags), and `ibv_dereg_mr`. For a range that
//! is
//!
//! - in a CPU mapping of a dma-buf (`/proc/self/maps` names it `/dmabuf:NAME`; the fd is a
//!   duplicate of the program's own fd of that dma-buf, found by device and inode), or
//! - CUDA device memory (`cuPointerGetAttributes`, in a process that has libcuda loaded; the
//!   allocation is exported once with `cuMemGetHandleForAddressRange`),
//!
//! it calls `ibv_reg_dmabuf_mr(pd, offset, length, iova, fd, access)` instead, with the offset of
//! the address in the dma-buf and the iova the caller asked for (the address itself for
//! `ibv_reg_mr`), so RDMA operations addressed with the virtual address work, and hands back
//! that memory region with `addr` set to the address (as `ibv_reg_mr` would). The fd is kept
//! per buffer and closed when its last memory region is deregistered. Everything else (host
//! memory, pinned or managed CUDA memory, a range that leaves the buffer, a dma-buf whose fd the
//! program no longer holds) goes to the real function untouched.
//!
//! For CUDA VMM memory (`cuMemCreate` + `cuMemAddressReserve` + `cuMemMap`) the export is the
//! mapping that holds the range (`cuMemGetAddressRange`), never the whole reservation, made
//! with the primary context of the pointer's device current (VMM memory has no owning
//! context); a range over two mappings is refused (EINVAL): one memory region is one dma-buf,
//! and one dma-buf is one mapping.
//!
//! Host memory costs a look at `/proc/self/maps` and a question to the driver the first time a
//! mapping is seen; after that, a registration in the same plain host mapping (private,
//! readable or writable, not a device file or a dma-buf, not device memory to the driver) is
//! passed on without a system call or a driver call, until the library sees a call that could
//! change what a mapping is (`mmap` of a file, `PROT_NONE` or at a fixed address, `mprotect`,
//! `mremap`, which it interposes for that): see `hostcache.rs` and docs/cuda.md.
//! `P2PBUF_PEERMEM_HOST_CACHE=0` turns that off.
//!
//! `P2PBUF_PEERMEM_DEBUG=1` makes the library say on stderr what it decided and why, for every
//! call; otherwise it prints one line only for a refusal that the program could not explain
//! otherwise (a range over two VMM mappings). Errors are returned as the real functions return
//! them: NULL with `errno`.

mod cuda;
mod fdfind;
mod hostcache;
mod maps;
mod real;
mod registry;

use std::cell::Cell;
use std::ffi::{c_int, c_uint, c_void};
use std::fmt;
use std::io::Write;
use std::os::fd::OwnedFd;
use std::sync::{Mutex, MutexGuard, OnceLock};

use p2pbuf_rdma::ffi::{ibv_access_flags as acc, ibv_mr, ibv_pd};
use p2pbuf_rdma::MrAccess;

use registry::{Key, Registry};

/// The environment variable that turns on the messages.
pub const DEBUG_ENV: &str = "P2PBUF_PEERMEM_DEBUG";

fn debug_on() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var_os(DEBUG_ENV).is_some_and(|v| !v.is_empty() && v != "0"))
}

/// One line on stderr, if debugging is on; never panics (eprintln! would on a closed stderr).
macro_rules! debug {
    ($($t:tt)*) => {
        if debug_on() {
            let _ = writeln!(std::io::stderr(), "p2pbuf-peermem: {}", format_args!($($t)*));
        }
    };
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn set_errno(e: i32) {
    // SAFETY: the calling thread's errno.
    unsafe { *libc::__errno_location() = e };
}

fn errno_text(e: i32) -> String {
    format!("{} (errno {e})", p2pbuf::error::errno_text(e))
}

thread_local! {
    /// Set while this thread is inside a real libibverbs function: calls that come back to
    /// us from there (libibverbs' own `ibv_reg_mr` calls `ibv_reg_mr_iova2` through its PLT)
    /// go straight on.
    static IN_REAL: Cell<bool> = const { Cell::new(false) };
}

struct RealGuard(bool);

impl RealGuard {
    fn enter() -> RealGuard {
        RealGuard(IN_REAL.replace(true))
    }
}

impl Drop for RealGuard {
    fn drop(&mut self) {
        IN_REAL.set(self.0);
    }
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry::new());

fn registry() -> MutexGuard<'static, Registry> {
    REGISTRY.lock().unwrap_or_else(|p| p.into_inner())
}

fn page_size() -> u64 {
    static PAGE: OnceLock<u64> = OnceLock::new();
    // SAFETY: sysconf only reads.
    *PAGE.get_or_init(|| match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
        p if p > 0 => p as u64,
        _ => 4096,
    })
}

/// The access flags that let the HCA write the memory (what makes `ib_umem_get` pin with
/// `FOLL_WRITE`).
const ACCESS_WRITES: u32 =
    acc::IBV_ACCESS_LOCAL_WRITE | acc::IBV_ACCESS_REMOTE_WRITE | acc::IBV_ACCESS_REMOTE_ATOMIC;

/// `IBV_ACCESS_OPTIONAL_RANGE` (verbs.h: bits 20 to 29).
const ACCESS_OPTIONAL_RANGE: u32 = 0x3ff0_0000;

/// The access flags for `ibv_reg_dmabuf_mr`: optional flags that it does not know are dropped
/// (optional flags may be ignored: `ibv_reg_mr_iova2` drops them all on a kernel without
/// optional-access support; the kernel's `REG_DMABUF_MR` accepts `RELAXED_ORDERING` only), and
/// so is `HUGETLB`, which only tells `ibv_reg_mr` how to keep the range out of a `fork`
/// (`ibv_dontfork_range`), something a dma-buf registration does not do. Everything else goes
/// to the kernel, which refuses what a dma-buf MR cannot be (`ON_DEMAND`, `ZERO_BASED`,
/// `MW_BIND`: EINVAL).
pub fn dmabuf_access(access: u32) -> u32 {
    access & !(ACCESS_OPTIONAL_RANGE & !acc::IBV_ACCESS_RELAXED_ORDERING) & !acc::IBV_ACCESS_HUGETLB
}

/// Which entry point the program called.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Api {
    RegMr,
    RegMrIova,
    RegMrIova2,
}

impl Api {
    fn sym(self) -> &'static real::Sym {
        match self {
            Api::RegMr => &real::REG_MR,
            Api::RegMrIova => &real::REG_MR_IOVA,
            Api::RegMrIova2 => &real::REG_MR_IOVA2,
        }
    }
}

/// A registration call, as the program made it.
struct Call {
    api: Api,
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: u32,
}

impl fmt::Display for Call {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}(pd {:p}, addr {:p}, length {}",
            self.api.sym().name(),
            self.pd,
            self.addr,
            self.len
        )?;
        if self.api != Api::RegMr {
            write!(f, ", iova {:#x}", self.iova)?;
        }
        write!(f, ", access {})", MrAccess::from_bits_retain(self.access))
    }
}

impl Call {
    /// The real function, with the program's arguments.
    unsafe fn pass(&self) -> *mut ibv_mr {
        let Some(f) = self.api.sym().get() else {
            debug!(
                "{self}: no {} after this library in the lookup order nor in a loaded libibverbs.so.1 (is libibverbs linked or loaded?): ENOSYS",
                self.api.sym().name()
            );
            set_errno(libc::ENOSYS);
            return std::ptr::null_mut();
        };
        let _g = RealGuard::enter();
        match self.api {
            Api::RegMr => std::mem::transmute::<*mut c_void, real::RegMr>(f)(
                self.pd,
                self.addr,
                self.len,
                self.access as c_int,
            ),
            Api::RegMrIova => std::mem::transmute::<*mut c_void, real::RegMrIova>(f)(
                self.pd,
                self.addr,
                self.len,
                self.iova,
                self.access as c_int,
            ),
            Api::RegMrIova2 => std::mem::transmute::<*mut c_void, real::RegMrIova2>(f)(
                self.pd,
                self.addr,
                self.len,
                self.iova,
                self.access,
            ),
        }
    }
}

/// Where the memory comes from.
enum Source {
    Mapped(maps::DmaBufRange),
    Cuda(cuda::DeviceAlloc),
}

/// What to do with a call.
enum Plan {
    /// Hand it to the real function, for this reason.
    Pass(String),
    Device(Source),
    /// Fail with this errno, for this reason (said with `P2PBUF_PEERMEM_DEBUG`).
    Fail(i32, String),
    /// Fail with this errno, and say why on stderr in any case: the program asked for
    /// something that cannot be done and would not know why otherwise.
    Refuse(i32, String),
}

/// Where a registration range lies in the CUDA memory that holds its start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fit {
    /// Inside: one export.
    Inside,
    /// Runs past the end of a CUDA VMM mapping (into another mapping, or unmapped space).
    PastMapping,
    /// Runs past the end of an allocation that is not VMM memory.
    PastAllocation,
}

fn fit(addr: u64, len: u64, a: &cuda::DeviceAlloc) -> Fit {
    match addr.checked_add(len) {
        Some(end) if end <= a.base.saturating_add(a.size) => Fit::Inside,
        _ if a.reservation.is_some() => Fit::PastMapping,
        _ => Fit::PastAllocation,
    }
}

/// The plan for CUDA device memory.
fn plan_device(c: &Call, a: cuda::DeviceAlloc) -> Plan {
    match fit(c.addr as u64, c.len as u64, &a) {
        Fit::Inside => Plan::Device(Source::Cuda(a)),
        Fit::PastMapping => Plan::Refuse(
            libc::EINVAL,
            format!(
                "{c}: the range runs past the end of the CUDA VMM mapping that holds its start ({:#x}+{}); a memory region is one dma-buf and a dma-buf is one mapping: register each mapping separately",
                a.base, a.size
            ),
        ),
        Fit::PastAllocation => Plan::Pass(format!(
            "CUDA device memory, but the range runs past its allocation ({:#x}+{}) and cannot be one dma-buf",
            a.base, a.size
        )),
    }
}

fn describe_other(l: &maps::Lookup) -> String {
    match l {
        maps::Lookup::Other {
            start,
            end,
            perms,
            path,
        } => format!(
            "host memory (mapping {start:x}-{end:x} {perms} {})",
            if path.is_empty() { "[anonymous]" } else { path }
        ),
        _ => "not mapped in this process".into(),
    }
}

fn classify(c: &Call) -> Plan {
    let (addr, len) = (c.addr as u64, c.len as u64);
    if len == 0 || addr == 0 {
        return Plan::Pass("empty range or NULL address".into());
    }
    let seen = hostcache::generation();
    let mut plain = None;
    let host = match maps::lookup_self(addr, len) {
        Ok(maps::Lookup::DmaBuf(r)) if !r.writable && c.access & ACCESS_WRITES != 0 => {
            // The library does not grant writes that the program's own mapping does not
            // allow; ibv_reg_mr refuses writable access to read-only memory (EFAULT).
            return Plan::Pass(format!(
                "the mapping of dma-buf {} is not writable ({}) and the access flags ask for writes",
                r.path, r.perms
            ));
        }
        Ok(maps::Lookup::DmaBuf(r)) => return Plan::Device(Source::Mapped(r)),
        Ok(maps::Lookup::Partial { path, map_end }) => {
            return Plan::Pass(format!(
            "the range starts in a mapping of dma-buf {path} but runs past its end at {map_end:#x}"
        ))
        }
        Ok(l) => {
            plain = match &l {
                maps::Lookup::Other {
                    start,
                    end,
                    perms,
                    path,
                } if hostcache::plain_host(perms, path) => Some((*start, *end)),
                _ => None,
            };
            describe_other(&l)
        }
        Err(e) => format!("/proc/self/maps cannot be read ({e})"),
    };
    let remember = || {
        if let Some((start, end)) = plain {
            hostcache::remember(start, end, seen);
        }
    };
    match cuda::probe(addr) {
        cuda::Probe::NotCuda => {
            remember();
            Plan::Pass(host)
        }
        cuda::Probe::Host(why) => {
            remember();
            Plan::Pass(why)
        }
        cuda::Probe::Unusable(why) => Plan::Pass(why),
        cuda::Probe::Device(a) => plan_device(c, a),
        cuda::Probe::Unmapped(why) => Plan::Fail(libc::EFAULT, why),
    }
}

/// Why no fd could be had.
enum OpenError {
    /// The library cannot help: the real function answers as without it.
    Pass(String),
    /// Registration fails with this errno.
    Fail(i32, String),
}

/// A checked dma-buf fd and what it is.
fn checked(fd: OwnedFd, how: String) -> Result<(OwnedFd, String), p2pbuf::Error> {
    let b = p2pbuf::DmaBuf::from_fd(fd)?;
    let what = format!("{how}, {} dma-buf of {} bytes", b.exporter(), b.size());
    Ok((b.into_fd(), what))
}

fn open_mapped(r: &maps::DmaBufRange) -> Result<(OwnedFd, String), OpenError> {
    use std::os::fd::AsRawFd;
    let (fd, how) = match fdfind::scan_fds(r.dev, r.ino) {
        Ok(f) => {
            let how = format!(
                "fd {} (a duplicate of the program's fd {})",
                f.fd.as_raw_fd(),
                f.original
            );
            (f.fd, how)
        }
        Err(scanned) => {
            let (s, e) = r.first_vma;
            match fdfind::open_map_files(s, e, r.dev, r.ino) {
                Ok(fd) => {
                    let how = format!(
                        "fd {} (opened through {})",
                        fd.as_raw_fd(),
                        fdfind::map_files_path(s, e)
                    );
                    (fd, how)
                }
                Err(err) => {
                    return Err(OpenError::Pass(format!(
                        "no fd of this process refers to that dma-buf ({scanned} fds looked at in /proc/self/fd) and {} cannot be opened: {}; keep the dma-buf's fd open while registering",
                        fdfind::map_files_path(s, e),
                        err.raw_os_error().map_or(err.to_string(), errno_text)
                    )))
                }
            }
        }
    };
    checked(fd, how).map_err(|e| OpenError::Pass(format!("the file is not a usable dma-buf: {e}")))
}

fn open_cuda(a: &cuda::DeviceAlloc, start: u64, len: u64) -> Result<(OwnedFd, String), OpenError> {
    use std::os::fd::AsRawFd;
    match cuda::export(a, start, len) {
        Ok(fd) => {
            let how = format!(
                "fd {} (exported [{start:#x}, +{len}) with cuMemGetHandleForAddressRange)",
                fd.as_raw_fd()
            );
            checked(fd, how).map_err(|e| {
                OpenError::Fail(
                    libc::EIO,
                    format!("the exported fd is not a usable dma-buf: {e}"),
                )
            })
        }
        Err(e) => Err(OpenError::Fail(
            e.errno(),
            format!(
                "{} failed: {} ({})",
                e.call,
                cuda::error_name(e.code),
                e.code
            ),
        )),
    }
}

/// Registers device memory through `ibv_reg_dmabuf_mr`.
///
/// Over 100 lines on purpose: the export (or the one already held for the same memory), the
/// argument checks, the call and the fix-up of the MR's address are one registration, each step
/// using what the one before found; every failure path gives the export back.
unsafe fn register_device(c: &Call, src: Source) -> *mut ibv_mr {
    let addr = c.addr as u64;
    let (key, offset, desc) = match &src {
        Source::Mapped(r) => (
            Key::Mapped {
                dev: r.dev,
                ino: r.ino,
            },
            r.dmabuf_offset(addr),
            format!(
                "in the mapping of dma-buf {} ({:x}-{:x} {}, dev {} ino {})",
                r.path, r.map_start, r.map_end, r.perms, r.dev_text, r.ino
            ),
        ),
        Source::Cuda(a) => {
            let (start, len) = a.export_range(page_size());
            (
                Key::Cuda {
                    ctx: a.ctx,
                    buffer_id: a.buffer_id,
                    block_id: a.block_id,
                    start,
                    len,
                },
                addr - start,
                match a.reservation {
                    None => format!(
                        "CUDA device memory of device {} (allocation {:#x}+{}, buffer id {})",
                        a.device, a.base, a.size, a.buffer_id
                    ),
                    Some((rb, rs)) => format!(
                        "CUDA VMM memory of device {} (mapping {:#x}+{} of the reservation {rb:#x}+{rs}, buffer id {}, memory block id {})",
                        a.device, a.base, a.size, a.buffer_id, a.block_id
                    ),
                },
            )
        }
    };
    let acquired = registry().acquire(&key, || match &src {
        Source::Mapped(r) => open_mapped(r),
        Source::Cuda(a) => match &key {
            Key::Cuda { start, len, .. } => open_cuda(a, *start, *len),
            Key::Mapped { .. } => unreachable!(),
        },
    });
    let got = match acquired {
        Ok(g) => g,
        Err(OpenError::Pass(why)) => {
            debug!("{c}: {desc}: {why}; passing to the real function");
            return c.pass();
        }
        Err(OpenError::Fail(e, why)) => {
            debug!("{c}: {desc}: {why}; failing with {}", errno_text(e));
            set_errno(e);
            return std::ptr::null_mut();
        }
    };
    debug!(
        "{c}: {desc}: {}{}",
        if got.reused { "cached " } else { "" },
        got.what
    );
    let fail = |e: i32, why: String| {
        let rel = registry().release(&key);
        debug!("{why}: {}; {rel}", errno_text(e));
        set_errno(e);
        std::ptr::null_mut()
    };
    if c.pd.is_null() {
        return fail(
            libc::EINVAL,
            "not calling ibv_reg_dmabuf_mr: the protection domain is NULL".into(),
        );
    }
    if (*c.pd).context.is_null() {
        return fail(
            libc::EINVAL,
            "not calling ibv_reg_dmabuf_mr: the protection domain has no device context (pd->context is NULL)".into(),
        );
    }
    let Some(f) = real::REG_DMABUF_MR.get() else {
        return fail(
            libc::EOPNOTSUPP,
            "this libibverbs has no ibv_reg_dmabuf_mr (rdma-core 34 or later has it)".into(),
        );
    };
    let access = dmabuf_access(c.access);
    let args = format!(
        "ibv_reg_dmabuf_mr(pd {:p}, offset {offset:#x}, length {}, iova {:#x}, fd {}, access {})",
        c.pd,
        c.len,
        c.iova,
        got.fd,
        MrAccess::from_bits_retain(access)
    );
    let mr = {
        let _g = RealGuard::enter();
        std::mem::transmute::<*mut c_void, real::RegDmabufMr>(f)(
            c.pd,
            offset,
            c.len,
            c.iova,
            got.fd,
            access as c_int,
        )
    };
    if mr.is_null() {
        let e = errno();
        return fail(e, format!("{args} failed"));
    }
    // ibv_reg_dmabuf_mr reports the dma-buf offset as the address; the program asked for its
    // own address (and ibv_reg_mr returns that), which programs send to their peers.
    (*mr).addr = c.addr;
    registry().add_mr(mr as usize, key);
    debug!(
        "{args}: registered, mr {mr:p} lkey {:#x} rkey {:#x}",
        (*mr).lkey,
        (*mr).rkey
    );
    mr
}

/// The host-memory fast path: the start of the range is in a mapping that [`classify`] found
/// to be plain host memory, in the current generation ([`hostcache`]); `classify` would pass
/// such a call on too. No system call, no driver call.
fn surely_host(c: &Call) -> bool {
    let addr = c.addr as u64;
    c.len != 0 && addr != 0 && hostcache::known_plain_host(addr)
}

unsafe fn register(c: Call) -> *mut ibv_mr {
    if IN_REAL.get() {
        return c.pass();
    }
    let saved = errno();
    let fast = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| surely_host(&c)));
    if fast.unwrap_or(false) {
        debug!("{c}: host memory (in a plain host mapping looked at before, with no mapping made since that could change that): passing to the real function");
        set_errno(saved);
        return c.pass();
    }
    let plan = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| classify(&c)))
        .unwrap_or_else(|_| Plan::Pass("internal error while looking at the range".into()));
    match plan {
        Plan::Pass(why) => {
            debug!("{c}: {why}: passing to the real function");
            set_errno(saved);
            c.pass()
        }
        Plan::Fail(e, why) => {
            debug!("{c}: {why}: failing with {}", errno_text(e));
            set_errno(e);
            std::ptr::null_mut()
        }
        Plan::Refuse(e, why) => {
            let _ = writeln!(
                std::io::stderr(),
                "p2pbuf-peermem: {why}: failing with {}",
                errno_text(e)
            );
            set_errno(e);
            std::ptr::null_mut()
        }
        Plan::Device(src) => {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| register_device(&c, src)))
                .unwrap_or_else(|_| {
                    set_errno(libc::EIO);
                    std::ptr::null_mut()
                })
        }
    }
}

/// `ibv_reg_mr` (IBVERBS_1.1), what `verbs.h`'s `ibv_reg_mr()` calls when the access flags are
/// a constant without optional flags.
///
/// # Safety
/// As the real function: `pd` from `ibv_alloc_pd`, `addr` mapped for `length` bytes.
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> *mut ibv_mr {
    register(Call {
        api: Api::RegMr,
        pd,
        addr,
        len: length,
        iova: addr as u64,
        access: access as u32,
    })
}

/// `ibv_reg_mr_iova` (IBVERBS_1.7).
///
/// # Safety
/// As the real function.
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr_iova(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_int,
) -> *mut ibv_mr {
    register(Call {
        api: Api::RegMrIova,
        pd,
        addr,
        len: length,
        iova,
        access: access as u32,
    })
}

/// `ibv_reg_mr_iova2` (IBVERBS_1.8), what `verbs.h`'s `ibv_reg_mr()` and `ibv_reg_mr_iova()`
/// call when the access flags are not a compile-time constant or have optional flags.
///
/// # Safety
/// As the real function.
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr_iova2(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_uint,
) -> *mut ibv_mr {
    register(Call {
        api: Api::RegMrIova2,
        pd,
        addr,
        len: length,
        iova,
        access,
    })
}

/// `ibv_dereg_mr` (IBVERBS_1.1): the real one, then, for a memory region made here, the fd's
/// reference is dropped (the last closes it).
///
/// # Safety
/// As the real function.
#[no_mangle]
pub unsafe extern "C" fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int {
    let ours = if IN_REAL.get() || mr.is_null() {
        None
    } else {
        registry().take_mr(mr as usize)
    };
    let Some(f) = real::DEREG_MR.get() else {
        if let Some(k) = ours {
            registry().add_mr(mr as usize, k);
        }
        debug!("ibv_dereg_mr(mr {mr:p}): no ibv_dereg_mr after this library: ENOSYS");
        set_errno(libc::ENOSYS);
        return libc::ENOSYS;
    };
    let rc = {
        let _g = RealGuard::enter();
        std::mem::transmute::<*mut c_void, real::DeregMr>(f)(mr)
    };
    let e = errno();
    if let Some(k) = ours {
        if rc == 0 {
            let (rel, (fds, mrs)) = {
                let mut r = registry();
                (r.release(&k), r.counts())
            };
            debug!(
                "ibv_dereg_mr(mr {mr:p}): deregistered; {rel}; the library now holds {fds} fd(s) for {mrs} memory region(s)"
            );
        } else {
            registry().add_mr(mr as usize, k);
            debug!(
                "ibv_dereg_mr(mr {mr:p}) failed ({}); the memory region and its fd stay",
                errno_text(rc)
            );
        }
    }
    set_errno(e);
    rc
}

#[cfg(test)]
mod tests;
