//! `p2pbuf rdma serve`: register a buffer, serve clients one after the other, verify what
//! they wrote through the CPU.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use clap::Args;
use p2pbuf::units::human_size;
use p2pbuf::Error;
use p2pbuf_rdma::session::{self, ServerMemory};
use p2pbuf_rdma::{Listener, MrInfo, Op, Pd};
use serde::Serialize;

use super::memory::{get_memory, register, BufArgs};
use super::{mr_line, open_device, DEFAULT_PORT};
use crate::output::print_json;

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// rdma_cm port.
    #[arg(long, default_value_t = DEFAULT_PORT)]
    port: u16,
    /// Address to listen on (default: all).
    #[arg(long)]
    bind: Option<IpAddr>,
    #[command(flatten)]
    buf: BufArgs,
    /// Clients to serve, one after the other (0: until killed).
    #[arg(long, default_value_t = 1)]
    clients: u32,
    /// Give up when no client comes for this many seconds (0: wait forever).
    #[arg(long, default_value_t = 0)]
    timeout: u64,
}

/// The lines of `p2pbuf --json rdma serve`, one per event, told apart by `event`.
#[derive(Serialize)]
#[serde(tag = "event", rename_all = "lowercase")]
pub enum ServeEvent<'a> {
    /// The memory is registered and the server listens.
    Registered {
        /// The RDMA device.
        device: &'a str,
        /// The memory registered.
        memory: &'a str,
        /// `ibv_reg_mr` or `ibv_reg_dmabuf_mr`.
        verb: &'static str,
        /// The MR.
        mr: MrInfo,
        /// The address listened on.
        listen: String,
    },
    /// A client was served (or failed).
    Client {
        /// 1 for the first client.
        n: u32,
        /// What happened.
        outcome: &'a ClientOutcome,
    },
    /// All clients were served.
    Done {
        /// Clients whose operation verified.
        verified: u32,
        /// Clients that failed.
        failed: u32,
        /// Checksum of the whole region (null: unreadable).
        region_checksum: Option<String>,
        /// Why the region could not be read (e.g. revoked).
        region_error: Option<String>,
    },
    /// The MR is deregistered.
    Deregistered {
        /// `ibv_reg_mr` or `ibv_reg_dmabuf_mr`.
        verb: &'static str,
    },
}

/// A client of `rdma serve`, in its `client` event.
#[derive(Serialize)]
pub struct ClientOutcome {
    /// The client's address.
    pub peer: Option<String>,
    /// Its operation verified.
    pub ok: bool,
    /// Why it failed.
    pub error: Option<String>,
    /// The errno of the failure.
    pub errno: Option<i32>,
    /// What it did and what the server found.
    pub served: Option<session::Served>,
}

