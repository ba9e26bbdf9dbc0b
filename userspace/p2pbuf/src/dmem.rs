//! The dmem cgroup controller as this process sees it: how much of a p2pbuf provider's BAR
//! its cgroup holds, and the limits that apply.
//!
//! The exporter registers each provider's BAR as a region of the dmem controller, named
//! `p2pbuf/<PCI address>/bar<N>` ([`region_name`]), and charges every buffer to the dmem
//! cgroup of the allocating process; over a `dmem.max` (of that cgroup or of an ancestor)
//! `P2PBUF_IOCTL_ALLOC` fails with `ENOSPC`. The files are those of cgroup v2
//! (`Documentation/admin-guide/cgroup-v2.rst`, "DMEM"): `dmem.current` and `dmem.max` hold
//! one `REGION BYTES` line per region (`REGION max` for no limit).
//!
//! Everything here is pure text parsing or reads files under a root given by the caller
//! ([`Dmem::at`]), so it is tested on a directory tree; [`Dmem::of_this_process`] reads
//! `/proc/self/cgroup` and `/proc/self/mountinfo`.
//!
//! ```
//! use p2pbuf::dmem::{parse_regions, region_name, Limit};
//! assert_eq!(region_name("0000:01:00.0", 2), "p2pbuf/0000:01:00.0/bar2");
//! let max = parse_regions("p2pbuf/0000:01:00.0/bar2 1073741824\ndrm/0000:03:00.0/vram0 max\n");
//! assert_eq!(max[1], ("drm/0000:03:00.0/vram0".to_string(), Limit::Max));
//! ```

use std::fmt;
use std::path::PathBuf;

use serde::{Serialize, Serializer};

use crate::units::human_size;

/// This process's cgroups.
pub const PROC_SELF_CGROUP: &str = "/proc/self/cgroup";
/// This process's mounts.
pub const PROC_SELF_MOUNTINFO: &str = "/proc/self/mountinfo";

/// The dmem region of a provider: `p2pbuf/<PCI address>/bar<N>`.
pub fn region_name(pci_name: &str, bar: u32) -> String {
    format!("p2pbuf/{pci_name}/bar{bar}")
}

/// What to do when `P2PBUF_IOCTL_ALLOC` answers `ENOSPC` for `region`.
pub fn enospc_check(region: &str) -> String {
    format!(
        "ENOSPC: the dmem.max for {region} of this process's cgroup (or of an ancestor) is \
         reached: see `p2pbuf info`, free buffers or raise the limit"
    )
}

/// A value of `dmem.max` (also `dmem.min`, `dmem.low`): bytes, or no limit.
///
/// Ordered with every byte count below [`Limit::Max`], so the smallest of several limits is
/// their `min()`. JSON: a number, or the string `"max"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Limit {
    /// At most this many bytes.
    Bytes(u64),
    /// No limit (`max` in the file).
    Max,
}

impl Limit {
    /// Parse `1073741824` or `max`.
    pub fn parse(s: &str) -> Option<Limit> {
        match s.trim() {
            "max" => Some(Limit::Max),
            t => t.parse().ok().map(Limit::Bytes),
        }
    }
}

impl fmt::Display for Limit {
    /// `max`, or [`human_size`].
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Limit::Bytes(n) => f.write_str(&human_size(*n)),
            Limit::Max => f.write_str("max"),
        }
    }
}

impl Serialize for Limit {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Limit::Bytes(n) => s.serialize_u64(*n),
            Limit::Max => s.serialize_str("max"),
        }
    }
}

/// The `REGION VALUE` lines of a dmem file (`dmem.capacity`, `dmem.current`, `dmem.max`, ...),
/// in file order. Lines that do not have that form are skipped.
pub fn parse_regions(text: &str) -> Vec<(String, Limit)> {
    text.lines()
        .filter_map(|l| {
            let (region, value) = l.trim().rsplit_once(char::is_whitespace)?;
            Some((region.trim_end().to_string(), Limit::parse(value)?))
        })
        .collect()
}

/// The value of `region` in a dmem file's text, if listed.
pub fn region_value(text: &str, region: &str) -> Option<Limit> {
    parse_regions(text)
        .into_iter()
        .find(|(r, _)| r == region)
        .map(|(_, v)| v)
}

/// The cgroup v2 path in the text of `/proc/PID/cgroup` (its `0::/PATH` line), e.g.
/// `/user.slice/tenant-a`. None without one (cgroup v1 only).
pub fn parse_proc_cgroup(text: &str) -> Option<String> {
    text.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(|p| p.trim_end().to_string())
}

/// A cgroup2 mount from `/proc/PID/mountinfo`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cgroup2Mount {
    /// The cgroup mounted there (mountinfo's root field): `/` for the whole hierarchy.
    pub root: String,
    /// Where it is mounted, usually `/sys/fs/cgroup`.
    pub mount_point: PathBuf,
}

