//! The host-memory fast path: the mappings that a lookup found to be plain host memory.
//!
//! A registration of host memory needs two answers: the range is not in a CPU mapping of a
//! dma-buf (`/proc/self/maps`: a `PROCMAP_QUERY` ioctl, 0.4 us on an H200 machine), and it is
//! not CUDA device memory (the driver: `cuPointerGetAttributes`, 0.15 us with one attribute,
//! 0.21 us with seven). Both answers are kept here for the mapping that holds the address,
//! when the mapping is *plain host memory* ([`plain_host`]): private, readable or writable,
//! not a device file, not a dma-buf, and the driver said it is not device memory. They stay
//! valid until the library sees the address space change in a way that could make an address
//! of such a mapping a dma-buf's or CUDA's ([`changes_kinds`]): then a new [`generation`]
//! begins, and the cache is empty.
//!
//! Why that cannot misclassify:
//!
//! - CUDA device memory (`cuMemAlloc`, pools, VMM reservations and their mappings) lives at
//!   addresses that the driver keeps for the GPU in the CPU's address space too (unified
//!   addressing): it maps them `PROT_NONE` (`---p` in `/proc/self/maps`), or as a mapping of a
//!   `/dev/nvidia*` file. Neither is plain host memory, so neither is ever cached; memory
//!   that CUDA maps later inside such a reservation is therefore never answered from here.
//! - An address of a cached mapping becomes CUDA's or a dma-buf's only if that mapping goes
//!   and a new one is made there: by `mmap` of a file (a dma-buf, a device file), an `mmap`
//!   with `PROT_NONE` or at a fixed address, `mprotect`, or `mremap`. The library interposes
//!   those (`mmap`, `mmap64`, `mprotect`, `mremap` below: the system call, then a new
//!   generation). Anonymous readable or writable `mmap` and `munmap` (`malloc`, `free`) keep
//!   the generation: they make no dma-buf or CUDA mapping.
//! - Pinned (`cudaHostRegister`, `cuMemAllocHost`) and managed memory is host memory to
//!   `ibv_reg_mr` (the slow path passes it on too); a mapping is cached only after the driver
//!   said the address is not device memory.
//!
//! What the interposition cannot see is a raw `mmap` system call that bypasses libc (the
//! checker verifies that the driver's reservations reach this library's `mmap`); a program
//! that maps dma-bufs or device memory that way turns the fast path off with
//! `P2PBUF_PEERMEM_HOST_CACHE=0`.

use std::ffi::{c_int, c_long, c_void};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

/// The environment variable that turns the cache (and so the fast path) off: `0`.
pub const CACHE_ENV: &str = "P2PBUF_PEERMEM_HOST_CACHE";

/// How many mappings are remembered (the most recent ones).
pub const CAPACITY: usize = 32;

/// Mappings known to be plain host memory, as of one generation.
#[derive(Debug, Default)]
pub struct Ranges {
    gen: u64,
    ranges: Vec<(u64, u64)>,
}

impl Ranges {
    /// An empty cache.
    pub const fn new() -> Ranges {
        Ranges {
            gen: 0,
            ranges: Vec::new(),
        }
    }

    /// Whether `addr` lies in a remembered mapping, the cache being of generation `now`.
    pub fn holds(&self, addr: u64, now: u64) -> bool {
        self.gen == now && self.ranges.iter().any(|&(s, e)| s <= addr && addr < e)
    }

    /// Remembers `[start, end)`, found by a lookup that began in generation `seen`, the
    /// current one being `now`. A lookup that began before a later generation may describe a
    /// mapping that is gone: it is not kept.
    pub fn remember(&mut self, start: u64, end: u64, seen: u64, now: u64) {
        if seen != now || start >= end {
            return;
        }
        if self.gen != now {
            self.gen = now;
            self.ranges.clear();
        }
        if self.ranges.contains(&(start, end)) {
            return;
        }
        if self.ranges.len() == CAPACITY {
            self.ranges.remove(0);
        }
        self.ranges.push((start, end));
    }

    /// How many mappings are remembered.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.ranges.len()
    }
}

/// The generation: how many calls that may change what a mapping is the library has seen.
static GENERATION: AtomicU64 = AtomicU64::new(0);

static RANGES: Mutex<Ranges> = Mutex::new(Ranges::new());

fn ranges() -> std::sync::MutexGuard<'static, Ranges> {
    RANGES.lock().unwrap_or_else(|p| p.into_inner())
}

/// Whether the cache is on (`P2PBUF_PEERMEM_HOST_CACHE` unset, or not `0`).
pub fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var_os(CACHE_ENV).is_none_or(|v| v != "0"))
}

/// The current generation; read it before a lookup whose result is then [`remember`]ed.
pub fn generation() -> u64 {
    GENERATION.load(Ordering::Acquire)
}

fn new_generation() {
    GENERATION.fetch_add(1, Ordering::AcqRel);
}

