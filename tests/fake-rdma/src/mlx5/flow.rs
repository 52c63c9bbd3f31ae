//! Flow steering rules (`ibv_create_flow` / `ibv_destroy_flow` through the context's
//! `ibv_create_flow` / `ibv_destroy_flow` slots: `mlx5_create_flow`, v44 verbs.c:
//! 4390–4474, over `ibv_cmd_create_flow`, libibverbs/cmd.c:935–1126, and the kernel's
//! `ib_uverbs_ex_create_flow` / `mlx5_ib_create_flow`), and the steering decision the
//! device model's port makes with them.
//!
//! What reaches the receive queues: a frame from the wire goes to the RSS QP of the first
//! rule it matches, in the device's order (NORMAL rules by priority, multicast-only NORMAL
//! rules in the multicast priority after them, then the leftovers: MC_DEFAULT for
//! multicast, ALL_DEFAULT for everything); a frame no rule matches goes to the kernel's
//! netdev, i.e. not to any RQ of ours. Each hashing QP is a TIR of its own (its key, fields
//! and table); a frame hashes on the TIR of the rule it matched, and one of another type
//! than that TIR hashes counts as the model's `rx_hash_wrong_type`; frames are taken only
//! while every RQ of every table is RDY (see RULES.md).

use super::caps;
use super::qp::Qp;
use super::wq::Wq;
use crate::ffi::*;
use crate::objects::{has_cap_net_raw, non_null, obj};
use crate::state::{addr, call_int, call_ptr, die, Kind, State};
use crate::verbs::ctx_of;
use serde_json::json;
use std::ffi::c_int;
use std::mem::size_of;

/// `IB_FLOW_ATTR_FLAGS_RESERVED` (kernel uverbs: flags at or above it → EINVAL).
const FLOW_ATTR_FLAGS_RESERVED: u32 = 1 << 3;

/// One match of a rule (the spec's value and mask, in network byte order as given).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Spec {
    /// `IBV_FLOW_SPEC_ETH`: dst MAC, src MAC, EtherType (after the VLAN tag), VLAN TCI.
    Eth {
        /// Value: dst 6, src 6, EtherType 2, TCI 2.
        val: [u8; 16],
        /// Mask, same layout.
        mask: [u8; 16],
    },
    /// `IBV_FLOW_SPEC_IPV4`: the frame is IPv4; src and dst addresses.
    Ipv4 {
        /// Value: src 4, dst 4.
        val: [u8; 8],
        /// Mask.
        mask: [u8; 8],
    },
    /// `IBV_FLOW_SPEC_IPV6`: the frame is IPv6; src and dst addresses.
    Ipv6 {
        /// Value: src 16, dst 16.
        val: [u8; 32],
        /// Mask.
        mask: [u8; 32],
    },
    /// `IBV_FLOW_SPEC_TCP` / `_UDP`: the protocol, dst and src ports.
    L4 {
        /// IP protocol (6 TCP, 17 UDP).
        proto: u8,
        /// Value: dst 2, src 2.
        val: [u8; 4],
        /// Mask.
        mask: [u8; 4],
    },
}

/// A rule as the port's steering sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Matcher {
    /// Order key: 0..=15 NORMAL priorities, 16 multicast NORMAL, 17 MC_DEFAULT, 18
    /// ALL_DEFAULT; then creation order.
    pub rank: (u32, u64),
    /// `IBV_FLOW_ATTR_*`.
    pub kind: u32,
    /// The specs (all must match).
    pub specs: Vec<Spec>,
    /// `IBV_FLOW_SPEC_ACTION_DROP`: matching frames are dropped.
    pub drop: bool,
}

/// A hashing QP's TIR as the device model takes it: key, `IBV_RX_HASH_*` fields, the
/// table by RQ number.
pub type Tir = ([u8; 40], u32, Vec<u32>);

/// The steering state of a port: its rules in order, the TIR each leads to, and whether the
/// RQs they lead to are all ready.
#[derive(Debug, Clone, Default)]
pub struct Steering {
    /// Rules, in the device's order.
    pub rules: Vec<Matcher>,
    /// `tirs[i]`: the index of rule `i`'s hashing QP among the port's TIRs.
    pub tirs: Vec<usize>,
    /// Every RQ of the RSS table is RDY.
    pub ready: bool,
}

fn masked_eq(frame: &[u8], val: &[u8], mask: &[u8]) -> bool {
    frame
        .iter()
        .zip(val)
        .zip(mask)
        .all(|((f, v), m)| f & m == v & m)
}

