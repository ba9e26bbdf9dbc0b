//! Checks made from the host after a VM run, on the files backing the emulated devices: what
//! the guest wrote into device memory must be in the memory-backend-file at the same offset.
//! And on QEMU's trace of the NVMe controller: the data addresses the drive was given for a
//! transfer must lie in the peer's BAR (peer-to-peer), in its own CMB, or, for a host-memory
//! transfer, in neither.

use crate::ktap::{Parser, Status};
use crate::qemu::VmFiles;
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

/// Where the data addresses of an NVMe transfer must be.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
pub enum Expect {
    /// All inside `lo..hi` (a peer's memory, e.g. the exporter's buffer in the ivshmem BAR),
    /// none in the controller's own CMB.
    P2p,
    /// All in the controller's CMB (QEMU's `pci_nvme_map_addr_cmb`), inside `lo..hi`.
    Cmb,
    /// None inside `lo..hi` and none in the CMB: host memory (the control).
    Host,
}

/// A `# hostcheck target=nvmedma op=read|write offset=X len=N expect=p2p|cmb|host lo=A hi=B`
/// request: the NVMe commands that moved drive bytes `offset..offset + len` (each of them
/// inside that range, `len` bytes in all) were given data addresses as `expect` says.
#[derive(Debug, PartialEq, Eq)]
pub struct DmaRequest {
    pub write: bool,
    pub offset: u64,
    pub len: u64,
    pub expect: Expect,
    pub lo: u64,
    pub hi: u64,
}

fn num(v: &str) -> Option<u64> {
    match v.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).ok(),
        None => v.parse().ok(),
    }
}

pub fn parse_dma_request(line: &str) -> Option<DmaRequest> {
    let rest = &line[line.find("hostcheck target=nvmedma")? + "hostcheck ".len()..];
    let (mut write, mut offset, mut len, mut expect, mut lo, mut hi) =
        (None, None, None, None, None, None);
    for kv in rest.split_whitespace() {
        match kv.split_once('=')? {
            ("op", "read") => write = Some(false),
            ("op", "write") => write = Some(true),
            ("offset", v) => offset = num(v),
            ("len", v) => len = num(v),
            ("expect", "p2p") => expect = Some(Expect::P2p),
            ("expect", "cmb") => expect = Some(Expect::Cmb),
            ("expect", "host") => expect = Some(Expect::Host),
            ("lo", v) => lo = num(v),
            ("hi", v) => hi = num(v),
            ("target", _) => {}
            _ => return None,
        }
    }
    Some(DmaRequest {
        write: write?,
        offset: offset?,
        len: len?,
        expect: expect?,
        lo: lo?,
        hi: hi?,
    })
}

/// One NVMe read or write command as QEMU traced it, with the data addresses it was given.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct NvmeCmd {
    pub write: bool,
    /// Drive byte offset and length.
    pub offset: u64,
    pub bytes: u64,
    /// (bus address, length, in the controller's CMB).
    pub maps: Vec<(u64, u64, bool)>,
}

/// Value of `key` in a trace line's `key value` words.
fn field(words: &[&str], key: &str) -> Option<u64> {
    let i = words.iter().position(|w| *w == key)?;
    num(words.get(i + 1)?)
}

/// Parses QEMU's log-backend trace (`[pid@time:]event args`): `pci_nvme_read`/`_write` start
/// a command (`nlb N count BYTES lba 0xL`); `pci_nvme_map_addr addr 0xA len N` lines that
/// follow are its data addresses (QEMU handles one command's mapping at a time), and
/// `pci_nvme_map_addr_cmb` marks the preceding address as the controller's own CMB.
pub fn parse_nvme_trace(text: &str) -> Vec<NvmeCmd> {
    let mut cmds: Vec<NvmeCmd> = vec![];
    let mut cur: Option<NvmeCmd> = None;
    for line in text.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        let Some(first) = words.first() else { continue };
        let event = first.rsplit(':').next().unwrap_or(first);
        match event {
            "pci_nvme_read" | "pci_nvme_write" => {
                if let Some(c) = cur.take() {
                    cmds.push(c);
                }
                let (Some(nlb), Some(count), Some(lba)) = (
                    field(&words, "nlb"),
                    field(&words, "count"),
                    field(&words, "lba"),
                ) else {
                    continue;
                };
                if nlb == 0 {
                    continue;
                }
                cur = Some(NvmeCmd {
                    write: event == "pci_nvme_write",
                    offset: lba * (count / nlb),
                    bytes: count,
                    maps: vec![],
                });
            }
            "pci_nvme_map_addr" => {
                if let (Some(c), Some(a), Some(l)) =
                    (cur.as_mut(), field(&words, "addr"), field(&words, "len"))
                {
                    c.maps.push((a, l, false));
                }
            }
            "pci_nvme_map_addr_cmb" => {
                if let (Some(c), Some(a)) = (cur.as_mut(), field(&words, "addr")) {
                    if let Some(m) = c.maps.iter_mut().rev().find(|m| m.0 == a) {
                        m.2 = true;
                    }
                }
            }
            _ => {}
        }
    }
    if let Some(c) = cur {
        cmds.push(c);
    }
    cmds
}

