//! Checks made from the host after a VM run, on the files backing the emulated devices: what
//! the guest wrote into device memory must be in the memory-backend-file at the same offset.

use crate::ktap::{Parser, Status};
use crate::vm::VmFiles;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};

/// A host-side check: (name, status, note).
pub type Check = (String, Status, String);

fn read_at(path: &std::path::Path, off: u64, len: usize) -> std::io::Result<Vec<u8>> {
    let mut f = File::open(path)?;
    f.seek(SeekFrom::Start(off))?;
    let mut buf = vec![0u8; len];
    f.read_exact(&mut buf)?;
    Ok(buf)
}

/// Which backing file a host check reads.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
pub enum Target {
    /// The emulated GPU memory (ivshmem BAR2): offsets are BAR offsets.
    Gpu,
    /// The NVMe namespace: offsets are byte offsets on the drive.
    Nvme,
}

/// A `# hostcheck target=gpu|nvme offset=X len=N seed=S` request printed by an in-VM test:
/// the `len` bytes at `offset` must hold the test pattern for `seed`.
#[derive(Debug, PartialEq, Eq)]
pub struct Request {
    pub target: Target,
    pub offset: u64,
    pub len: usize,
    pub seed: u32,
}

pub fn parse_request(line: &str) -> Option<Request> {
    let rest = &line[line.find("hostcheck target=")? + "hostcheck ".len()..];
    let (mut target, mut offset, mut len, mut seed) = (None, None, None, None);
    for kv in rest.split_whitespace() {
        match kv.split_once('=')? {
            ("target", "gpu") => target = Some(Target::Gpu),
            ("target", "nvme") => target = Some(Target::Nvme),
            ("offset", v) => offset = v.parse().ok(),
            ("len", v) => len = v.parse().ok(),
            ("seed", v) => seed = v.parse().ok(),
            _ => {}
        }
    }
    Some(Request {
        target: target?,
        offset: offset?,
        len: len?,
        seed: seed?,
    })
}

/// The pattern of the in-VM tests (`pat` in tests/selftests/*.c).
fn exporter_pattern(i: usize, seed: u32) -> u8 {
    (i.wrapping_mul(13)
        .wrapping_add(seed as usize)
        .wrapping_add(i >> 12)) as u8
}

/// Runs the host checks that the in-VM tests asked for.
pub fn checks(p: &Parser, files: &VmFiles) -> Vec<Check> {
    let mut out = vec![];
    for req in p.lines.iter().filter_map(|l| parse_request(l)) {
        let (file, what) = match req.target {
            Target::Gpu => (
                &files.gpu_mem,
                "ivshmem (GPU memory) backing file at BAR offset",
            ),
            Target::Nvme => (&files.nvme, "NVMe backing file at offset"),
        };
        let name = format!(
            "host: {} bytes written in the guest are in the {what} {:#x}",
            req.len, req.offset
        );
        let want = |i: usize| exporter_pattern(i, req.seed);
        let check = match read_at(file, req.offset, req.len) {
            Ok(buf) => match (0..req.len).find(|&i| buf[i] != want(i)) {
                None => (name, Status::Pass, String::new()),
                Some(i) => {
                    let note = format!("byte {i} is {:#04x}, want {:#04x}", buf[i], want(i));
                    (name, Status::Fail, note)
                }
            },
            Err(e) => (
                name,
                Status::Fail,
                format!("cannot read {}: {e}", file.display()),
            ),
        };
        out.push(check);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_hostcheck_requests() {
        assert_eq!(
            parse_request("    # hostcheck target=gpu offset=4194304 len=4096 seed=7"),
            Some(Request {
                target: Target::Gpu,
                offset: 4194304,
                len: 4096,
                seed: 7
            })
        );
        assert_eq!(
            parse_request("# # hostcheck target=nvme offset=0 len=1 seed=1").map(|r| r.target),
            Some(Target::Nvme)
        );
        assert_eq!(
            parse_request("# hostcheck target=gpu offset=x len=1 seed=1"),
            None
        );
        assert_eq!(
            parse_request("# hostcheck target=disk offset=1 len=1 seed=1"),
            None
        );
        assert_eq!(parse_request("ok 1 something"), None);
    }

    #[test]
    fn pattern_matches_the_c_side() {
        // pat(i, seed) = (uint8_t)(i * 13 + seed + (i >> 12))
        assert_eq!(exporter_pattern(0, 5), 5);
        assert_eq!(exporter_pattern(4096, 0), ((4096 * 13 + 1) & 0xff) as u8);
    }
}
