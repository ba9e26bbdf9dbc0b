//! `/proc/self/maps`: which mapping an address range lies in, and whether that mapping is a
//! dma-buf's.
//!
//! A CPU mapping of a dma-buf (`mmap` of its fd) shows up with the dma-buf's own inode and the
//! name that the dma-buf filesystem gives it (`dmabuffs_dname()` in
//! `drivers/dma-buf/dma-buf.c`): `/dmabuf:` followed by the buffer's name
//! (`DMA_BUF_SET_NAME`), empty when it has none. A p2pbuf buffer of 4 MiB mapped at
//! 0x7f5c0e400000, for example:
//!
//! ```text
//! 7f5c0e400000-7f5c0e800000 rw-s 00000000 00:0e 12        /dmabuf:
//! ```
//!
//! The device field is the dma-buf filesystem's anonymous device (major 0), the inode is unique
//! per dma-buf while it exists, and the offset is the mapping's offset into the buffer
//! (`vm_pgoff` in bytes). Everything here is pure text processing, so it is tested on the host.

/// One line of `/proc/<pid>/maps`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping<'a> {
    /// First address.
    pub start: u64,
    /// One past the last address.
    pub end: u64,
    /// `rw-s` and the like.
    pub perms: &'a str,
    /// Offset of `start` into the mapped file, in bytes.
    pub offset: u64,
    /// Device of the mapped file: major number.
    pub major: u32,
    /// Device of the mapped file: minor number.
    pub minor: u32,
    /// Inode of the mapped file (0 for anonymous memory).
    pub inode: u64,
    /// The path column: a file name, `[heap]`, `/dmabuf:NAME`, or empty.
    pub path: &'a str,
}

/// The prefix of a dma-buf mapping's path (`"/" + dentry name "dmabuf" + ":" + buffer name`).
pub const DMABUF_PREFIX: &str = "/dmabuf:";

impl Mapping<'_> {
    /// The device as `fstat()` reports it in `st_dev` (glibc's `makedev` encoding).
    pub fn dev(&self) -> u64 {
        makedev(self.major, self.minor)
    }
}

/// glibc's `makedev()`: the `dev_t` that `stat()` returns for a device `major:minor`.
pub fn makedev(major: u32, minor: u32) -> u64 {
    libc::makedev(major, minor)
}

/// Parses one line; `None` if it is not in the kernel's format.
pub fn parse_line(line: &str) -> Option<Mapping<'_>> {
    let mut rest = line;
    let mut field = || {
        let s = rest.trim_start_matches(' ');
        let end = s.find(' ').unwrap_or(s.len());
        let (f, r) = s.split_at(end);
        rest = r;
        (!f.is_empty()).then_some(f)
    };
    let range = field()?;
    let perms = field()?;
    let offset = field()?;
    let dev = field()?;
    let inode = field()?;
    let (start, end) = range.split_once('-')?;
    let (major, minor) = dev.split_once(':')?;
    let m = Mapping {
        start: u64::from_str_radix(start, 16).ok()?,
        end: u64::from_str_radix(end, 16).ok()?,
        perms,
        offset: u64::from_str_radix(offset, 16).ok()?,
        major: u32::from_str_radix(major, 16).ok()?,
        minor: u32::from_str_radix(minor, 16).ok()?,
        inode: inode.parse().ok()?,
        // The path is the rest after the padding; it may itself contain spaces.
        path: rest.trim_start_matches(' ').trim_end_matches('\n'),
    };
    (m.start < m.end).then_some(m)
}

/// A range that lies wholly in a CPU mapping of one dma-buf.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DmaBufRange {
    /// Start of the mapping (of the first of several adjacent mappings of the same buffer at
    /// consecutive offsets, which the kernel may list separately after an `mprotect` of part
    /// of it).
    pub map_start: u64,
    /// End of the (last adjacent) mapping.
    pub map_end: u64,
    /// Offset into the dma-buf of `map_start`.
    pub map_offset: u64,
    /// The mapping that contains the range's first byte, as `/proc/self/map_files` names it
    /// (`start-end` in hex).
    pub first_vma: (u64, u64),
    /// `st_dev` of the dma-buf.
    pub dev: u64,
    /// `st_ino` of the dma-buf.
    pub ino: u64,
    /// The maps line's `major:minor`, for messages.
    pub dev_text: String,
    /// The path column (`/dmabuf:NAME`).
    pub path: String,
    /// `rw-s` and the like (of the first mapping).
    pub perms: String,
    /// Whether every mapping of the range is writable.
    pub writable: bool,
}

