//! Bit-field descriptors: a field is (byte offset of its 32-bit word, hi bit, lo bit) in a
//! given byte order, the way hardware spec tables list them.
#![forbid(unsafe_code)]

/// Byte order of the 32-bit word a field lives in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endian {
    /// Little-endian (MANA / GDMA).
    Little,
    /// Big-endian (mlx5 PRM).
    Big,
}

/// A bit field `[hi:lo]` of the 32-bit word at byte `offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bits32 {
    /// Byte offset of the 32-bit word.
    pub offset: usize,
    /// Highest bit of the field (inclusive, 0..=31).
    pub hi: u32,
    /// Lowest bit of the field (0..=hi).
    pub lo: u32,
    /// Byte order of the word.
    pub endian: Endian,
}

impl Bits32 {
    /// A field of a little-endian word.
    ///
    /// # Panics
    /// At compile time (in a `const`) if `hi < lo` or `hi > 31`.
    pub const fn le(offset: usize, hi: u32, lo: u32) -> Self {
        assert!(hi >= lo && hi < 32);
        Self {
            offset,
            hi,
            lo,
            endian: Endian::Little,
        }
    }

    /// A field of a big-endian word.
    ///
    /// # Panics
    /// At compile time (in a `const`) if `hi < lo` or `hi > 31`.
    pub const fn be(offset: usize, hi: u32, lo: u32) -> Self {
        assert!(hi >= lo && hi < 32);
        Self {
            offset,
            hi,
            lo,
            endian: Endian::Big,
        }
    }

    /// The field's value mask, right-aligned (e.g. `0x3f` for a 6-bit field).
    #[inline(always)]
    pub const fn max(&self) -> u32 {
        u32::MAX >> (31 - (self.hi - self.lo))
    }

    /// The byte just past the field's word; a view must be at least this long.
    pub const fn end(&self) -> usize {
        self.offset + 4
    }

    /// `word` with the field set to `value` (bits above the width dropped): for building a
    /// whole dword from several fields before one store.
    #[inline(always)]
    pub const fn insert(&self, word: u32, value: u32) -> u32 {
        let mask = self.max() << self.lo;
        (word & !mask) | ((value << self.lo) & mask)
    }

    /// The field's value inside `word` (a dword already read in this field's byte order).
    #[inline(always)]
    pub const fn extract(&self, word: u32) -> u32 {
        (word >> self.lo) & self.max()
    }

    #[inline(always)]
    fn word(&self, buf: &[u8]) -> u32 {
        let b: [u8; 4] = [
            buf[self.offset],
            buf[self.offset + 1],
            buf[self.offset + 2],
            buf[self.offset + 3],
        ];
        match self.endian {
            Endian::Little => u32::from_le_bytes(b),
            Endian::Big => u32::from_be_bytes(b),
        }
    }

    /// Reads the field.
    ///
    /// # Panics
    /// If `buf` is shorter than [`Bits32::end`]; views check that once at construction.
    #[inline(always)]
    pub fn get(&self, buf: &[u8]) -> u32 {
        (self.word(buf) >> self.lo) & self.max()
    }

    /// Writes the field, leaving every other bit of the word unchanged. Bits of `value` above
    /// the field width are dropped (as a C bit-field store does).
    ///
    /// # Panics
    /// If `buf` is shorter than [`Bits32::end`]; views check that once at construction.
    #[inline(always)]
    pub fn set(&self, buf: &mut [u8], value: u32) {
        let mask = self.max() << self.lo;
        let w = (self.word(buf) & !mask) | ((value << self.lo) & mask);
        let bytes = match self.endian {
            Endian::Little => w.to_le_bytes(),
            Endian::Big => w.to_be_bytes(),
        };
        buf[self.offset..self.offset + 4].copy_from_slice(&bytes);
    }
}

/// Reads a little-endian `u32` at `offset`.
#[inline(always)]
pub fn le32(buf: &[u8], offset: usize) -> u32 {
    Bits32::le(offset, 31, 0).get(buf)
}

/// Writes a little-endian `u32` at `offset`.
#[inline(always)]
pub fn set_le32(buf: &mut [u8], offset: usize, v: u32) {
    buf[offset..offset + 4].copy_from_slice(&v.to_le_bytes());
}

