//! `p2pbuf`: inspect, pass and export dma-bufs.
//!
//! Exit status: 0 on success, 1 on an error, 69 (`EX_UNAVAILABLE`) when
//! the machine lacks what was asked for (no GPU, no driver support, no
//! RDMA device, no /dev/udmabuf), 2 for usage errors (including an invalid
//! surface description).
//!
//! One module per command (`alloc`, `inspect` for info/revoke, `pass` for send/recv,
//! `cuda`, `nvme`, `dma`, `rdma`); `output` holds what their reports share, and every
//! `--json` line is one of the documented `Serialize` structs of those modules.

mod alloc;
mod cuda;
mod dma;
mod inspect;
mod nvme;
mod output;
mod p2ppath;
mod pass;
mod rdma;
mod target;
mod verify;

use clap::{Parser, Subcommand};
use p2pbuf::memory::Source;
use p2pbuf::Error;

use target::Target;

/// Exit status for "this machine lacks the facility".
const EX_UNAVAILABLE: i32 = 69;

/// The help of every option that names where memory comes from.
const MEMORY_HELP: &str = "Where the memory comes from: p2pbuf (device memory from \
    /dev/p2pbuf), udmabuf (system memory as a dma-buf), host (memory of this process, no \
    dma-buf), cuda (CUDA device memory), fd-from:SOCKET (a dma-buf received from `p2pbuf \
    alloc --send`). Every command defaults to p2pbuf";

/// clap's parser for a [`Source`].
fn parse_source(s: &str) -> Result<Source, String> {
    s.parse().map_err(|e: Error| e.to_string())
}

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
    /// Print a dma-buf's size, exporter and fdinfo; without TARGET, the p2pbuf exporter's
    /// providers and this process's dmem cgroup use and limit for each.
    ///
    /// TARGET is an fd of this process (`3`, e.g. after `3<&N` in a
    /// shell), `PID:FD` (taken with pidfd_getfd), an fdinfo file
    /// (`/proc/PID/fdinfo/FD`), or a path to open.
    Info {
        /// fd, PID:FD, /proc/PID/fdinfo/FD or a path (none: list the providers).
        target: Option<Target>,
    },
    /// Revoke a p2pbuf dma-buf through the exporter (P2PBUF_IOCTL_REVOKE): its importers
    /// (RDMA MRs, the DMA engine) lose the memory, CPU mappings fault, the fds stay open.
    /// `PID:FD` revokes another process's buffer.
    Revoke {
        /// fd, PID:FD or a path (not an fdinfo file).
        target: Target,
    },
    /// Send a dma-buf to a `p2pbuf recv` listening on a Unix socket.
    Send(pass::SendArgs),
    /// Listen on a Unix socket, receive one dma-buf, print what this
    /// process sees of it, and answer the sender.
    Recv(pass::RecvArgs),
    /// Allocate a dma-buf (device memory from the p2pbuf exporter, udmabuf, CUDA), report
    /// it, and optionally send it to a receiver (`p2pbuf recv`, `p2pbuf rdma serve --buf
    /// fd-from SOCKET`).
    Alloc(alloc::AllocArgs),
    /// RDMA: serve a buffer (host memory or a dma-buf), write into it and
    /// read from it from a client, register buffers.
    #[command(subcommand)]
    Rdma(rdma::RdmaCmd),
    /// CUDA device memory as a dma-buf (build with `--features cuda`).
    #[command(subcommand)]
    Cuda(cuda::CudaCmd),
    /// NVMe: O_DIRECT reads and writes between a drive and a freshly allocated buffer
    /// (device memory: peer-to-peer, the GPUDirect Storage path without nvidia-fs).
    #[command(subcommand)]
    Nvme(nvme::NvmeCmd),
    /// p2pbuf-dma: the DMA engine behind /dev/p2pbuf-dma (the FPGA stand-in) copying
    /// between dma-bufs.
    #[command(subcommand)]
    Dma(dma::DmaCmd),
}

fn main() {
    let cli = Cli::parse();
    let json = cli.json;
    if let Err(e) = run(cli) {
        if json {
            output::print_json(&output::ErrorReport::new(&e));
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
        Cmd::Info {
            target: Some(target),
        } => inspect::info(&target, cli.json),
        Cmd::Info { target: None } => inspect::providers(cli.json),
        Cmd::Revoke { target } => inspect::revoke(&target, cli.json),
        Cmd::Send(a) => pass::send(&a, cli.json),
        Cmd::Recv(a) => pass::recv(&a, cli.json),
        Cmd::Alloc(a) => alloc::run(a, cli.json),
        Cmd::Rdma(c) => rdma::run(c, cli.json),
        Cmd::Cuda(c) => cuda::run(c, cli.json),
        Cmd::Nvme(c) => nvme::run(c, cli.json),
        Cmd::Dma(c) => dma::run(c, cli.json),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn one_memory_default_everywhere() {
        assert_eq!(parse_source(Source::DEFAULT_NAME).unwrap(), Source::DEFAULT);
        let c = Cli::try_parse_from(["p2pbuf", "nvme", "read", "--len", "4k"]).unwrap();
        let Cmd::Nvme(nvme::NvmeCmd::Read { into, .. }) = c.cmd else {
            panic!("{c:?}")
        };
        assert_eq!(into, Source::DEFAULT);
        let c = Cli::try_parse_from(["p2pbuf", "dma", "copy", "--len", "4k"]).unwrap();
        let Cmd::Dma(dma::DmaCmd::Copy(a)) = c.cmd else {
            panic!("{c:?}")
        };
        assert_eq!(
            (a.src.clone(), a.dst.clone()),
            (Source::DEFAULT, Source::DEFAULT)
        );
        let c = Cli::try_parse_from(["p2pbuf", "alloc", "--size", "4k"]).unwrap();
        let Cmd::Alloc(a) = c.cmd else {
            panic!("{c:?}")
        };
        assert_eq!(a.kind, Source::DEFAULT);
    }
}