/// The headers of a frame the specs look at.
struct Headers<'a> {
    frame: &'a [u8],
    /// EtherType after one C-VLAN tag, the TCI, where L3 starts.
    ether_type: [u8; 2],
    tci: Option<[u8; 2]>,
    l3: usize,
}

impl<'a> Headers<'a> {
    fn of(frame: &'a [u8]) -> Option<Self> {
        if frame.len() < 14 {
            return None;
        }
        let mut et = [frame[12], frame[13]];
        let mut l3 = 14;
        let mut tci = None;
        if et == [0x81, 0x00] && frame.len() >= 18 {
            tci = Some([frame[14], frame[15]]);
            et = [frame[16], frame[17]];
            l3 = 18;
        }
        Some(Headers {
            frame,
            ether_type: et,
            tci,
            l3,
        })
    }

    fn ipv4(&self) -> Option<&'a [u8]> {
        (self.ether_type == [0x08, 0x00] && self.frame.len() >= self.l3 + 20)
            .then(|| &self.frame[self.l3..])
    }

    fn ipv6(&self) -> Option<&'a [u8]> {
        (self.ether_type == [0x86, 0xdd] && self.frame.len() >= self.l3 + 40)
            .then(|| &self.frame[self.l3..])
    }

    /// (protocol, L4 header).
    fn l4(&self) -> Option<(u8, &'a [u8])> {
        if let Some(ip) = self.ipv4() {
            let ihl = usize::from(ip[0] & 0x0f) * 4;
            return (ip.len() >= ihl + 4).then(|| (ip[9], &ip[ihl..]));
        }
        let ip = self.ipv6()?;
        (ip.len() >= 44).then(|| (ip[6], &ip[40..]))
    }
}

impl Spec {
    fn matches(&self, h: &Headers<'_>) -> bool {
        match self {
            Spec::Eth { val, mask } => {
                let tci = h.tci.unwrap_or([0, 0]);
                // A VLAN match needs a tagged frame (the rule matches cvlan_tag).
                if mask[14..16] != [0, 0] && h.tci.is_none() {
                    return false;
                }
                let mut f = [0u8; 16];
                f[..12].copy_from_slice(&h.frame[..12]);
                f[12..14].copy_from_slice(&h.ether_type);
                f[14..16].copy_from_slice(&tci);
                masked_eq(&f, val, mask)
            }
            Spec::Ipv4 { val, mask } => {
                h.ipv4().is_some_and(|ip| masked_eq(&ip[12..20], val, mask))
            }
            Spec::Ipv6 { val, mask } => h.ipv6().is_some_and(|ip| masked_eq(&ip[8..40], val, mask)),
            Spec::L4 { proto, val, mask } => h.l4().is_some_and(|(p, l4)| {
                // The spec's layout is dst port then src port.
                let ports = [l4[2], l4[3], l4[0], l4[1]];
                p == *proto && masked_eq(&ports, val, mask)
            }),
        }
    }
}

fn multicast(frame: &[u8]) -> bool {
    frame.first().is_some_and(|b| b & 1 != 0)
}

impl Matcher {
    fn matches(&self, frame: &[u8], h: &Headers<'_>) -> bool {
        match self.kind {
            IBV_FLOW_ATTR_MC_DEFAULT => multicast(frame),
            IBV_FLOW_ATTR_ALL_DEFAULT => true,
            _ => self.specs.iter().all(|s| s.matches(h)),
        }
    }
}

impl Steering {
    /// Whether a frame from the wire goes to the port's RQs: the first rule it matches
    /// decides (a DROP rule drops it); no rule: it is the kernel's.
    pub fn accepts(&self, frame: &[u8]) -> bool {
        if !self.ready {
            return false;
        }
        let Some(h) = Headers::of(frame) else {
            return false;
        };
        self.rules
            .iter()
            .find(|r| r.matches(frame, &h))
            .is_some_and(|r| !r.drop)
    }

    /// The TIR of the first rule `frame` matches (the one [`Steering::accepts`] went by).
    pub fn tir_of(&self, frame: &[u8]) -> Option<usize> {
        let h = Headers::of(frame)?;
        let i = self.rules.iter().position(|r| r.matches(frame, &h))?;
        self.tirs.get(i).copied()
    }
}

/// A flow rule (`struct mlx5_flow`).
#[repr(C)]
pub struct Flow {
    /// What callers hold.
    pub f: ibv_flow,
    /// The QP it steers to.
    pub qp: *mut Qp,
    /// The rule.
    pub rule: Matcher,
}