impl DmaBufRange {
    /// Offset into the dma-buf of the byte mapped at `addr` (which must lie in the mapping).
    pub fn dmabuf_offset(&self, addr: u64) -> u64 {
        debug_assert!(addr >= self.map_start && addr < self.map_end);
        self.map_offset + (addr - self.map_start)
    }
}

/// Where an address range lies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// Wholly inside the CPU mapping of one dma-buf.
    DmaBuf(DmaBufRange),
    /// It starts in a dma-buf mapping but runs past its end (into a hole, other memory, or a
    /// non-adjacent part of the buffer).
    Partial {
        /// The dma-buf's path column.
        path: String,
        /// End of the dma-buf mapping(s) that hold the start of the range.
        map_end: u64,
    },
    /// It starts in some other mapping (anonymous memory, a file, a device).
    Other {
        /// Start of that mapping.
        start: u64,
        /// End of that mapping.
        end: u64,
        /// Its permissions.
        perms: String,
        /// Its path column (empty for anonymous memory).
        path: String,
    },
    /// Its first byte is not mapped (or the range is empty or wraps around).
    Unmapped,
}

/// A mapping as [`resolve`] needs it (owned: from a text line or from `PROCMAP_QUERY`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vma {
    /// First address.
    pub start: u64,
    /// One past the last address.
    pub end: u64,
    /// `rw-s` and the like.
    pub perms: String,
    /// Offset into the file.
    pub offset: u64,
    /// `st_dev` of the file.
    pub dev: u64,
    /// The device as `major:minor` in hex, for messages.
    pub dev_text: String,
    /// Inode of the file (0 for none).
    pub inode: u64,
    /// Path column.
    pub path: String,
}

impl From<&Mapping<'_>> for Vma {
    fn from(m: &Mapping<'_>) -> Vma {
        Vma {
            start: m.start,
            end: m.end,
            perms: m.perms.to_string(),
            offset: m.offset,
            dev: m.dev(),
            dev_text: format!("{:02x}:{:02x}", m.major, m.minor),
            inode: m.inode,
            path: m.path.to_string(),
        }
    }
}

impl Vma {
    /// Whether this is a CPU mapping of a dma-buf.
    pub fn is_dmabuf(&self) -> bool {
        self.inode != 0 && self.path.starts_with(DMABUF_PREFIX)
    }
}

/// Where `[addr, addr + len)` lies, given the mapping that contains `addr` (`first`, `None` if
/// none does) and a way to get the mapping that starts exactly at an address (`next`).
pub fn resolve(
    first: Option<Vma>,
    mut next: impl FnMut(u64) -> Option<Vma>,
    addr: u64,
    len: u64,
) -> Lookup {
    let Some(last) = len.checked_sub(1).and_then(|l| addr.checked_add(l)) else {
        return Lookup::Unmapped;
    };
    let Some(m) = first.filter(|m| m.start <= addr && addr < m.end) else {
        return Lookup::Unmapped;
    };
    if !m.is_dmabuf() {
        return Lookup::Other {
            start: m.start,
            end: m.end,
            perms: m.perms,
            path: m.path,
        };
    }
    let mut r = DmaBufRange {
        map_start: m.start,
        map_end: m.end,
        map_offset: m.offset,
        first_vma: (m.start, m.end),
        dev: m.dev,
        ino: m.inode,
        dev_text: m.dev_text,
        writable: m.perms.as_bytes().get(1) == Some(&b'w'),
        path: m.path,
        perms: m.perms,
    };
    while last >= r.map_end {
        // A buffer mapped once can still be listed as several mappings (after an mprotect of
        // part of it): adjacent, same file, consecutive offsets.
        match next(r.map_end) {
            Some(n)
                if n.start == r.map_end
                    && n.is_dmabuf()
                    && n.dev == r.dev
                    && n.inode == r.ino
                    && n.offset == r.map_offset + (r.map_end - r.map_start) =>
            {
                r.map_end = n.end;
                r.writable &= n.perms.as_bytes().get(1) == Some(&b'w');
            }
            _ => {
                return Lookup::Partial {
                    path: r.path,
                    map_end: r.map_end,
                }
            }
        }
    }
    Lookup::DmaBuf(r)
}

