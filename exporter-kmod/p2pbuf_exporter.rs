// SPDX-License-Identifier: GPL-2.0

//! p2pbuf exporter: device memory (a PCI BAR registered as p2pdma memory) exported as dma-buf.
//!
//! This is the skeleton that the VM lab loads; the exporter proper lands with the dma-buf and
//! p2pdma abstractions of the `linux/` series.

use kernel::prelude::*;

module! {
    type: P2pbufExporter,
    name: "p2pbuf_exporter",
    authors: ["p2pbuf developers"],
    description: "Exports PCI device memory as p2pdma-aware dma-buf",
    license: "GPL",
}

struct P2pbufExporter;

impl kernel::Module for P2pbufExporter {
    fn init(_module: &'static ThisModule) -> Result<Self> {
        pr_info!("p2pbuf_exporter: loaded\n");
        Ok(P2pbufExporter)
    }
}

impl Drop for P2pbufExporter {
    fn drop(&mut self) {
        pr_info!("p2pbuf_exporter: unloaded\n");
    }
}
