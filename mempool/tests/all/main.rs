//! mempool's integration tests, in one binary (one link instead of one per file): the pool,
//! mbufs, regions, and pools shared between processes. `region_env.rs` stays apart: it sets
//! environment variables, which every test of a process would see.

mod mbuf;
mod pool;
mod region;
mod shared;
