//! `p2pbuf`: inspect, pass and export dma-bufs.
//!
//! Exit status: 0 on success, 1 on an error, 69 (`EX_UNAVAILABLE`) when
//! the machine lacks what was asked for (no GPU, no driver support, no
//! RDMA device, no /dev/udmabuf), 2 for usage errors (including an invalid
//! surface description).

mod p2ppath;
mod rdma;
mod target;
mod xfer;

use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use p2pbuf::{Access, DmaBuf, DmaBufInfo, Error};
use serde::Serialize;
use serde_json::json;

use target::{human_size, Resolved, Target};

/// Exit status for "this machine lacks the facility".
const EX_UNAVAILABLE: i32 = 69;

#[derive(Parser, Debug)]
#[command(name = "p2pbuf", version, about = "Inspect, pass and export dma-bufs")]
struct Cli {
    /// Print JSON instead of text.
    #[arg(long, global = true)]
    json: bool,

    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Print a dma-buf's size, exporter and fdinfo.
    ///
    /// TARGET is an fd of this process (`3`, e.g. after `3<&N` in a
    /// shell), `PID:FD` (taken with pidfd_getfd), an fdinfo file
    /// (`/proc/PID/fdinfo/FD`), or a path to open.
    Info {
        /// fd, PID:FD, /proc/PID/fdinfo/FD or a path.
        target: Target,
    },
    /// Revoke a p2pbuf dma-buf through the exporter (P2PBUF_IOCTL_REVOKE): its importers
    /// (RDMA MRs, the DMA engine) lose the memory, CPU mappings fault, the fds stay open.
    /// `PID:FD` revokes another process's buffer.
    Revoke {
        /// fd, PID:FD or a path (not an fdinfo file).
        target: Target,
    },
    /// Send a dma-buf to a `p2pbuf recv` listening on a Unix socket.
    Send {
        /// Socket path the receiver listens on.
        socket: PathBuf,
        /// The buffer: fd, PID:FD or a path (not an fdinfo file).
        target: Target,
        /// Seconds to wait for the receiver's socket to appear.
        #[arg(long, default_value_t = 10)]
        wait: u64,
    },
    /// Listen on a Unix socket, receive one dma-buf, print what this
    /// process sees of it, and answer the sender.
    Recv {
        /// Socket path to create.
        socket: PathBuf,
        /// Also try a CPU mapping (mmap + DMA_BUF_IOCTL_SYNC) and report.
        #[arg(long)]
        mmap: bool,
        /// Also try RDMA registration and report.
        #[arg(long)]
        rdma: bool,
        /// Keep the received fd open this many seconds before exiting.
        #[arg(long, default_value_t = 0)]
        hold: u64,
    },
    /// Allocate a dma-buf (udmabuf, or device memory from the p2pbuf
    /// exporter), report it, and optionally send it to a receiver
    /// (`p2pbuf recv`, `p2pbuf rdma serve --buf fd-from SOCKET`).
    Alloc {
        /// The exporter.
        #[arg(long, value_enum, default_value = "udmabuf")]
        kind: AllocKind,
        /// Bytes (rounded up to the page size): 4096, 2M, 64MiB. With --surface: at least
        /// the surface's size (default: exactly that).
        #[arg(long, value_parser = target::parse_size, required_unless_present = "surface")]
        size: Option<usize>,
        /// A 2D surface WIDTHxHEIGHT (e.g. 1920x1080): the size is computed from it, and the
        /// description is stored as the dma-buf's name, visible to every process holding it.
        #[arg(long, value_parser = parse_dims)]
        surface: Option<(u32, u32)>,
        /// The surface's DRM format: a fourcc code (XR24, AR24, RG24, NV12, YU12, YUYV, R8...)
        /// or a name (XRGB8888).
        #[arg(long, requires = "surface", default_value = "XR24", value_parser = parse_format)]
        format: p2pbuf::surface::DrmFourcc,
        /// The surface's DRM format modifier: LINEAR, I915_X_TILED, I915_Y_TILED.
        #[arg(long, requires = "surface", default_value = "LINEAR", value_parser = parse_modifier)]
        modifier: p2pbuf::surface::DrmModifier,
        /// The surface's stride (bytes per row of plane 0); default: a row's bytes rounded up
        /// to 64 (linear) or to the tile width.
        #[arg(long, requires = "surface")]
        stride: Option<u32>,
        /// Fill it with this byte through its mmap (0-255 or 0x00-0xff).
        #[arg(long, value_parser = target::parse_byte)]
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
    },
    /// RDMA: serve a buffer (host memory or a dma-buf), write into it and
    /// read from it from a client, register buffers.
    #[command(subcommand)]
    Rdma(rdma::RdmaCmd),
    /// CUDA device memory as a dma-buf (build with `--features cuda`).
    #[command(subcommand)]
    Cuda(CudaCmd),
    /// NVMe: O_DIRECT reads and writes between a drive and a freshly allocated buffer
    /// (device memory: peer-to-peer, the GPUDirect Storage path without nvidia-fs).
    #[command(subcommand)]
    Nvme(xfer::NvmeCmd),
    /// The FPGA stand-in: the DMA engine behind /dev/p2pbuf-dma copying between dma-bufs.
    #[command(subcommand)]
    Fpga(xfer::FpgaCmd),
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum AllocKind {
    /// /dev/udmabuf (memfd pages).
    Udmabuf,
    /// /dev/p2pbuf (PCI device memory).
    P2pbuf,
}

#[derive(Subcommand, Debug)]
enum CudaCmd {
    /// Show a device's dma-buf and GPUDirect RDMA attributes.
    Probe {
        /// Device ordinal.
        #[arg(long, default_value_t = 0)]
        device: i32,
    },
    /// Allocate device memory, export it as a dma-buf, and report (or send
    /// it to `p2pbuf recv`).
    Export {
        /// Device ordinal.
        #[arg(long, default_value_t = 0)]
        device: i32,
        /// Bytes (rounded up to 2 MiB): 4096, 2M, 64MiB, 1G.
        #[arg(long, default_value = "2M", value_parser = target::parse_size)]
        size: usize,
        /// Byte to fill the memory with before export (0-255 or 0x00-0xff).
        #[arg(long, default_value = "0xa5", value_parser = target::parse_byte)]
        fill: u8,
        /// Ask for CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE.
        #[arg(long)]
        pcie_mapping: bool,
        /// Send the fd to a `p2pbuf recv` on this socket.
        #[arg(long)]
        send: Option<PathBuf>,
        /// Seconds to wait for the receiver's socket.
        #[arg(long, default_value_t = 10)]
        wait: u64,
        /// Also try a CPU mapping here and report.
        #[arg(long)]
        mmap: bool,
        /// Also try RDMA registration here and report.
        #[arg(long)]
        rdma: bool,
        /// Keep the memory and fd this many seconds before exiting.
        #[arg(long, default_value_t = 0)]
        hold: u64,
    },
}

fn main() {
    let cli = Cli::parse();
    let json = cli.json;
    if let Err(e) = run(cli) {
        if json {
            println!(
                "{}",
                json!({ "error": e.to_string(), "errno": e.errno(), "unavailable": e.is_unavailable() })
            );
        }
        eprintln!("p2pbuf: error: {e}");
        std::process::exit(if e.is_unavailable() {
            EX_UNAVAILABLE
        } else if matches!(e, Error::Invalid { .. }) {
            2
        } else {
            1
        });
    }
}

fn run(cli: Cli) -> p2pbuf::Result<()> {
    match cli.cmd {
        Cmd::Info { target } => info(&target, cli.json),
        Cmd::Revoke { target } => revoke(&target, cli.json),
        Cmd::Send {
            socket,
            target,
            wait,
        } => send(&socket, &target, wait, cli.json),
        Cmd::Recv {
            socket,
            mmap,
            rdma,
            hold,
        } => recv(&socket, mmap, rdma, hold, cli.json),
        Cmd::Alloc {
            kind,
            size,
            surface,
            format,
            modifier,
            stride,
            fill,
            send,
            wait,
            hold,
        } => {
            let surface = surface
                .map(|(width, height)| {
                    p2pbuf::surface::Surface::new(p2pbuf::surface::SurfaceSpec {
                        width,
                        height,
                        format,
                        modifier,
                        stride,
                    })
                })
                .transpose()?;
            alloc(
                kind,
                size,
                surface.as_ref(),
                fill,
                send.as_deref(),
                wait,
                hold,
                cli.json,
            )
        }
        Cmd::Rdma(c) => rdma::run(c, cli.json),
        Cmd::Cuda(c) => cuda(c, cli.json),
        Cmd::Nvme(c) => xfer::nvme(c, cli.json),
        Cmd::Fpga(c) => xfer::fpga(c, cli.json),
    }
}

fn parse_dims(s: &str) -> Result<(u32, u32), String> {
    p2pbuf::surface::parse_dims(s).map_err(|e| e.to_string())
}

fn parse_format(s: &str) -> Result<p2pbuf::surface::DrmFourcc, String> {
    p2pbuf::surface::parse_format(s).map_err(|e| e.to_string())
}

fn parse_modifier(s: &str) -> Result<p2pbuf::surface::DrmModifier, String> {
    p2pbuf::surface::parse_modifier(s).map_err(|e| e.to_string())
}

/// The bytes to allocate: `--size`, or the surface's size; both: the size must hold the
/// surface.
fn alloc_size(
    size: Option<usize>,
    surface: Option<&p2pbuf::surface::Surface>,
) -> p2pbuf::Result<u64> {
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

/// The surface a buffer's name describes, for JSON: its layout, `{"error": ...}` for a
/// malformed description, null for none.
fn surface_json(i: &DmaBufInfo) -> serde_json::Value {
    match i.surface() {
        Some(Ok(s)) => serde_json::to_value(s.summary()).unwrap_or_default(),
        Some(Err(e)) => json!({ "error": e.to_string() }),
        None => serde_json::Value::Null,
    }
}

#[allow(clippy::too_many_arguments)]
fn alloc(
    kind: AllocKind,
    size: Option<usize>,
    surface: Option<&p2pbuf::surface::Surface>,
    fill: Option<u8>,
    send: Option<&Path>,
    wait: u64,
    hold: u64,
    json: bool,
) -> p2pbuf::Result<()> {
    let size = alloc_size(size, surface)?;
    let (mut buf, offset) = match kind {
        AllocKind::Udmabuf => (p2pbuf::udmabuf::alloc(size)?, None),
        AllocKind::P2pbuf => {
            let a = p2pbuf::exporter::alloc(size)?;
            (a.buf, Some((a.provider, a.offset)))
        }
    };
    if let Some(s) = surface {
        buf.set_name(&s.name())?;
    }
    if let Some(b) = fill {
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
                offset.map_or(String::new(), |(p, o)| format!(
                    " from provider {p} at BAR offset {o:#x}"
                ))
            ),
            Some(buf.as_raw_fd()),
            buf.info(),
        );
    }
    let ack = match send {
        Some(s) => {
            let a = send_to(s, &buf, wait)?;
            if !json {
                println!("sent to {}; receiver: {a}", s.display());
            }
            Some(a)
        }
        None => None,
    };
    if json {
        println!(
            "{}",
            json!({
                "fd": buf.as_raw_fd(),
                "pid": std::process::id(),
                "info": buf.info(),
                "surface": surface_json(buf.info()),
                "provider": offset.map(|o| o.0),
                "bar_offset": offset.map(|o| o.1),
                "fill": fill,
                "sent_to": send,
                "receiver": ack,
            })
        );
    }
    if hold > 0 {
        std::thread::sleep(Duration::from_secs(hold));
    }
    Ok(())
}

