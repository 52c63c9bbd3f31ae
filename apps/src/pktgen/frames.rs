//! Address and port ranges, the flows they make, and the frame generator: UDP/IPv4 frame
//! templates stamped with a sequence number and a TX timestamp.
#![deny(unsafe_code)]

use super::{cycle_index, HEADERS, MIN_SIZE, STAMP_BYTES};
use pmd::net::csum;
use std::fmt;
use std::net::Ipv4Addr;
use std::str::FromStr;

/// An inclusive range `A[-B]` of IPv4 addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpRange {
    /// First address.
    pub start: u32,
    /// Number of addresses.
    pub len: u32,
}

impl FromStr for IpRange {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("'{s}' is not an IPv4 address or range (A.B.C.D or A.B.C.D-E.F.G.H)");
        let (a, b) = s.split_once('-').unwrap_or((s, s));
        let a: Ipv4Addr = a.trim().parse().map_err(|_| bad())?;
        let b: Ipv4Addr = b.trim().parse().map_err(|_| bad())?;
        let (a, b) = (u32::from(a), u32::from(b));
        if b < a {
            return Err(format!("'{s}': the range ends before it starts"));
        }
        if a == 0 && b == u32::MAX {
            return Err(format!(
                "'{s}': at most 4294967295 addresses (the whole IPv4 space is one too many)"
            ));
        }
        Ok(Self {
            start: a,
            len: b - a + 1,
        })
    }
}

impl fmt::Display for IpRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let a = Ipv4Addr::from(self.start);
        if self.len == 1 {
            write!(f, "{a}")
        } else {
            write!(f, "{a}-{}", Ipv4Addr::from(self.start + self.len - 1))
        }
    }
}

/// An inclusive range `P[-Q]` of UDP ports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortRange {
    /// First port.
    pub start: u16,
    /// Number of ports.
    pub len: u32,
}

impl FromStr for PortRange {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("'{s}' is not a UDP port or range (P or P-Q, 0..65535)");
        let (a, b) = s.split_once('-').unwrap_or((s, s));
        let a: u16 = a.trim().parse().map_err(|_| bad())?;
        let b: u16 = b.trim().parse().map_err(|_| bad())?;
        if b < a {
            return Err(format!("'{s}': the range ends before it starts"));
        }
        Ok(Self {
            start: a,
            len: u32::from(b - a) + 1,
        })
    }
}

/// What frames to build.
#[derive(Debug, Clone)]
pub struct FrameSpec {
    /// Frame lengths in bytes (without FCS), one cycle: frame `seq` has length
    /// `sizes[seq % sizes.len()]` (see [`super::size_cycle`]). Not empty.
    pub sizes: Vec<u16>,
    /// Number of flows (distinct 5-tuples, cycled).
    pub flows: u32,
    /// Source addresses.
    pub src_ip: IpRange,
    /// Destination addresses.
    pub dst_ip: IpRange,
    /// Source ports.
    pub src_port: PortRange,
    /// Destination ports.
    pub dst_port: PortRange,
    /// 802.1Q VLAN id to tag frames with.
    pub vlan: Option<u16>,
    /// Source MAC.
    pub src_mac: [u8; 6],
    /// Destination MAC.
    pub dst_mac: [u8; 6],
}

/// Distinct 5-tuples the ranges give: every combination of the four ranges (their product,
/// saturating), which the flows walk through like the digits of a number.
fn distinct_tuples(spec: &FrameSpec) -> u64 {
    [
        u64::from(spec.src_ip.len),
        u64::from(spec.dst_ip.len),
        u64::from(spec.src_port.len),
        u64::from(spec.dst_port.len),
    ]
    .into_iter()
    .fold(1u64, u64::saturating_mul)
}

/// Makes `spec.flows` distinct 5-tuples: with every range a single value (the defaults),
/// the source UDP port varies over `flows` ports from its start (as pktgen-dpdk's range mode
/// does); ranges that give fewer distinct tuples than flows are an error.
fn flows_vary(spec: &FrameSpec) -> Result<FrameSpec, String> {
    let mut s = spec.clone();
    if u64::from(s.flows) <= distinct_tuples(&s) {
        return Ok(s);
    }
    let single = [s.src_ip.len, s.dst_ip.len, s.src_port.len, s.dst_port.len]
        .iter()
        .all(|&n| n == 1);
    if single {
        let last = u32::from(s.src_port.start) + s.flows - 1;
        if last > u32::from(u16::MAX) {
            return Err(format!(
                "--flows {}: the source port would run from {} past 65535; give --src-port a lower start or a range",
                s.flows, s.src_port.start
            ));
        }
        s.src_port.len = s.flows;
        return Ok(s);
    }
    Err(format!(
        "--flows {}: the address and port ranges give only {} distinct 5-tuples; widen a range or lower --flows",
        s.flows,
        distinct_tuples(&s)
    ))
}

