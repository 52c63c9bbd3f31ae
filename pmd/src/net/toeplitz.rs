//! The Toeplitz hash used for RSS (Microsoft "Verifying the RSS Hash Calculation").
#![deny(unsafe_code)]

/// Toeplitz hash of `input` under `key` (key at least `input.len() + 4` bytes; a 40-byte key
/// covers the 36-byte IPv6 4-tuple).
///
/// # Panics
/// If the key is shorter than `input.len() + 4` bytes.
pub fn hash(key: &[u8], input: &[u8]) -> u32 {
    assert!(
        key.len() >= input.len() + 4,
        "toeplitz key too short for the input"
    );
    let mut result = 0u32;
    // The leftmost 32 bits of the key, shifted left one bit per input bit.
    let mut window = u32::from_be_bytes([key[0], key[1], key[2], key[3]]);
    for (i, &byte) in input.iter().enumerate() {
        for bit in 0..8 {
            if byte & (0x80 >> bit) != 0 {
                result ^= window;
            }
            let next_bit = (key[i + 4] >> (7 - bit)) & 1;
            window = (window << 1) | u32::from(next_bit);
        }
    }
    result
}

/// Longest input a [`Table`] hashes: the IPv6 4-tuple (two 16-byte addresses, two ports).
pub const TABLE_INPUT_MAX: usize = 36;

/// The Toeplitz hash under one key, precomputed: for every input byte position and byte
/// value, what that byte contributes (the XOR of the key windows its set bits select). A hash
/// is then one lookup and one XOR per input byte instead of eight shift-and-test steps, which
/// is how a device model hashes every frame it receives at a few nanoseconds. Equal to
/// [`hash`] for every key and input (the tests compare them).
#[derive(Clone)]
pub struct Table {
    key: [u8; 40],
    rows: Box<[[u32; 256]; TABLE_INPUT_MAX]>,
}

impl std::fmt::Debug for Table {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "toeplitz::Table({:02x?})", &self.key[..4])
    }
}

impl Table {
    /// The table of `key` (36 KiB).
    pub fn new(key: &[u8; 40]) -> Self {
        // The key, zero-padded so that every 64-bit window read below stays inside.
        let mut k = [0u8; 48];
        k[..40].copy_from_slice(key);
        // The 32-bit key window that starts at bit `bit` (bit 0: the key's first MSB).
        let window = |bit: usize| {
            let at = bit / 8;
            let w = u64::from_be_bytes(k[at..at + 8].try_into().expect("8 bytes"));
            ((w << (bit % 8)) >> 32) as u32
        };
        let mut rows = Box::new([[0u32; 256]; TABLE_INPUT_MAX]);
        for (i, row) in rows.iter_mut().enumerate() {
            // The contribution of each single bit, then of every byte value by XOR.
            let bits: [u32; 8] = std::array::from_fn(|j| window(8 * i + j));
            for (v, e) in row.iter_mut().enumerate() {
                *e = (0..8)
                    .filter(|j| v & (0x80 >> j) != 0)
                    .fold(0, |acc, j| acc ^ bits[j]);
            }
        }
        Self { key: *key, rows }
    }

    /// The key this table was built for.
    pub fn key(&self) -> &[u8; 40] {
        &self.key
    }

    /// The Toeplitz hash of `input` (at most [`TABLE_INPUT_MAX`] bytes; longer inputs are
    /// hashed bit by bit with [`hash`], which a 40-byte key covers up to 36 bytes anyway).
    #[inline]
    pub fn hash(&self, input: &[u8]) -> u32 {
        if input.len() > TABLE_INPUT_MAX {
            return hash(&self.key, input);
        }
        self.hash_at(0, input)
    }

    /// What bytes `at..at + part.len()` of an input contribute to its hash, when they are
    /// `part`: the hash of an input in pieces is the XOR of its pieces' `hash_at` (so a
    /// device hashes addresses and ports where they lie in the frame, without gathering
    /// them). Bytes past [`TABLE_INPUT_MAX`] contribute nothing.
    #[inline]
    pub fn hash_at(&self, at: usize, part: &[u8]) -> u32 {
        part.iter()
            .zip(self.rows.iter().skip(at))
            .fold(0, |acc, (&b, row)| acc ^ row[usize::from(b)])
    }
}