fn print_info(title: &str, fd: Option<i32>, i: &DmaBufInfo) {
    println!("{title}");
    if let Some(fd) = fd {
        println!("  fd:       {fd} (pid {})", std::process::id());
    }
    println!("  exporter: {}", i.exporter);
    println!("  size:     {}", human_size(i.size));
    if let Some(n) = &i.name {
        println!("  name:     {n}");
    }
    match i.surface() {
        Some(Ok(s)) => println!("  surface:  {s}"),
        Some(Err(e)) => println!("  surface:  the name is not a valid description: {e}"),
        None => {}
    }
    if let Some(ino) = i.ino {
        println!("  inode:    {ino}");
    }
    if let Some(c) = i.count {
        println!("  count:    {c}");
    }
    if let Some(f) = i.flags {
        println!(
            "  flags:    0{f:o} ({})",
            match i.writable() {
                Some(true) => "read-write",
                _ => "read-only",
            }
        );
    }
    for (k, v) in &i.other {
        println!("  {k}: {v}");
    }
}

fn info(target: &Target, json: bool) -> p2pbuf::Result<()> {
    let r = target.resolve()?;
    let fd = match &r {
        Resolved::Buf(b) => Some(b.as_raw_fd()),
        Resolved::InfoOnly(_) => None,
    };
    if json {
        println!(
            "{}",
            json!({ "target": target.to_string(), "fd": fd, "pid": std::process::id(), "info": r.info(), "surface": surface_json(r.info()) })
        );
    } else {
        print_info(&format!("dma-buf: {target}"), fd, r.info());
    }
    Ok(())
}

