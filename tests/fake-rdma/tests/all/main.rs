//! The fake rdma-core's integration tests, in one binary (one link instead of one per file).
//! Each test installs the fake in a temporary folder of its own; the runs that carry traffic
//! take [`common::serial`] so that only one does at a time, as when each file was a binary.

mod common;
mod events;
mod fake_rdma;
mod mana_busy;
mod mana_port;
mod mlx5;
mod mlx5_port;
mod multi_process;
mod preflight;
mod queues;
mod recovery;
mod service;
mod watch;
