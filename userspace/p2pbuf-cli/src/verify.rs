//! Checking data against the lab pattern ([`p2pbuf::pattern`]) of `nvme write` and
//! `dma copy`, and their throughput.

/// A check's failure: the first index where the data differs, the byte there, the byte
/// wanted, and how many bytes differ.
pub type Mismatch = (usize, u8, u8, usize);

/// Index and count of bytes where `data[i] != want(i)`.
pub fn mismatches(data: &[u8], want: impl Fn(usize) -> u8) -> Option<Mismatch> {
    let mut first = None;
    let mut n = 0;
    for (i, b) in data.iter().enumerate() {
        let w = want(i);
        if *b != w {
            n += 1;
            if first.is_none() {
                first = Some((i, *b, w));
            }
        }
    }
    first.map(|(i, g, w)| (i, g, w, n))
}

/// MiB/s.
pub fn mib_per_s(bytes: u64, secs: f64) -> f64 {
    bytes as f64 / (1 << 20) as f64 / if secs > 0.0 { secs } else { f64::MIN_POSITIVE }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mismatch_reports_the_first() {
        let d = [1u8, 2, 9, 4, 0];
        let m = mismatches(&d, |i| (i + 1) as u8).unwrap();
        assert_eq!((m.0, m.1, m.2, m.3), (2, 9, 3, 2));
        assert!(mismatches(&d[..2], |i| (i + 1) as u8).is_none());
    }
}
