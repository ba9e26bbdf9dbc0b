//! `p2pbuf nvme read/write` (O_DIRECT between a drive and a buffer's mapping) and
//! `p2pbuf fpga copy` (the DMA engine behind /dev/p2pbuf-dma copying between two dma-bufs).

use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::time::Instant;

use clap::{Subcommand, ValueEnum};
use p2pbuf::importer::{self, Engine, Import};
use p2pbuf::{Access, DmaBuf, Error};
use serde::Serialize;
use serde_json::json;

use crate::target::{human_size, parse_size};

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum MemKind {
    /// Device memory from /dev/p2pbuf (p2pdma pages: the drive DMAs peer-to-peer).
    P2pbuf,
    /// System memory as a dma-buf (/dev/udmabuf).
    Udmabuf,
    /// Plain host memory of this process (the bounce-free baseline).
    Host,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DmaKind {
    /// Device memory from /dev/p2pbuf.
    P2pbuf,
    /// System memory from /dev/udmabuf.
    Udmabuf,
}

#[derive(Subcommand, Debug)]
pub enum NvmeCmd {
    /// O_DIRECT read from the drive into a freshly allocated buffer (device memory: the
    /// drive writes into the BAR peer-to-peer), optionally checking the pattern.
    Read {
        /// The block device.
        #[arg(long, default_value = "/dev/nvme0n1")]
        dev: PathBuf,
        /// Byte offset on the drive (a multiple of its logical block size).
        #[arg(long, default_value = "0", value_parser = parse_size)]
        offset: usize,
        /// Bytes (a multiple of the logical block size).
        #[arg(long, value_parser = parse_size)]
        len: usize,
        /// The buffer to read into.
        #[arg(long, value_enum, default_value = "p2pbuf")]
        into: MemKind,
        /// Check that the data is `p2pbuf nvme write --pattern-seed S`'s pattern.
        #[arg(long)]
        verify_seed: Option<u32>,
    },
    /// Fill a freshly allocated buffer with a pattern through its mapping, then O_DIRECT
    /// write it to the drive (device memory: the drive reads the BAR peer-to-peer).
    Write {
        /// The block device.
        #[arg(long, default_value = "/dev/nvme0n1")]
        dev: PathBuf,
        /// Byte offset on the drive (a multiple of its logical block size).
        #[arg(long, default_value = "0", value_parser = parse_size)]
        offset: usize,
        /// Bytes (a multiple of the logical block size).
        #[arg(long, value_parser = parse_size)]
        len: usize,
        /// The buffer to write from.
        #[arg(long, value_enum, default_value = "p2pbuf")]
        from: MemKind,
        /// Pattern seed (`read --verify-seed` checks it).
        #[arg(long, default_value_t = 1)]
        pattern_seed: u32,
    },
}

#[derive(Subcommand, Debug)]
pub enum FpgaCmd {
    /// Allocate two buffers, fill the source through its mapping, import both into the DMA
    /// engine (/dev/p2pbuf-dma), copy with the engine, verify the destination through its
    /// mapping. QEMU's edu engine is slow (10-20 KiB/s): keep --len small.
    Copy {
        /// Source memory.
        #[arg(long, value_enum, default_value = "p2pbuf")]
        src: DmaKind,
        /// Destination memory.
        #[arg(long, value_enum, default_value = "p2pbuf")]
        dst: DmaKind,
        /// Bytes to copy.
        #[arg(long, value_parser = parse_size)]
        len: usize,
        /// First byte of the source.
        #[arg(long, default_value = "0", value_parser = parse_size)]
        src_offset: usize,
        /// First byte of the destination.
        #[arg(long, default_value = "0", value_parser = parse_size)]
        dst_offset: usize,
        /// Pattern seed of the source.
        #[arg(long, default_value_t = 7)]
        seed: u32,
        /// Completion timeout of each engine transfer, ms (0: the module's default).
        #[arg(long, default_value_t = 0)]
        timeout_ms: u32,
        /// The importer's device.
        #[arg(long, default_value = importer::DEVICE)]
        device: PathBuf,
    },
}

/// The pattern of `nvme write` (and tests/selftests/nvme_p2p.c).
pub fn pattern(i: usize, seed: u32) -> u8 {
    (i.wrapping_mul(13)
        .wrapping_add(seed as usize)
        .wrapping_add(i >> 12)) as u8
}

/// Where the bytes live.
enum Mem {
    Dma {
        buf: DmaBuf,
        provider: Option<(u32, u64)>,
    },
    Host(Vec<u8>),
}

#[derive(Serialize)]
struct MemInfo {
    kind: MemKind,
    exporter: Option<String>,
    size: u64,
    device_memory: bool,
    fd: Option<i32>,
    provider: Option<u32>,
    bar_offset: Option<u64>,
}

impl Mem {
    fn alloc(kind: MemKind, len: usize) -> p2pbuf::Result<Mem> {
        Ok(match kind {
            MemKind::P2pbuf => {
                let a = p2pbuf::exporter::alloc(len as u64)?;
                Mem::Dma {
                    buf: a.buf,
                    provider: Some((a.provider, a.offset)),
                }
            }
            MemKind::Udmabuf => Mem::Dma {
                buf: p2pbuf::udmabuf::alloc(len as u64)?,
                provider: None,
            },
            // One page more than asked, so that an aligned slice fits.
            MemKind::Host => Mem::Host(vec![0u8; len + 4096]),
        })
    }

    fn info(&self, kind: MemKind) -> MemInfo {
        match self {
            Mem::Dma { buf, provider } => MemInfo {
                kind,
                exporter: Some(buf.exporter().to_string()),
                size: buf.size(),
                device_memory: kind == MemKind::P2pbuf,
                fd: Some(buf.as_raw_fd()),
                provider: provider.map(|p| p.0),
                bar_offset: provider.map(|p| p.1),
            },
            Mem::Host(v) => MemInfo {
                kind,
                exporter: None,
                size: (v.len() - 4096) as u64,
                device_memory: false,
                fd: None,
                provider: None,
                bar_offset: None,
            },
        }
    }
}

/// The page-aligned first `len` bytes of a host buffer.
fn aligned(v: &mut [u8], len: usize) -> &mut [u8] {
    let skip = (4096 - (v.as_ptr() as usize) % 4096) % 4096;
    &mut v[skip..skip + len]
}

/// Index and count of bytes where `data[i] != want(i)`.
fn mismatches(data: &[u8], want: impl Fn(usize) -> u8) -> Option<(usize, u8, u8, usize)> {
    let mut first = None;
    let mut n = 0;
    for (i, b) in data.iter().enumerate() {
        let w = want(i);
        if *b != w {
            n += 1;
            if first.is_none() {
                first = Some((i, *b, w));
            }
        }
    }
    first.map(|(i, g, w)| (i, g, w, n))
}

fn describe(m: &MemInfo) -> String {
    match (&m.exporter, m.device_memory) {
        (Some(e), true) => format!(
            "device memory ({e} dma-buf of {}{})",
            human_size(m.size),
            m.provider.map_or(String::new(), |p| format!(
                ", provider {p}, BAR offset {:#x}",
                m.bar_offset.unwrap_or(0)
            ))
        ),
        (Some(e), false) => format!("system memory ({e} dma-buf of {})", human_size(m.size)),
        (None, _) => "host memory of this process (no dma-buf)".to_string(),
    }
}

fn rate(bytes: u64, secs: f64) -> f64 {
    bytes as f64 / (1 << 20) as f64 / if secs > 0.0 { secs } else { f64::MIN_POSITIVE }
}

pub fn nvme(c: NvmeCmd, json: bool) -> p2pbuf::Result<()> {
    let (write, dev, offset, len, kind, seed) = match c {
        NvmeCmd::Read {
            dev,
            offset,
            len,
            into,
            verify_seed,
        } => (false, dev, offset, len, into, verify_seed),
        NvmeCmd::Write {
            dev,
            offset,
            len,
            from,
            pattern_seed,
        } => (true, dev, offset, len, from, Some(pattern_seed)),
    };
    let op = if write { "write" } else { "read" };
    if len == 0 {
        return Err(Error::Protocol {
            what: format!("p2pbuf nvme {op}"),
            detail: "--len must be at least one logical block (e.g. 4096)".into(),
        });
    }
    let drive = p2pbuf::nvme::Drive::open(&dev, write)?;
    let mut mem = Mem::alloc(kind, len)?;
    let info = mem.info(kind);
    // Device memory with an aligned request: EINVAL/EREMOTEIO mean "no P2P path".
    let p2p_aligned = kind == MemKind::P2pbuf && offset % 512 == 0 && len % 512 == 0;
    let explain = |e: Error| {
        if p2p_aligned {
            p2pbuf::nvme::explain_p2p_refusal(e)
        } else {
            e
        }
    };
    let (secs, verified) = match &mut mem {
        Mem::Dma { buf, .. } => {
            let mut map = buf.map(Access::ReadWrite)?;
            if write {
                {
                    let mut w = map.write()?;
                    for (i, b) in w[..len].iter_mut().enumerate() {
                        *b = pattern(i, seed.unwrap_or(0));
                    }
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
                let t;
                let s;
                {
                    let mut w = map.write()?;
                    t = Instant::now();
                    drive
                        .read_into(&mut w[..len], offset as u64)
                        .map_err(explain)?;
                    s = t.elapsed().as_secs_f64();
                    w.finish()?;
                }
                let v = seed.map(|sd| {
                    let r = map.read()?;
                    let m = mismatches(&r[..len], |i| pattern(i, sd));
                    r.finish()?;
                    Ok::<_, Error>(m)
                });
                (s, v.transpose()?)
            }
        }
        Mem::Host(v) => {
            let b = aligned(v, len);
            if write {
                for (i, x) in b.iter_mut().enumerate() {
                    *x = pattern(i, seed.unwrap_or(0));
                }
                let t = Instant::now();
                drive.write_from(b, offset as u64)?;
                (t.elapsed().as_secs_f64(), None)
            } else {
                let t = Instant::now();
                drive.read_into(b, offset as u64)?;
                let s = t.elapsed().as_secs_f64();
                (s, seed.map(|sd| mismatches(b, |i| pattern(i, sd))))
            }
        }
    };
    let ok = !matches!(verified, Some(Some(_)));
    let verify_text = match verified {
        None => None,
        Some(None) => Some(format!(
            "all {len} bytes are seed {}'s pattern",
            seed.unwrap_or(0)
        )),
        Some(Some((i, g, w, n))) => Some(format!(
            "{n} byte(s) differ from seed {}'s pattern, first at {i} (got {g:#04x}, want {w:#04x})",
            seed.unwrap_or(0)
        )),
    };
    if json {
        println!(
            "{}",
            json!({
                "op": op,
                "dev": dev,
                "drive_size": drive.size(),
                "offset": offset,
                "len": len,
                "bytes": len,
                "seconds": secs,
                "mib_per_s": rate(len as u64, secs),
                "buffer": info,
                "device_memory": info.device_memory,
                "peer_to_peer": info.device_memory,
                "pattern_seed": seed,
                "verified": verified.map(|m| m.is_none()),
                "verify": verify_text,
            })
        );
    } else {
        let (dir, prep) = if write {
            ("drive <- buffer", "from")
        } else {
            ("drive -> buffer", "into")
        };
        println!(
            "nvme {op}: {} at offset {offset} of {} ({}), O_DIRECT, {dir}",
            human_size(len as u64),
            dev.display(),
            human_size(drive.size())
        );
        println!("  buffer:   {prep} {}", describe(&info));
        println!(
            "  path:     {}",
            if info.device_memory {
                "peer-to-peer: the drive DMAs to/from the device's BAR (p2pdma pages, no bounce)"
            } else {
                "system memory: the drive DMAs to/from RAM"
            }
        );
        println!(
            "  moved:    {len} bytes in {:.3} ms ({:.1} MiB/s)",
            secs * 1e3,
            rate(len as u64, secs)
        );
        if write {
            println!("  pattern:  seed {}", seed.unwrap_or(0));
        }
        if let Some(t) = &verify_text {
            println!("  verify:   {t}");
        }
        println!("{}", if ok { "OK" } else { "FAILED" });
    }
    if ok {
        Ok(())
    } else {
        Err(Error::Protocol {
            what: format!("verifying {len} bytes read from {}", dev.display()),
            detail: verify_text.unwrap_or_default(),
        })
    }
}

fn dma_alloc(kind: DmaKind, len: usize) -> p2pbuf::Result<(DmaBuf, Option<(u32, u64)>)> {
    match kind {
        DmaKind::P2pbuf => {
            let a = p2pbuf::exporter::alloc(len as u64)?;
            Ok((a.buf, Some((a.provider, a.offset))))
        }
        DmaKind::Udmabuf => Ok((p2pbuf::udmabuf::alloc(len as u64)?, None)),
    }
}

fn mem_kind(k: DmaKind) -> MemKind {
    match k {
        DmaKind::P2pbuf => MemKind::P2pbuf,
        DmaKind::Udmabuf => MemKind::Udmabuf,
    }
}

fn fill(buf: &DmaBuf, seed: u32) -> p2pbuf::Result<()> {
    let mut m = buf.map(Access::ReadWrite)?;
    let mut w = m.write()?;
    for (i, b) in w.iter_mut().enumerate() {
        *b = pattern(i, seed);
    }
    w.finish()
}

pub fn fpga(c: FpgaCmd, json: bool) -> p2pbuf::Result<()> {
    let FpgaCmd::Copy {
        src,
        dst,
        len,
        src_offset,
        dst_offset,
        seed,
        timeout_ms,
        device,
    } = c;
    if len == 0 {
        return Err(Error::Protocol {
            what: "p2pbuf fpga copy".into(),
            detail: "--len must be at least 1 byte".into(),
        });
    }
    // The engine first: without it there is nothing to do.
    let eng = Engine::open_at(&device)?;
    let (sbuf, sprov) = dma_alloc(src, src_offset + len)?;
    let (dbuf, dprov) = dma_alloc(dst, dst_offset + len)?;
    let dseed = seed.wrapping_add(101);
    fill(&sbuf, seed)?;
    fill(&dbuf, dseed)?;
    let si = eng.import(&sbuf)?;
    let di = eng.import(&dbuf)?;
    let t = Instant::now();
    let done = eng.copy(&importer::Copy {
        src: si.handle,
        src_offset: src_offset as u64,
        dst: di.handle,
        dst_offset: dst_offset as u64,
        len: len as u64,
        timeout_ms,
    });
    let secs = t.elapsed().as_secs_f64();
    let _ = eng.release(si.handle);
    let _ = eng.release(di.handle);
    let done = done?;
    // Verify: the range holds the source's bytes, everything around it is untouched.
    let bad = {
        let m = dbuf.map(Access::Read)?;
        let r = m.read()?;
        let b = mismatches(&r, |i| {
            if i >= dst_offset && i < dst_offset + len {
                pattern(i - dst_offset + src_offset, seed)
            } else {
                pattern(i, dseed)
            }
        });
        r.finish()?;
        b
    };
    let short = done.copied != len as u64;
    let ok = bad.is_none() && !short;
    let verify_text = match bad {
        None => format!(
            "destination holds the source's {len} bytes at offset {dst_offset}, the rest untouched"
        ),
        Some((i, g, w, n)) => format!(
            "{n} byte(s) wrong in the destination, first at {i} (got {g:#04x}, want {w:#04x})"
        ),
    };
    let side = |name: &str, k: DmaKind, b: &DmaBuf, p: Option<(u32, u64)>, imp: &Import| {
        json!({
            "side": name,
            "kind": mem_kind(k),
            "exporter": b.exporter(),
            "size": b.size(),
            "provider": p.map(|x| x.0),
            "bar_offset": p.map(|x| x.1),
            "handle": imp.handle,
            "map_type": imp.map_type,
            "peer_to_peer": imp.map_type.is_device_memory(),
            "nr_ranges": imp.nr_ranges,
        })
    };
    if json {
        println!(
            "{}",
            json!({
                "src": side("src", src, &sbuf, sprov, &si),
                "dst": side("dst", dst, &dbuf, dprov, &di),
                "len": len,
                "src_offset": src_offset,
                "dst_offset": dst_offset,
                "copied": done.copied,
                "nr_transfers": done.nr_transfers,
                "seconds": secs,
                "kib_per_s": len as f64 / 1024.0 / secs.max(f64::MIN_POSITIVE),
                "verified": ok,
                "verify": verify_text,
            })
        );
    } else {
        println!(
            "fpga copy: {} with the DMA engine ({})",
            human_size(len as u64),
            device.display()
        );
        for (name, k, b, p, imp, off) in [
            ("src", src, &sbuf, sprov, &si, src_offset),
            ("dst", dst, &dbuf, dprov, &di, dst_offset),
        ] {
            let info = MemInfo {
                kind: mem_kind(k),
                exporter: Some(b.exporter().to_string()),
                size: b.size(),
                device_memory: k == DmaKind::P2pbuf,
                fd: Some(b.as_raw_fd()),
                provider: p.map(|x| x.0),
                bar_offset: p.map(|x| x.1),
            };
            println!(
                "  {name}:      {} at offset {off}; handle {}, map type {}, {} range(s)",
                describe(&info),
                imp.handle,
                imp.map_type,
                imp.nr_ranges
            );
        }
        println!(
            "  copied:   {} bytes in {} engine transfer(s), {:.2} s ({:.1} KiB/s)",
            done.copied,
            done.nr_transfers,
            secs,
            len as f64 / 1024.0 / secs.max(f64::MIN_POSITIVE)
        );
        println!("  verify:   {verify_text}");
        println!("{}", if ok { "OK" } else { "FAILED" });
    }
    if ok {
        Ok(())
    } else {
        Err(Error::Protocol {
            what: format!("verifying the engine's copy of {len} bytes"),
            detail: if short {
                format!("only {} of {len} bytes copied (a signal?)", done.copied)
            } else {
                verify_text
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_matches_the_c_selftest() {
        // tests/selftests/nvme_p2p.c: (uint8_t)(i * 13 + seed + (i >> 12)).
        assert_eq!(pattern(0, 5), 5);
        assert_eq!(pattern(1, 5), 18);
        assert_eq!(pattern(4096, 0), ((4096 * 13 + 1) & 0xff) as u8);
    }

    #[test]
    fn mismatch_reports_the_first() {
        let d = [1u8, 2, 9, 4, 0];
        let m = mismatches(&d, |i| (i + 1) as u8).unwrap();
        assert_eq!((m.0, m.1, m.2, m.3), (2, 9, 3, 2));
        assert!(mismatches(&d[..2], |i| (i + 1) as u8).is_none());
    }

    #[test]
    fn host_buffer_is_aligned() {
        let mut v = vec![0u8; 8192 + 4096];
        let a = aligned(&mut v, 8192);
        assert_eq!(a.as_ptr() as usize % 4096, 0);
        assert_eq!(a.len(), 8192);
    }
}
