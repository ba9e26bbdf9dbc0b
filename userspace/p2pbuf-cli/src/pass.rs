//! `p2pbuf send` and `p2pbuf recv`: a dma-buf passed to another process over a Unix
//! socket (`SCM_RIGHTS`, [`p2pbuf::fdpass`]).

use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use p2pbuf::fdpass::Header;
use p2pbuf::units::human_size;
use p2pbuf::{DmaBufInfo, Error};
use serde::Serialize;

use crate::output::{print_info, print_json, Outcome, SurfaceReport, TryArgs};
use crate::target::Target;

#[derive(Args, Debug)]
pub struct SendArgs {
    /// Socket path the receiver listens on.
    socket: PathBuf,
    /// The buffer: fd, PID:FD or a path (not an fdinfo file).
    target: Target,
    /// Seconds to wait for the receiver's socket to appear.
    #[arg(long, default_value_t = 10)]
    wait: u64,
}

#[derive(Args, Debug)]
pub struct RecvArgs {
    /// Socket path to create.
    socket: PathBuf,
    #[command(flatten)]
    tries: TryArgs,
}

/// `p2pbuf --json send`.
#[derive(Serialize)]
pub struct SendReport<'a> {
    /// The buffer sent, as this process sees it.
    pub sent: &'a DmaBufInfo,
    /// The receiver's socket.
    pub socket: &'a PathBuf,
    /// The receiver's answer.
    pub receiver: String,
}

/// `p2pbuf --json recv`.
#[derive(Serialize)]
pub struct RecvReport<'a> {
    /// This process.
    pub pid: u32,
    /// The received fd in this process.
    pub fd: i32,
    /// The sender, from `SO_PEERCRED`.
    pub peer_pid: Option<i32>,
    /// What the sender said of the buffer.
    pub header: &'a Header,
    /// Where this process's fdinfo of it is.
    pub fdinfo_path: String,
    /// This process's fdinfo of it.
    pub info: &'a DmaBufInfo,
    /// The surface its name describes (null: none).
    pub surface: Option<SurfaceReport>,
    /// `--mmap`'s outcome.
    pub mmap: Option<Outcome>,
    /// `--rdma`'s outcome.
    pub rdma: Option<Outcome>,
}

pub fn send(a: &SendArgs, json: bool) -> p2pbuf::Result<()> {
    let buf = a.target.open()?;
    let ack = p2pbuf::fdpass::send_to(&a.socket, &buf, a.wait)?;
    if json {
        print_json(&SendReport {
            sent: buf.info(),
            socket: &a.socket,
            receiver: ack,
        });
    } else {
        println!(
            "sent {} dma-buf of {} to {}",
            buf.exporter(),
            human_size(buf.size()),
            a.socket.display()
        );
        println!("receiver: {ack}");
    }
    Ok(())
}

pub fn recv(a: &RecvArgs, json: bool) -> p2pbuf::Result<()> {
    let socket = &a.socket;
    let listener = p2pbuf::fdpass::listen(socket)?;
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
        let tried = a.tries.run(&got.buf);
        let i = got.buf.info();
        let fd = got.buf.as_raw_fd();
        let mut ack = format!(
            "pid {} got fd {fd}: exp_name {} size {} ino {}",
            std::process::id(),
            i.exporter,
            i.size,
            i.ino.map_or("?".into(), |n| n.to_string())
        );
        if let Some(m) = &tried.mmap {
            ack += &format!("; mmap {}", m.line());
        }
        if let Some(r) = &tried.rdma {
            ack += &format!("; rdma {}", r.line());
        }
        if json {
            print_json(&RecvReport {
                pid: std::process::id(),
                fd,
                peer_pid: got.peer_pid,
                header: &got.header,
                fdinfo_path: format!("/proc/{}/fdinfo/{fd}", std::process::id()),
                info: i,
                surface: SurfaceReport::of(i),
                mmap: tried.mmap,
                rdma: tried.rdma,
            });
        } else {
            print_info(
                &format!(
                    "received dma-buf from pid {} (sender said: {} bytes, exporter {})",
                    got.peer_pid.map_or("?".into(), |p| p.to_string()),
                    got.header.size,
                    got.header.exporter
                ),
                Some(fd),
                i,
            );
            if i.size != got.header.size || i.exporter != got.header.exporter {
                println!("  warning: differs from what the sender said");
            }
            tried.print();
        }
        p2pbuf::fdpass::send_ack(&conn, true, &ack)?;
        if a.tries.hold > 0 {
            if !json {
                println!(
                    "holding fd {fd} for {} s (see /proc/{}/fdinfo/{fd})",
                    a.tries.hold,
                    std::process::id(),
                );
            }
            std::thread::sleep(Duration::from_secs(a.tries.hold));
        }
        Ok(())
    })();
    let _ = std::fs::remove_file(socket);
    res
}
