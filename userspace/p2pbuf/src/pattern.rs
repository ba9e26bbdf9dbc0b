//! The lab's byte pattern and the transfers' checksum, the one Rust definition of each.
//!
//! Byte `i` of a transfer (counted from its first byte) for a seed is
//! `(i * 13 + seed + (i >> 12)) & 0xff`: what the C selftests write (`p2pbuf_pattern()` in
//! `tests/selftests/p2pbuf_pattern.h`, the one C definition), what `p2pbuf nvme write`,
//! `p2pbuf dma copy`, `p2pbuf rdma write --lab-pattern` and `p2pbuf-fabric` write and
//! check, and what `cargo xtask test`'s host check looks for in the backing file of the
//! emulated device memory. [`tests::c_header_agrees`] compiles the C header and compares.

/// Byte `i` of the pattern for `seed` (the C `p2pbuf_pattern(i, seed)`).
pub fn byte(i: u64, seed: u64) -> u8 {
    (i.wrapping_mul(13).wrapping_add(seed).wrapping_add(i >> 12)) as u8
}

/// Fill `buf` with the pattern for `seed`, from byte 0.
pub fn fill(buf: &mut [u8], seed: u64) {
    for (i, b) in buf.iter_mut().enumerate() {
        *b = byte(i as u64, seed);
    }
}

/// Offset of the first byte of `buf` that is not the pattern for `seed`.
pub fn first_mismatch(buf: &[u8], seed: u64) -> Option<u64> {
    buf.iter()
        .enumerate()
        .position(|(i, b)| *b != byte(i as u64, seed))
        .map(|i| i as u64)
}

/// The checksum both ends of a transfer compute and compare: FNV-1a, 64 bits.
pub fn checksum(buf: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in buf {
        h ^= *b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;
    use std::process::Command;

    /// Where the byte pattern is checked: across the `i >> 12` steps, seeds above a byte.
    const POINTS: &[(u64, u64)] = &[
        (0, 0),
        (1, 5),
        (255, 1),
        (4095, 7),
        (4096, 7),
        (8191, 42),
        (12345, 200),
        (1 << 20, 3),
        ((1 << 20) + 77, 0x1_0000_0101),
        ((1 << 33) + 4099, 0xffff_ffff),
    ];

    #[test]
    fn pattern_values() {
        assert_eq!(byte(0, 5), 5);
        assert_eq!(byte(1, 5), 18);
        assert_eq!(byte(4096, 7), ((4096 * 13 + 7 + 1) & 0xff) as u8);
        let mut b = vec![0u8; 3 << 12];
        fill(&mut b, 7);
        assert_eq!((b[0], b[1]), (7, 20));
        assert_eq!(first_mismatch(&b, 7), None);
        b[5000] ^= 0x80;
        assert_eq!(first_mismatch(&b, 7), Some(5000));
        assert_eq!(first_mismatch(&b[..10], 8), Some(0));
    }

    #[test]
    fn checksum_is_fnv1a() {
        assert_eq!(checksum(b""), 0xcbf29ce484222325);
        assert_eq!(checksum(b"a"), 0xaf63dc4c8601ec8c);
    }

    /// The C definition (tests/selftests/p2pbuf_pattern.h, compiled here with `$CC` or `cc`)
    /// gives the same bytes as [`byte`]. No C compiler is a failure, not a skip.
    #[test]
    fn c_header_agrees() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let header = root.join("tests/selftests/p2pbuf_pattern.h");
        assert!(header.exists(), "{} is missing", header.display());
        let dir = std::env::temp_dir().join(format!("p2pbuf-pattern-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (src, exe) = (dir.join("pattern.c"), dir.join("pattern"));
        // Each point on its own line: "i seed byte", i and seed as the C types take them.
        let mut c = format!(
            "#include <stdio.h>\n#include \"{}\"\nint main(void)\n{{\n",
            header.display()
        );
        for (i, seed) in POINTS {
            c += &format!(
                "\tprintf(\"%zu %u %u\\n\", (size_t){i}ULL, (unsigned int){seed}ULL, \
                 (unsigned)p2pbuf_pattern((size_t){i}ULL, (unsigned int){seed}ULL));\n"
            );
        }
        c += "\treturn 0;\n}\n";
        std::fs::write(&src, c).unwrap();
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
        let st = Command::new(&cc)
            .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-o"])
            .arg(&exe)
            .arg(&src)
            .status()
            .unwrap_or_else(|e| panic!("running the C compiler {cc:?}: {e}"));
        assert!(st.success(), "{cc} {} failed", src.display());
        let out = Command::new(&exe).output().unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(out.status.success());
        let lines: Vec<String> = String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(String::from)
            .collect();
        let want: Vec<String> = POINTS
            .iter()
            .map(|&(i, seed)| format!("{i} {} {}", seed as u32, byte(i, seed)))
            .collect();
        assert_eq!(lines, want, "C (left) and Rust (right) disagree");
    }
}