/// Reads the specs after `attr` as `ibv_cmd_create_flow` walks them (cmd.c:1096–1108):
/// each by its own `hdr.size`; an unknown type → EINVAL (errno).
fn specs(attr: &ibv_flow_attr, call: &str) -> Result<(Vec<Spec>, bool), c_int> {
    let mut out = Vec::new();
    let mut drop = false;
    let mut p = (attr as *const ibv_flow_attr)
        .cast::<u8>()
        .wrapping_add(size_of::<ibv_flow_attr>());
    for _ in 0..attr.num_of_specs {
        // SAFETY: the caller's rule carries `num_of_specs` specs after the attr (the verbs
        // contract; libibverbs reads them the same way); each starts with its header.
        let (ty, size) = unsafe {
            (
                p.cast::<u32>().read_unaligned(),
                p.add(4).cast::<u16>().read_unaligned(),
            )
        };
        let inner = ty & IBV_FLOW_SPEC_INNER != 0;
        // ib_spec_to_kern_spec: these may be inner; GRE, VXLAN and the actions may not.
        let layered = [
            IBV_FLOW_SPEC_ETH,
            IBV_FLOW_SPEC_IPV4,
            IBV_FLOW_SPEC_IPV4_EXT,
            IBV_FLOW_SPEC_IPV6,
            IBV_FLOW_SPEC_ESP,
            IBV_FLOW_SPEC_TCP,
            IBV_FLOW_SPEC_UDP,
            IBV_FLOW_SPEC_MPLS,
        ];
        let flat = [
            IBV_FLOW_SPEC_VXLAN_TUNNEL,
            IBV_FLOW_SPEC_GRE,
            IBV_FLOW_SPEC_ACTION_TAG,
            IBV_FLOW_SPEC_ACTION_DROP,
            IBV_FLOW_SPEC_ACTION_HANDLE,
            IBV_FLOW_SPEC_ACTION_COUNT,
        ];
        let valid = if inner {
            layered.contains(&(ty & !IBV_FLOW_SPEC_INNER))
        } else {
            layered.contains(&ty) || flat.contains(&ty)
        };
        if !valid {
            return Err(libc::EINVAL);
        }
        match ty {
            IBV_FLOW_SPEC_ETH => {
                // SAFETY: a spec of this type is a `struct ibv_flow_spec_eth`.
                let e = unsafe { p.cast::<ibv_flow_spec_eth>().read_unaligned() };
                let bytes = |f: ibv_flow_eth_filter| {
                    let mut b = [0u8; 16];
                    b[..6].copy_from_slice(&f.dst_mac);
                    b[6..12].copy_from_slice(&f.src_mac);
                    // Network byte order as given: the bytes as they lie in memory.
                    b[12..14].copy_from_slice(&f.ether_type.to_ne_bytes());
                    b[14..16].copy_from_slice(&f.vlan_tag.to_ne_bytes());
                    b
                };
                out.push(Spec::Eth {
                    val: bytes(e.val),
                    mask: bytes(e.mask),
                });
            }
            IBV_FLOW_SPEC_IPV4 => {
                // SAFETY: a spec of this type is a `struct ibv_flow_spec_ipv4`.
                let e = unsafe { p.cast::<ibv_flow_spec_ipv4>().read_unaligned() };
                let bytes = |f: ibv_flow_ipv4_filter| {
                    let mut b = [0u8; 8];
                    b[..4].copy_from_slice(&f.src_ip.to_ne_bytes());
                    b[4..].copy_from_slice(&f.dst_ip.to_ne_bytes());
                    b
                };
                out.push(Spec::Ipv4 {
                    val: bytes(e.val),
                    mask: bytes(e.mask),
                });
            }
            IBV_FLOW_SPEC_IPV6 => {
                // SAFETY: a spec of this type is a `struct ibv_flow_spec_ipv6`.
                let e = unsafe { p.cast::<ibv_flow_spec_ipv6>().read_unaligned() };
                let bytes = |f: ibv_flow_ipv6_filter| {
                    let mut b = [0u8; 32];
                    b[..16].copy_from_slice(&f.src_ip);
                    b[16..].copy_from_slice(&f.dst_ip);
                    b
                };
                out.push(Spec::Ipv6 {
                    val: bytes(e.val),
                    mask: bytes(e.mask),
                });
            }
            IBV_FLOW_SPEC_TCP | IBV_FLOW_SPEC_UDP => {
                // SAFETY: a spec of these types is a `struct ibv_flow_spec_tcp_udp`.
                let e = unsafe { p.cast::<ibv_flow_spec_tcp_udp>().read_unaligned() };
                let bytes = |f: ibv_flow_tcp_udp_filter| {
                    let mut b = [0u8; 4];
                    b[..2].copy_from_slice(&f.dst_port.to_ne_bytes());
                    b[2..].copy_from_slice(&f.src_port.to_ne_bytes());
                    b
                };
                out.push(Spec::L4 {
                    proto: if ty == IBV_FLOW_SPEC_TCP { 6 } else { 17 },
                    val: bytes(e.val),
                    mask: bytes(e.mask),
                });
            }
            IBV_FLOW_SPEC_ACTION_DROP => drop = true,
            IBV_FLOW_SPEC_ACTION_TAG => {
                // Accepted; the device model writes no flow tag into CQEs (RULES.md).
            }
            _ => die(
                call,
                &format!("flow spec type {ty:#x} is not modelled by the fake (ETH, IPV4, IPV6, TCP, UDP, TAG, DROP are)"),
            ),
        }
        p = p.wrapping_add(usize::from(size));
    }
    Ok((out, drop))
}

