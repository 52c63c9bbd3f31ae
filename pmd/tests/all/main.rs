//! pmd's integration tests, in one binary (one link instead of one per file). Two stay apart
//! because they change what every test of a process would see:
//! - `no_alloc.rs` installs a counting global allocator;
//! - `takeover.rs` asserts on the process-wide registry of taken-over netdevs (and the panic
//!   hook that empties it).

mod capture;
mod devices;
mod inline_engine;
mod jumbo;
mod layering;
mod mana_emu;
mod mana_golden;
mod mlx5_emu;
mod mlx5_golden;
mod mlx5_port;
mod mlx5_recovery;
mod mp;
mod parked;
mod port_events;
mod port_null;
mod port_recovery;