/// Finds where `[addr, addr + len)` lies, reading `lines` (the maps file, in the kernel's
/// ascending order) only as far as needed.
pub fn lookup<S: AsRef<str>>(lines: impl IntoIterator<Item = S>, addr: u64, len: u64) -> Lookup {
    let mut it = lines.into_iter();
    let mut first = None;
    for line in it.by_ref() {
        let Some(m) = parse_line(line.as_ref()) else {
            continue;
        };
        if m.end <= addr {
            continue;
        }
        first = Some(Vma::from(&m));
        break;
    }
    let next = |at: u64| {
        let line = it.next()?;
        parse_line(line.as_ref())
            .filter(|m| m.start == at)
            .map(|m| Vma::from(&m))
    };
    resolve(first, next, addr, len)
}

/// [`lookup`] on this process's `/proc/self/maps`, reading it line by line and stopping at the
/// range (the kernel generates the text as it is read, so the rest is never produced).
pub fn lookup_self_text(addr: u64, len: u64) -> std::io::Result<Lookup> {
    use std::io::BufRead;
    let f = std::fs::File::open("/proc/self/maps")?;
    let mut r = std::io::BufReader::with_capacity(16384, f);
    let mut err = None;
    let lines = std::iter::from_fn(|| {
        let mut s = String::new();
        match r.read_line(&mut s) {
            Ok(0) => None,
            Ok(_) => Some(s),
            Err(e) => {
                err = Some(e);
                None
            }
        }
    });
    let l = lookup(lines, addr, len);
    match err {
        Some(e) => Err(e),
        None => Ok(l),
    }
}

/// `struct procmap_query` (`include/uapi/linux/fs.h`, Linux 6.11).
#[repr(C)]
#[derive(Default)]
struct ProcmapQuery {
    size: u64,
    query_flags: u64,
    query_addr: u64,
    vma_start: u64,
    vma_end: u64,
    vma_flags: u64,
    vma_page_size: u64,
    vma_offset: u64,
    inode: u64,
    dev_major: u32,
    dev_minor: u32,
    vma_name_size: u32,
    build_id_size: u32,
    vma_name_addr: u64,
    build_id_addr: u64,
}

/// `PROCMAP_QUERY`: `_IOWR('f', 17, struct procmap_query)`.
const PROCMAP_QUERY: u64 =
    (3 << 30) | ((size_of::<ProcmapQuery>() as u64) << 16) | (0x66 << 8) | 17;
/// A name longer than this is not a dma-buf's (`/dmabuf:` and at most 31 bytes of name).
const NAME_MAX: usize = 512;