/// The first cgroup2 mount in the text of `/proc/PID/mountinfo` (one whose root is `/` if
/// there is one). Fields: `ID PARENT MAJ:MIN ROOT MOUNT_POINT OPTIONS [OPTIONAL...] - FSTYPE
/// SOURCE SUPER_OPTIONS`, with spaces in paths written as `\040`.
pub fn parse_mountinfo_cgroup2(text: &str) -> Option<Cgroup2Mount> {
    let mounts: Vec<Cgroup2Mount> = text
        .lines()
        .filter_map(|l| {
            let (before, after) = l.split_once(" - ")?;
            if after.split_whitespace().next()? != "cgroup2" {
                return None;
            }
            let f: Vec<&str> = before.split_whitespace().collect();
            Some(Cgroup2Mount {
                root: unescape_mountinfo(f.get(3)?),
                mount_point: PathBuf::from(unescape_mountinfo(f.get(4)?)),
            })
        })
        .collect();
    let whole = mounts.iter().position(|m| m.root == "/").unwrap_or(0);
    mounts.into_iter().nth(whole)
}

/// mountinfo's octal escapes (`\040` space, `\011` tab, `\012` newline, `\134` backslash).
fn unescape_mountinfo(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') as u32 * 64
                + (b[i + 2] - b'0') as u32 * 8
                + (b[i + 3] - b'0') as u32;
            if let Ok(v) = u8::try_from(v) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Why no dmem figures can be given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotAvailable {
    /// No cgroup2 mount, no cgroup v2 line for this process, or no `dmem.current` in its
    /// cgroup nor in any ancestor: the kernel lacks `CONFIG_CGROUP_DMEM`.
    NoController,
    /// The controller is there but does not list the region (a p2pbuf module that does not
    /// register its BARs, or a provider bound before it did).
    RegionNotListed {
        /// The region looked for.
        region: String,
        /// The `dmem.current` file read.
        file: PathBuf,
    },
}

impl fmt::Display for NotAvailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotAvailable::NoController => f.write_str(
                "not available (kernel without CONFIG_CGROUP_DMEM, or cgroup2 not mounted)",
            ),
            NotAvailable::RegionNotListed { region, file } => write!(
                f,
                "not available ({} does not list region {region}: a p2pbuf module without dmem cgroup support?)",
                file.display()
            ),
        }
    }
}

/// A cgroup v2 hierarchy and the cgroup to look at in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dmem {
    /// The directory of the hierarchy's root cgroup (the cgroup2 mount point).
    pub mount: PathBuf,
    /// The cgroup, as `/proc/self/cgroup` names it (`/` is the root).
    pub cgroup: String,
}

/// How much of a region a cgroup holds, and its limits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DmemUsage {
    /// The region, `p2pbuf/<PCI address>/bar<N>`.
    pub region: String,
    /// The process's cgroup (`/proc/self/cgroup`).
    pub process_cgroup: String,
    /// The cgroup charged: the process's own, or the nearest ancestor that has the dmem
    /// controller enabled (its parent's `cgroup.subtree_control` lists `dmem`), else `/`.
    pub cgroup: String,
    /// Bytes of the region charged to `cgroup` and its descendants (`dmem.current`).
    pub current: u64,
    /// `dmem.max` of `cgroup` (`max` for the root cgroup, which has no such file).
    pub max: Limit,
    /// The smallest `dmem.max` of `cgroup` and its ancestors: what an allocation can reach.
    pub effective_max: Limit,
    /// The cgroup whose `dmem.max` is `effective_max` (null: no limit anywhere).
    pub limited_by: Option<String>,
}

impl Dmem {
    /// The hierarchy mounted at `mount` and `cgroup` in it (a path such as `/tenant-a`).
    pub fn at(mount: impl Into<PathBuf>, cgroup: impl Into<String>) -> Dmem {
        Dmem {
            mount: mount.into(),
            cgroup: cgroup.into(),
        }
    }

    /// From the texts of `/proc/self/cgroup` and `/proc/self/mountinfo`: the cgroup2 mount
    /// and this process's cgroup, with the mount's root taken off the cgroup's path.
    pub fn from_proc(proc_cgroup: &str, mountinfo: &str) -> Result<Dmem, NotAvailable> {
        let path = parse_proc_cgroup(proc_cgroup).ok_or(NotAvailable::NoController)?;
        let m = parse_mountinfo_cgroup2(mountinfo).ok_or(NotAvailable::NoController)?;
        let root = m.root.trim_end_matches('/');
        let cgroup = match path.strip_prefix(root) {
            Some("") => "/".to_string(),
            Some(rest) if rest.starts_with('/') => rest.to_string(),
            _ => path,
        };
        Ok(Dmem::at(m.mount_point, cgroup))
    }

