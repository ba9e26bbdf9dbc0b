//! `p2pbuf alloc`: a dma-buf of some memory, reported, filled, sent, held.

use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use p2pbuf::exporter::AllocFlags;
use p2pbuf::memory::{self, Source};
use p2pbuf::surface::{DrmFourcc, DrmModifier, Surface, SurfaceSpec};
use p2pbuf::units::{human_size, parse_byte, parse_size};
use p2pbuf::{Access, DmaBufInfo, Error};
use serde::Serialize;

use crate::output::{print_info, print_json, SurfaceReport};

#[derive(Args, Debug)]
pub struct AllocArgs {
    /// The memory (a dma-buf: not host).
    #[arg(long, default_value = Source::DEFAULT_NAME, value_parser = crate::mem::parse,
          help = crate::mem::HELP)]
    pub mem: Source,
    /// Bytes (rounded up to the page size): 4096, 2M, 64MiB. With --surface: at least
    /// the surface's size (default: exactly that).
    #[arg(long, value_parser = parse_size, required_unless_present = "surface")]
    size: Option<usize>,
    /// A 2D surface WIDTHxHEIGHT (e.g. 1920x1080): the size is computed from it, and the
    /// description is stored as the dma-buf's name, visible to every process holding it.
    #[arg(long, value_parser = parse_dims)]
    surface: Option<(u32, u32)>,
    /// The surface's DRM format: a fourcc code (XR24, AR24, RG24, NV12, YU12, YUYV, R8...)
    /// or a name (XRGB8888).
    #[arg(long, requires = "surface", default_value = "XR24", value_parser = parse_format)]
    format: DrmFourcc,
    /// The surface's DRM format modifier: LINEAR, I915_X_TILED, I915_Y_TILED.
    #[arg(long, requires = "surface", default_value = "LINEAR", value_parser = parse_modifier)]
    modifier: DrmModifier,
    /// The surface's stride (bytes per row of plane 0); default: a row's bytes rounded up
    /// to 64 (linear) or to the tile width.
    #[arg(long, requires = "surface")]
    stride: Option<u32>,
    /// p2pbuf memory: map it as I/O memory without struct pages (P2PBUF_ALLOC_PFNMAP,
    /// VM_IO | VM_PFNMAP), for cudaHostRegister(..., cudaHostRegisterIoMemory) of its mmap.
    /// O_DIRECT and plain ibv_reg_mr refuse such a mapping (EFAULT): register the dma-buf.
    #[arg(long)]
    pfnmap: bool,
    /// Fill it with this byte through its mmap (0-255 or 0x00-0xff).
    #[arg(long, value_parser = parse_byte)]
    fill: Option<u8>,
    /// Send the fd to a receiver listening on this Unix socket.
    #[arg(long)]
    send: Option<PathBuf>,
    /// Seconds to wait for the receiver's socket.
    #[arg(long, default_value_t = 10)]
    wait: u64,
    /// Keep the buffer this many seconds before exiting.
    #[arg(long, default_value_t = 0)]
    hold: u64,
}

fn parse_dims(s: &str) -> Result<(u32, u32), String> {
    p2pbuf::surface::parse_dims(s).map_err(|e| e.to_string())
}

fn parse_format(s: &str) -> Result<DrmFourcc, String> {
    p2pbuf::surface::parse_format(s).map_err(|e| e.to_string())
}

fn parse_modifier(s: &str) -> Result<DrmModifier, String> {
    p2pbuf::surface::parse_modifier(s).map_err(|e| e.to_string())
}

/// `p2pbuf --json alloc`: one line, printed once the buffer is filled (and sent).
#[derive(Serialize)]
pub struct AllocReport<'a> {
    /// The dma-buf's fd in this process (another process takes it as `PID:FD`).
    pub fd: i32,
    /// This process.
    pub pid: u32,
    /// Its fdinfo.
    pub info: &'a DmaBufInfo,
    /// The surface its name describes (null: none).
    pub surface: Option<SurfaceReport>,
    /// p2pbuf memory: the provider it came from.
    pub provider: Option<u32>,
    /// p2pbuf memory: where it starts in the provider's BAR.
    pub bar_offset: Option<u64>,
    /// p2pbuf memory: its mmap is I/O memory without struct pages (`--pfnmap`).
    pub pfnmap: bool,
    /// `--fill`.
    pub fill: Option<u8>,
    /// `--send`.
    pub sent_to: Option<&'a PathBuf>,
    /// The receiver's answer.
    pub receiver: Option<String>,
}

