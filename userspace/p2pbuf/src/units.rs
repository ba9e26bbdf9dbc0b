//! Sizes and bytes on command lines and in reports: one parser and one printer for every
//! p2pbuf tool (the CLI, `p2pbuf-fabric`).

/// Parse `4096`, `2M`, `2MiB`, `1G`, `64k` (binary units) into bytes.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    if num.is_empty() {
        return Err(format!("size {s:?}: expected a number"));
    }
    let n: u64 = num.parse().map_err(|e| format!("size {s:?}: {e}"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        u => return Err(format!("size {s:?}: unknown unit {u:?} (use k, M or G)")),
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("size {s:?} overflows (does not fit in 64 bits)"))
}

/// [`parse_bytes`] for sizes of memory in this process.
pub fn parse_size(s: &str) -> Result<usize, String> {
    let n = parse_bytes(s)?;
    usize::try_from(n).map_err(|_| format!("size {s:?} overflows (does not fit in usize)"))
}

/// Parse a byte: `165`, `0xa5`.
pub fn parse_byte(s: &str) -> Result<u8, String> {
    let t = s.trim();
    let r = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(h) => u8::from_str_radix(h, 16),
        None => t.parse(),
    };
    r.map_err(|e| format!("byte {s:?}: {e} (0-255 or 0x00-0xff)"))
}

/// Parse a 64-bit number, decimal or `0x` hexadecimal.
pub fn parse_u64(s: &str) -> Result<u64, String> {
    let t = s.trim();
    match t.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16),
        None => t.parse(),
    }
    .map_err(|e| format!("{s:?}: {e}"))
}

/// `2097152 (2 MiB)`.
pub fn human_size(n: u64) -> String {
    const UNITS: [(&str, u64); 3] = [("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
    for (u, m) in UNITS {
        if n >= m {
            let v = n as f64 / m as f64;
            return if n % m == 0 {
                format!("{n} ({} {u})", n / m)
            } else {
                format!("{n} ({v:.1} {u})")
            };
        }
    }
    format!("{n} bytes")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("2M").unwrap(), 2 << 20);
        assert_eq!(parse_size("2MiB").unwrap(), 2 << 20);
        assert_eq!(parse_size("64k").unwrap(), 64 << 10);
        assert_eq!(parse_size("1G").unwrap(), 1 << 30);
        assert!(parse_size("M").is_err());
        assert!(parse_size("2X").is_err());
        assert!(parse_size("99999999999999999999G").is_err());
        assert!(parse_bytes("99999999999G").unwrap_err().contains("64 bits"));
    }

    #[test]
    fn bytes() {
        assert_eq!(parse_byte("0xa5").unwrap(), 0xa5);
        assert_eq!(parse_byte("90").unwrap(), 90);
        assert!(parse_byte("256").is_err());
        assert!(parse_byte("0x").is_err());
        assert_eq!(parse_u64("0x10").unwrap(), 16);
        assert_eq!(parse_u64("17").unwrap(), 17);
    }

    #[test]
    fn human_sizes() {
        assert_eq!(human_size(2097152), "2097152 (2 MiB)");
        assert_eq!(human_size(1536), "1536 (1.5 KiB)");
        assert_eq!(human_size(10), "10 bytes");
    }
}