    /// [`Dmem::from_proc`] of this process.
    pub fn of_this_process() -> Result<Dmem, NotAvailable> {
        let read = |p: &str| std::fs::read_to_string(p).map_err(|_| NotAvailable::NoController);
        Dmem::from_proc(&read(PROC_SELF_CGROUP)?, &read(PROC_SELF_MOUNTINFO)?)
    }

    /// The cgroup and its ancestors, nearest first, ending with `/`.
    fn lineage(&self) -> Vec<String> {
        let parts: Vec<&str> = self.cgroup.split('/').filter(|p| !p.is_empty()).collect();
        (0..=parts.len())
            .rev()
            .map(|n| format!("/{}", parts[..n].join("/")))
            .collect()
    }

    fn dir(&self, cgroup: &str) -> PathBuf {
        self.mount.join(cgroup.trim_start_matches('/'))
    }

    /// The use and limits of `region` for the cgroup.
    pub fn usage(&self, region: &str) -> Result<DmemUsage, NotAvailable> {
        let lineage = self.lineage();
        let read = |cg: &str, file: &str| std::fs::read_to_string(self.dir(cg).join(file)).ok();
        // The cgroup charged: the nearest with the controller's files.
        let (at, current_text) = lineage
            .iter()
            .enumerate()
            .find_map(|(i, cg)| read(cg, "dmem.current").map(|t| (i, t)))
            .ok_or(NotAvailable::NoController)?;
        let cgroup = &lineage[at];
        let current = match region_value(&current_text, region) {
            Some(Limit::Bytes(n)) => n,
            _ => {
                return Err(NotAvailable::RegionNotListed {
                    region: region.to_string(),
                    file: self.dir(cgroup).join("dmem.current"),
                })
            }
        };
        let max_of = |cg: &str| {
            read(cg, "dmem.max")
                .and_then(|t| region_value(&t, region))
                .unwrap_or(Limit::Max)
        };
        let max = max_of(cgroup);
        let (effective_max, limited_by) = lineage[at..]
            .iter()
            .map(|cg| (max_of(cg), cg))
            .min_by_key(|(l, _)| *l)
            .map(|(l, cg)| (l, (l != Limit::Max).then(|| cg.clone())))
            .unwrap_or((Limit::Max, None));
        Ok(DmemUsage {
            region: region.to_string(),
            process_cgroup: self.cgroup.clone(),
            cgroup: cgroup.clone(),
            current,
            max,
            effective_max,
            limited_by,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    const REGION: &str = "p2pbuf/0000:01:00.0/bar2";
    const OTHER: &str = "p2pbuf/0000:02:00.0/bar0";

    fn tmpdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("p2pbuf-dmem-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn write(root: &Path, cgroup: &str, file: &str, text: &str) {
        let d = root.join(cgroup.trim_start_matches('/'));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join(file), text).unwrap();
    }

    #[test]
    fn proc_cgroup_v2_line() {
        assert_eq!(
            parse_proc_cgroup("0::/user.slice/tenant-a\n").as_deref(),
            Some("/user.slice/tenant-a")
        );
        // Hybrid: v1 hierarchies first.
        let hybrid = "12:memory:/user.slice\n1:name=systemd:/user.slice\n0::/tenant-b\n";
        assert_eq!(parse_proc_cgroup(hybrid).as_deref(), Some("/tenant-b"));
        assert_eq!(parse_proc_cgroup("0::/\n").as_deref(), Some("/"));
        assert_eq!(parse_proc_cgroup("4:cpu:/\n"), None);
    }

    #[test]
    fn mountinfo_cgroup2_line() {
        let mi = "22 1 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw\n\
                  25 23 0:23 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n";
        assert_eq!(
            parse_mountinfo_cgroup2(mi),
            Some(Cgroup2Mount {
                root: "/".into(),
                mount_point: "/sys/fs/cgroup".into()
            })
        );
        // No optional fields, an escaped space, and a sub-tree mount listed first.
        let mi = "30 1 0:23 /tenant /srv/t rw - cgroup2 none rw\n\
                  31 1 0:23 / /mnt/cg\\0402 rw - cgroup2 none rw\n";
        assert_eq!(
            parse_mountinfo_cgroup2(mi).unwrap().mount_point,
            PathBuf::from("/mnt/cg 2")
        );
        assert_eq!(
            parse_mountinfo_cgroup2("22 1 0:21 / /proc rw - proc proc rw\n"),
            None
        );
        let d = Dmem::from_proc(
            "0::/tenant/job\n",
            "30 1 0:23 /tenant /srv/t rw - cgroup2 none rw\n",
        )
        .unwrap();
        assert_eq!(d, Dmem::at("/srv/t", "/job"));
    }

    #[test]
    fn dmem_files_with_several_regions() {
        let t = format!("drm/0000:03:00.0/vram0 8514437120\n{REGION} 33554432\n{OTHER} max\n");
        let v = parse_regions(&t);
        assert_eq!(v.len(), 3);
        assert_eq!(region_value(&t, REGION), Some(Limit::Bytes(32 << 20)));
        assert_eq!(region_value(&t, OTHER), Some(Limit::Max));
        assert_eq!(region_value(&t, "p2pbuf/0000:09:00.0/bar0"), None);
        assert!(parse_regions("garbage\n\n").is_empty());
        assert!(Limit::Bytes(u64::MAX) < Limit::Max);
        assert!(enospc_check(REGION).contains("dmem.max for p2pbuf/0000:01:00.0/bar2"));
        assert_eq!(serde_json::to_string(&Limit::Max).unwrap(), "\"max\"");
        assert_eq!(serde_json::to_string(&Limit::Bytes(7)).unwrap(), "7");
    }

    #[test]
    fn max_and_current_of_one_cgroup() {
        let root = tmpdir("one");
        write(
            &root,
            "/",
            "dmem.capacity",
            &format!("{REGION} 1073741824\n"),
        );
        write(&root, "/", "dmem.current", &format!("{REGION} 67108864\n"));
        write(
            &root,
            "/t",
            "dmem.current",
            &format!("{REGION} 33554432\n{OTHER} 0\n"),
        );
        write(
            &root,
            "/t",
            "dmem.max",
            &format!("{REGION} max\n{OTHER} 4096\n"),
        );
        let u = Dmem::at(&root, "/t").usage(REGION).unwrap();
        assert_eq!(
            (u.current, u.max, u.effective_max, u.limited_by.as_deref()),
            (32 << 20, Limit::Max, Limit::Max, None)
        );
        let u = Dmem::at(&root, "/t").usage(OTHER).unwrap();
        assert_eq!(
            (u.max, u.effective_max, u.limited_by.as_deref()),
            (Limit::Bytes(4096), Limit::Bytes(4096), Some("/t"))
        );
        std::fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn missing_region_or_controller() {
        let root = tmpdir("missing");
        assert_eq!(
            Dmem::at(&root, "/t").usage(REGION),
            Err(NotAvailable::NoController)
        );
        write(&root, "/", "dmem.current", "drm/0000:03:00.0/vram0 0\n");
        let e = Dmem::at(&root, "/t").usage(REGION).unwrap_err();
        assert!(matches!(e, NotAvailable::RegionNotListed { .. }), "{e:?}");
        assert!(e.to_string().contains(REGION), "{e}");
        assert!(NotAvailable::NoController
            .to_string()
            .contains("CONFIG_CGROUP_DMEM"));
        std::fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn nested_cgroups_effective_limit_from_an_ancestor() {
        let root = tmpdir("nested");
        write(&root, "/", "dmem.current", &format!("{REGION} 100663296\n"));
        write(
            &root,
            "/tenants",
            "dmem.current",
            &format!("{REGION} 100663296\n"),
        );
        write(
            &root,
            "/tenants",
            "dmem.max",
            &format!("{REGION} 268435456\n"),
        );
        write(
            &root,
            "/tenants/a",
            "dmem.current",
            &format!("{REGION} 67108864\n"),
        );
        write(
            &root,
            "/tenants/a",
            "dmem.max",
            &format!("{REGION} 1073741824\n"),
        );
        write(
            &root,
            "/tenants/a/job",
            "dmem.current",
            &format!("{REGION} 33554432\n"),
        );
        write(
            &root,
            "/tenants/a/job",
            "dmem.max",
            &format!("{REGION} max\n"),
        );
        let u = Dmem::at(&root, "/tenants/a/job").usage(REGION).unwrap();
        assert_eq!(u.cgroup, "/tenants/a/job");
        assert_eq!(u.current, 32 << 20);
        assert_eq!(u.max, Limit::Max);
        assert_eq!(u.effective_max, Limit::Bytes(256 << 20));
        assert_eq!(u.limited_by.as_deref(), Some("/tenants"));
        // A leaf without the controller enabled: charged to its parent.
        std::fs::create_dir_all(root.join("tenants/a/job/sub")).unwrap();
        let u = Dmem::at(&root, "/tenants/a/job/sub").usage(REGION).unwrap();
        assert_eq!(u.cgroup, "/tenants/a/job");
        assert_eq!(u.process_cgroup, "/tenants/a/job/sub");
        assert_eq!(u.effective_max, Limit::Bytes(256 << 20));
        // The root cgroup: no dmem.max, no limit.
        let u = Dmem::at(&root, "/").usage(REGION).unwrap();
        assert_eq!(
            (u.max, u.effective_max, u.limited_by),
            (Limit::Max, Limit::Max, None)
        );
        std::fs::remove_dir_all(root).unwrap();
    }
}