/// Reads a little-endian `u64` at `offset`.
#[inline(always)]
pub fn le64(buf: &[u8], offset: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&buf[offset..offset + 8]);
    u64::from_le_bytes(b)
}

/// Writes a little-endian `u64` at `offset`.
#[inline(always)]
pub fn set_le64(buf: &mut [u8], offset: usize, v: u64) {
    buf[offset..offset + 8].copy_from_slice(&v.to_le_bytes());
}

/// Reads a big-endian `u16` at `offset`.
#[inline(always)]
pub fn be16(buf: &[u8], offset: usize) -> u16 {
    u16::from_be_bytes([buf[offset], buf[offset + 1]])
}

/// Writes a big-endian `u16` at `offset`.
#[inline(always)]
pub fn set_be16(buf: &mut [u8], offset: usize, v: u16) {
    buf[offset..offset + 2].copy_from_slice(&v.to_be_bytes());
}

/// Reads a big-endian `u32` at `offset`.
#[inline(always)]
pub fn be32(buf: &[u8], offset: usize) -> u32 {
    Bits32::be(offset, 31, 0).get(buf)
}

/// Writes a big-endian `u32` at `offset`.
#[inline(always)]
pub fn set_be32(buf: &mut [u8], offset: usize, v: u32) {
    buf[offset..offset + 4].copy_from_slice(&v.to_be_bytes());
}

/// Reads a big-endian `u64` at `offset`.
#[inline(always)]
pub fn be64(buf: &[u8], offset: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&buf[offset..offset + 8]);
    u64::from_be_bytes(b)
}

/// Writes a big-endian `u64` at `offset`.
#[inline(always)]
pub fn set_be64(buf: &mut [u8], offset: usize, v: u64) {
    buf[offset..offset + 8].copy_from_slice(&v.to_be_bytes());
}

/// Declares an enum for a hardware code with an `Unknown(raw)` variant, converting both ways,
/// so decoding never fails on a value the spec did not list.
#[macro_export]
macro_rules! enum_with_unknown {
    (
        $(#[$attr:meta])*
        pub enum $name:ident($ty:ty) {
            $( $(#[$vattr:meta])* $variant:ident = $value:expr ),+ $(,)?
        }
    ) => {
        $(#[$attr])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $( $(#[$vattr])* $variant, )+
            /// A value the spec does not list.
            Unknown($ty),
        }
        impl From<$ty> for $name {
            fn from(v: $ty) -> Self {
                match v {
                    $( x if x == $value => $name::$variant, )+
                    other => $name::Unknown(other),
                }
            }
        }
        impl From<$name> for $ty {
            fn from(v: $name) -> $ty {
                match v {
                    $( $name::$variant => $value, )+
                    $name::Unknown(other) => other,
                }
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn le_and_be_place_bits_per_spec_tables() {
        let mut b = [0u8; 8];
        Bits32::le(4, 31, 24).set(&mut b, 0xab);
        assert_eq!(b, [0, 0, 0, 0, 0, 0, 0, 0xab]);
        let mut b = [0u8; 8];
        Bits32::be(4, 31, 24).set(&mut b, 0xab);
        assert_eq!(b, [0, 0, 0, 0, 0xab, 0, 0, 0]);
        let mut b = [0u8; 4];
        Bits32::le(0, 10, 8).set(&mut b, 0x7);
        assert_eq!(b, [0, 0x07, 0, 0]);
        assert_eq!(Bits32::le(0, 31, 0).max(), u32::MAX);
        assert_eq!(Bits32::le(0, 5, 0).max(), 0x3f);
    }

    proptest! {
        #[test]
        fn set_then_get_round_trips_and_spares_neighbours(
            init in any::<[u8; 8]>(), offset in 0usize..=4, lo in 0u32..32, width in 1u32..=32, v in any::<u32>(), be in any::<bool>()
        ) {
            let hi = (lo + width - 1).min(31);
            let f = if be { Bits32::be(offset, hi, lo) } else { Bits32::le(offset, hi, lo) };
            let mut b = init;
            f.set(&mut b, v);
            prop_assert_eq!(f.get(&b), v & f.max());
            // Every bit outside the field is unchanged.
            let mut cleared_new = b; f.set(&mut cleared_new, 0);
            let mut cleared_old = init; f.set(&mut cleared_old, 0);
            prop_assert_eq!(cleared_new, cleared_old);
        }
    }
}