fn revoke(target: &Target, json: bool) -> p2pbuf::Result<()> {
    let buf = target.open()?;
    p2pbuf::exporter::Exporter::open()?.revoke(&buf)?;
    if json {
        println!(
            "{}",
            json!({ "revoked": true, "target": target.to_string(), "exporter": buf.exporter(), "size": buf.size() })
        );
    } else {
        println!(
            "revoked {target}: {} dma-buf of {}",
            buf.exporter(),
            target::human_size(buf.size())
        );
    }
    Ok(())
}

fn connect(socket: &Path, wait: u64) -> p2pbuf::Result<UnixStream> {
    let deadline = Instant::now() + Duration::from_secs(wait);
    loop {
        match UnixStream::connect(socket) {
            Ok(s) => return Ok(s),
            Err(e)
                if Instant::now() < deadline
                    && matches!(
                        e.kind(),
                        std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
                    ) =>
            {
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => {
                return Err(Error::Io {
                    what: format!("connecting to the receiver (waited {wait} s)"),
                    path: socket.to_path_buf(),
                    source: e,
                    check: Some("is `p2pbuf recv SOCKET` running?".into()),
                })
            }
        }
    }
}

/// Send `buf` and wait for the receiver's answer.
fn send_to(socket: &Path, buf: &DmaBuf, wait: u64) -> p2pbuf::Result<String> {
    let s = connect(socket, wait)?;
    p2pbuf::send_dmabuf(&s, buf)?;
    p2pbuf::fdpass::recv_ack(&s)
}

fn send(socket: &Path, target: &Target, wait: u64, json: bool) -> p2pbuf::Result<()> {
    let buf = target.open()?;
    let ack = send_to(socket, &buf, wait)?;
    if json {
        println!(
            "{}",
            json!({ "sent": buf.info(), "socket": socket, "receiver": ack })
        );
    } else {
        println!(
            "sent {} dma-buf of {} to {}",
            buf.exporter(),
            human_size(buf.size()),
            socket.display()
        );
        println!("receiver: {ack}");
    }
    Ok(())
}

fn bind(socket: &Path) -> p2pbuf::Result<UnixListener> {
    use std::os::unix::fs::FileTypeExt;
    if let Ok(md) = std::fs::symlink_metadata(socket) {
        // A socket file nobody listens on is left over from a previous
        // run: remove it. Anything else is refused.
        let stale = md.file_type().is_socket() && UnixStream::connect(socket).is_err();
        if !stale {
            return Err(Error::Unavailable {
                what: format!("listening on {}", socket.display()),
                detail: "the path exists and is not a stale socket".into(),
                check: Some("another `p2pbuf recv` on it, or choose another path".into()),
            });
        }
        let _ = std::fs::remove_file(socket);
    }
    UnixListener::bind(socket).map_err(|e| Error::Io {
        what: "listening on a Unix socket".into(),
        path: socket.to_path_buf(),
        source: e,
        check: Some("does the directory exist and is it writable?".into()),
    })
}

#[derive(Serialize)]
struct Outcome {
    ok: bool,
    detail: String,
    errno: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    first_bytes: Option<String>,
}

impl Outcome {
    fn err(e: &Error) -> Self {
        Outcome {
            ok: false,
            detail: e.to_string(),
            errno: e.errno(),
            first_bytes: None,
        }
    }

    fn line(&self) -> String {
        match (&self.first_bytes, self.ok) {
            (Some(b), true) => format!("ok, first bytes {b}"),
            (None, true) => format!("ok, {}", self.detail),
            _ => format!("failed: {}", self.detail),
        }
    }
}

/// Map `buf`, read its first bytes inside a SYNC bracket, and report.
fn try_mmap(buf: &DmaBuf) -> Outcome {
    let r = (|| {
        let m = buf.map(Access::Read)?;
        let g = m.read()?;
        let head: Vec<String> = g.iter().take(16).map(|b| format!("{b:02x}")).collect();
        g.finish()?;
        Ok::<_, Error>(head.join(" "))
    })();
    match r {
        Ok(head) => Outcome {
            ok: true,
            detail: "mapped read-only, DMA_BUF_IOCTL_SYNC start/end ok".into(),
            errno: None,
            first_bytes: Some(head),
        },
        Err(e) => Outcome::err(&e),
    }
}

/// Register `buf` for RDMA (ibv_reg_dmabuf_mr on the first device) and report.
fn try_rdma(buf: &DmaBuf) -> Outcome {
    let r = (|| {
        let ctx = p2pbuf_rdma::Context::open(None)?;
        let pd = p2pbuf_rdma::Pd::new(&ctx)?;
        let mr = pd.reg_dmabuf_mr(
            0,
            buf.size() as usize,
            0,
            std::os::fd::AsFd::as_fd(buf),
            p2pbuf_rdma::Access::REMOTE_RW,
        )?;
        let i = mr.info();
        Ok::<_, Error>(format!(
            "registered on {} with ibv_reg_dmabuf_mr: rkey {:#x}, {} bytes",
            ctx.name(),
            i.rkey,
            i.len
        ))
    })();
    match r {
        Ok(detail) => Outcome {
            ok: true,
            detail,
            errno: None,
            first_bytes: None,
        },
        Err(e) => Outcome::err(&e),
    }
}

fn recv(socket: &Path, mmap: bool, rdma: bool, hold: u64, json: bool) -> p2pbuf::Result<()> {
    let listener = bind(socket)?;
    if !json {
        println!(
            "pid {} listening on {}",
            std::process::id(),
            socket.display()
        );
    }
    let res = (|| {
        let (conn, _) = listener.accept().map_err(|e| Error::Io {
            what: "accepting a connection".into(),
            path: socket.to_path_buf(),
            source: e,
            check: None,
        })?;
        let got = match p2pbuf::recv_dmabuf(&conn) {
            Ok(g) => g,
            Err(e) => {
                let _ = p2pbuf::fdpass::send_ack(&conn, false, &e.to_string());
                return Err(e);
            }
        };
        let mm = mmap.then(|| try_mmap(&got.buf));
        let rd = rdma.then(|| try_rdma(&got.buf));
        let i = got.buf.info();
        let mut ack = format!(
            "pid {} got fd {}: exp_name {} size {} ino {}",
            std::process::id(),
            got.buf.as_raw_fd(),
            i.exporter,
            i.size,
            i.ino.map_or("?".into(), |n| n.to_string())
        );
        if let Some(m) = &mm {
            ack += &format!("; mmap {}", m.line());
        }
        if let Some(r) = &rd {
            ack += &format!("; rdma {}", r.line());
        }
        if json {
            println!(
                "{}",
                json!({
                    "pid": std::process::id(),
                    "fd": got.buf.as_raw_fd(),
                    "peer_pid": got.peer_pid,
                    "header": got.header,
                    "fdinfo_path": format!("/proc/{}/fdinfo/{}", std::process::id(), got.buf.as_raw_fd()),
                    "info": i,
                    "surface": surface_json(i),
                    "mmap": mm,
                    "rdma": rd,
                })
            );
        } else {
            print_info(
                &format!(
                    "received dma-buf from pid {} (sender said: {} bytes, exporter {})",
                    got.peer_pid.map_or("?".into(), |p| p.to_string()),
                    got.header.size,
                    got.header.exporter
                ),
                Some(got.buf.as_raw_fd()),
                i,
            );
            if i.size != got.header.size || i.exporter != got.header.exporter {
                println!("  warning: differs from what the sender said");
            }
            if let Some(m) = &mm {
                println!("  mmap:     {}", m.line());
            }
            if let Some(r) = &rd {
                println!("  rdma:     {}", r.line());
            }
        }
        p2pbuf::fdpass::send_ack(&conn, true, &ack)?;
        if hold > 0 {
            if !json {
                println!(
                    "holding fd {} for {hold} s (see /proc/{}/fdinfo/{})",
                    got.buf.as_raw_fd(),
                    std::process::id(),
                    got.buf.as_raw_fd()
                );
            }
            std::thread::sleep(Duration::from_secs(hold));
        }
        Ok(())
    })();
    let _ = std::fs::remove_file(socket);
    res
}

#[cfg(not(feature = "cuda"))]
fn cuda(_: CudaCmd, _json: bool) -> p2pbuf::Result<()> {
    Err(Error::Unavailable {
        what: "p2pbuf cuda".into(),
        detail: "this p2pbuf was built without the `cuda` feature".into(),
        check: Some("cargo build -p p2pbuf-cli --features cuda".into()),
    })
}

#[cfg(feature = "cuda")]
fn cuda(c: CudaCmd, json: bool) -> p2pbuf::Result<()> {
    use p2pbuf::cuda;
    match c {
        CudaCmd::Probe { device } => {
            let d = cuda::probe(device)?;
            let rdma = p2pbuf::rdma::status()?;
            if json {
                println!("{}", json!({ "device": d, "rdma": rdma }));
            } else {
                print_device(&d);
                println!("  rdma:     {}", rdma.summary());
            }
            Ok(())
        }
        CudaCmd::Export {
            device,
            size,
            fill,
            pcie_mapping,
            send,
            wait,
            mmap,
            rdma,
            hold,
        } => {
            let x = cuda::export(&cuda::ExportOptions {
                device,
                size,
                fill: Some(fill),
                pcie_mapping,
            })?;
            let buf = x.dmabuf();
            let mm = mmap.then(|| try_mmap(buf));
            let rd = rdma.then(|| try_rdma(buf));
            let rdma_status = p2pbuf::rdma::status()?;
            if !json {
                print_device(x.device());
                print_info(
                    &format!(
                        "exported {} at device address {:#x} (filled with {fill:#04x})",
                        human_size(x.size() as u64),
                        x.device_ptr()
                    ),
                    Some(buf.as_raw_fd()),
                    buf.info(),
                );
                if let Some(m) = &mm {
                    println!("  mmap:     {}", m.line());
                }
                if let Some(r) = &rd {
                    println!("  rdma:     {}", r.line());
                }
            }
            let ack = match &send {
                Some(s) => {
                    let a = send_to(s, buf, wait)?;
                    if !json {
                        println!("sent to {}; receiver: {a}", s.display());
                    }
                    Some(a)
                }
                None => None,
            };
            // Check the memory still reads back as filled.
            let back = x.read_back(0, 16)?;
            let intact = back.iter().all(|b| *b == fill);
            if json {
                println!(
                    "{}",
                    json!({
                        "device": x.device(),
                        "device_ptr": x.device_ptr(),
                        "size": x.size(),
                        "allocated": x.allocated(),
                        "fill": fill,
                        "pcie_mapping": pcie_mapping,
                        "fd": buf.as_raw_fd(),
                        "pid": std::process::id(),
                        "info": buf.info(),
                        "mmap": mm,
                        "rdma": rd,
                        "rdma_devices": rdma_status,
                        "sent_to": send,
                        "receiver": ack,
                        "read_back_intact": intact,
                    })
                );
            } else {
                println!(
                    "read back through cuMemcpyDtoH: {} ({})",
                    back.iter()
                        .map(|b| format!("{b:02x}"))
                        .collect::<Vec<_>>()
                        .join(" "),
                    if intact { "intact" } else { "CHANGED" }
                );
            }
            if hold > 0 {
                if !json {
                    println!(
                        "holding for {hold} s (see /proc/{}/fdinfo/{})",
                        std::process::id(),
                        buf.as_raw_fd()
                    );
                }
                std::thread::sleep(Duration::from_secs(hold));
            }
            Ok(())
        }
    }
}

#[cfg(feature = "cuda")]
fn print_device(d: &p2pbuf::cuda::DeviceInfo) {
    println!(
        "CUDA device {} of {}: {} ({}), driver API {}",
        d.ordinal,
        d.device_count,
        d.name,
        d.pci_address,
        d.driver_version_string()
    );
    println!("  memory:   {}", human_size(d.total_mem));
    for a in &d.attributes {
        println!("  {} ({}) = {}", a.name, a.id, a.value);
    }
}
