//! What `p2pbuf-fabric serve` and its clients exchange: the request in the connection
//! request's data (`fi_connect`), the server's region in the accept data (`fi_accept`), and
//! two messages after the transfer (`fi_send`). Little-endian, fixed sizes: verbs carries
//! connection data in rdma_cm private data (56 bytes in a connect request).

use crate::{Error, Result};

/// What the client does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `fi_write` into the server's region.
    Write,
    /// `fi_read` from it.
    Read,
}

impl Op {
    /// The libfabric call.
    pub fn call(self) -> &'static str {
        match self {
            Op::Write => "fi_write",
            Op::Read => "fi_read",
        }
    }
}

const MAGIC: u16 = 0x4650; // "PF"

/// The client's request (connect data).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// Write or read.
    pub op: Op,
    /// Offset into the server's region.
    pub offset: u64,
    /// Bytes.
    pub len: u64,
    /// Seed of the lab pattern the bytes must hold after the operation.
    pub seed: u64,
}

impl Request {
    /// Encoded size.
    pub const SIZE: usize = 27;

    /// Bytes.
    pub fn encode(&self) -> [u8; Self::SIZE] {
        let mut b = [0u8; Self::SIZE];
        b[..2].copy_from_slice(&MAGIC.to_le_bytes());
        b[2] = match self.op {
            Op::Write => 1,
            Op::Read => 2,
        };
        b[3..11].copy_from_slice(&self.offset.to_le_bytes());
        b[11..19].copy_from_slice(&self.len.to_le_bytes());
        b[19..27].copy_from_slice(&self.seed.to_le_bytes());
        b
    }

    /// From the connection request's data.
    pub fn decode(b: &[u8]) -> Result<Request> {
        if b.len() < Self::SIZE || u16::from_le_bytes([b[0], b[1]]) != MAGIC {
            return Err(Error::Protocol(format!(
                "connection request data is not a p2pbuf-fabric request ({} bytes)",
                b.len()
            )));
        }
        let op = match b[2] {
            1 => Op::Write,
            2 => Op::Read,
            x => return Err(Error::Protocol(format!("unknown operation {x}"))),
        };
        Ok(Request {
            op,
            offset: u64_at(b, 3),
            len: u64_at(b, 11),
            seed: u64_at(b, 19),
        })
    }
}

/// The server's region (accept data).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Region {
    /// The MR's key (`fi_mr_key`).
    pub key: u64,
    /// The address of its first byte for RMA (the iova: the MR is registered with the
    /// mapping's address as base, `FI_MR_VIRT_ADDR`).
    pub addr: u64,
    /// Its length.
    pub len: u64,
}

impl Region {
    /// Encoded size.
    pub const SIZE: usize = 24;

    /// Bytes.
    pub fn encode(&self) -> [u8; Self::SIZE] {
        let mut b = [0u8; Self::SIZE];
        b[..8].copy_from_slice(&self.key.to_le_bytes());
        b[8..16].copy_from_slice(&self.addr.to_le_bytes());
        b[16..].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    /// From the accept data.
    pub fn decode(b: &[u8]) -> Result<Region> {
        if b.len() < Self::SIZE {
            return Err(Error::Protocol(format!(
                "accept data of {} bytes, want {} (is the server p2pbuf-fabric serve?)",
                b.len(),
                Self::SIZE
            )));
        }
        Ok(Region {
            key: u64_at(b, 0),
            addr: u64_at(b, 8),
            len: u64_at(b, 16),
        })
    }
}

/// The server's verdict on the range, after the client said it was done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    /// The range lies in the region.
    pub in_range: bool,
    /// FNV-1a of the range as the server's CPU reads it through the mmap.
    pub checksum: u64,
    /// First byte of the range that is not the seed's lab pattern.
    pub first_mismatch: Option<u64>,
}

impl Verdict {
    /// Encoded size.
    pub const SIZE: usize = 17;

    /// Bytes.
    pub fn encode(&self) -> [u8; Self::SIZE] {
        let mut b = [0u8; Self::SIZE];
        b[0] = self.in_range as u8;
        b[1..9].copy_from_slice(&self.checksum.to_le_bytes());
        b[9..].copy_from_slice(&self.first_mismatch.unwrap_or(u64::MAX).to_le_bytes());
        b
    }

    /// From the server's message.
    pub fn decode(b: &[u8]) -> Result<Verdict> {
        if b.len() < Self::SIZE {
            return Err(Error::Protocol(format!(
                "verdict of {} bytes, want {}",
                b.len(),
                Self::SIZE
            )));
        }
        let m = u64_at(b, 9);
        Ok(Verdict {
            in_range: b[0] == 1,
            checksum: u64_at(b, 1),
            first_mismatch: (m != u64::MAX).then_some(m),
        })
    }
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let r = Request {
            op: Op::Read,
            offset: 61 << 20,
            len: 3 << 20,
            seed: 53,
        };
        assert_eq!(Request::decode(&r.encode()).unwrap(), r);
        let g = Region {
            key: 0x1234,
            addr: 0x7f00_0000_0000,
            len: 64 << 20,
        };
        assert_eq!(Region::decode(&g.encode()).unwrap(), g);
        for m in [None, Some(0), Some(4095)] {
            let v = Verdict {
                in_range: true,
                checksum: 0xdead_beef,
                first_mismatch: m,
            };
            assert_eq!(Verdict::decode(&v.encode()).unwrap(), v);
        }
    }

    #[test]
    fn refuses_foreign_data() {
        let mut b = Request {
            op: Op::Write,
            offset: 0,
            len: 1,
            seed: 1,
        }
        .encode();
        assert!(Request::decode(&b[..10]).is_err());
        b[2] = 9;
        assert_eq!(
            Request::decode(&b).unwrap_err().to_string(),
            "protocol: unknown operation 9"
        );
        b[0] = 0;
        assert!(Request::decode(&b)
            .unwrap_err()
            .to_string()
            .contains("not a p2pbuf-fabric request"));
        assert!(Region::decode(&[0; 23]).is_err());
        // Fits a verbs connect request's private data (56 bytes, less the provider's header).
        const { assert!(Request::SIZE <= 48) };
    }
}
