//! The workspace's wire and kernel-peer tests, in one binary (one link instead of one per
//! file); each creates and removes its own veths and namespaces. `shm_wire.rs` stays apart: it
//! sets `PMD_SHM_DIR`, which every test of a process would see.

mod afpacket_wire;
mod hw_nic;
mod jumbo_veth;
mod veth_kernel_peer;
