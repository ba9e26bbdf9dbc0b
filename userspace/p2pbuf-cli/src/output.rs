//! What the commands' reports share: the dma-buf block of the text output, the surface and
//! error parts of the `--json` output, and printing one JSON line.

use p2pbuf::surface::SurfaceSummary;
use p2pbuf::units::human_size;
use p2pbuf::{Access, DmaBuf, DmaBufInfo, Error};
use serde::Serialize;

/// Print `v` as one line of JSON (the `--json` output of every command).
pub fn print_json<T: Serialize>(v: &T) {
    match serde_json::to_string(v) {
        Ok(s) => println!("{s}"),
        Err(e) => eprintln!("p2pbuf: error: writing JSON: {e}"),
    }
}

/// `--json` when a command fails: `{"error", "errno", "unavailable"}`.
#[derive(Serialize)]
pub struct ErrorReport {
    /// The error, as the text output says it.
    pub error: String,
    /// Its errno, when a system call failed.
    pub errno: Option<i32>,
    /// The machine lacks what was asked for (exit status 69).
    pub unavailable: bool,
}

impl ErrorReport {
    pub fn new(e: &Error) -> Self {
        ErrorReport {
            error: e.to_string(),
            errno: e.errno(),
            unavailable: e.is_unavailable(),
        }
    }
}

/// The surface a buffer's name describes: its layout, `{"error": ...}` for a malformed
/// description (JSON null when the name describes none).
#[derive(Serialize)]
#[serde(untagged)]
pub enum SurfaceReport {
    /// The layout.
    Layout(SurfaceSummary),
    /// Why the name is not a valid description.
    Error { error: String },
}

impl SurfaceReport {
    pub fn of(i: &DmaBufInfo) -> Option<SurfaceReport> {
        match i.surface()? {
            Ok(s) => Some(SurfaceReport::Layout(s.summary())),
            Err(e) => Some(SurfaceReport::Error {
                error: e.to_string(),
            }),
        }
    }
}

/// A dma-buf as the text output shows it.
pub fn print_info(title: &str, fd: Option<i32>, i: &DmaBufInfo) {
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

/// The outcome of trying something on a buffer (`--mmap`, `--rdma`).
#[derive(Serialize)]
pub struct Outcome {
    /// It worked.
    pub ok: bool,
    /// What was done, or the error.
    pub detail: String,
    /// The errno of a failure.
    pub errno: Option<i32>,
    /// `--mmap`: the first 16 bytes read, in hex.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_bytes: Option<String>,
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

    /// For the text output.
    pub fn line(&self) -> String {
        match (&self.first_bytes, self.ok) {
            (Some(b), true) => format!("ok, first bytes {b}"),
            (None, true) => format!("ok, {}", self.detail),
            _ => format!("failed: {}", self.detail),
        }
    }
}

/// `--mmap`, `--rdma` and `--hold` of the commands that end up holding a dma-buf (`recv`,
/// `cuda export`).
#[derive(clap::Args, Debug, Clone, Copy)]
pub struct TryArgs {
    /// Also try a CPU mapping here (mmap + DMA_BUF_IOCTL_SYNC) and report.
    #[arg(long)]
    pub mmap: bool,
    /// Also try RDMA registration here and report.
    #[arg(long)]
    pub rdma: bool,
    /// Keep the buffer (its fd, and memory this process allocated) this many seconds before
    /// exiting.
    #[arg(long, default_value_t = 0)]
    pub hold: u64,
}

/// The outcomes of `--mmap` and `--rdma` (`None`: not asked for).
pub struct Tried {
    /// `--mmap`'s.
    pub mmap: Option<Outcome>,
    /// `--rdma`'s.
    pub rdma: Option<Outcome>,
}

impl TryArgs {
    /// Try on `buf` what was asked for.
    pub fn run(&self, buf: &DmaBuf) -> Tried {
        Tried {
            mmap: self.mmap.then(|| try_mmap(buf)),
            rdma: self.rdma.then(|| try_rdma(buf)),
        }
    }
}

impl Tried {
    /// The text output's lines of what was tried.
    pub fn print(&self) {
        if let Some(m) = &self.mmap {
            println!("  mmap:     {}", m.line());
        }
        if let Some(r) = &self.rdma {
            println!("  rdma:     {}", r.line());
        }
    }
}

/// The end of a command that checks what it did: its last text line (`OK` or `FAILED`,
/// unless `json`), and an [`Error::Protocol`] (`what` was checked, `detail` says how it
/// failed) when not `ok`.
pub fn verdict(
    ok: bool,
    json: bool,
    what: String,
    detail: impl FnOnce() -> String,
) -> p2pbuf::Result<()> {
    if !json {
        println!("{}", if ok { "OK" } else { "FAILED" });
    }
    if ok {
        return Ok(());
    }
    Err(Error::Protocol {
        what,
        detail: detail(),
    })
}

/// Map `buf`, read its first bytes inside a SYNC bracket, and report.
pub fn try_mmap(buf: &DmaBuf) -> Outcome {
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
pub fn try_rdma(buf: &DmaBuf) -> Outcome {
    let r = (|| {
        let ctx = p2pbuf_rdma::Context::open(None)?;
        let pd = p2pbuf_rdma::Pd::new(&ctx)?;
        let mr = pd.reg_dmabuf_mr(
            0,
            buf.size() as usize,
            0,
            std::os::fd::AsFd::as_fd(buf),
            p2pbuf_rdma::MrAccess::REMOTE_RW,
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