/// `vctx->ibv_create_flow` = `mlx5_create_flow` (v44 verbs.c:4390–4455).
///
/// # Safety
/// `attr` is the caller's rule, with its specs after it.
pub unsafe extern "C" fn create_flow_slot(
    qp: *mut ibv_qp,
    attr: *mut ibv_flow_attr,
) -> *mut ibv_flow {
    const CALL: &str = "ibv_create_flow";
    call_ptr(CALL, json!({"qp": addr(qp)}), |st| {
        let q = obj(st, qp.cast::<Qp>(), &[Kind::Qp], CALL);
        // SAFETY: the caller passes its rule.
        let a = unsafe { &*non_null(attr, CALL, "flow_attr") };
        let (specs, drop) = specs(a, CALL)?;
        let ctx = ctx_of(st, q.qp.context, CALL);
        let nports = ctx.nports();
        st.kernel(q.qp.context, CALL)?;
        // ib_uverbs_ex_create_flow: CAP_NET_RAW (EPERM); flags ≥ RESERVED, DONT_TRAP on a
        // DEFAULT rule, more than 10 specs → EINVAL (the QP is raw-packet).
        if !has_cap_net_raw() {
            return Err(libc::EPERM);
        }
        if a.flags >= FLOW_ATTR_FLAGS_RESERVED {
            return Err(libc::EINVAL);
        }
        let default = a.type_ == IBV_FLOW_ATTR_ALL_DEFAULT || a.type_ == IBV_FLOW_ATTR_MC_DEFAULT;
        if a.flags & IBV_FLOW_ATTR_FLAGS_DONT_TRAP != 0 && default {
            return Err(libc::EINVAL);
        }
        if a.num_of_specs > caps::FLOW_MAX_SPECS {
            return Err(libc::EINVAL);
        }
        // mlx5_ib_create_flow: a priority above the last bypass priority → ENOMEM; a port
        // beyond the device's, or flags other than DONT_TRAP / EGRESS → EINVAL; EGRESS on a
        // DEFAULT rule → EINVAL.
        if a.priority > caps::FLOW_LAST_PRIO {
            return Err(libc::ENOMEM);
        }
        if a.port > nports
            || a.flags & !(IBV_FLOW_ATTR_FLAGS_DONT_TRAP | IBV_FLOW_ATTR_FLAGS_EGRESS) != 0
        {
            return Err(libc::EINVAL);
        }
        if a.flags & IBV_FLOW_ATTR_FLAGS_EGRESS != 0 {
            if default {
                return Err(libc::EINVAL);
            }
            die(CALL, "egress flow rules are not modelled by the fake");
        }
        if a.type_ == IBV_FLOW_ATTR_SNIFFER {
            die(CALL, "sniffer rules are not modelled by the fake");
        }
        if a.type_ > IBV_FLOW_ATTR_SNIFFER {
            return Err(libc::EINVAL);
        }
        // The rule's destination is the QP's TIR: an RSS QP's; a raw QP's own RQ TIR
        // (not served by the fake); a send-only QP has none, which the firmware refuses.
        if q.rss.is_none() {
            if q.tirn == 0 {
                return Err(libc::EINVAL);
            }
            die(
                CALL,
                "steering to a raw QP's own RQ is not modelled by the fake (use WQs and an RSS QP)",
            );
        }
        let mcast_only = specs.iter().any(|s| match s {
            Spec::Eth { val, mask } => mask[0] & 1 != 0 && val[0] & 1 != 0,
            _ => false,
        });
        let prio = match a.type_ {
            IBV_FLOW_ATTR_MC_DEFAULT => 17,
            IBV_FLOW_ATTR_ALL_DEFAULT => 18,
            _ if mcast_only && a.flags & IBV_FLOW_ATTR_FLAGS_DONT_TRAP == 0 => 16,
            _ => u32::from(a.priority),
        };
        let handle = st.next_id();
        let f = Box::into_raw(Box::new(Flow {
            f: ibv_flow {
                comp_mask: 0,
                context: q.qp.context,
                handle,
            },
            qp: q,
            rule: Matcher {
                rank: (prio, u64::from(handle)),
                kind: a.type_,
                specs,
                drop,
            },
        }));
        q.flows += 1;
        let dev = q.device;
        let context = q.qp.context;
        st.register(f as usize, Kind::Flow, context as usize);
        sync(st, dev);
        Ok(f.cast::<ibv_flow>())
    })
}

