//! `p2pbuf cuda`: CUDA device memory exported as a dma-buf (feature `cuda`).

use std::path::PathBuf;

use clap::Subcommand;
use p2pbuf::units::{parse_byte, parse_size};

#[derive(Subcommand, Debug)]
pub enum CudaCmd {
    /// Show a device's dma-buf and GPUDirect RDMA attributes.
    Probe {
        /// Device ordinal.
        #[arg(long, default_value_t = 0)]
        device: i32,
    },
    /// Allocate device memory, export it as a dma-buf, and report (or send
    /// it to `p2pbuf recv`).
    Export {
        /// Device ordinal.
        #[arg(long, default_value_t = 0)]
        device: i32,
        /// Bytes (rounded up to 2 MiB): 4096, 2M, 64MiB, 1G.
        #[arg(long, default_value = "2M", value_parser = parse_size)]
        size: usize,
        /// Byte to fill the memory with before export (0-255 or 0x00-0xff).
        #[arg(long, default_value = "0xa5", value_parser = parse_byte)]
        fill: u8,
        /// Ask for CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE.
        #[arg(long)]
        pcie_mapping: bool,
        /// Send the fd to a `p2pbuf recv` on this socket.
        #[arg(long)]
        send: Option<PathBuf>,
        /// Seconds to wait for the receiver's socket.
        #[arg(long, default_value_t = 10)]
        wait: u64,
        #[command(flatten)]
        tries: crate::output::TryArgs,
    },
}

#[cfg(not(feature = "cuda"))]
pub fn run(_: CudaCmd, _json: bool) -> p2pbuf::Result<()> {
    Err(p2pbuf::Error::Unavailable {
        what: "p2pbuf cuda".into(),
        detail: "this p2pbuf was built without the `cuda` feature".into(),
        check: Some("cargo build -p p2pbuf-cli --features cuda".into()),
    })
}

#[cfg(feature = "cuda")]
pub use with_cuda::run;

#[cfg(feature = "cuda")]
mod with_cuda {
    use std::os::fd::AsRawFd;
    use std::path::PathBuf;
    use std::time::Duration;

    use p2pbuf::cuda::{self, DeviceInfo};
    use p2pbuf::rdma::RdmaStatus;
    use p2pbuf::units::human_size;
    use p2pbuf::DmaBufInfo;
    use serde::Serialize;

    use super::CudaCmd;
    use crate::output::{print_info, print_json, Outcome};

    /// `p2pbuf --json cuda probe`.
    #[derive(Serialize)]
    pub struct ProbeReport {
        /// The CUDA device and its attributes.
        pub device: DeviceInfo,
        /// The RDMA devices sysfs lists.
        pub rdma: RdmaStatus,
    }

    /// `p2pbuf --json cuda export`.
    #[derive(Serialize)]
    pub struct ExportReport<'a> {
        /// The CUDA device.
        pub device: &'a DeviceInfo,
        /// The memory's device address.
        pub device_ptr: u64,
        /// Bytes exported.
        pub size: usize,
        /// Bytes allocated (rounded up to the granularity).
        pub allocated: usize,
        /// `--fill`.
        pub fill: u8,
        /// `--pcie-mapping`.
        pub pcie_mapping: bool,
        /// The dma-buf's fd in this process.
        pub fd: i32,
        /// This process.
        pub pid: u32,
        /// The dma-buf's fdinfo.
        pub info: &'a DmaBufInfo,
        /// `--mmap`'s outcome.
        pub mmap: Option<Outcome>,
        /// `--rdma`'s outcome.
        pub rdma: Option<Outcome>,
        /// The RDMA devices sysfs lists.
        pub rdma_devices: RdmaStatus,
        /// `--send`.
        pub sent_to: Option<PathBuf>,
        /// The receiver's answer.
        pub receiver: Option<String>,
        /// The first bytes still read back as `--fill` through cuMemcpyDtoH.
        pub read_back_intact: bool,
    }

    pub fn run(c: CudaCmd, json: bool) -> p2pbuf::Result<()> {
        match c {
            CudaCmd::Probe { device } => {
                let d = cuda::probe(device)?;
                let rdma = p2pbuf::rdma::status()?;
                if json {
                    print_json(&ProbeReport { device: d, rdma });
                } else {
                    print_device(&d);
                    println!("  rdma:     {}", rdma.summary());
                }
                Ok(())
            }
            CudaCmd::Export {
                device,
                size,
                fill,
                pcie_mapping,
                send,
                wait,
                tries,
            } => {
                let x = cuda::export(&cuda::ExportOptions {
                    device,
                    size,
                    fill: Some(fill),
                    pcie_mapping,
                })?;
                let buf = x.dmabuf();
                let tried = tries.run(buf);
                let rdma_status = p2pbuf::rdma::status()?;
                if !json {
                    print_device(x.device());
                    print_info(
                        &format!(
                            "exported {} at device address {:#x} (filled with {fill:#04x})",
                            human_size(x.size() as u64),
                            x.device_ptr()
                        ),
                        Some(buf.as_raw_fd()),
                        buf.info(),
                    );
                    tried.print();
                }
                let ack = match &send {
                    Some(s) => {
                        let a = p2pbuf::fdpass::send_to(s, buf, wait)?;
                        if !json {
                            println!("sent to {}; receiver: {a}", s.display());
                        }
                        Some(a)
                    }
                    None => None,
                };
                // Check the memory still reads back as filled.
                let back = x.read_back(0, 16)?;
                let intact = back.iter().all(|b| *b == fill);
                if json {
                    print_json(&ExportReport {
                        device: x.device(),
                        device_ptr: x.device_ptr(),
                        size: x.size(),
                        allocated: x.allocated(),
                        fill,
                        pcie_mapping,
                        fd: buf.as_raw_fd(),
                        pid: std::process::id(),
                        info: buf.info(),
                        mmap: tried.mmap,
                        rdma: tried.rdma,
                        rdma_devices: rdma_status,
                        sent_to: send,
                        receiver: ack,
                        read_back_intact: intact,
                    });
                } else {
                    println!(
                        "read back through cuMemcpyDtoH: {} ({})",
                        back.iter()
                            .map(|b| format!("{b:02x}"))
                            .collect::<Vec<_>>()
                            .join(" "),
                        if intact { "intact" } else { "CHANGED" }
                    );
                }
                if tries.hold > 0 {
                    if !json {
                        println!(
                            "holding for {} s (see /proc/{}/fdinfo/{})",
                            tries.hold,
                            std::process::id(),
                            buf.as_raw_fd()
                        );
                    }
                    std::thread::sleep(Duration::from_secs(tries.hold));
                }
                Ok(())
            }
        }
    }

    fn print_device(d: &DeviceInfo) {
        println!(
            "CUDA device {} of {}: {} ({}), driver API {}",
            d.ordinal,
            d.device_count,
            d.name,
            d.pci_address,
            d.driver_version_string()
        );
        println!("  memory:   {}", human_size(d.total_mem));
        for a in &d.attributes {
            println!("  {} ({}) = {}", a.name, a.id, a.value);
        }
    }
}
