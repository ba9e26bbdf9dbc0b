//! `p2pbuf nvme read/write`: O_DIRECT between a drive and a buffer's mapping (device memory:
//! the drive DMAs peer-to-peer).

use std::path::PathBuf;
use std::time::Instant;

use clap::{Args, Subcommand};
use p2pbuf::memory::{self, Buffer, Source, Summary};
use p2pbuf::units::{human_size, parse_size};
use p2pbuf::{Access, Error};
use serde::Serialize;

use crate::output::print_json;
use crate::verify::{mib_per_s, mismatches, Mismatch};
use p2pbuf::pattern;

#[derive(Subcommand, Debug)]
pub enum NvmeCmd {
    /// O_DIRECT read from the drive into a freshly allocated buffer (device memory: the
    /// drive writes into the BAR peer-to-peer), optionally checking the pattern.
    Read {
        #[command(flatten)]
        io: Io,
        /// The buffer to read into.
        #[arg(long, default_value = Source::DEFAULT_NAME, value_parser = crate::mem::parse,
              help = crate::mem::HELP)]
        mem: Source,
        /// Check that the data is `p2pbuf nvme write --pattern-seed S`'s pattern.
        #[arg(long)]
        verify_seed: Option<u32>,
    },
    /// Fill a freshly allocated buffer with a pattern through its mapping, then O_DIRECT
    /// write it to the drive (device memory: the drive reads the BAR peer-to-peer).
    Write {
        #[command(flatten)]
        io: Io,
        /// The buffer to write from.
        #[arg(long, default_value = Source::DEFAULT_NAME, value_parser = crate::mem::parse,
              help = crate::mem::HELP)]
        mem: Source,
        /// Pattern seed (`read --verify-seed` checks it).
        #[arg(long, default_value_t = 1)]
        pattern_seed: u32,
    },
}

/// Where on which drive, and how much.
#[derive(Args, Debug)]
pub struct Io {
    /// The block device.
    #[arg(long, default_value = "/dev/nvme0n1")]
    dev: PathBuf,
    /// Byte offset on the drive (a multiple of its logical block size).
    #[arg(long, default_value = "0", value_parser = parse_size)]
    offset: usize,
    /// Bytes (a multiple of the logical block size).
    #[arg(long, value_parser = parse_size)]
    len: usize,
}

/// `p2pbuf --json nvme read/write`.
#[derive(Serialize)]
pub struct NvmeReport<'a> {
    /// `read` or `write`.
    pub op: &'static str,
    /// The block device.
    pub dev: &'a PathBuf,
    /// Its size in bytes.
    pub drive_size: u64,
    /// Byte offset on the drive.
    pub offset: usize,
    /// Bytes asked for.
    pub len: usize,
    /// Bytes moved.
    pub bytes: usize,
    /// Time of the O_DIRECT call.
    pub seconds: f64,
    /// `bytes / seconds`.
    pub mib_per_s: f64,
    /// The buffer.
    pub buffer: &'a Summary,
    /// The buffer is device memory.
    pub device_memory: bool,
    /// The drive DMAed peer-to-peer (device memory).
    pub peer_to_peer: bool,
    /// The pattern written, or checked.
    pub pattern_seed: Option<u32>,
    /// Whether the data read is the pattern (null: not checked).
    pub verified: Option<bool>,
    /// What the check found.
    pub verify: Option<String>,
}

pub fn run(c: NvmeCmd, json: bool) -> p2pbuf::Result<()> {
    let (write, Io { dev, offset, len }, kind, seed) = match c {
        NvmeCmd::Read {
            io,
            mem,
            verify_seed,
        } => (false, io, mem, verify_seed),
        NvmeCmd::Write {
            io,
            mem,
            pattern_seed,
        } => (true, io, mem, Some(pattern_seed)),
    };
    let op = if write { "write" } else { "read" };
    if len == 0 {
        return Err(Error::Protocol {
            what: format!("p2pbuf nvme {op}"),
            detail: "--len must be at least one logical block (e.g. 4096)".into(),
        });
    }
    let drive = p2pbuf::nvme::Drive::open(&dev, write)?;
    let mut mem = memory::alloc(&kind, len as u64)?;
    let info = mem.summary(&kind);
    let (secs, verified) = transfer(
        &drive,
        &mut mem,
        info.device_memory,
        write,
        offset,
        len,
        seed,
    )?;
    let seed0 = seed.unwrap_or(0);
    let ok = !matches!(verified, Some(Some(_)));
    let verify_text = match verified {
        None => None,
        Some(None) => Some(format!("all {len} bytes are seed {seed0}'s pattern")),
        Some(Some((i, g, w, n))) => Some(format!(
            "{n} byte(s) differ from seed {seed0}'s pattern, first at {i} (got {g:#04x}, want {w:#04x})"
        )),
    };
    let report = NvmeReport {
        op,
        dev: &dev,
        drive_size: drive.size(),
        offset,
        len,
        bytes: len,
        seconds: secs,
        mib_per_s: mib_per_s(len as u64, secs),
        buffer: &info,
        device_memory: info.device_memory,
        peer_to_peer: info.device_memory,
        pattern_seed: seed,
        verified: verified.map(|m| m.is_none()),
        verify: verify_text.clone(),
    };
    if json {
        print_json(&report);
    } else {
        print_text(&report);
    }
    let what = format!("verifying {len} bytes read from {}", dev.display());
    crate::output::verdict(ok, json, what, || verify_text.unwrap_or_default())
}

