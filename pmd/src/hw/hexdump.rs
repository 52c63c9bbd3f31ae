//! One hexdump format for WQEs and CQEs, the one Linux's `print_hex_dump(.., DUMP_PREFIX_OFFSET,
//! 16, 1, ..)` prints, so dumps can be diffed against kernel (and DPDK) logs.
#![forbid(unsafe_code)]

use std::fmt::Write;

/// `bytes` as lines of `OFFSET: 16 hex bytes`, offsets in 8 hex digits.
pub fn hexdump(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 3 + bytes.len() / 16 * 12);
    for (i, line) in bytes.chunks(16).enumerate() {
        let _ = write!(s, "{:08x}:", i * 16);
        for b in line {
            let _ = write!(s, " {b:02x}");
        }
        s.push('\n');
    }
    s
}

#[cfg(test)]
mod tests {
    #[test]
    fn kernel_style_lines() {
        let b: Vec<u8> = (0..20).collect();
        assert_eq!(
            super::hexdump(&b),
            "00000000: 00 01 02 03 04 05 06 07 08 09 0a 0b 0c 0d 0e 0f\n00000010: 10 11 12 13\n"
        );
        assert_eq!(super::hexdump(&[]), "");
    }
}
