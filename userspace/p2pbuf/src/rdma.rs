//! RDMA devices as sysfs shows them, without libibverbs.
//!
//! This module finds the RDMA devices the kernel knows
//! (`/sys/class/infiniband`). Registration itself (`ibv_reg_dmabuf_mr`),
//! rdma_cm and RDMA WRITE/READ are in the `p2pbuf-rdma` crate, which loads
//! rdma-core (`p2pbuf_rdma::Pd::reg_dmabuf_mr` registers a dma-buf).

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::error::{Error, Result};

/// Where the kernel lists RDMA devices.
pub const SYSFS_CLASS: &str = "/sys/class/infiniband";

/// An RDMA device as sysfs shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RdmaDevice {
    /// Device name, e.g. `mlx5_0`, `rxe0`.
    pub name: String,
    /// `node_type` (e.g. `1: CA`), if readable.
    pub node_type: Option<String>,
    /// `node_guid`, if readable.
    pub node_guid: Option<String>,
    /// Names of its ports (`ports/*`).
    pub ports: Vec<String>,
}

/// What the RDMA check found, for reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RdmaStatus {
    /// The sysfs directory looked at.
    pub sysfs: PathBuf,
    /// Whether it exists at all (it does not when ib_core is not loaded).
    pub sysfs_present: bool,
    /// Devices found.
    pub devices: Vec<RdmaDevice>,
}

/// List RDMA devices under `root` (normally [`SYSFS_CLASS`]).
pub fn status_at(root: impl AsRef<Path>) -> Result<RdmaStatus> {
    let root = root.as_ref();
    let rd = match std::fs::read_dir(root) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(RdmaStatus {
                sysfs: root.to_path_buf(),
                sysfs_present: false,
                devices: Vec::new(),
            })
        }
        Err(e) => return Err(Error::io("listing RDMA devices", root, e)),
    };
    let mut devices = Vec::new();
    for ent in rd {
        let ent = ent.map_err(|e| Error::io("listing RDMA devices", root, e))?;
        let name = ent.file_name().to_string_lossy().into_owned();
        let dir = ent.path();
        let read = |f: &str| {
            std::fs::read_to_string(dir.join(f))
                .ok()
                .map(|s| s.trim().to_string())
        };
        let mut ports: Vec<String> = std::fs::read_dir(dir.join("ports"))
            .map(|rd| {
                rd.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        ports.sort();
        devices.push(RdmaDevice {
            node_type: read("node_type"),
            node_guid: read("node_guid"),
            name,
            ports,
        });
    }
    devices.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(RdmaStatus {
        sysfs: root.to_path_buf(),
        sysfs_present: true,
        devices,
    })
}

/// List this machine's RDMA devices.
pub fn status() -> Result<RdmaStatus> {
    status_at(SYSFS_CLASS)
}

impl RdmaStatus {
    /// One line for humans.
    pub fn summary(&self) -> String {
        if !self.sysfs_present {
            format!(
                "no RDMA device: {} does not exist (no RDMA driver loaded)",
                self.sysfs.display()
            )
        } else if self.devices.is_empty() {
            format!("no RDMA device: {} is empty", self.sysfs.display())
        } else {
            let names: Vec<&str> = self.devices.iter().map(|d| d.name.as_str()).collect();
            format!("RDMA devices: {}", names.join(", "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmpdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("p2pbuf-rdma-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn missing_sysfs_dir() {
        let st = status_at("/nonexistent/infiniband").unwrap();
        assert!(!st.sysfs_present);
        assert!(st.summary().contains("does not exist"), "{}", st.summary());
    }

    #[test]
    fn empty_sysfs_dir() {
        let d = tmpdir("empty");
        let st = status_at(&d).unwrap();
        assert!(st.sysfs_present);
        assert_eq!(
            st.summary(),
            format!("no RDMA device: {} is empty", d.display())
        );
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn devices_are_listed() {
        let d = tmpdir("devs");
        std::fs::create_dir_all(d.join("rxe0/ports/1")).unwrap();
        std::fs::write(d.join("rxe0/node_type"), "1: CA\n").unwrap();
        std::fs::create_dir_all(d.join("mlx5_0")).unwrap();
        let st = status_at(&d).unwrap();
        assert_eq!(st.devices.len(), 2);
        assert_eq!(st.devices[0].name, "mlx5_0");
        assert_eq!(st.devices[1].ports, vec!["1"]);
        assert_eq!(st.devices[1].node_type.as_deref(), Some("1: CA"));
        assert_eq!(st.summary(), "RDMA devices: mlx5_0, rxe0");
        std::fs::remove_dir_all(d).unwrap();
    }
}
