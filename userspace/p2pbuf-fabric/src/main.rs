//! `p2pbuf-fabric`: libfabric RMA (the verbs provider) into and out of p2pbuf device memory
//! registered with `fi_mr_regattr(..., FI_MR_DMABUF)`.
//!
//! ```text
//! p2pbuf-fabric serve --addr 10.0.3.1 --port 7500 --size 64M --clients 3
//! p2pbuf-fabric write --server 10.0.3.1 --port 7500 --size 4M --offset 0 --seed 61
//! p2pbuf-fabric read  --server 10.0.3.1 --port 7500 --size 4M --offset 0 --seed 61
//! p2pbuf-fabric reg   --addr 10.0.3.1 --size 1M --fd closed     # negative cases
//! ```

use anyhow::Result;
use clap::{Args, Parser, Subcommand, ValueEnum};
use std::process::ExitCode;

use p2pbuf::units::parse_bytes as parse_size;

#[derive(Parser)]
#[command(about = "libfabric RMA on p2pbuf device memory (fi_mr_regattr with FI_MR_DMABUF)")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Allocate device memory, register it with FI_MR_DMABUF, serve RMA clients and check
    /// what they did through the dma-buf's mmap.
    Serve {
        /// Local address of the RDMA device (rxe0's netdev).
        #[arg(long)]
        addr: String,
        #[arg(long, default_value_t = 7500)]
        port: u16,
        /// Device memory to allocate and register (k, M, G suffixes).
        #[arg(long, value_parser = parse_size, default_value = "64M")]
        size: u64,
        /// Clients to serve, then exit.
        #[arg(long, default_value_t = 1)]
        clients: u32,
        /// Seconds to wait for each client.
        #[arg(long, default_value_t = 300)]
        timeout: u64,
    },
    /// fi_write the lab pattern (seed) into the server's device memory.
    Write(ClientArgs),
    /// fi_read a range of the server's device memory and check it holds the seed's pattern.
    Read(ClientArgs),
    /// Register (FI_MR_DMABUF) and deregister, for the negative cases; prints the key, or
    /// the error with its errno and exits 1.
    Reg {
        /// Local address of the RDMA device.
        #[arg(long)]
        addr: String,
        /// Device memory to allocate.
        #[arg(long, value_parser = parse_size, default_value = "1M")]
        size: u64,
        /// Offset into the dma-buf.
        #[arg(long, value_parser = parse_size, default_value = "0")]
        offset: u64,
        /// Length to register (default: the size).
        #[arg(long, value_parser = parse_size)]
        len: Option<u64>,
        /// Which fd to hand to libfabric.
        #[arg(long, value_enum, default_value_t = FdKind::P2pbuf)]
        fd: FdKind,
        /// Revoke the buffer (P2PBUF_IOCTL_REVOKE) before registering it.
        #[arg(long)]
        revoked: bool,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum FdKind {
    /// The p2pbuf dma-buf.
    P2pbuf,
    /// An fd of /dev/null (open, not a dma-buf).
    Devnull,
    /// An fd number that is not open.
    Closed,
}

#[derive(Args)]
struct ClientArgs {
    /// The server's address.
    #[arg(long)]
    server: String,
    #[arg(long, default_value_t = 7500)]
    port: u16,
    #[arg(long, value_parser = parse_size)]
    size: u64,
    #[arg(long, value_parser = parse_size, default_value = "0")]
    offset: u64,
    /// Seed of the lab pattern.
    #[arg(long)]
    seed: u64,
    /// Seconds to wait for the connection and each completion.
    #[arg(long, default_value_t = 120)]
    timeout: u64,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}

#[cfg(not(p2pbuf_fabric))]
fn run(_: Cli) -> Result<bool> {
    anyhow::bail!(
        "p2pbuf-fabric was built without libfabric ({})",
        p2pbuf_fabric::bindings()
    )
}

#[cfg(p2pbuf_fabric)]
fn run(cli: Cli) -> Result<bool> {
    use p2pbuf_fabric::proto::Op;
    use p2pbuf_fabric::session;
    use std::time::Duration;
    let mut say = |l: &str| println!("{l}");
    match cli.cmd {
        Cmd::Serve {
            addr,
            port,
            size,
            clients,
            timeout,
        } => {
            let served = session::serve(
                &session::ServeOpts {
                    addr,
                    port,
                    size,
                    clients,
                    timeout: Duration::from_secs(timeout),
                },
                &mut say,
            )?;
            let bad = served.iter().filter(|s| !s.ok()).count();
            println!(
                "done: {} client(s) verified, {bad} failed",
                served.len() - bad
            );
            Ok(bad == 0)
        }
        Cmd::Write(a) => client(Op::Write, a),
        Cmd::Read(a) => client(Op::Read, a),
        Cmd::Reg {
            addr,
            size,
            offset,
            len,
            fd,
            revoked,
        } => {
            use std::os::fd::AsRawFd;
            let ex = p2pbuf::exporter::Exporter::open()?;
            let alloc = p2pbuf::exporter::alloc(size)?;
            if revoked {
                ex.revoke(&alloc.buf)?;
                println!("revoked the buffer (P2PBUF_IOCTL_REVOKE)");
            }
            let null = std::fs::File::open("/dev/null")?;
            let raw = match fd {
                FdKind::P2pbuf => alloc.buf.as_raw_fd(),
                FdKind::Devnull => null.as_raw_fd(),
                // Well above anything this process opens.
                FdKind::Closed => 999,
            };
            let len = len.unwrap_or(size);
            match session::reg_only(&addr, raw, offset, len) {
                Ok(key) => {
                    println!("registered: fd {raw}, offset {offset}, length {len}: key {key:#x}");
                    Ok(true)
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    println!("errno {}", e.errno().unwrap_or(0));
                    Ok(false)
                }
            }
        }
    }
}

#[cfg(p2pbuf_fabric)]
fn client(op: p2pbuf_fabric::proto::Op, a: ClientArgs) -> Result<bool> {
    use anyhow::Context;
    use p2pbuf_fabric::proto::Request;
    use p2pbuf_fabric::session;
    use std::time::Duration;
    let mut say = |l: &str| println!("{l}");
    let request = Request {
        op,
        offset: a.offset,
        len: a.size,
        seed: a.seed,
    };
    let r = session::client(
        &session::ClientOpts {
            server: a.server.clone(),
            port: a.port,
            request,
            timeout: Duration::from_secs(a.timeout),
        },
        &mut say,
    )
    .with_context(|| format!("{} with {}:{}", op.call(), a.server, a.port))?;
    println!(
        "{} of {} bytes at offset {} in {:.3} s, {:.2} MiB/s",
        op.call(),
        a.size,
        a.offset,
        r.seconds,
        a.size as f64 / 1048576.0 / r.seconds.max(1e-9)
    );
    if let Some(m) = r.local_mismatch {
        println!("read data is not the pattern from offset {}", a.offset + m);
    }
    match (r.verdict.in_range, r.verdict.first_mismatch) {
        (false, _) => println!("server: the range is outside its region"),
        (true, None) => println!("server: verified the pattern"),
        (true, Some(m)) => println!("server: not the pattern from offset {}", a.offset + m),
    }
    if r.verdict.checksum != r.checksum {
        println!(
            "checksums differ: here {:#018x}, server {:#018x}",
            r.checksum, r.verdict.checksum
        );
    }
    println!("{}", if r.ok() { "OK" } else { "FAILED" });
    Ok(r.ok())
}