/// The mapping that contains `addr`, asked of the kernel with `PROCMAP_QUERY` on an open
/// `/proc/self/maps`: `Ok(None)` if none does, `Err` if the kernel does not know the ioctl.
fn query(maps: &std::fs::File, addr: u64) -> std::io::Result<Option<Vma>> {
    use std::os::fd::AsRawFd;
    let mut name = [0u8; NAME_MAX];
    let mut q = ProcmapQuery {
        size: size_of::<ProcmapQuery>() as u64,
        query_addr: addr,
        vma_name_size: NAME_MAX as u32,
        vma_name_addr: name.as_mut_ptr() as u64,
        ..Default::default()
    };
    // SAFETY: the argument is a `struct procmap_query` of the size it declares, with a name
    // buffer of the size it declares.
    let r = unsafe { libc::ioctl(maps.as_raw_fd(), PROCMAP_QUERY as _, &mut q) };
    let path = if r == 0 {
        let n = (q.vma_name_size as usize).saturating_sub(1).min(NAME_MAX);
        String::from_utf8_lossy(&name[..n]).into_owned()
    } else {
        match std::io::Error::last_os_error().raw_os_error() {
            Some(libc::ENOENT) => return Ok(None),
            // Longer than any dma-buf's name: some other file.
            Some(libc::ENAMETOOLONG) => {
                let mut q2 = ProcmapQuery {
                    size: size_of::<ProcmapQuery>() as u64,
                    query_addr: addr,
                    ..Default::default()
                };
                // SAFETY: as above, without a name buffer.
                if unsafe { libc::ioctl(maps.as_raw_fd(), PROCMAP_QUERY as _, &mut q2) } != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                q = q2;
                format!("(a name of more than {NAME_MAX} bytes)")
            }
            _ => return Err(std::io::Error::last_os_error()),
        }
    };
    let f = q.vma_flags;
    let bit = |b: u64, c: char| if f & b != 0 { c } else { '-' };
    Ok(Some(Vma {
        start: q.vma_start,
        end: q.vma_end,
        perms: [
            bit(1, 'r'),
            bit(2, 'w'),
            bit(4, 'x'),
            if f & 8 != 0 { 's' } else { 'p' },
        ]
        .iter()
        .collect(),
        offset: q.vma_offset,
        dev: makedev(q.dev_major, q.dev_minor),
        dev_text: format!("{:02x}:{:02x}", q.dev_major, q.dev_minor),
        inode: q.inode,
        path,
    }))
}

/// This process's `/proc/self/maps`, kept open between lookups (opening it costs more than the
/// query), with what identifies it.
struct MapsFile {
    file: std::fs::File,
    pid: u32,
    ids: (u64, u64),
}

static MAPS_FILE: std::sync::Mutex<Option<MapsFile>> = std::sync::Mutex::new(None);

fn file_ids(f: &std::fs::File) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    f.metadata().ok().map(|m| (m.dev(), m.ino()))
}

/// Runs `f` on an open `/proc/self/maps`: the kept one if it is still this process's and
/// still ours (a fork makes it the parent's; a program that closes fds it does not know may
/// have closed it, and the number may now be another file, which must then not be closed
/// here), else a new one.
fn with_maps_file<T>(f: impl FnOnce(&std::fs::File) -> T) -> std::io::Result<T> {
    let mut kept = MAPS_FILE.lock().unwrap_or_else(|p| p.into_inner());
    let pid = std::process::id();
    if let Some(m) = kept.take() {
        let ids = file_ids(&m.file);
        if m.pid == pid && ids == Some(m.ids) {
            *kept = Some(m);
        } else if ids == Some(m.ids) {
            // Inherited over fork: ours, but the parent's maps.
            drop(m.file);
        } else {
            // The number is no longer ours.
            std::mem::forget(m.file);
        }
    }
    if kept.is_none() {
        let file = std::fs::File::open("/proc/self/maps")?;
        let ids = file_ids(&file).ok_or_else(|| std::io::Error::other("fstat failed"))?;
        *kept = Some(MapsFile { file, pid, ids });
    }
    Ok(f(&kept.as_ref().expect("kept").file))
}

/// [`resolve`] with `PROCMAP_QUERY` (one ioctl per mapping looked at, whatever the number of
/// mappings of the process), or `None` where the kernel lacks it (before 6.11).
pub fn lookup_self_query(addr: u64, len: u64) -> Option<std::io::Result<Lookup>> {
    let r = with_maps_file(|maps| {
        let first = match query(maps, addr) {
            Ok(v) => v,
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTTY | libc::EINVAL)) => return None,
            Err(e) => return Some(Err(e)),
        };
        let next = |at: u64| query(maps, at).ok().flatten();
        Some(Ok(resolve(first, next, addr, len)))
    });
    match r {
        Ok(v) => v,
        Err(e) => Some(Err(e)),
    }
}

