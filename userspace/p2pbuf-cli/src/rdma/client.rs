//! `p2pbuf rdma write/read`: one client's RDMA WRITE or READ against a server's region.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::time::Duration;

use clap::Args;
use p2pbuf::units::{human_size, parse_size};
use p2pbuf::Error;
use p2pbuf_rdma::session;
use p2pbuf_rdma::Op;
use serde::Serialize;

use super::DEFAULT_PORT;
use crate::output::print_json;

#[derive(Args, Debug)]
pub struct ClientArgs {
    /// The server, ADDR:PORT (or ADDR, for port 18515).
    #[arg(long)]
    server: String,
    /// Bytes.
    #[arg(long, value_parser = parse_size)]
    size: usize,
    /// Offset into the server's region.
    #[arg(long, default_value = "0", value_parser = parse_size)]
    offset: usize,
    /// Pattern seed: written (write), expected (read).
    #[arg(long)]
    pattern: Option<u64>,
    /// Post even past the end of the server's region (to see the HCA refuse it).
    #[arg(long)]
    unchecked: bool,
    /// Write the lab pattern instead: byte i of the transfer is (i*13 + seed + (i>>12)) &
    /// 0xff, what `cargo xtask test`'s host check looks for in the GPU memory's backing file.
    #[arg(long)]
    lab_pattern: bool,
    /// Do the operation this many times over the same connection (the same bytes), printing
    /// the count done after the 1st, 2nd, 4th, 8th, ...; the first failed completion ends it.
    #[arg(long, default_value_t = 1)]
    repeat: u64,
    /// With --repeat: operations kept in flight (1 to 12).
    #[arg(long, default_value_t = 1)]
    depth: usize,
    /// Seconds to wait for the connection.
    #[arg(long, default_value_t = 20)]
    timeout: u64,
}

/// `p2pbuf --json rdma write/read`.
#[derive(Serialize)]
pub struct ClientReportJson<'a> {
    /// Every check passed.
    pub ok: bool,
    /// What was done and found.
    pub report: &'a session::ClientReport,
}

fn resolve(server: &str) -> p2pbuf::Result<SocketAddr> {
    let with_port = if server.parse::<IpAddr>().is_ok() || !server.contains(':') {
        format!("{server}:{DEFAULT_PORT}")
    } else {
        server.to_string()
    };
    with_port
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| Error::Protocol {
            what: format!("--server {server}"),
            detail: "not an ADDR:PORT this machine can resolve".into(),
        })
}

/// `--repeat`'s progress lines: after operation 1, 2, 4, 8, ... (stdout is line-buffered, so
/// a script sees them as they come).
fn progress(n: u64) {
    if n.is_power_of_two() {
        println!("completed {n}");
    }
}

pub fn client(a: ClientArgs, op: Op, json: bool) -> p2pbuf::Result<()> {
    let server = resolve(&a.server)?;
    if op == Op::Write && a.pattern.is_none() {
        return Err(Error::Protocol {
            what: "rdma write".into(),
            detail: "--pattern SEED is needed (what to write)".into(),
        });
    }
    let rep = session::client(&session::ClientOpts {
        server,
        op,
        offset: a.offset as u64,
        len: a.size as u64,
        seed: a.pattern,
        lab: a.lab_pattern,
        repeat: a.repeat,
        depth: a.depth,
        progress: (a.repeat > 1).then_some(progress as fn(u64)),
        check_bounds: !a.unchecked,
        timeout: Duration::from_secs(a.timeout),
    })?;
    let ok = rep.ok();
    if json {
        print_json(&ClientReportJson { ok, report: &rep });
    } else {
        let h = &rep.hello;
        println!(
            "server {}: {} region ({}), addr {:#x} len {} rkey {:#x}",
            rep.server,
            h.memory,
            if h.dmabuf { "dma-buf MR" } else { "host MR" },
            h.addr,
            human_size(h.len),
            h.rkey
        );
        println!(
            "RDMA {} of {} at offset {}{}{}: {:.3} s, {:.1} MiB/s",
            if op == Op::Write { "WRITE" } else { "READ" },
            human_size(rep.request.len),
            rep.request.offset,
            rep.request.seed.map_or(String::new(), |s| format!(
                " ({}pattern seed {s})",
                if rep.request.lab { "lab " } else { "" }
            )),
            if rep.repeat > 1 {
                format!(", {} times", rep.repeat)
            } else {
                String::new()
            },
            rep.seconds,
            rep.mib_per_s
        );
        println!(
            "checksum: here {:#018x}, server {:#018x}{}",
            rep.request.checksum,
            rep.reply.checksum,
            if rep.reply.checksum == rep.request.checksum {
                " (equal)"
            } else {
                " (DIFFERENT)"
            }
        );
        if let Some(at) = rep.local_mismatch {
            println!(
                "read data is not the pattern from offset {}",
                rep.request.offset + at
            );
        }
        match rep.reply.first_mismatch {
            Some(at) => println!(
                "server: not the pattern from offset {}",
                rep.request.offset + at
            ),
            None if rep.request.seed.is_some() && rep.reply.in_range => {
                println!("server: verified the pattern through its CPU mapping")
            }
            _ => {}
        }
        println!("{}", if ok { "OK" } else { "FAILED" });
    }
    if !ok {
        return Err(Error::Protocol {
            what: format!("rdma {}", if op == Op::Write { "write" } else { "read" }),
            detail: "verification failed".into(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    #[test]
    fn servers() {
        assert_eq!(resolve("10.0.2.15:7000").unwrap().port(), 7000);
        assert_eq!(resolve("10.0.2.15").unwrap().port(), DEFAULT_PORT);
        assert_eq!(
            resolve("127.0.0.1").unwrap().ip(),
            IpAddr::V4(Ipv4Addr::LOCALHOST)
        );
        assert!(resolve("not an address:x").is_err());
    }
}