/// Checks one DMA request against the traced commands: (pass, what was found).
pub fn check_dma(req: &DmaRequest, cmds: &[NvmeCmd]) -> (bool, String) {
    let end = req.offset + req.len;
    let mine: Vec<&NvmeCmd> = cmds
        .iter()
        .filter(|c| c.write == req.write && c.offset < end && c.offset + c.bytes > req.offset)
        .collect();
    if mine.is_empty() {
        return (false, "no such command in the NVMe trace".into());
    }
    if let Some(c) = mine
        .iter()
        .find(|c| c.offset < req.offset || c.offset + c.bytes > end)
    {
        return (
            false,
            format!(
                "a command at drive offset {:#x} ({} bytes) reaches outside the range",
                c.offset, c.bytes
            ),
        );
    }
    let cmd_bytes: u64 = mine.iter().map(|c| c.bytes).sum();
    let maps: Vec<(u64, u64, bool)> = mine.iter().flat_map(|c| c.maps.clone()).collect();
    let mapped: u64 = maps.iter().map(|m| m.1).sum();
    let inside = |m: &(u64, u64, bool)| m.0 >= req.lo && m.0 + m.1 <= req.hi;
    let touches = |m: &(u64, u64, bool)| m.0 < req.hi && m.0 + m.1 > req.lo;
    let n_in = maps.iter().filter(|m| inside(m)).count();
    let n_cmb = maps.iter().filter(|m| m.2).count();
    let found = format!(
        "{} command(s), {} data address(es) for {} bytes: {} inside {:#x}-{:#x}, {} in the CMB",
        mine.len(),
        maps.len(),
        mapped,
        n_in,
        req.lo,
        req.hi - 1,
        n_cmb
    );
    if cmd_bytes != req.len || mapped != req.len {
        return (
            false,
            format!(
                "{found}; want {} bytes (was the range used twice?)",
                req.len
            ),
        );
    }
    let ok = match req.expect {
        Expect::P2p => n_in == maps.len() && n_cmb == 0,
        Expect::Cmb => n_in == maps.len() && n_cmb == maps.len(),
        Expect::Host => !maps.iter().any(|m| touches(m) || m.2),
    };
    (ok, found)
}

