//! Packet-buffer memory: hugepage regions, a lock-free object pool with per-core caches, and `Mbuf`.
