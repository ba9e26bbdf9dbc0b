//! Parsing `/proc/<pid>/fdinfo/<fd>` of a dma-buf.
//!
//! The kernel writes the generic fields (`pos`, `flags` in octal, `mnt_id`,
//! `ino`) and then, for a dma-buf, `dma_buf_show_fdinfo()` in
//! `drivers/dma-buf/dma-buf.c` adds `size`, `count`, `exp_name` and, when
//! the buffer was named with `DMA_BUF_SET_NAME`, `name` (key and value are
//! separated by `:` and a tab):
//!
//! ```text
//! pos: 0
//! flags: 02000002
//! mnt_id: 15
//! ino: 1055
//! size: 2097152
//! count: 1
//! exp_name: nv_dmabuf
//! ```
//!
//! A dma-buf is recognised by `exp_name` and `size`; anything else is
//! rejected with [`Error::NotDmaBuf`].

use std::collections::BTreeMap;
use std::path::Path;

use serde::Serialize;

use crate::error::{Error, Result};

/// What fdinfo says about a dma-buf.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DmaBufInfo {
    /// Size in bytes (`size:`).
    pub size: u64,
    /// Name of the exporter (`exp_name:`), e.g. `nv_dmabuf`, `udmabuf`.
    pub exporter: String,
    /// Number of references to the file (`count:`), if present.
    pub count: Option<u64>,
    /// Name given with `DMA_BUF_SET_NAME` (`name:`), if any.
    pub name: Option<String>,
    /// File position (`pos:`).
    pub pos: Option<u64>,
    /// Open flags (`flags:`, printed in octal by the kernel).
    pub flags: Option<u32>,
    /// Mount id (`mnt_id:`).
    pub mnt_id: Option<u64>,
    /// Inode number in the dma-buf filesystem (`ino:`): the same buffer has
    /// the same inode in every process, which is how to tell two fds refer
    /// to one buffer.
    pub ino: Option<u64>,
    /// Every other `key: value` line, as written.
    pub other: BTreeMap<String, String>,
}

impl DmaBufInfo {
    /// The surface described by the buffer's name (`name:`), if the name is a surface
    /// description (see [`crate::surface`]); `Some(Err)` when it looks like one but is not
    /// valid.
    pub fn surface(&self) -> Option<Result<crate::surface::Surface>> {
        self.name
            .as_deref()
            .and_then(crate::surface::Surface::from_name)
    }

    /// Parse fdinfo text. `source_name` names where it came from, for
    /// error messages.
    ///
    /// Over 100 lines on purpose: one pass over the lines, then each field taken out of the map
    /// with its own error; split, each piece would take the map and the source's name.
    pub fn parse(text: &str, source_name: &str) -> Result<Self> {
        let mut fields: BTreeMap<String, (usize, String)> = BTreeMap::new();
        for (i, raw) in text.lines().enumerate() {
            let line = raw.trim_end();
            if line.is_empty() {
                continue;
            }
            let Some((key, value)) = line.split_once(':') else {
                return Err(Error::Fdinfo {
                    source_name: source_name.to_string(),
                    line: i + 1,
                    reason: format!("expected `key: value`, got {line:?}"),
                });
            };
            let key = key.trim();
            if key.is_empty() {
                return Err(Error::Fdinfo {
                    source_name: source_name.to_string(),
                    line: i + 1,
                    reason: format!("empty key in {line:?}"),
                });
            }
            // First occurrence wins; later repeats (e.g. several `lock:`
            // lines) go to `other` with a suffix so nothing is lost.
            let mut k = key.to_string();
            let mut n = 1;
            while fields.contains_key(&k) {
                n += 1;
                k = format!("{key}#{n}");
            }
            fields.insert(k, (i + 1, value.trim().to_string()));
        }

        let missing: Vec<&str> = ["exp_name", "size"]
            .into_iter()
            .filter(|k| !fields.contains_key(*k))
            .collect();
        if !missing.is_empty() {
            let keys: Vec<&str> = fields.keys().map(String::as_str).collect();
            return Err(Error::NotDmaBuf {
                what: format!("reading {source_name}"),
                detail: format!(
                    "fdinfo has no {} line (it has: {})",
                    missing.join(" or "),
                    if keys.is_empty() {
                        "nothing".to_string()
                    } else {
                        keys.join(", ")
                    }
                ),
                check: Some(
                    "pass a dma-buf fd (from an exporter: CUDA, udmabuf, DRM PRIME, vfio-pci, the p2pbuf exporter)"
                        .into(),
                ),
            });
        }

        let num = |key: &str, radix: u32| -> Result<Option<u64>> {
            match fields.get(key) {
                None => Ok(None),
                Some((line, v)) => {
                    u64::from_str_radix(v, radix)
                        .map(Some)
                        .map_err(|e| Error::Fdinfo {
                            source_name: source_name.to_string(),
                            line: *line,
                            reason: format!("{key}: {v:?} is not a base-{radix} number: {e}"),
                        })
                }
            }
        };

        let size = num("size", 10)?.expect("checked above");
        let count = num("count", 10)?;
        let pos = num("pos", 10)?;
        let mnt_id = num("mnt_id", 10)?;
        let ino = num("ino", 10)?;
        let flags = match num("flags", 8)? {
            None => None,
            Some(f) => Some(u32::try_from(f).map_err(|_| Error::Fdinfo {
                source_name: source_name.to_string(),
                line: fields["flags"].0,
                reason: format!("flags: {f:o} does not fit in 32 bits"),
            })?),
        };
        let exporter = fields["exp_name"].1.clone();
        if exporter.is_empty() {
            return Err(Error::Fdinfo {
                source_name: source_name.to_string(),
                line: fields["exp_name"].0,
                reason: "exp_name is empty".into(),
            });
        }
        let name = fields
            .get("name")
            .map(|(_, v)| v.clone())
            .filter(|v| !v.is_empty());

        const KNOWN: [&str; 8] = [
            "size", "count", "exp_name", "name", "pos", "flags", "mnt_id", "ino",
        ];
        let other = fields
            .into_iter()
            .filter(|(k, _)| !KNOWN.contains(&k.as_str()))
            .map(|(k, (_, v))| (k, v))
            .collect();

        Ok(DmaBufInfo {
            size,
            exporter,
            count,
            name,
            pos,
            flags,
            mnt_id,
            ino,
            other,
        })
    }