/// Runs the host checks that the in-VM tests asked for.
pub fn checks(p: &Parser, files: &VmFiles) -> Vec<Check> {
    let mut out = vec![];
    let mut trace: Option<Result<Vec<NvmeCmd>, String>> = None;
    for req in p.lines.iter().filter_map(|l| parse_dma_request(l)) {
        let cmds = trace.get_or_insert_with(|| {
            std::fs::read_to_string(&files.nvme_trace)
                .map(|t| parse_nvme_trace(&t))
                .map_err(|e| format!("cannot read {}: {e}", files.nvme_trace.display()))
        });
        let name = format!(
            "host: NVMe {} of {} bytes at drive offset {:#x}: data addresses {}",
            if req.write { "write" } else { "read" },
            req.len,
            req.offset,
            match req.expect {
                Expect::P2p => format!("in the peer's memory {:#x}-{:#x}", req.lo, req.hi - 1),
                Expect::Cmb => "in the drive's own CMB".to_string(),
                Expect::Host => format!("in host memory, not in {:#x}-{:#x}", req.lo, req.hi - 1),
            }
        );
        let (status, note) = match cmds {
            Err(e) => (Status::Fail, e.clone()),
            Ok(c) => match check_dma(&req, c) {
                (true, note) => (Status::Pass, note),
                (false, note) => (Status::Fail, note),
            },
        };
        out.push((name, status, note));
    }
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

    const TRACE: &str = "\
pci_nvme_read cid 7 nsid 1 nlb 8 count 4096 lba 0x0
pci_nvme_map_addr addr 0x1000 len 4096
1234@1700000000.000001:pci_nvme_write cid 9 opname 'write' nsid 1 nlb 16 count 8192 lba 0x4000
pci_nvme_map_addr addr 0xfe000000 len 4096
pci_nvme_map_addr addr 0xfe001000 len 4096
pci_nvme_read cid 10 nsid 1 nlb 16 count 8192 lba 0x4000
pci_nvme_map_addr addr 0xfd000000 len 4096
pci_nvme_map_addr_cmb addr 0xfd000000 len 4096
pci_nvme_map_addr addr 0xfd001000 len 4096
pci_nvme_map_addr_cmb addr 0xfd001000 len 4096
pci_nvme_read cid 11 nsid 1 nlb 16 count 8192 lba 0x8000
pci_nvme_map_addr addr 0x7000 len 8192
";

    fn dma(line: &str) -> DmaRequest {
        parse_dma_request(line).expect(line)
    }

    #[test]
    fn parses_the_nvme_trace() {
        let c = parse_nvme_trace(TRACE);
        assert_eq!(c.len(), 4);
        assert_eq!(
            (c[1].write, c[1].offset, c[1].bytes),
            (true, 0x4000 * 512, 8192)
        );
        assert_eq!(
            c[1].maps,
            vec![(0xfe000000, 4096, false), (0xfe001000, 4096, false)]
        );
        assert!(c[2].maps.iter().all(|m| m.2));
        assert!(!c[3].write);
    }

    #[test]
    fn dma_checks_pass_and_fail() {
        let c = parse_nvme_trace(TRACE);
        let off = 0x4000 * 512;
        let p2p = |lo: u64, hi: u64| {
            dma(&format!(
                "# hostcheck target=nvmedma op=write offset={off} len=8192 expect=p2p lo={lo:#x} hi={hi:#x}"
            ))
        };
        assert!(check_dma(&p2p(0xfe000000, 0xfe002000), &c).0);
        // One page outside the buffer: not peer-to-peer into it.
        assert!(!check_dma(&p2p(0xfe001000, 0xfe002000), &c).0);
        // The same transfer as the host-memory control must fail, and the CMB read passes
        // only as CMB.
        let host = dma(&format!(
            "# hostcheck target=nvmedma op=write offset={off} len=8192 expect=host lo=0xfe000000 hi=0xff000000"
        ));
        assert!(!check_dma(&host, &c).0);
        let cmb = dma(&format!(
            "# hostcheck target=nvmedma op=read offset={off} len=8192 expect=cmb lo=0xfd000000 hi=0xfe000000"
        ));
        assert!(check_dma(&cmb, &c).0);
        let cmb_as_p2p = dma(&format!(
            "# hostcheck target=nvmedma op=read offset={off} len=8192 expect=p2p lo=0xfd000000 hi=0xfe000000"
        ));
        assert!(!check_dma(&cmb_as_p2p, &c).0);
        // A host-memory read is what the control expects.
        let ctl = dma(&format!(
            "# hostcheck target=nvmedma op=read offset={} len=8192 expect=host lo=0xfe000000 hi=0xff000000",
            0x8000 * 512
        ));
        assert!(check_dma(&ctl, &c).0);
        // Wrong length, or no command at all.
        let short = dma(&format!(
            "# hostcheck target=nvmedma op=write offset={off} len=4096 expect=p2p lo=0xfe000000 hi=0xfe002000"
        ));
        assert!(!check_dma(&short, &c).0);
        let none =
            dma("# hostcheck target=nvmedma op=write offset=0 len=4096 expect=host lo=0x0 hi=0x1");
        assert!(!check_dma(&none, &c).0);
        // A pattern request is not a DMA request and vice versa.
        assert!(parse_dma_request("# hostcheck target=nvme offset=0 len=1 seed=1").is_none());
        assert!(parse_request(
            "# hostcheck target=nvmedma op=read offset=0 len=1 expect=p2p lo=0 hi=1"
        )
        .is_none());
    }

    #[test]
    fn pattern_matches_the_c_side() {
        // pat(i, seed) = (uint8_t)(i * 13 + seed + (i >> 12))
        assert_eq!(exporter_pattern(0, 5), 5);
        assert_eq!(exporter_pattern(4096, 0), ((4096 * 13 + 1) & 0xff) as u8);
    }
}