/// Whether a mapping with these permissions (`rw-p`) and path column is plain host memory:
/// private, readable or writable, not a device file's (`/dev/...`), not a dma-buf's.
pub fn plain_host(perms: &str, path: &str) -> bool {
    let p = perms.as_bytes();
    p.len() == 4
        && (p[0] == b'r' || p[1] == b'w')
        && p[3] == b'p'
        && !path.starts_with("/dev/")
        && !path.starts_with(crate::maps::DMABUF_PREFIX)
}

/// Whether `addr` is in a mapping that a lookup of this generation found to be plain host
/// memory.
pub fn known_plain_host(addr: u64) -> bool {
    enabled() && ranges().holds(addr, generation())
}

/// Remembers a plain host mapping found by a lookup begun in generation `seen`.
pub fn remember(start: u64, end: u64, seen: u64) {
    if enabled() {
        ranges().remember(start, end, seen, generation());
    }
}

/// Whether an `mmap` with these arguments may make a mapping that is not plain host memory,
/// or replace one: a file mapping (a dma-buf, a device file), `PROT_NONE` (how the CUDA driver
/// keeps addresses for the GPU), or a fixed address.
pub fn changes_kinds(prot: c_int, flags: c_int, fd: c_int) -> bool {
    flags & libc::MAP_ANONYMOUS == 0
        || fd >= 0
        || prot == libc::PROT_NONE
        || flags & (libc::MAP_FIXED | libc::MAP_FIXED_NOREPLACE) != 0
}

/// `p2pbuf_peermem_generation()`: the current generation, for checkers (a CUDA reservation
/// must start one).
#[no_mangle]
pub extern "C" fn p2pbuf_peermem_generation() -> u64 {
    generation()
}

fn syscall_ptr(r: c_long) -> *mut c_void {
    // -1 with errno set by syscall() is MAP_FAILED.
    r as *mut c_void
}

/// `mmap`, interposed: the system call, as glibc makes it, and a new generation where the
/// mapping may not be plain host memory (after the call: a lookup racing with it is not
/// remembered, as it began in the old generation).
///
/// # Safety
/// As `mmap(2)`.
#[no_mangle]
pub unsafe extern "C" fn mmap(
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: libc::off_t,
) -> *mut c_void {
    if off & (page_size() - 1) != 0 {
        // SAFETY: the calling thread's errno.
        unsafe { *libc::__errno_location() = libc::EINVAL };
        return libc::MAP_FAILED;
    }
    // SAFETY: the arguments are the caller's, for the same system call.
    let r = unsafe { libc::syscall(libc::SYS_mmap, addr, len, prot, flags, fd, off) };
    if changes_kinds(prot, flags, fd) {
        new_generation();
    }
    syscall_ptr(r)
}

/// `mmap64`, the same function on a 64-bit system.
///
/// # Safety
/// As `mmap(2)`.
#[no_mangle]
pub unsafe extern "C" fn mmap64(
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: libc::off_t,
) -> *mut c_void {
    // SAFETY: as above.
    unsafe { mmap(addr, len, prot, flags, fd, off) }
}

/// `mremap`, interposed: the system call and a new generation (a dma-buf mapping may move).
/// The C declaration is variadic (`new_address` only with `MREMAP_FIXED`); on x86-64 and
/// AArch64 Linux a variadic pointer argument is passed where a fifth fixed one is, and the
/// kernel reads it only with `MREMAP_FIXED`.
///
/// # Safety
/// As `mremap(2)`.
#[no_mangle]
pub unsafe extern "C" fn mremap(
    old: *mut c_void,
    old_len: usize,
    new_len: usize,
    flags: c_int,
    new_addr: *mut c_void,
) -> *mut c_void {
    // SAFETY: the caller's arguments, for the same system call.
    let r = unsafe { libc::syscall(libc::SYS_mremap, old, old_len, new_len, flags, new_addr) };
    new_generation();
    syscall_ptr(r)
}

/// `mprotect`, interposed: the system call and a new generation (`PROT_NONE` is how addresses
/// are kept for the GPU; any change of protection may make a mapping that is not plain host
/// memory).
///
/// # Safety
/// As `mprotect(2)`.
#[no_mangle]
pub unsafe extern "C" fn mprotect(addr: *mut c_void, len: usize, prot: c_int) -> c_int {
    // SAFETY: the caller's arguments, for the same system call.
    let r = unsafe { libc::syscall(libc::SYS_mprotect, addr, len, prot) };
    new_generation();
    r as c_int
}

