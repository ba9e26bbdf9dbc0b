//! `p2pbuf dma copy`: p2pbuf-dma, the DMA engine behind /dev/p2pbuf-dma (the
//! FPGA stand-in) copying between two dma-bufs.

use std::path::PathBuf;
use std::time::Instant;

use clap::{Args, Subcommand};
use p2pbuf::dma::{self, Engine, Import, MapType};
use p2pbuf::memory::{self, Buffer, Source, Summary};
use p2pbuf::units::{human_size, parse_size};
use p2pbuf::{Access, DmaBuf, Error};
use serde::Serialize;

use crate::output::print_json;
use crate::verify::{mismatches, Mismatch};
use p2pbuf::pattern;

#[derive(Subcommand, Debug)]
pub enum DmaCmd {
    /// Allocate two buffers, fill the source through its mapping, import both into the DMA
    /// engine (/dev/p2pbuf-dma), copy with the engine, verify the destination through its
    /// mapping. QEMU's edu engine is slow (10-20 KiB/s): keep --len small.
    Copy(CopyArgs),
}

#[derive(Args, Debug)]
pub struct CopyArgs {
    /// Source memory (a dma-buf: not host).
    #[arg(long, default_value = Source::DEFAULT_NAME, value_parser = crate::mem::parse,
          help = crate::mem::HELP)]
    pub src_mem: Source,
    /// Destination memory (a dma-buf: not host).
    #[arg(long, default_value = Source::DEFAULT_NAME, value_parser = crate::mem::parse,
          help = crate::mem::HELP)]
    pub dst_mem: Source,
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
    /// The p2pbuf-dma device.
    #[arg(long, default_value = dma::DEVICE)]
    device: PathBuf,
}

/// One side of a copy in `p2pbuf --json dma copy`.
#[derive(Serialize)]
pub struct SideReport {
    /// `src` or `dst`.
    pub side: &'static str,
    /// Where the memory came from.
    pub kind: Source,
    /// The dma-buf's exporter.
    pub exporter: Option<String>,
    /// Its size in bytes.
    pub size: u64,
    /// p2pbuf memory: its provider.
    pub provider: Option<u32>,
    /// p2pbuf memory: where it starts in the BAR.
    pub bar_offset: Option<u64>,
    /// The engine's handle of the import.
    pub handle: u32,
    /// How the engine mapped it.
    pub map_type: MapType,
    /// The engine reaches it peer-to-peer.
    pub peer_to_peer: bool,
    /// DMA ranges of the mapping.
    pub nr_ranges: u32,
}

impl SideReport {
    fn new(side: &'static str, s: Summary, imp: &Import) -> Self {
        SideReport {
            side,
            kind: s.kind,
            exporter: s.exporter,
            size: s.size,
            provider: s.provider,
            bar_offset: s.bar_offset,
            handle: imp.handle,
            map_type: imp.map_type,
            peer_to_peer: imp.map_type.is_device_memory(),
            nr_ranges: imp.nr_ranges,
        }
    }
}

/// `p2pbuf --json dma copy`.
#[derive(Serialize)]
pub struct CopyReport {
    /// The source.
    pub src: SideReport,
    /// The destination.
    pub dst: SideReport,
    /// Bytes asked for.
    pub len: usize,
    /// First byte of the source.
    pub src_offset: usize,
    /// First byte of the destination.
    pub dst_offset: usize,
    /// Bytes the engine copied.
    pub copied: u64,
    /// Engine transfers it took.
    pub nr_transfers: u32,
    /// Time of the copy.
    pub seconds: f64,
    /// `len / seconds`.
    pub kib_per_s: f64,
    /// The destination holds the source's bytes and nothing else changed.
    pub verified: bool,
    /// What the check found.
    pub verify: String,
}

/// The check of a copy: the destination's range holds the source's bytes (the lab pattern of
/// `a.seed` from `a.src_offset`), everything around it is still the pattern of `dseed`; the
/// first mismatch, if any.
fn check_copy(dbuf: &DmaBuf, a: &CopyArgs, dseed: u32) -> p2pbuf::Result<Option<Mismatch>> {
    let (src_offset, dst_offset, len, seed) = (a.src_offset, a.dst_offset, a.len, a.seed);
    let m = dbuf.map(Access::Read)?;
    let r = m.read()?;
    let bad = mismatches(&r, |i| {
        if i >= dst_offset && i < dst_offset + len {
            pattern::byte((i - dst_offset + src_offset) as u64, seed.into())
        } else {
            pattern::byte(i as u64, dseed.into())
        }
    });
    r.finish()?;
    Ok(bad)
}

