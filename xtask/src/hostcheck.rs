//! Checks made from the host after a VM run, on the files backing the emulated devices: what
//! the guest wrote into device memory must be in the memory-backend-file at the same offset.

use crate::ktap::{Parser, Status};
use crate::vm::VmFiles;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};

/// Shared with tests/selftests/lab_ivshmem.c.
const LAB_OFFSET: u64 = 1 << 20;
const LAB_LEN: usize = 4096;

fn lab_pattern(i: usize) -> u8 {
    (i * 7 + 3) as u8
}

/// A host-side check: (name, status, note).
pub type Check = (String, Status, String);

fn read_at(path: &std::path::Path, off: u64, len: usize) -> std::io::Result<Vec<u8>> {
    let mut f = File::open(path)?;
    f.seek(SeekFrom::Start(off))?;
    let mut buf = vec![0u8; len];
    f.read_exact(&mut buf)?;
    Ok(buf)
}

fn passed(p: &Parser, name: &str) -> Option<bool> {
    p.results.iter().find(|r| r.path.contains(name)).map(|r| r.status == Status::Pass)
}

/// Runs the host checks whose in-VM half ran and passed.
pub fn checks(p: &Parser, files: &VmFiles) -> Vec<Check> {
    let mut out = vec![];
    let name = "host: ivshmem backing file holds the bytes the guest wrote to BAR2".to_string();
    match passed(p, "bar2_write_read_back") {
        Some(true) => match read_at(&files.gpu_mem, LAB_OFFSET, LAB_LEN) {
            Ok(buf) => {
                let bad = (0..LAB_LEN).find(|&i| buf[i] != lab_pattern(i));
                match bad {
                    None => out.push((name, Status::Pass, String::new())),
                    Some(i) => out.push((
                        name,
                        Status::Fail,
                        format!("byte {i} at offset {:#x} is {:#04x}, want {:#04x}", LAB_OFFSET + i as u64, buf[i], lab_pattern(i)),
                    )),
                }
            }
            Err(e) => out.push((name, Status::Fail, format!("cannot read {}: {e}", files.gpu_mem.display()))),
        },
        _ => out.push((name, Status::Skip, "the in-VM half did not run or failed".into())),
    }
    out
}
