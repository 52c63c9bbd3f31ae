//! The apps' integration tests, in one binary (one link instead of one per file). Each test
//! runs the apps as child processes on names of its own (cables, runtime folders, veths), so
//! they share no state. `rate_accuracy.rs` stays apart: it measures pktgen's achieved rate,
//! which wants the machine to itself, and a test binary runs alone.

mod afpacket_link;
mod cli;
mod device_counters;
mod dumpcap;
mod end_to_end;
mod jumbo;
mod multi_process;
mod pktgen_rx;
mod pmd_devices;
mod port_exclusivity;
mod shm_cables;
mod signals;
mod support;
mod telemetry;
mod unprivileged;