/// What varies between the flows [`FrameGen::new`] builds for `spec`, e.g. `source UDP port
/// 1024-1087`, or `one 5-tuple`.
///
/// # Errors
/// As [`FrameGen::new`] for the flows.
pub fn flows_varying(spec: &FrameSpec) -> Result<String, String> {
    flows_vary(spec).map(|s| describe_flows(&s))
}

fn describe_flows(spec: &FrameSpec) -> String {
    if spec.flows == 1 {
        return "one 5-tuple".into();
    }
    let mut v = Vec::new();
    if spec.src_ip.len > 1 {
        v.push(format!("source IP {}", spec.src_ip));
    }
    if spec.dst_ip.len > 1 {
        v.push(format!("destination IP {}", spec.dst_ip));
    }
    let port = |r: &PortRange| {
        let last = u32::from(r.start) + r.len - 1;
        format!("{}-{last}", r.start)
    };
    if spec.src_port.len > 1 {
        v.push(format!("source UDP port {}", port(&spec.src_port)));
    }
    if spec.dst_port.len > 1 {
        v.push(format!("destination UDP port {}", port(&spec.dst_port)));
    }
    v.join(", ")
}

/// Prebuilt frames, one per flow at the largest size, with valid IPv4 and UDP checksums for
/// an all-zero stamp; smaller frames are cut from them with their lengths and checksums
/// updated (RFC 1624).
#[derive(Debug, Clone)]
pub struct FrameGen {
    templates: Vec<Vec<u8>>,
    /// The sizes, one cycle.
    sizes: Vec<u16>,
    /// Offset of the stamp in each frame.
    stamp_at: usize,
    /// Offset of the IPv4 header.
    l3_at: usize,
}

/// RFC 1624 eqn. 3: the one's complement sum `sum` (not complemented) with a 16-bit word
/// changed from `old` to `new`.
#[inline]
fn sum_replace(sum: u32, old: u16, new: u16) -> u32 {
    sum + u32::from(!old) + u32::from(new)
}

impl FrameGen {
    /// Builds the templates.
    ///
    /// # Errors
    /// A size too small for the headers and stamp.
    pub fn new(spec: &FrameSpec) -> Result<Self, String> {
        let vlan_bytes = if spec.vlan.is_some() { 4 } else { 0 };
        let min = (HEADERS + vlan_bytes + STAMP_BYTES).max(usize::from(MIN_SIZE));
        let Some(&max) = spec.sizes.iter().max() else {
            return Err("no frame size given".into());
        };
        if let Some(small) = spec.sizes.iter().find(|&&s| usize::from(s) < min) {
            return Err(format!(
                "--size {small}: frames need at least {min} bytes (headers and the sequence/time stamp)",
            ));
        }
        let payload = usize::from(max) - HEADERS - vlan_bytes;
        let spec = &flows_vary(spec)?;
        let mut templates = Vec::with_capacity(spec.flows as usize);
        for f in 0..spec.flows {
            // Flow f is a mixed-radix number over the ranges: source port fastest, then
            // destination port, source IP, destination IP.
            let mut d = f;
            let mut digit = |len: u32| {
                let v = d % len;
                d /= len;
                v
            };
            let sport = spec.src_port.start + digit(spec.src_port.len) as u16;
            let dport = spec.dst_port.start + digit(spec.dst_port.len) as u16;
            let src = Ipv4Addr::from(spec.src_ip.start + digit(spec.src_ip.len)).octets();
            let dst = Ipv4Addr::from(spec.dst_ip.start + digit(spec.dst_ip.len)).octets();
            let eth = etherparse::PacketBuilder::ethernet2(spec.src_mac, spec.dst_mac);
            let mut out = Vec::with_capacity(usize::from(max));
            let zeros = vec![0u8; payload];
            let r = match spec.vlan {
                Some(vid) => eth
                    .single_vlan(
                        etherparse::VlanId::try_new(vid)
                            .map_err(|e| format!("--vlan {vid}: {e}"))?,
                    )
                    .ipv4(src, dst, 64)
                    .udp(sport, dport)
                    .write(&mut out, &zeros),
                None => eth
                    .ipv4(src, dst, 64)
                    .udp(sport, dport)
                    .write(&mut out, &zeros),
            };
            r.map_err(|e| format!("building frame: {e}"))?;
            templates.push(out);
        }
        Ok(Self {
            templates,
            sizes: spec.sizes.clone(),
            stamp_at: HEADERS + vlan_bytes,
            l3_at: 14 + vlan_bytes,
        })
    }