/// The drive's transfer of `len` bytes at `offset` into or out of `mem` (the lab pattern of
/// `seed` written into it first, for a write; checked against it after, for a read with a
/// seed): the seconds the drive took, and for a checked read the first mismatch, if any.
fn transfer(
    drive: &p2pbuf::nvme::Drive,
    mem: &mut Buffer,
    device_memory: bool,
    write: bool,
    offset: usize,
    len: usize,
    seed: Option<u32>,
) -> p2pbuf::Result<(f64, Option<Option<Mismatch>>)> {
    // Device memory with an aligned request: EINVAL/EREMOTEIO mean "no P2P path".
    let p2p_aligned = device_memory && offset % 512 == 0 && len % 512 == 0;
    let explain = |e: Error| {
        if p2p_aligned {
            p2pbuf::nvme::explain_p2p_refusal(e)
        } else {
            e
        }
    };
    let seed0 = seed.unwrap_or(0);
    let moved = match mem {
        Buffer::Host(h) => {
            let b = &mut h.as_mut_slice()[..len];
            if write {
                pattern::fill(b, seed0.into());
                let t = Instant::now();
                drive.write_from(b, offset as u64)?;
                (t.elapsed().as_secs_f64(), None)
            } else {
                let t = Instant::now();
                drive.read_into(b, offset as u64)?;
                let s = t.elapsed().as_secs_f64();
                (
                    s,
                    seed.map(|sd| mismatches(b, |i| pattern::byte(i as u64, sd.into()))),
                )
            }
        }
        dma => {
            let buf = dma.require_dmabuf("p2pbuf nvme")?;
            let mut map = buf.map(Access::ReadWrite)?;
            if write {
                {
                    let mut w = map.write()?;
                    pattern::fill(&mut w[..len], seed0.into());
                    w.finish()?;
                }
                let r = map.read()?;
                let t = Instant::now();
                drive
                    .write_from(&r[..len], offset as u64)
                    .map_err(explain)?;
                let s = t.elapsed().as_secs_f64();
                r.finish()?;
                (s, None)
            } else {
                let s = {
                    let mut w = map.write()?;
                    let t = Instant::now();
                    drive
                        .read_into(&mut w[..len], offset as u64)
                        .map_err(explain)?;
                    let s = t.elapsed().as_secs_f64();
                    w.finish()?;
                    s
                };
                let v = seed.map(|sd| {
                    let r = map.read()?;
                    let m = mismatches(&r[..len], |i| pattern::byte(i as u64, sd.into()));
                    r.finish()?;
                    Ok::<_, Error>(m)
                });
                (s, v.transpose()?)
            }
        }
    };
    Ok(moved)
}

/// `p2pbuf nvme read/write` without `--json`: the report for people.
fn print_text(r: &NvmeReport) {
    let write = r.op == "write";
    let (dir, prep) = if write {
        ("drive <- buffer", "from")
    } else {
        ("drive -> buffer", "into")
    };
    println!(
        "nvme {}: {} at offset {} of {} ({}), O_DIRECT, {dir}",
        r.op,
        human_size(r.len as u64),
        r.offset,
        r.dev.display(),
        human_size(r.drive_size)
    );
    println!("  buffer:   {prep} {}", r.buffer.describe());
    println!(
        "  path:     {}",
        if r.device_memory {
            "peer-to-peer: the drive DMAs to/from the device's BAR (p2pdma pages, no bounce)"
        } else {
            "system memory: the drive DMAs to/from RAM"
        }
    );
    println!(
        "  moved:    {} bytes in {:.3} ms ({:.1} MiB/s)",
        r.len,
        r.seconds * 1e3,
        r.mib_per_s
    );
    if write {
        println!("  pattern:  seed {}", r.pattern_seed.unwrap_or(0));
    }
    if let Some(t) = &r.verify {
        println!("  verify:   {t}");
    }
}