/// The 2-tuple (addresses) or 4-tuple (addresses then ports) input, as NDIS orders it.
pub fn ipv4_input(
    src: [u8; 4],
    dst: [u8; 4],
    ports: Option<(u16, u16)>,
    out: &mut [u8; 12],
) -> usize {
    out[..4].copy_from_slice(&src);
    out[4..8].copy_from_slice(&dst);
    match ports {
        Some((s, d)) => {
            out[8..10].copy_from_slice(&s.to_be_bytes());
            out[10..12].copy_from_slice(&d.to_be_bytes());
            12
        }
        None => 8,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The verification key and two rows of the verification table from Microsoft's RSS
    /// documentation ("Verifying the RSS Hash Calculation").
    const MS_KEY: [u8; 40] = [
        0x6d, 0x5a, 0x56, 0xda, 0x25, 0x5b, 0x0e, 0xc2, 0x41, 0x67, 0x25, 0x3d, 0x43, 0xa3, 0x8f,
        0xb0, 0xd0, 0xca, 0x2b, 0xcb, 0xae, 0x7b, 0x30, 0xb4, 0x77, 0xcb, 0x2d, 0xa3, 0x80, 0x30,
        0xf2, 0x0c, 0x6a, 0x42, 0xb7, 0x3b, 0xbe, 0xac, 0x01, 0xfa,
    ];

    #[test]
    fn microsoft_verification_vectors() {
        let mut buf = [0u8; 12];
        // 66.9.149.187:2794 -> 161.142.100.80:1766
        let n = ipv4_input([66, 9, 149, 187], [161, 142, 100, 80], None, &mut buf);
        assert_eq!(hash(&MS_KEY, &buf[..n]), 0x323e_8fc2);
        let n = ipv4_input(
            [66, 9, 149, 187],
            [161, 142, 100, 80],
            Some((2794, 1766)),
            &mut buf,
        );
        assert_eq!(hash(&MS_KEY, &buf[..n]), 0x51cc_c178);
        // 199.92.111.2:14230 -> 65.69.140.83:4739
        let n = ipv4_input([199, 92, 111, 2], [65, 69, 140, 83], None, &mut buf);
        assert_eq!(hash(&MS_KEY, &buf[..n]), 0xd718_262a);
        let n = ipv4_input(
            [199, 92, 111, 2],
            [65, 69, 140, 83],
            Some((14230, 4739)),
            &mut buf,
        );
        assert_eq!(hash(&MS_KEY, &buf[..n]), 0xc626_b0ea);
    }

    #[test]
    fn table_gives_the_verification_vectors() {
        let t = Table::new(&MS_KEY);
        let mut buf = [0u8; 12];
        let n = ipv4_input(
            [66, 9, 149, 187],
            [161, 142, 100, 80],
            Some((2794, 1766)),
            &mut buf,
        );
        assert_eq!(t.hash(&buf[..n]), 0x51cc_c178);
        let n = ipv4_input([199, 92, 111, 2], [65, 69, 140, 83], None, &mut buf);
        assert_eq!(t.hash(&buf[..n]), 0xd718_262a);
        assert_eq!(t.hash(&[]), 0);
    }

    proptest::proptest! {
        #[test]
        fn table_equals_the_bitwise_hash(
            key in proptest::array::uniform32(proptest::num::u8::ANY),
            tail in proptest::array::uniform8(proptest::num::u8::ANY),
            input in proptest::collection::vec(proptest::num::u8::ANY, 0..=36),
        ) {
            let mut k = [0u8; 40];
            k[..32].copy_from_slice(&key);
            k[32..].copy_from_slice(&tail);
            let t = Table::new(&k);
            proptest::prop_assert_eq!(t.hash(&input), hash(&k, &input));
            let cut = input.len() / 3;
            proptest::prop_assert_eq!(
                t.hash_at(0, &input[..cut]) ^ t.hash_at(cut, &input[cut..]),
                hash(&k, &input)
            );
        }
    }
}
