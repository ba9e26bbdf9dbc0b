//! Work-completion status: one type for its `IBV_WC_*` name, rdma-core's description and what
//! to check when it is not success.

use std::fmt;

use crate::ffi::{self, libs};

/// `enum ibv_wc_status` of a work completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WcStatus(pub u32);

impl WcStatus {
    /// `IBV_WC_SUCCESS`.
    pub const SUCCESS: WcStatus = WcStatus(ffi::ibv_wc_status::IBV_WC_SUCCESS);

    /// The work request completed without error.
    pub fn is_success(self) -> bool {
        self == Self::SUCCESS
    }

    /// `IBV_WC_*` name.
    pub fn name(self) -> String {
        use ffi::ibv_wc_status as s;
        let n = match self.0 {
            s::IBV_WC_SUCCESS => "IBV_WC_SUCCESS",
            s::IBV_WC_LOC_LEN_ERR => "IBV_WC_LOC_LEN_ERR",
            s::IBV_WC_LOC_QP_OP_ERR => "IBV_WC_LOC_QP_OP_ERR",
            s::IBV_WC_LOC_PROT_ERR => "IBV_WC_LOC_PROT_ERR",
            s::IBV_WC_WR_FLUSH_ERR => "IBV_WC_WR_FLUSH_ERR",
            s::IBV_WC_REM_INV_REQ_ERR => "IBV_WC_REM_INV_REQ_ERR",
            s::IBV_WC_REM_ACCESS_ERR => "IBV_WC_REM_ACCESS_ERR",
            s::IBV_WC_REM_OP_ERR => "IBV_WC_REM_OP_ERR",
            s::IBV_WC_RETRY_EXC_ERR => "IBV_WC_RETRY_EXC_ERR",
            s::IBV_WC_RNR_RETRY_EXC_ERR => "IBV_WC_RNR_RETRY_EXC_ERR",
            s::IBV_WC_GENERAL_ERR => "IBV_WC_GENERAL_ERR",
            _ => return format!("IBV_WC status {}", self.0),
        };
        n.to_string()
    }

    /// rdma-core's description (`ibv_wc_status_str`).
    pub fn describe(self) -> String {
        libs()
            .ok()
            .and_then(|l| crate::sys::verbs::wc_status_str(l, self.0))
            .unwrap_or_else(|| format!("status {}", self.0))
    }

    /// What to check when a work request completes with this status.
    pub fn check(self) -> &'static str {
        use ffi::ibv_wc_status as s;
        match self.0 {
            s::IBV_WC_REM_ACCESS_ERR => "the peer's MR lacks that access (REMOTE_WRITE / REMOTE_READ), or address, length or rkey fall outside it",
            s::IBV_WC_LOC_PROT_ERR | s::IBV_WC_LOC_LEN_ERR => "the local buffer's lkey, address or length",
            s::IBV_WC_RETRY_EXC_ERR => "the peer does not answer (network, rxe on both ends)",
            s::IBV_WC_WR_FLUSH_ERR => "the QP went to the error state (after an earlier failed work request, or the peer disconnected)",
            s::IBV_WC_REM_INV_REQ_ERR => "the peer refused the request (length past its MR, or an opcode it does not allow)",
            _ => "dmesg on both ends",
        }
    }
}

/// `IBV_WC_REM_ACCESS_ERR (remote access error)`.
impl fmt::Display for WcStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name(), self.describe())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wc_names() {
        assert_eq!(WcStatus(10).name(), "IBV_WC_REM_ACCESS_ERR");
        assert_eq!(WcStatus(0).name(), "IBV_WC_SUCCESS");
        assert!(WcStatus(10).check().contains("REMOTE_WRITE"));
        assert!(WcStatus::SUCCESS.is_success());
    }
}