fn fill(buf: &DmaBuf, seed: u32) -> p2pbuf::Result<()> {
    let mut m = buf.map(Access::ReadWrite)?;
    let mut w = m.write()?;
    pattern::fill(&mut w, seed.into());
    w.finish()
}

fn alloc(side: &str, s: &Source, len: usize) -> p2pbuf::Result<Buffer> {
    if !s.is_dmabuf() {
        return Err(Error::Invalid {
            what: format!("p2pbuf dma copy --{side}-mem {s}"),
            detail: "the engine imports dma-bufs; host memory is not one".into(),
            check: Some("choose p2pbuf, udmabuf, cuda or fd-from:SOCKET".into()),
        });
    }
    memory::alloc(s, len as u64)
}

pub fn run(c: DmaCmd, json: bool) -> p2pbuf::Result<()> {
    let DmaCmd::Copy(a) = c;
    let len = a.len;
    if len == 0 {
        return Err(Error::Protocol {
            what: "p2pbuf dma copy".into(),
            detail: "--len must be at least 1 byte".into(),
        });
    }
    // The engine first: without it there is nothing to do.
    let eng = Engine::open_at(&a.device)?;
    let smem = alloc("src", &a.src_mem, a.src_offset + len)?;
    let dmem = alloc("dst", &a.dst_mem, a.dst_offset + len)?;
    let (sbuf, dbuf) = (smem.require_dmabuf("src")?, dmem.require_dmabuf("dst")?);
    let dseed = a.seed.wrapping_add(101);
    fill(sbuf, a.seed)?;
    fill(dbuf, dseed)?;
    let si = eng.import(sbuf)?;
    let di = eng.import(dbuf)?;
    let t = Instant::now();
    let done = eng.copy(&dma::Copy {
        src: si.handle,
        src_offset: a.src_offset as u64,
        dst: di.handle,
        dst_offset: a.dst_offset as u64,
        len: len as u64,
        timeout_ms: a.timeout_ms,
    });
    let secs = t.elapsed().as_secs_f64();
    let _ = eng.release(si.handle);
    let _ = eng.release(di.handle);
    let done = done?;
    let (src_offset, dst_offset) = (a.src_offset, a.dst_offset);
    let bad = check_copy(dbuf, &a, dseed)?;
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
    let kib_per_s = len as f64 / 1024.0 / secs.max(f64::MIN_POSITIVE);
    if json {
        print_json(&CopyReport {
            src: SideReport::new("src", smem.summary(&a.src_mem), &si),
            dst: SideReport::new("dst", dmem.summary(&a.dst_mem), &di),
            len,
            src_offset,
            dst_offset,
            copied: done.copied,
            nr_transfers: done.nr_transfers,
            seconds: secs,
            kib_per_s,
            verified: ok,
            verify: verify_text.clone(),
        });
    } else {
        println!(
            "dma copy: {} with the DMA engine ({})",
            human_size(len as u64),
            a.device.display()
        );
        for (name, m, k, imp, off) in [
            ("src", &smem, &a.src_mem, &si, src_offset),
            ("dst", &dmem, &a.dst_mem, &di, dst_offset),
        ] {
            println!(
                "  {name}:      {} at offset {off}; handle {}, map type {}, {} range(s)",
                m.summary(k).describe(),
                imp.handle,
                imp.map_type,
                imp.nr_ranges
            );
        }
        println!(
            "  copied:   {} bytes in {} engine transfer(s), {:.2} s ({kib_per_s:.1} KiB/s)",
            done.copied, done.nr_transfers, secs,
        );
        println!("  verify:   {verify_text}");
    }
    let what = format!("verifying the engine's copy of {len} bytes");
    crate::output::verdict(ok, json, what, || {
        if short {
            format!("only {} of {len} bytes copied (a signal?)", done.copied)
        } else {
            verify_text
        }
    })
}
