// SPDX-License-Identifier: GPL-2.0

//! p2pbuf importer: imports dma-buf fds and drives a PCI DMA engine (QEMU edu) with them.
//!
//! This is the skeleton that the VM lab loads; the importer proper lands with the dma-buf and
//! p2pdma abstractions of the `linux/` series.

use kernel::prelude::*;

module! {
    type: P2pbufImporter,
    name: "p2pbuf_importer",
    authors: ["p2pbuf developers"],
    description: "Imports dma-buf fds into a PCI DMA engine",
    license: "GPL",
}

struct P2pbufImporter;

impl kernel::Module for P2pbufImporter {
    fn init(_module: &'static ThisModule) -> Result<Self> {
        pr_info!("p2pbuf_importer: loaded\n");
        Ok(P2pbufImporter)
    }
}

impl Drop for P2pbufImporter {
    fn drop(&mut self) {
        pr_info!("p2pbuf_importer: unloaded\n");
    }
}