    /// Read and parse an fdinfo file, e.g. `/proc/1234/fdinfo/5`.
    pub fn read(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| Error::Io {
            what: "reading fdinfo".into(),
            path: path.to_path_buf(),
            check: Some(match e.kind() {
                std::io::ErrorKind::NotFound => {
                    "is the fd open in that process (ls -l /proc/<pid>/fd)?".into()
                }
                std::io::ErrorKind::PermissionDenied => {
                    "fdinfo of another user's process needs the same uid or CAP_SYS_PTRACE".into()
                }
                _ => "is /proc mounted?".into(),
            }),
            source: e,
        })?;
        Self::parse(&text, &path.display().to_string())
    }

    /// Whether the fd was opened for writing (`O_RDWR` or `O_WRONLY` in
    /// `flags`), if the flags are known.
    pub fn writable(&self) -> Option<bool> {
        self.flags.map(|f| f & 0o3 != 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NV: &str = "pos:\t0\nflags:\t02000002\nmnt_id:\t15\nino:\t1055\nsize:\t2097152\ncount:\t1\nexp_name:\tnv_dmabuf\n";

    #[test]
    fn parses_nv_dmabuf() {
        let i = DmaBufInfo::parse(NV, "t").unwrap();
        assert_eq!(i.size, 2 * 1024 * 1024);
        assert_eq!(i.exporter, "nv_dmabuf");
        assert_eq!(i.count, Some(1));
        assert_eq!(i.pos, Some(0));
        assert_eq!(i.flags, Some(0o2000002));
        assert_eq!(i.writable(), Some(true));
        assert_eq!(i.mnt_id, Some(15));
        assert_eq!(i.ino, Some(1055));
        assert_eq!(i.name, None);
        assert!(i.other.is_empty());
    }

    #[test]
    fn parses_name_and_unknown_fields() {
        let t = "pos:\t0\nflags:\t02000000\nmnt_id:\t9\nino:\t7\nsize:\t4096\ncount:\t3\nexp_name:\tudmabuf\nname:\tframe 0\nfuture_field:\tx y\n";
        let i = DmaBufInfo::parse(t, "t").unwrap();
        assert_eq!(i.exporter, "udmabuf");
        assert_eq!(i.name.as_deref(), Some("frame 0"));
        assert_eq!(i.writable(), Some(false));
        assert_eq!(i.other.get("future_field").map(String::as_str), Some("x y"));
    }

    /// The surface of the fdinfo text `t` (None: its name describes none).
    fn surface_of(t: &str) -> Option<Result<crate::surface::Surface>> {
        DmaBufInfo::parse(t, "t").unwrap().surface()
    }

    #[test]
    fn surface_from_the_name() {
        let t = "size:\t8388608\nexp_name:\tp2pbuf\nname:\ts:1920x1080.XR24.7680.L\n";
        let s = surface_of(t).unwrap().unwrap();
        assert_eq!((s.width, s.height, s.size), (1920, 1080, 8294400));
        let t = "size:\t4096\nexp_name:\tudmabuf\nname:\tframe 0\n";
        assert!(surface_of(t).is_none());
        let t = "size:\t4096\nexp_name:\tudmabuf\nname:\ts:1x1.XR24.2.L\n";
        let e = surface_of(t).unwrap().unwrap_err();
        assert!(
            e.to_string()
                .contains("stride 2 is less than a row's 4 bytes"),
            "{e}"
        );
        let t = "size:\t4096\nexp_name:\tudmabuf\n";
        assert!(surface_of(t).is_none());
    }

    #[test]
    fn empty_name_is_none() {
        let t = "size:\t4096\nexp_name:\tudmabuf\nname:\t\n";
        let i = DmaBufInfo::parse(t, "t").unwrap();
        assert_eq!(i.name, None);
        assert_eq!(i.flags, None);
        assert_eq!(i.writable(), None);
    }

    #[test]
    fn tolerates_spaces_and_crlf() {
        let t = "size:   8192  \r\nexp_name:  p2pbuf \r\n\r\n";
        let i = DmaBufInfo::parse(t, "t").unwrap();
        assert_eq!(i.size, 8192);
        assert_eq!(i.exporter, "p2pbuf");
    }

    #[test]
    fn repeated_keys_are_kept() {
        let t = "size:\t1\nexp_name:\tx\nlock:\ta\nlock:\tb\n";
        let i = DmaBufInfo::parse(t, "t").unwrap();
        assert_eq!(i.other["lock"], "a");
        assert_eq!(i.other["lock#2"], "b");
    }

    #[test]
    fn regular_file_is_not_a_dmabuf() {
        let t = "pos:\t0\nflags:\t0100002\nmnt_id:\t25\nino:\t3\n";
        let e = DmaBufInfo::parse(t, "/proc/self/fdinfo/3").unwrap_err();
        assert!(matches!(e, Error::NotDmaBuf { .. }), "{e:?}");
        let s = e.to_string();
        assert!(s.contains("not a dma-buf"), "{s}");
        assert!(s.contains("exp_name or size"), "{s}");
        assert!(s.contains("/proc/self/fdinfo/3"), "{s}");
        assert!(e.check().is_some());
    }

    #[test]
    fn empty_text_is_not_a_dmabuf() {
        let e = DmaBufInfo::parse("", "t").unwrap_err();
        assert!(e.to_string().contains("it has: nothing"), "{e}");
    }

    #[test]
    fn size_without_exporter_is_rejected() {
        let e = DmaBufInfo::parse("size:\t4096\n", "t").unwrap_err();
        assert!(matches!(e, Error::NotDmaBuf { .. }));
        assert!(e.to_string().contains("no exp_name line"), "{e}");
    }

    #[test]
    fn bad_size_names_the_line() {
        let e = DmaBufInfo::parse("exp_name:\tx\nsize:\tbig\n", "f").unwrap_err();
        match e {
            Error::Fdinfo { line, reason, .. } => {
                assert_eq!(line, 2);
                assert!(reason.contains("size"), "{reason}");
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    /// The line of `text` that parsing refuses.
    fn bad_line(text: &str) -> usize {
        match DmaBufInfo::parse(text, "f").unwrap_err() {
            Error::Fdinfo { line, .. } => line,
            e => panic!("unexpected {e:?}"),
        }
    }

    #[test]
    fn flags_are_octal() {
        assert_eq!(bad_line("exp_name:\tx\nsize:\t1\nflags:\t089\n"), 3);
    }

    #[test]
    fn line_without_colon_is_an_error() {
        assert_eq!(bad_line("exp_name:\tx\nsize:\t1\ngarbage\n"), 3);
    }

    #[test]
    fn empty_exporter_is_an_error() {
        assert_eq!(bad_line("exp_name:\t\nsize:\t1\n"), 1);
    }

    #[test]
    fn read_missing_file_keeps_errno_and_check() {
        let e = DmaBufInfo::read("/proc/self/fdinfo/999999").unwrap_err();
        assert_eq!(e.errno(), Some(2));
        assert!(e.check().unwrap().contains("fd open"));
    }

    #[test]
    fn read_real_fdinfo_of_a_regular_file() {
        let f = std::fs::File::open("/proc/self/status").unwrap();
        use std::os::fd::AsRawFd;
        let e = DmaBufInfo::read(format!("/proc/self/fdinfo/{}", f.as_raw_fd())).unwrap_err();
        assert!(matches!(e, Error::NotDmaBuf { .. }), "{e:?}");
    }

    #[test]
    fn serializes_to_json() {
        let i = DmaBufInfo::parse(NV, "t").unwrap();
        let v = serde_json::to_value(&i).unwrap();
        assert_eq!(v["exporter"], "nv_dmabuf");
        assert_eq!(v["size"], 2097152);
    }
}
