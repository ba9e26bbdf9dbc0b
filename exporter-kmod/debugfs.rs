// SPDX-License-Identifier: GPL-2.0

//! `/sys/kernel/debug/p2pbuf/`: providers, live buffers with their attachments (importer
//! device and its latest mapping) and map/unmap counts, revoked buffers, and recent refusals with their
//! reason.

use crate::{buffer::AttachInfo, PROVIDERS};
use core::fmt;
use kernel::{debugfs, dma_buf::Attachment, prelude::*, sync::atomic::Relaxed};

/// The debugfs directory and its files; removed when dropped.
pub(crate) struct Files {
    _dir: debugfs::Dir,
    _providers: Option<Pin<KBox<debugfs::File<()>>>>,
    _buffers: Option<Pin<KBox<debugfs::File<()>>>>,
}

fn providers(_: &(), f: &mut fmt::Formatter<'_>) -> fmt::Result {
    for (i, p) in PROVIDERS.lock().iter() {
        let s = p.state.lock();
        writeln!(
            f,
            "provider {i}: {} BAR{} size {} MiB, {} buffer(s){}",
            p.name_str(),
            p.bar,
            p.bar_size >> 20,
            s.buffers.len(),
            if s.gone { ", gone" } else { "" }
        )?;
        for (dev, why) in s.refusals.iter() {
            writeln!(
                f,
                "  refused {}: {}",
                dev.to_str().unwrap_or("?"),
                why.to_str().unwrap_or("?")
            )?;
        }
    }
    Ok(())
}

fn buffers(_: &(), f: &mut fmt::Formatter<'_>) -> fmt::Result {
    // Handles are taken under the locks and read without them: the walk of a buffer's
    // attachments takes its reservation lock, which an importer may hold for long.
    let providers = PROVIDERS.lock().clone_ids().map_err(|_| fmt::Error)?;
    for (_, p) in providers.iter() {
        for b in p.buffer_handles().map_err(|_| fmt::Error)?.iter() {
            let st = b.stats();
            writeln!(
                f,
                "buffer {} on {}: {} bytes at BAR offset {:#x}{}{}, maps {} active ({} map / {} unmap calls), vmaps {}, cpu access {} begin / {} end, cpu mapping {} ({} pages faulted in)",
                b.id,
                p.name_str(),
                b.size,
                b.offset,
                if st.revoked { ", revoked" } else { "" },
                if b.is_alive() { "" } else { ", released" },
                st.active_maps,
                st.maps_total,
                st.unmaps_total,
                st.active_vmaps,
                b.cpu_access[0].load(Relaxed),
                b.cpu_access[1].load(Relaxed),
                b.mapping.name(),
                b.inserted.load(Relaxed)
            )?;
            // A revoke (which may wait for fences with the reservation lock held) is not
            // waited for, and a signal ends the wait for that lock.
            let mut res = Ok(());
            let walked = b.for_each_attachment(|att, info| {
                if res.is_ok() {
                    res = attachment(f, att, info);
                }
            });
            res?;
            match walked {
                Err(e) if e == EBUSY => {
                    writeln!(f, "  attachments: not shown, the buffer is being revoked")?
                }
                Err(_) => writeln!(f, "  attachments: not shown, interrupted")?,
                Ok(_) => {}
            }
        }
    }
    Ok(())
}

/// One line of `buffers` per attachment.
fn attachment(f: &mut fmt::Formatter<'_>, att: &Attachment, info: &AttachInfo) -> fmt::Result {
    write!(
        f,
        "  attached: {}",
        att.device().name().to_str().unwrap_or("?")
    )?;
    match info.last_map() {
        Some(m) => writeln!(
            f,
            ", mapped: {} sg entries, {} bytes, largest {}, {}",
            m.entries,
            m.bytes,
            m.largest,
            if m.contiguous {
                "contiguous"
            } else {
                "not contiguous"
            }
        ),
        None => writeln!(f),
    }
}

impl Files {
    pub(crate) fn new() -> Self {
        let dir = debugfs::Dir::new(c"p2pbuf");
        let providers = KBox::pin_init(
            dir.read_callback_file(c"providers", (), &providers),
            GFP_KERNEL,
        )
        .ok();
        let buffers =
            KBox::pin_init(dir.read_callback_file(c"buffers", (), &buffers), GFP_KERNEL).ok();
        Self {
            _dir: dir,
            _providers: providers,
            _buffers: buffers,
        }
    }
}