/// The bytes to allocate: `--size`, or the surface's size; both: the size must hold the
/// surface.
fn alloc_size(size: Option<usize>, surface: Option<&Surface>) -> p2pbuf::Result<u64> {
    match (size, surface) {
        (Some(n), Some(s)) if (n as u64) < s.size => Err(Error::Invalid {
            what: format!("allocating {n} bytes for surface {}", s.name()),
            detail: format!("the surface needs {} bytes", s.size),
            check: Some(format!(
                "leave --size out, or give --size {} or more",
                s.size
            )),
        }),
        (Some(n), _) => Ok(n as u64),
        (None, Some(s)) => Ok(s.size),
        (None, None) => Err(Error::Invalid {
            what: "alloc".into(),
            detail: "neither --size nor --surface given".into(),
            check: None,
        }),
    }
}

pub fn run(a: AllocArgs, json: bool) -> p2pbuf::Result<()> {
    let surface = a
        .surface
        .map(|(width, height)| {
            Surface::new(SurfaceSpec {
                width,
                height,
                format: a.format,
                modifier: a.modifier,
                stride: a.stride,
            })
        })
        .transpose()?;
    let size = alloc_size(a.size, surface.as_ref())?;
    if !a.mem.is_dmabuf() {
        return Err(Error::Invalid {
            what: format!("p2pbuf alloc --mem {}", a.mem),
            detail: "host memory is not a dma-buf".into(),
            check: Some("choose p2pbuf, udmabuf or cuda".into()),
        });
    }
    if a.pfnmap && a.mem != Source::P2pbuf {
        return Err(Error::Invalid {
            what: format!("p2pbuf alloc --mem {} --pfnmap", a.mem),
            detail: "only p2pbuf device memory can be PFN-mapped".into(),
            check: Some("use --mem p2pbuf, or leave --pfnmap out".into()),
        });
    }
    let opts = memory::Options {
        p2pbuf: AllocFlags {
            pfnmap: a.pfnmap,
            ..Default::default()
        },
        ..Default::default()
    };
    let mut mem = memory::alloc_with(&a.mem, size, &opts)?;
    if let (Some(s), Some(b)) = (&surface, mem.dmabuf_mut()) {
        b.set_name(&s.name())?;
    }
    let buf = mem.require_dmabuf("p2pbuf alloc")?;
    let placement = mem.placement();
    if let Some(b) = a.fill {
        let mut m = buf.map(Access::ReadWrite)?;
        let mut w = m.write()?;
        w.fill(b);
        w.finish()?;
    }
    if !json {
        print_info(
            &format!(
                "allocated {}{}",
                human_size(buf.size()),
                placement.map_or(String::new(), |p| format!(
                    " from provider {} at BAR offset {:#x}",
                    p.provider, p.bar_offset
                ))
            ),
            Some(buf.as_raw_fd()),
            buf.info(),
        );
        if a.pfnmap {
            println!(
                "cpu mapping: VM_IO | VM_PFNMAP (cudaHostRegister with cudaHostRegisterIoMemory takes it; O_DIRECT and ibv_reg_mr refuse it)"
            );
        }
    }
    let receiver = match &a.send {
        Some(s) => {
            let ack = p2pbuf::fdpass::send_to(s, buf, a.wait)?;
            if !json {
                println!("sent to {}; receiver: {ack}", s.display());
            }
            Some(ack)
        }
        None => None,
    };
    if json {
        print_json(&AllocReport {
            fd: buf.as_raw_fd(),
            pid: std::process::id(),
            info: buf.info(),
            surface: SurfaceReport::of(buf.info()),
            provider: placement.map(|p| p.provider),
            bar_offset: placement.map(|p| p.bar_offset),
            pfnmap: a.pfnmap,
            fill: a.fill,
            sent_to: a.send.as_ref(),
            receiver,
        });
    }
    if a.hold > 0 {
        std::thread::sleep(Duration::from_secs(a.hold));
    }
    Ok(())
}