/// Where `[addr, addr + len)` lies in this process: `PROCMAP_QUERY` where the kernel has it,
/// else the text of `/proc/self/maps`.
pub fn lookup_self(addr: u64, len: u64) -> std::io::Result<Lookup> {
    lookup_self_query(addr, len).unwrap_or_else(|| lookup_self_text(addr, len))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
55d0c0a00000-55d0c0a21000 r--p 00000000 fe:01 1234567                    /usr/bin/verbs-rdma-write
55d0c1e00000-55d0c1e21000 rw-p 00000000 00:00 0                          [heap]
7f5c0e400000-7f5c0e800000 rw-s 00000000 00:0e 12                         /dmabuf:
7f5c0e800000-7f5c0e900000 rw-s 00100000 00:0e 13                         /dmabuf:camera frame 0
7f5c0e900000-7f5c0ea00000 r--s 00200000 00:0e 13                         /dmabuf:camera frame 0
7f5c0ea00000-7f5c0eb00000 rw-s 00400000 00:0e 13                         /dmabuf:camera frame 0
7f5c0ec00000-7f5c0ec01000 rw-p 00000000 00:00 0 
7ffd1e5f0000-7ffd1e611000 rw-p 00000000 00:00 0                          [stack]
";

    #[test]
    fn parses_a_dmabuf_line() {
        let m = parse_line(
            "7f5c0e400000-7f5c0e800000 rw-s 00000000 00:0e 12                         /dmabuf:",
        )
        .unwrap();
        assert_eq!(m.start, 0x7f5c0e400000);
        assert_eq!(m.end, 0x7f5c0e800000);
        assert_eq!(m.perms, "rw-s");
        assert_eq!((m.major, m.minor, m.inode), (0, 0x0e, 12));
        assert!(Vma::from(&m).is_dmabuf());
        assert_eq!(m.dev(), 0x0e);
    }

    #[test]
    fn parses_names_with_spaces_and_anonymous_lines() {
        let m = parse_line(
            "7f5c0e800000-7f5c0e900000 rw-s 00100000 00:0e 13      /dmabuf:camera frame 0\n",
        )
        .unwrap();
        assert_eq!(m.path, "/dmabuf:camera frame 0");
        assert_eq!(m.offset, 0x100000);
        let a = parse_line("7f5c0ec00000-7f5c0ec01000 rw-p 00000000 00:00 0 ").unwrap();
        assert_eq!(a.path, "");
        assert!(!Vma::from(&a).is_dmabuf());
        assert!(parse_line("garbage").is_none());
        assert!(parse_line("").is_none());
        assert!(parse_line("1000-1000 rw-p 00000000 00:00 0").is_none());
    }

    #[test]
    fn a_file_named_like_a_dmabuf_needs_an_inode_and_prefix() {
        let f = parse_line("1000-2000 rw-s 00000000 fe:01 77 /dmabufs/x").unwrap();
        assert!(!Vma::from(&f).is_dmabuf());
    }

    #[test]
    fn makedev_matches_glibc() {
        // glibc's encoding: minor bits 0-7 and 20-43, major bits 8-19 and 44-63.
        assert_eq!(makedev(0, 0x0e), 0x0e);
        assert_eq!(makedev(8, 1), 0x801);
        assert_eq!(makedev(0xfe, 0x01), 0xfe01);
        assert_eq!(makedev(259, 0x12345), 0x1231_0345);
        assert_eq!(makedev(0x1234, 0), 0x1000_0002_3400);
        // /dev/null is 1:3.
        let st = std::fs::metadata("/dev/null").unwrap();
        assert_eq!(makedev(1, 3), std::os::unix::fs::MetadataExt::rdev(&st));
    }

    #[test]
    fn range_inside_a_dmabuf_mapping() {
        let l = lookup(MAPS.lines(), 0x7f5c0e400000 + 0x1234, 0x10000);
        let Lookup::DmaBuf(r) = l else {
            panic!("{l:?}")
        };
        assert_eq!((r.map_start, r.map_end), (0x7f5c0e400000, 0x7f5c0e800000));
        assert_eq!(r.first_vma, (0x7f5c0e400000, 0x7f5c0e800000));
        assert_eq!((r.dev, r.ino), (0x0e, 12));
        assert_eq!(r.path, "/dmabuf:");
        assert!(r.writable);
        assert_eq!(r.dmabuf_offset(0x7f5c0e400000 + 0x1234), 0x1234);
        // The whole mapping, to its last byte.
        assert!(matches!(
            lookup(MAPS.lines(), 0x7f5c0e400000, 0x400000),
            Lookup::DmaBuf(_)
        ));
    }

    #[test]
    fn offset_of_a_mapping_that_starts_inside_the_buffer() {
        let Lookup::DmaBuf(r) = lookup(MAPS.lines(), 0x7f5c0e800010, 16) else {
            panic!()
        };
        assert_eq!(r.dmabuf_offset(0x7f5c0e800010), 0x100010);
    }

    #[test]
    fn adjacent_mappings_of_the_same_buffer_merge() {
        // 7f5c0e800000-7f5c0e900000 (offset 1 MiB) and 7f5c0e900000-7f5c0ea00000 (offset 2 MiB)
        // are one range of the buffer split by an mprotect.
        let l = lookup(MAPS.lines(), 0x7f5c0e8ff000, 0x2000);
        let Lookup::DmaBuf(r) = l else {
            panic!("{l:?}")
        };
        assert_eq!((r.map_start, r.map_end), (0x7f5c0e800000, 0x7f5c0ea00000));
        assert_eq!(r.first_vma, (0x7f5c0e800000, 0x7f5c0e900000));
        assert_eq!(r.dmabuf_offset(0x7f5c0e8ff000), 0x1ff000);
        // The second part is read-only (r--s): the range is not writable as a whole.
        assert!(!r.writable);
        let Lookup::DmaBuf(w) = lookup(MAPS.lines(), 0x7f5c0e800000, 0x1000) else {
            panic!()
        };
        assert!(w.writable);
        // The next one is adjacent in addresses but maps offset 4 MiB, not 3: not one range.
        let l = lookup(MAPS.lines(), 0x7f5c0e9ff000, 0x2000);
        assert_eq!(
            l,
            Lookup::Partial {
                path: "/dmabuf:camera frame 0".into(),
                map_end: 0x7f5c0ea00000
            }
        );
    }

    #[test]
    fn ranges_that_leave_the_mapping() {
        // Past the end into a hole.
        assert!(matches!(
            lookup(MAPS.lines(), 0x7f5c0eaff000, 0x2000),
            Lookup::Partial { .. }
        ));
        // Past the end into another buffer's mapping.
        assert!(matches!(
            lookup(MAPS.lines(), 0x7f5c0e7ff000, 0x2000),
            Lookup::Partial { .. }
        ));
    }

    #[test]
    fn host_memory_and_holes() {
        let l = lookup(MAPS.lines(), 0x55d0c1e00100, 64);
        assert_eq!(
            l,
            Lookup::Other {
                start: 0x55d0c1e00000,
                end: 0x55d0c1e21000,
                perms: "rw-p".into(),
                path: "[heap]".into()
            }
        );
        assert_eq!(lookup(MAPS.lines(), 0x1000, 64), Lookup::Unmapped);
        assert_eq!(lookup(MAPS.lines(), 0x7f5c0eb00000, 64), Lookup::Unmapped);
        assert_eq!(
            lookup(MAPS.lines(), 0xffff_ffff_ffff_f000, 0),
            Lookup::Unmapped
        );
        assert_eq!(lookup(MAPS.lines(), u64::MAX - 4, 64), Lookup::Unmapped);
        // A range that starts in a hole just before a dma-buf mapping: not the dma-buf's (the
        // real ibv_reg_mr answers for it).
        assert!(matches!(
            lookup(MAPS.lines(), 0x7f5c0e3ff000, 0x2000),
            Lookup::Unmapped
        ));
    }

    #[test]
    fn stops_reading_at_the_range() {
        let mut read = 0;
        let lines = MAPS.lines().inspect(|_| read += 1);
        assert!(matches!(
            lookup(lines, 0x55d0c1e00100, 64),
            Lookup::Other { .. }
        ));
        assert_eq!(read, 2);
    }

    #[test]
    fn this_process_maps_an_anonymous_mapping_as_other() {
        let v = vec![0u8; 1 << 20];
        let l = lookup_self(v.as_ptr() as u64, v.len() as u64).unwrap();
        assert!(matches!(l, Lookup::Other { .. }), "{l:?}");
    }

    #[test]
    fn procmap_query_agrees_with_the_text() {
        let Some(first) = lookup_self_query(0x1000, 1) else {
            eprintln!("this kernel has no PROCMAP_QUERY (before 6.11): only the text is used");
            return;
        };
        assert_eq!(first.unwrap(), Lookup::Unmapped);
        let v = vec![7u8; 3 << 20];
        let stack = 0u64;
        let here = &stack as *const u64 as u64;
        for (addr, len) in [
            (v.as_ptr() as u64, v.len() as u64),
            (v.as_ptr() as u64 + 4096, 100),
            (here, 8),
            (
                this_process_maps_an_anonymous_mapping_as_other as fn() as usize as u64,
                16,
            ),
            (0x1000, 4096),
        ] {
            // Other tests' threads map and unmap meanwhile, and an anonymous mapping next to
            // ours merges with it: the two answers must agree on one of a few tries.
            let mut last = None;
            let agreed = (0..5).any(|_| {
                let q = lookup_self_query(addr, len).unwrap().unwrap();
                let t = lookup_self_text(addr, len).unwrap();
                let same = q == t;
                last = Some((q, t));
                same
            });
            assert!(agreed, "at {addr:#x}+{len}: {last:?}");
        }
    }

    /// A MiB of heap and its address and length, looked up once with PROCMAP_QUERY (which keeps
    /// the maps file open); None where the kernel has no PROCMAP_QUERY.
    fn queried_heap() -> Option<(Vec<u8>, u64, u64)> {
        let v = vec![1u8; 1 << 20];
        let (a, l) = (v.as_ptr() as u64, v.len() as u64);
        lookup_self_query(a, l).map(|_| (v, a, l))
    }

    #[test]
    fn a_kept_maps_file_of_another_process_is_replaced() {
        let Some((_v, a, l)) = queried_heap() else {
            return;
        };
        // As after a fork: the kept file was opened by another pid (here: says it was).
        if let Some(m) = MAPS_FILE.lock().unwrap().as_mut() {
            m.pid = m.pid.wrapping_add(1);
        }
        let r = lookup_self_query(a, l).unwrap().unwrap();
        assert!(matches!(r, Lookup::Other { .. }), "{r:?}");
        assert_eq!(
            MAPS_FILE.lock().unwrap().as_ref().map(|m| m.pid),
            Some(std::process::id())
        );
    }

    #[test]
    fn the_kept_maps_file_is_not_closed_once_its_number_is_someone_elses() {
        use std::os::fd::{AsRawFd, FromRawFd};
        let Some((_v, a, l)) = queried_heap() else {
            return;
        };
        // Another thread's program closes "our" fd and opens something else under its number.
        let g = MAPS_FILE.lock().unwrap();
        let raw = g.as_ref().unwrap().file.as_raw_fd();
        // SAFETY: test: replace the fd number with /dev/null, as a program's dup2 would.
        unsafe {
            let n = libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY);
            assert!(n >= 0);
            assert_eq!(libc::dup2(n, raw), raw);
            libc::close(n);
        }
        drop(g);
        assert!(matches!(
            lookup_self_query(a, l),
            Some(Ok(Lookup::Other { .. }))
        ));
        // The program's /dev/null is still open at that number.
        let st = std::fs::metadata("/dev/null").unwrap();
        // SAFETY: borrow the number to look at it, then hand it back without closing.
        let f = unsafe { std::fs::File::from_raw_fd(raw) };
        use std::os::unix::fs::MetadataExt;
        assert_eq!(f.metadata().unwrap().rdev(), st.rdev());
        std::mem::forget(f);
    }
}