    /// The length of frame `seq`.
    #[inline]
    pub fn len_of(&self, seq: u64) -> usize {
        usize::from(self.sizes[cycle_index(seq, self.sizes.len())])
    }

    /// The frame of flow `seq % flows`, of length [`len_of`](Self::len_of)`(seq)`, stamped
    /// with `seq` and `ts_ns`, into `out` (at least that long); its length. The lengths and
    /// checksums are updated incrementally (RFC 1624) for the size and the stamp: the
    /// template's payload is zeros, which add nothing to the UDP checksum.
    #[inline]
    pub fn write(&self, seq: u64, ts_ns: u64, out: &mut [u8]) -> usize {
        let t = &self.templates[cycle_index(seq, self.templates.len())];
        let n = self.len_of(seq).min(t.len()).min(out.len());
        out[..n].copy_from_slice(&t[..n]);
        let mut stamp = [0u8; STAMP_BYTES];
        stamp[..8].copy_from_slice(&seq.to_be_bytes());
        stamp[8..].copy_from_slice(&ts_ns.to_be_bytes());
        out[self.stamp_at..self.stamp_at + STAMP_BYTES].copy_from_slice(&stamp);
        let word = |b: &[u8], at: usize| u16::from_be_bytes([b[at], b[at + 1]]);
        let l3 = self.l3_at;
        let l4 = l3 + 20;
        let (ip_len_max, ip_len) = (word(t, l3 + 2), (n - l3) as u16);
        let (udp_len_max, udp_len) = (word(t, l4 + 4), (n - l4) as u16);
        if ip_len != ip_len_max {
            out[l3 + 2..l3 + 4].copy_from_slice(&ip_len.to_be_bytes());
            let c = !csum::fold(sum_replace(
                u32::from(!word(t, l3 + 10)),
                ip_len_max,
                ip_len,
            ));
            out[l3 + 10..l3 + 12].copy_from_slice(&c.to_be_bytes());
            out[l4 + 4..l4 + 6].copy_from_slice(&udp_len.to_be_bytes());
        }
        let old = word(t, l4 + 6);
        if old != 0 {
            // The UDP length is summed twice (pseudo-header and header); the template
            // summed zeros where the stamp now is: add the stamp's words.
            let mut sum = u32::from(!old);
            if udp_len != udp_len_max {
                sum = sum_replace(sum_replace(sum, udp_len_max, udp_len), udp_len_max, udp_len);
            }
            let mut c = !csum::fold(csum::add(sum, &stamp));
            if c == 0 {
                c = 0xffff;
            }
            out[l4 + 6..l4 + 8].copy_from_slice(&c.to_be_bytes());
        }
        n
    }

    /// Sets the source MAC of every frame.
    pub fn set_src_mac(&mut self, mac: [u8; 6]) {
        for t in &mut self.templates {
            t[6..12].copy_from_slice(&mac);
        }
    }

    /// Largest frame length.
    pub fn len(&self) -> usize {
        self.templates[0].len()
    }

    /// Mean frame length over a cycle of sizes.
    pub fn mean_len(&self) -> f64 {
        self.sizes.iter().map(|&s| f64::from(s)).sum::<f64>() / self.sizes.len() as f64
    }

    /// Whether there are no templates (never: at least one flow).
    pub fn is_empty(&self) -> bool {
        self.templates.is_empty()
    }
}

/// Reads the stamp of one of our frames: `(seq, ts_ns)`, or `None` for any other frame.
#[inline]
pub fn read_stamp(frame: &[u8]) -> Option<(u64, u64)> {
    if frame.len() < 14 {
        return None;
    }
    let mut l3 = 14;
    let mut et = u16::from_be_bytes([frame[12], frame[13]]);
    if et == 0x8100 && frame.len() >= 18 {
        l3 = 18;
        et = u16::from_be_bytes([frame[16], frame[17]]);
    }
    if et != 0x0800 || frame.len() < l3 + 20 || frame[l3] != 0x45 || frame[l3 + 9] != 17 {
        return None;
    }
    let at = l3 + 20 + 8;
    if frame.len() < at + STAMP_BYTES {
        return None;
    }
    let seq = u64::from_be_bytes(frame[at..at + 8].try_into().ok()?);
    let ts = u64::from_be_bytes(frame[at + 8..at + 16].try_into().ok()?);
    Some((seq, ts))
}
