//! `p2pbuf info` and `p2pbuf revoke`: a dma-buf named on the command line, looked at or
//! revoked.

use std::os::fd::AsRawFd;

use p2pbuf::units::human_size;
use p2pbuf::DmaBufInfo;
use serde::Serialize;

use crate::output::{print_info, print_json, SurfaceReport};
use crate::target::{Resolved, Target};

/// `p2pbuf --json info`.
#[derive(Serialize)]
pub struct InfoReport<'a> {
    /// TARGET as given.
    pub target: String,
    /// The fd this process holds (null for an fdinfo file).
    pub fd: Option<i32>,
    /// This process.
    pub pid: u32,
    /// The buffer's fdinfo.
    pub info: &'a DmaBufInfo,
    /// The surface its name describes (null: none).
    pub surface: Option<SurfaceReport>,
}

/// `p2pbuf --json revoke`.
#[derive(Serialize)]
pub struct RevokeReport<'a> {
    /// Always true (a failure is an error report).
    pub revoked: bool,
    /// TARGET as given.
    pub target: String,
    /// The buffer's exporter (`p2pbuf`).
    pub exporter: &'a str,
    /// Its size in bytes.
    pub size: u64,
}

pub fn info(target: &Target, json: bool) -> p2pbuf::Result<()> {
    let r = target.resolve()?;
    let fd = match &r {
        Resolved::Buf(b) => Some(b.as_raw_fd()),
        Resolved::InfoOnly(_) => None,
    };
    if json {
        print_json(&InfoReport {
            target: target.to_string(),
            fd,
            pid: std::process::id(),
            info: r.info(),
            surface: SurfaceReport::of(r.info()),
        });
    } else {
        print_info(&format!("dma-buf: {target}"), fd, r.info());
    }
    Ok(())
}

pub fn revoke(target: &Target, json: bool) -> p2pbuf::Result<()> {
    let buf = target.open()?;
    p2pbuf::exporter::Exporter::open()?.revoke(&buf)?;
    if json {
        print_json(&RevokeReport {
            revoked: true,
            target: target.to_string(),
            exporter: buf.exporter(),
            size: buf.size(),
        });
    } else {
        println!(
            "revoked {target}: {} dma-buf of {}",
            buf.exporter(),
            human_size(buf.size())
        );
    }
    Ok(())
}
