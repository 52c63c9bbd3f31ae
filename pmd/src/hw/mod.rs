//! Hardware formats: typed views over bytes, shared by the drivers and the device model.
//!
//! Every field is declared once, as (byte offset, hi bit, lo bit) of a dword in the byte order
//! the format uses (MANA/GDMA: little-endian; mlx5 PRM: big-endian), exactly as the spec
//! tables list it. Views check the buffer length once at construction; after that no accessor
//! panics. Setters of structures only the device writes (CQEs) exist only for the device model
//! (`emu` feature) and tests, so driver code that writes a completion does not compile.
//!
//! Because driver and model share these views, a wrong offset would be wrong on both sides;
//! golden byte vectors from the spec and from reference implementations pin every format.
#![forbid(unsafe_code)]

pub mod bits;
pub mod hexdump;
pub mod mana;
pub mod mlx5;

pub use hexdump::hexdump;
