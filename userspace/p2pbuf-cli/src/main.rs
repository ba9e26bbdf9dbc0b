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
mod mem;
mod nvme;
mod output;
mod p2ppath;
mod pass;
mod rdma;
mod target;
mod verify;

use clap::{Parser, Subcommand};
use p2pbuf::Error;

use target::Target;

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
    /// it, and optionally send it to a receiver (`p2pbuf recv`, `p2pbuf rdma serve --mem
    /// fd-from:SOCKET`).
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
        use p2pbuf::memory::Source;
        assert_eq!(mem::parse(Source::DEFAULT_NAME).unwrap(), Source::DEFAULT);
        let c = Cli::try_parse_from(["p2pbuf", "nvme", "read", "--len", "4k"]).unwrap();
        let Cmd::Nvme(nvme::NvmeCmd::Read { mem, .. }) = c.cmd else {
            panic!("{c:?}")
        };
        assert_eq!(mem, Source::DEFAULT);
        let c = Cli::try_parse_from(["p2pbuf", "dma", "copy", "--len", "4k"]).unwrap();
        let Cmd::Dma(dma::DmaCmd::Copy(a)) = c.cmd else {
            panic!("{c:?}")
        };
        assert_eq!(
            (a.src_mem.clone(), a.dst_mem.clone()),
            (Source::DEFAULT, Source::DEFAULT)
        );
        let c = Cli::try_parse_from(["p2pbuf", "alloc", "--size", "4k"]).unwrap();
        let Cmd::Alloc(a) = c.cmd else {
            panic!("{c:?}")
        };
        assert_eq!(a.mem, Source::DEFAULT);
        let c = Cli::try_parse_from(["p2pbuf", "rdma", "reg", "--size", "4k"]).unwrap();
        let Cmd::Rdma(rdma::RdmaCmd::Reg(a)) = c.cmd else {
            panic!("{c:?}")
        };
        assert_eq!(a.buf.mem, mem::MemSpec::Memory(Source::DEFAULT));
    }

    /// One spelling of a memory source on every command line: `--mem` (two buffers:
    /// `--src-mem`/`--dst-mem`), `fd-from:SOCKET` with a colon.
    #[test]
    fn one_memory_spelling() {
        for argv in [
            &["p2pbuf", "alloc", "--mem", "udmabuf", "--size", "4k"][..],
            &["p2pbuf", "nvme", "read", "--len", "4k", "--mem", "host"],
            &[
                "p2pbuf",
                "nvme",
                "write",
                "--len",
                "4k",
                "--mem",
                "fd-from:/tmp/s",
            ],
            &[
                "p2pbuf",
                "dma",
                "copy",
                "--len",
                "4k",
                "--src-mem",
                "udmabuf",
                "--dst-mem",
                "p2pbuf",
            ],
            &["p2pbuf", "rdma", "serve", "--mem", "fd-from:/tmp/s"],
            &["p2pbuf", "rdma", "reg", "--mem", "file:/tmp/f"],
        ] {
            Cli::try_parse_from(argv).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
        }
        for argv in [
            &["p2pbuf", "alloc", "--kind", "udmabuf", "--size", "4k"][..],
            &["p2pbuf", "nvme", "read", "--len", "4k", "--into", "host"],
            &["p2pbuf", "nvme", "write", "--len", "4k", "--from", "host"],
            &["p2pbuf", "dma", "copy", "--len", "4k", "--src", "udmabuf"],
            &["p2pbuf", "rdma", "serve", "--buf", "host"],
            &["p2pbuf", "rdma", "reg", "--mem", "fd-from", "/tmp/s"],
            &["p2pbuf", "alloc", "--mem", "fd-from", "--size", "4k"],
        ] {
            assert!(Cli::try_parse_from(argv).is_err(), "{argv:?} parsed");
        }
    }
}
