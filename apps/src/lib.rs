//! Shared code of the command-line tools (`l2fwd`, `pktgen`, `pmd-devices`,
//! `pmd-telemetry`, `pmd-dumpcap`): their command-line values ([`cli`]), opening ports,
//! events and the loss accounting of their reports ([`common`]), pktgen's generator
//! ([`pktgen`]), the telemetry commands of the tools ([`telemetry`]), and the preflight of
//! `pmd-devices --check` ([`preflight`]).
#![deny(unsafe_code)]

pub mod cli;
pub mod common;
pub mod pktgen;
pub mod preflight;
pub mod telemetry;

use pmd::devices::DeviceInfo;
use serde_json::{json, Value};

/// The `pmd-devices --json` document: devices, the names libibverbs sees, the device model.
pub fn devices_json(devices: &[DeviceInfo], verbs_names: &[String]) -> Value {
    let devs: Vec<Value> = devices
        .iter()
        .map(|d| {
            json!({
                "name": d.name,
                "provider": d.family.to_string(),
                "vendor_id": d.vendor_id,
                "device_id": d.device_id,
                "pci_addr": d.pci_addr,
                "ports": d.ports.iter().map(|p| json!({
                    "port": p.number,
                    "state": p.state,
                    "link_layer": p.link_layer,
                    "netdev": p.netdev.as_ref().map(|n| json!({
                        "name": n.name,
                        "mac": n.mac.map(|m| m.to_string()),
                        "up": n.up,
                    })),
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    let model: Vec<Value> = pmd::devices::MODEL_PORTS
        .iter()
        .map(|(k, what)| json!({"kind": k, "description": what}))
        .collect();
    json!({
        "devices": devs,
        "verbs_devices": verbs_names,
        "rdma_core": pmd::sys::RDMA_CORE_VERSION,
        "multi_process": pmd::verbs::multi_process_support()
            .into_iter()
            .map(|(k, v)| (k.to_string(), Value::Bool(v)))
            .collect::<serde_json::Map<_, _>>(),
        "device_model": model,
    })
}