fn page_size() -> libc::off_t {
    crate::page_size() as libc::off_t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembered_ranges_hold_their_addresses_in_their_generation() {
        let mut r = Ranges::new();
        r.remember(0x1000, 0x3000, 5, 5);
        assert!(r.holds(0x1000, 5));
        assert!(r.holds(0x2fff, 5));
        assert!(!r.holds(0x3000, 5));
        assert!(!r.holds(0xfff, 5));
        // A new generation forgets everything.
        assert!(!r.holds(0x1000, 6));
        r.remember(0x8000, 0x9000, 6, 6);
        assert!(!r.holds(0x1000, 6));
        assert!(r.holds(0x8000, 6));
        assert_eq!(r.len(), 1);
    }

    #[test]
    fn a_lookup_older_than_the_generation_is_not_kept() {
        let mut r = Ranges::new();
        r.remember(0x1000, 0x2000, 3, 4);
        assert!(!r.holds(0x1000, 4));
        assert!(!r.holds(0x1000, 3));
        assert_eq!(r.len(), 0);
        r.remember(0x2000, 0x1000, 4, 4);
        assert_eq!(r.len(), 0, "an empty range is not kept");
    }

    #[test]
    fn only_plain_host_mappings_are_cached() {
        assert!(plain_host("rw-p", ""));
        assert!(plain_host("r--p", "/usr/lib/libc.so.6"));
        assert!(plain_host("rw-p", "[heap]"));
        assert!(!plain_host("---p", ""), "a CUDA reservation");
        assert!(!plain_host("rw-s", ""), "shared memory");
        assert!(!plain_host("rw-s", "/dev/nvidia-uvm"));
        assert!(!plain_host("rw-p", "/dev/nvidia0"));
        assert!(!plain_host("rw-p", "/dmabuf:"));
        assert!(!plain_host("rw", ""));
    }

    #[test]
    fn the_oldest_range_goes_when_full() {
        let mut r = Ranges::new();
        for i in 0..CAPACITY as u64 + 1 {
            r.remember(i << 20, (i << 20) + 4096, 1, 1);
        }
        assert_eq!(r.len(), CAPACITY);
        assert!(!r.holds(0, 1));
        assert!(r.holds(1 << 20, 1));
        assert!(r.holds((CAPACITY as u64) << 20, 1));
        r.remember(1 << 20, (1 << 20) + 4096, 1, 1);
        assert_eq!(
            r.len(),
            CAPACITY,
            "a range already there is not added twice"
        );
    }

    #[test]
    fn file_mappings_and_moves_start_a_generation_anonymous_memory_does_not() {
        let rw = libc::PROT_READ | libc::PROT_WRITE;
        let anon = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
        assert!(changes_kinds(rw, libc::MAP_SHARED, 3));
        assert!(changes_kinds(libc::PROT_READ, libc::MAP_PRIVATE, 3));
        assert!(!changes_kinds(rw, anon, -1));
        assert!(changes_kinds(libc::PROT_NONE, anon, -1), "a reservation");
        assert!(changes_kinds(rw, anon | libc::MAP_FIXED, -1));
        assert!(changes_kinds(rw, anon | libc::MAP_FIXED_NOREPLACE, -1));
        let g = generation();
        // SAFETY: an anonymous mapping of one page, unmapped below.
        let p = unsafe {
            mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        assert!(generation() >= g);
        let f = std::fs::File::open("/proc/self/exe").expect("open /proc/self/exe");
        let g = generation();
        // SAFETY: a read-only private mapping of one page of a file, unmapped below.
        let q = unsafe {
            use std::os::fd::AsRawFd;
            mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ,
                libc::MAP_PRIVATE,
                f.as_raw_fd(),
                0,
            )
        };
        assert_ne!(q, libc::MAP_FAILED, "{}", std::io::Error::last_os_error());
        assert!(generation() > g, "a file mapping must start a generation");
        // SAFETY: the mapping made above; the file's first bytes are its ELF magic.
        assert_eq!(unsafe { *(q as *const [u8; 4]) }, *b"\x7fELF");
        let g = generation();
        // SAFETY: moves (grows in place or moves) the anonymous page.
        let p2 = unsafe { mremap(p, 4096, 8192, libc::MREMAP_MAYMOVE, std::ptr::null_mut()) };
        assert_ne!(p2, libc::MAP_FAILED);
        assert!(generation() > g, "a move must start a generation");
        let g = generation();
        // SAFETY: the mapping made above.
        assert_eq!(unsafe { mprotect(p2, 4096, libc::PROT_NONE) }, 0);
        assert!(generation() > g, "mprotect must start a generation");
        // A misaligned offset fails as glibc's mmap does.
        // SAFETY: fails before any mapping is made.
        let bad = unsafe {
            mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ,
                libc::MAP_PRIVATE,
                3,
                1,
            )
        };
        assert_eq!(bad, libc::MAP_FAILED);
        assert_eq!(
            std::io::Error::last_os_error().raw_os_error(),
            Some(libc::EINVAL)
        );
        // SAFETY: the mappings made above.
        unsafe {
            libc::munmap(p2, 8192);
            libc::munmap(q, 4096);
        }
    }
}
