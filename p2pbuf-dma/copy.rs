// SPDX-License-Identifier: GPL-2.0

//! Copying between two imported buffers, one engine window at a time.
//!
//! Each step moves up to [`WINDOW`] bytes: with the source's reservation lock held, the source
//! range is mapped (again, if the exporter invalidated it) and transferred into the window, one
//! transfer per DMA-contiguous piece; then the same with the destination, out of the window.
//! Only one buffer is locked at a time (no ordering between two buffers' locks is needed), and
//! every transfer runs with its buffer's lock held: an exporter revoking the buffer waits for
//! the transfer, its `invalidate_mappings` then drops our mapping, and the next step learns
//! that the buffer is gone (`ENODEV`) before the engine is pointed at it again.

use crate::{
    edu::{Claim, Edu, WINDOW},
    import::Import,
};
use kernel::{dma::DmaAddress, dma_buf::import::dma_ranges, prelude::*, scatterlist::SGTable};

/// A validated copy request.
pub(crate) struct Request<'a> {
    pub(crate) src: &'a Import,
    pub(crate) src_offset: u64,
    pub(crate) dst: &'a Import,
    pub(crate) dst_offset: u64,
    pub(crate) len: u64,
    pub(crate) timeout_ms: u32,
}

impl Request<'_> {
    /// Checks the ranges: inside their buffers, not empty, and not overlapping within one
    /// buffer (the window is not a memmove).
    pub(crate) fn check(&self) -> Result {
        let end = |off: u64, imp: &Import| match off.checked_add(self.len) {
            Some(end) if end <= imp.size() => Ok(end),
            _ => Err(EINVAL),
        };
        if self.len == 0 {
            return Err(EINVAL);
        }
        let src_end = end(self.src_offset, self.src)?;
        let dst_end = end(self.dst_offset, self.dst)?;
        if core::ptr::eq(self.src, self.dst)
            && self.src_offset < dst_end
            && self.dst_offset < src_end
        {
            return Err(EINVAL);
        }
        Ok(())
    }
}

/// How far a copy got.
#[derive(Default)]
pub(crate) struct Progress {
    /// Bytes copied.
    pub(crate) copied: u64,
    /// Engine transfers issued.
    pub(crate) transfers: u32,
}

/// Copies `req.len` bytes, recording progress in `progress` (also when failing part way).
///
/// `stop` is asked before each step; a `true` ends the copy with `ENODEV` (the engine is being
/// unbound). A pending signal ends it with `EINTR`.
pub(crate) fn copy(
    edu: &Edu,
    req: &Request<'_>,
    progress: &mut Progress,
    stop: impl Fn() -> bool,
) -> Result {
    while progress.copied < req.len {
        if stop() {
            return Err(ENODEV);
        }
        if kernel::current!().signal_pending() {
            return Err(EINTR);
        }
        let left = req.len - progress.copied;
        let n = usize::try_from(left.min(WINDOW as u64))?;
        let mut claim = edu.claim()?;
        step(
            &mut claim,
            req.src,
            req.src_offset + progress.copied,
            n,
            true,
            req.timeout_ms,
            progress,
        )?;
        step(
            &mut claim,
            req.dst,
            req.dst_offset + progress.copied,
            n,
            false,
            req.timeout_ms,
            progress,
        )?;
        progress.copied += n as u64;
    }
    Ok(())
}

/// Moves `n` bytes between `imp` at `offset` and the window: into it if `into_window`.
fn step(
    claim: &mut Claim<'_>,
    imp: &Import,
    offset: u64,
    n: usize,
    into_window: bool,
    timeout_ms: u32,
    progress: &mut Progress,
) -> Result {
    let mut guard = imp.dma_buf().lock();
    let mut held = guard.exclusive();
    let sgt = imp.map(&mut held)?;
    // The engine reads the source (wait for writers) and writes the destination (wait for
    // everyone), including a move the exporter started in `map`.
    imp.wait_fences(!into_window)?;
    let mut done = 0usize;
    for_each_piece(sgt, offset, n, |addr, len| {
        progress.transfers = progress.transfers.saturating_add(1);
        if into_window {
            claim.fill_window(addr, done, len, timeout_ms)?;
        } else {
            claim.drain_window(done, addr, len, timeout_ms)?;
        }
        done += len;
        Ok(())
    })?;
    // The table covered less than the buffer's size: the exporter's bug, not a short copy.
    if done != n {
        return Err(EIO);
    }
    Ok(())
}

/// Calls `f(dma_address, len)` for each DMA-contiguous piece of `offset..offset + n`; table
/// entries that continue one another are merged into one piece.
fn for_each_piece(
    sgt: &SGTable,
    offset: u64,
    n: usize,
    mut f: impl FnMut(DmaAddress, usize) -> Result,
) -> Result {
    let mut pos = 0u64;
    let end = offset + n as u64;
    let mut pending: Option<(DmaAddress, u64)> = None;
    for (addr, len) in dma_ranges(sgt) {
        let seg_end = pos + len;
        if seg_end > offset && pos < end {
            let from = offset.max(pos);
            let to = end.min(seg_end);
            let piece = (addr + (from - pos), to - from);
            pending = match pending {
                Some((a, l)) if a + l == piece.0 => Some((a, l + piece.1)),
                Some((a, l)) => {
                    f(a, usize::try_from(l)?)?;
                    Some(piece)
                }
                None => Some(piece),
            };
        }
        if seg_end >= end {
            break;
        }
        pos = seg_end;
    }
    if let Some((a, l)) = pending {
        f(a, usize::try_from(l)?)?;
    }
    Ok(())
}