/// `vctx->ibv_destroy_flow` = `mlx5_destroy_flow` (v44 verbs.c:4457–4474).
///
/// # Safety
/// `flow` came from `create_flow_slot`.
pub unsafe extern "C" fn destroy_flow_slot(flow: *mut ibv_flow) -> c_int {
    const CALL: &str = "ibv_destroy_flow";
    call_int(CALL, json!({"flow": addr(flow)}), |st| {
        let f = obj(st, flow.cast::<Flow>(), &[Kind::Flow], CALL);
        let context = st.objects.get(&(flow as usize)).map_or(0, |e| e.ctx);
        // A disassociated context: the kernel destroyed the rule already (it stopped
        // steering then), and its QP may be gone; only the user-space part is left.
        if st.disassociated(context as *mut ibv_context) {
            st.unregister(flow as usize);
            // SAFETY: unregistered above; freed once.
            drop(unsafe { Box::from_raw(f as *mut Flow) });
            return Ok(0);
        }
        st.kernel(context as *mut ibv_context, CALL)?;
        // SAFETY: the QP cannot be destroyed while the rule uses it (EBUSY).
        let q = unsafe { &mut *f.qp };
        q.flows -= 1;
        let dev = q.device;
        st.unregister(flow as usize);
        // SAFETY: unregistered above; freed once.
        drop(unsafe { Box::from_raw(f as *mut Flow) });
        sync(st, dev);
        Ok(0)
    })
}

/// Recomputes device `dev`'s steering from its live rules and queues and hands it to the
/// device model: the rules in order, the TIR of each rule's hashing QP (its key, fields and
/// table: one per QP, as each RSS QP is a TIR of its own, kernel `create_rss_raw_qp_tir`),
/// and whether every RQ of every table is RDY.
pub fn sync(st: &mut State, dev: u32) {
    // Rules of a disassociated context were destroyed by the kernel: they steer no more
    // (and their QPs may be gone).
    let mut flows: Vec<&Flow> = st
        .objects
        .iter()
        .filter(|(_, e)| e.kind == Kind::Flow && !st.dead.contains(&e.ctx))
        // SAFETY: registered flows are live `Flow` boxes.
        .map(|(&a, _)| unsafe { &*(a as *const Flow) })
        // SAFETY: a flow's QP is live while the flow is.
        .filter(|f| unsafe { (*f.qp).device } == dev)
        .collect();
    flows.sort_by_key(|f| f.rule.rank);
    let mut qps: Vec<*mut Qp> = Vec::new();
    let mut tirs: Vec<Tir> = Vec::new();
    let mut of_rule = Vec::new();
    let mut ready = !flows.is_empty();
    for f in &flows {
        if let Some(i) = qps.iter().position(|&q| q == f.qp) {
            of_rule.push(i);
            continue;
        }
        // SAFETY: as above; a flow's QP is an RSS QP (create_flow_slot).
        let q = unsafe { &*f.qp };
        let r = q.rss.as_ref().expect("rules are on RSS QPs");
        // SAFETY: the table cannot be destroyed while the QP uses it.
        let t = unsafe { &*r.table };
        // SAFETY: the table's WQs cannot be destroyed while it exists.
        let wqs: Vec<&Wq> = t.wqs.iter().map(|&w| unsafe { &*w }).collect();
        ready &= wqs.iter().all(|w| w.served && w.wq.state == IBV_WQS_RDY);
        // The model hashes the four-tuple fields (IPSEC_SPI and INNER are not modelled).
        let fields = (r.fields & 0xff) as u32;
        of_rule.push(tirs.len());
        qps.push(f.qp);
        tirs.push((r.key, fields, wqs.iter().map(|w| w.wq.wq_num).collect()));
    }
    let steering = Steering {
        rules: flows.iter().map(|f| f.rule.clone()).collect(),
        tirs: of_rule,
        ready,
    };
    st.mlx5_nics
        .set_steering(dev, steering, if ready { tirs } else { Vec::new() });
}