/// `p2pbuf rdma serve`: one server session.
/// Over 100 lines on purpose: the session in the order it happens (listener, device, memory,
/// registration, each client, the region's last check, the deregistration), each step's JSON
/// and text report beside it.
pub fn serve(a: ServeArgs, json: bool) -> p2pbuf::Result<()> {
    // The device first (without one there is nothing to serve), then the memory.
    let bind = SocketAddr::new(a.bind.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED)), a.port);
    let listener = Listener::bind(bind)?;
    let (ctx, pd) = match (listener.context(), &a.buf.device) {
        (Some(c), None) => {
            let c = c?;
            let pd = Pd::new(&c)?;
            (c, pd)
        }
        (_, d) => open_device(d.as_deref())?,
    };
    let mem = get_memory(&a.buf, 600)?;
    let r = register(&pd, mem, &a.buf)?;
    let m = r.info();
    if json {
        print_json(&ServeEvent::Registered {
            device: ctx.name(),
            memory: &r.desc,
            verb: r.verb(),
            mr: m,
            listen: bind.to_string(),
        });
    } else {
        println!(
            "rdma serve: {} registered on {} with {}",
            r.desc,
            ctx.name(),
            r.verb()
        );
        println!("  mr:     {}", mr_line(&m));
        println!(
            "  listening on {bind} (rdma_cm, RC); {}",
            if a.clients == 0 {
                "serving clients until killed".to_string()
            } else {
                format!("{} client(s) to serve", a.clients)
            }
        );
    }
    let timeout = (a.timeout > 0).then(|| Duration::from_secs(a.timeout));
    let (mut good, mut bad) = (0u32, 0u32);
    let mut n = 0;
    while a.clients == 0 || n < a.clients {
        n += 1;
        let out = match session::serve_one(&listener, &pd, &m, &r.name, &r, timeout) {
            Ok(s) => {
                let ok = s.reply.in_range
                    && s.reply.first_mismatch.is_none()
                    && s.reply.checksum == s.request.checksum;
                ClientOutcome {
                    peer: s.peer.clone(),
                    ok,
                    error: None,
                    errno: None,
                    served: Some(s),
                }
            }
            Err(e) => {
                // No client in time ends the loop; other failures are the client's.
                let timed_out = e.errno() == Some(p2pbuf_rdma::verbs::errnos::ETIMEDOUT)
                    && e.to_string().contains("waiting for a client");
                let o = ClientOutcome {
                    peer: None,
                    ok: false,
                    error: Some(e.to_string()),
                    errno: e.errno(),
                    served: None,
                };
                if timed_out {
                    if !json {
                        println!("client {n}: {e}");
                    }
                    bad += 1;
                    break;
                }
                o
            }
        };
        if out.ok {
            good += 1;
        } else {
            bad += 1;
        }
        if json {
            print_json(&ServeEvent::Client { n, outcome: &out });
        } else {
            println!("{}", client_line(n, &out));
        }
    }
    // The region may be gone (the exporter revoked it): say so, and still deregister.
    let mut sum = 0;
    let unreadable = r
        .with_bytes(0, m.len, &mut |b| sum = p2pbuf::pattern::checksum(b))
        .err()
        .map(|e| e.to_string());
    let region = match &unreadable {
        None => format!("checksum of the whole region {sum:#018x}"),
        Some(e) => format!("the region cannot be read any more: {e}"),
    };
    if json {
        print_json(&ServeEvent::Done {
            verified: good,
            failed: bad,
            region_checksum: unreadable.is_none().then(|| format!("{sum:#018x}")),
            region_error: unreadable.clone(),
        });
    } else {
        println!("done: {good} client(s) verified, {bad} failed; {region}");
    }
    // Deregister here rather than on drop, so that a failure (e.g. after a revoke) shows.
    let verb = r.verb();
    r.dereg()?;
    if json {
        print_json(&ServeEvent::Deregistered { verb });
    } else {
        println!("deregistered the MR (ibv_dereg_mr) and closed the buffer");
    }
    if bad > 0 || unreadable.is_some() {
        return Err(Error::Protocol {
            what: "rdma serve".into(),
            detail: format!("{bad} client(s) failed"),
        });
    }
    Ok(())
}

fn client_line(n: u32, o: &ClientOutcome) -> String {
    match &o.served {
        Some(s) => {
            let q = &s.request;
            let verdict = if !s.reply.in_range {
                "range past the end of the region".to_string()
            } else if let Some(at) = s.reply.first_mismatch {
                format!("MISMATCH at offset {}", q.offset + at)
            } else if s.reply.checksum != q.checksum {
                format!("checksum differs (client {:#018x})", q.checksum)
            } else if q.seed.is_some() {
                "verified (pattern)".into()
            } else {
                "checksums agree".into()
            };
            format!(
                "client {n} ({}): {} of {} at offset {}{}: {verdict}, checksum {:#018x}",
                s.peer.as_deref().unwrap_or("?"),
                if q.op == Op::Write {
                    "RDMA WRITE"
                } else {
                    "RDMA READ"
                },
                human_size(q.len),
                q.offset,
                q.seed.map_or(String::new(), |s| format!(" (seed {s})")),
                s.reply.checksum
            )
        }
        None => format!("client {n}: failed: {}", o.error.as_deref().unwrap_or("?")),
    }
}
