//! pktgen's building blocks: address ranges, frame templates with sequence/timestamp stamps,
//! pcap loading, and the receive-side sequence tracker.
#![deny(unsafe_code)]

use pmd::net::csum;
use std::fmt;
use std::net::Ipv4Addr;
use std::path::Path;
use std::str::FromStr;

/// Bytes of the stamp at the start of the UDP payload: sequence number (u64, big-endian) and
/// TX timestamp in ns on the sender's monotonic clock (u64, big-endian).
pub const STAMP_BYTES: usize = 16;
/// Ethernet + IPv4 + UDP headers.
pub const HEADERS: usize = 14 + 20 + 8;
/// Smallest frame: headers and stamp, padded to Ethernet's 60-byte minimum (without FCS).
pub const MIN_SIZE: u16 = 60;
/// Bytes of the Ethernet frame check sequence, which the NIC appends: not in `--size`.
pub const FCS_BYTES: u64 = 4;
/// Bytes each frame takes on the wire besides itself and its FCS: preamble (7), start of
/// frame delimiter (1) and the minimum inter-frame gap (12).
pub const L1_OVERHEAD_BYTES: u64 = 20;

/// The frame sizes of `--imix`, without FCS, and how many of each in a cycle of 12: the
/// classic "simple IMIX" 7:4:1 of 64, 594 and 1518-byte frames counted with their FCS (IP
/// packets of 40 (padded to 46), 576 and 1500 bytes).
pub const IMIX: [(u16, u32); 3] = [(60, 7), (590, 4), (1514, 1)];

/// The order in which frames of the given sizes and weights are sent, one cycle: a smooth
/// weighted round robin (nginx's), so that `--imix` interleaves its sizes instead of
/// sending seven small frames in a row; equal weights keep the order given.
pub fn size_cycle(sizes: &[(u16, u32)]) -> Vec<u16> {
    let total: i64 = sizes.iter().map(|&(_, w)| i64::from(w)).sum();
    let mut current = vec![0i64; sizes.len()];
    let mut out = Vec::with_capacity(total as usize);
    for _ in 0..total {
        let mut best = 0;
        for (i, &(_, w)) in sizes.iter().enumerate() {
            current[i] += i64::from(w);
            if current[i] > current[best] {
                best = i;
            }
        }
        current[best] -= total;
        out.push(sizes[best].0);
    }
    out
}

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
    /// `sizes[seq % sizes.len()]` (see [`size_cycle`]). Not empty.
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

/// The frames of a capture, ready to replay.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Capture {
    /// Every frame, in capture order.
    pub frames: Vec<Vec<u8>>,
    /// When each frame was captured, in ns after the first (never decreasing: a timestamp
    /// earlier than the one before counts as the one before, and so does a pcapng simple
    /// packet block, which has none).
    pub times_ns: Vec<u64>,
    /// Records shorter than an Ethernet header (14 bytes): not frames, skipped.
    pub skipped_short: u64,
}

/// Bytes of an Ethernet header: a shorter record is not a frame.
const ETH_HEADER: usize = 14;
/// The first four bytes of a pcapng file (a Section Header Block).
const PCAPNG_MAGIC: [u8; 4] = [0x0a, 0x0d, 0x0d, 0x0a];

/// `seq mod n`: which of `n` things (sizes, flows) frame `seq` takes in turn. One of them
/// (the common case) costs no division, which is asked several times per frame.
#[inline]
fn cycle_index(seq: u64, n: usize) -> usize {
    match n {
        1 => 0,
        n => (seq % n as u64) as usize,
    }
}

/// One record of a capture.
struct Record<'a> {
    /// Its bytes.
    bytes: &'a [u8],
    /// The frame's original length.
    orig_len: u32,
    /// Its link type.
    link: pcap_file::DataLink,
    /// When it was captured (`None`: the record has no timestamp).
    ts: Option<std::time::Duration>,
}

/// Checks record `n + 1` of capture `name` and keeps it in `cap`, or skips and counts it
/// when it is shorter than an Ethernet header.
fn take(
    cap: &mut Capture,
    n: &mut usize,
    name: &str,
    max_len: usize,
    rec: Record<'_>,
) -> Result<(), String> {
    let Record {
        bytes,
        orig_len,
        link,
        ts,
    } = rec;
    *n += 1;
    let n = *n;
    if link != pcap_file::DataLink::ETHERNET {
        return Err(format!(
            "{name}: packet {n}: link type {link:?}, only Ethernet captures can be replayed"
        ));
    }
    if bytes.len() < orig_len as usize {
        return Err(format!(
            "{name}: packet {n} was captured cut to {} of {orig_len} bytes; it cannot be replayed as it was",
            bytes.len()
        ));
    }
    if bytes.len() > max_len {
        return Err(format!(
            "{name}: packet {n} has {} bytes, more than the {max_len} a frame may have at \
             this MTU (--mtu, up to 9000: frames of up to MTU + 18 bytes)",
            bytes.len()
        ));
    }
    if bytes.len() < ETH_HEADER {
        cap.skipped_short += 1;
    } else {
        let prev = cap.times_ns.last().copied().unwrap_or(0);
        let t = ts.map_or(prev, |t| {
            u64::try_from(t.as_nanos()).unwrap_or(u64::MAX).max(prev)
        });
        cap.frames.push(bytes.to_vec());
        cap.times_ns.push(t);
    }
    Ok(())
}

/// Loads every packet of a capture, classic pcap or pcapng (Wireshark's default), of
/// Ethernet link type. Records shorter than an Ethernet header are skipped and counted.
///
/// # Errors
/// A message naming the file and the problem: unreadable, not a capture, truncated, a link
/// type other than Ethernet, a packet captured cut short, a frame larger than `max_len`, or
/// no frame at all.
pub fn load_pcap(path: &Path, max_len: usize) -> Result<Capture, String> {
    let data = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    parse_pcap(&path.display().to_string(), &data, max_len)
}

/// [`load_pcap`] on the file's bytes, `name` naming it in messages.
///
/// # Errors
/// As [`load_pcap`], but for the file's reading.
pub fn parse_pcap(name: &str, data: &[u8], max_len: usize) -> Result<Capture, String> {
    let mut cap = Capture::default();
    let mut n = 0usize;
    if data.starts_with(&PCAPNG_MAGIC) {
        use pcap_file::pcapng::{Block, PcapNgReader};
        let mut r =
            PcapNgReader::new(data).map_err(|e| format!("{name}: not a pcapng file ({e})"))?;
        // Link types of the section's interfaces, by interface id.
        let mut links: Vec<pcap_file::DataLink> = Vec::new();
        while let Some(b) = r.next_block() {
            let b = b.map_err(|e| {
                format!("{name}: block after packet {n} is malformed or truncated ({e})")
            })?;
            // A packet block: the interface it names (a simple packet block names none: the
            // first), its bytes, original length and time.
            let (iface, bytes, orig_len, ts) = match &b {
                Block::SectionHeader(_) => {
                    links.clear();
                    continue;
                }
                Block::InterfaceDescription(i) => {
                    links.push(i.linktype);
                    continue;
                }
                Block::EnhancedPacket(p) => (
                    Some(p.interface_id as usize),
                    &p.data,
                    p.original_len,
                    Some(p.timestamp),
                ),
                Block::SimplePacket(p) => (None, &p.data, p.original_len, None),
                Block::Packet(p) => (
                    Some(usize::from(p.interface_id)),
                    &p.data,
                    p.original_len,
                    Some(std::time::Duration::from_micros(p.timestamp)),
                ),
                _ => continue,
            };
            let link = *links.get(iface.unwrap_or(0)).ok_or_else(|| match iface {
                Some(id) => format!(
                    "{name}: packet {} names interface {id} that the file does not describe",
                    n + 1
                ),
                None => format!(
                    "{name}: packet {} comes before any interface description",
                    n + 1
                ),
            })?;
            take(
                &mut cap,
                &mut n,
                name,
                max_len,
                Record {
                    bytes,
                    orig_len,
                    link,
                    ts,
                },
            )?;
        }
    } else {
        let mut r = pcap_file::pcap::PcapReader::new(data)
            .map_err(|e| format!("{name}: not a pcap or pcapng file ({e})"))?;
        let link = r.header().datalink;
        while let Some(p) = r.next_packet() {
            let p =
                p.map_err(|e| format!("{name}: packet {} is malformed or truncated ({e})", n + 1))?;
            take(
                &mut cap,
                &mut n,
                name,
                max_len,
                Record {
                    bytes: &p.data,
                    orig_len: p.orig_len,
                    link,
                    ts: Some(p.timestamp),
                },
            )?;
        }
    }
    if cap.frames.is_empty() {
        return Err(format!(
            "{name}: the capture holds no frames to replay ({} records shorter than an Ethernet header skipped)",
            cap.skipped_short
        ));
    }
    // Times after the first frame.
    let first = cap.times_ns[0];
    for t in &mut cap.times_ns {
        *t -= first;
    }
    Ok(cap)
}

/// When each frame is due, counted from the start of sending.
#[derive(Debug, Clone, PartialEq)]
pub enum Pacing {
    /// A fixed rate, packets per second: frame `k` at `k / rate` s.
    Rate(f64),
    /// A capture's own timing, looping, `speed` times as fast: frame `k` of a capture of `n`
    /// frames at `((k / n) * period + times[k % n]) / speed`; a loop lasts the capture's span
    /// plus its mean gap between frames.
    Capture {
        /// Each frame's time after the first, ns (never decreasing).
        times_ns: Vec<u64>,
        /// One loop, ns.
        period_ns: u64,
        /// The speed multiplier (more than 0).
        speed: f64,
    },
}

impl Pacing {
    /// The timing of a capture's frames ([`Capture::times_ns`]), replayed `speed` times as
    /// fast.
    ///
    /// # Errors
    /// A capture that spans no time (one frame, or every frame at one timestamp): it has no
    /// timing to replay.
    pub fn capture(times_ns: &[u64], speed: f64) -> Result<Self, String> {
        let n = times_ns.len() as u64;
        let span = times_ns.last().copied().unwrap_or(0);
        if n < 2 || span == 0 {
            return Err(format!(
                "the capture spans no time ({n} frames, all at one timestamp): it has no timing to replay; give a rate instead"
            ));
        }
        Ok(Self::Capture {
            times_ns: times_ns.to_vec(),
            period_ns: span + span / (n - 1),
            speed,
        })
    }

    /// How many frames are due `elapsed` after the start (the first is due at once).
    #[inline]
    pub fn due(&self, elapsed: std::time::Duration) -> u64 {
        match self {
            Self::Rate(r) => (elapsed.as_secs_f64() * r) as u64 + 1,
            Self::Capture {
                times_ns,
                period_ns,
                speed,
            } => {
                let t = (elapsed.as_nanos() as f64 * speed).min(u64::MAX as f64 / 2.0) as u64;
                let loops = t / period_ns;
                let within = t % period_ns;
                let idx = times_ns.partition_point(|&x| x <= within) as u64;
                loops
                    .saturating_mul(times_ns.len() as u64)
                    .saturating_add(idx)
            }
        }
    }

    /// When frame `k` (from 0) is due, after the start.
    #[inline]
    pub fn due_at(&self, k: u64) -> std::time::Duration {
        match self {
            Self::Rate(r) => std::time::Duration::from_secs_f64(k as f64 / r),
            Self::Capture {
                times_ns,
                period_ns,
                speed,
            } => {
                let n = times_ns.len() as u64;
                let ns = (k / n) as f64 * *period_ns as f64 + times_ns[(k % n) as usize] as f64;
                std::time::Duration::from_secs_f64((ns / speed / 1e9).min(crate::cli::MAX_SECONDS))
            }
        }
    }
}

/// Sequence numbers seen on the receive side: received, duplicates, reordering and gaps,
/// over a sliding window of the last [`SeqTracker::WINDOW`] numbers.
#[derive(Debug, Clone)]
pub struct SeqTracker {
    next: u64,
    bits: Vec<u64>,
    /// Distinct frames received.
    pub unique: u64,
    /// Frames received again.
    pub duplicates: u64,
    /// Frames that arrived after a later frame of the same flow (flow = sequence number
    /// modulo the flow count, as the generator assigns them). Frames of different flows may
    /// pass each other (RSS puts them on different queues) without counting.
    pub reordered: u64,
    /// Sequence numbers skipped so far (lost unless they turn up late).
    pub gaps: u64,
    /// The longest run of sequence numbers skipped at once (an outage: a link down, a port
    /// recovering from a device reset), and its first number.
    pub longest_gap: u64,
    /// First sequence number of [`SeqTracker::longest_gap`].
    pub longest_gap_first: u64,
    /// Per flow, one past the highest sequence number seen (0: none yet).
    last: Vec<u64>,
}

impl Default for SeqTracker {
    fn default() -> Self {
        Self::with_flows(1)
    }
}

impl SeqTracker {
    /// How far back a late frame is still told apart from a duplicate.
    pub const WINDOW: u64 = 1 << 20;

    /// A tracker for frames of `flows` flows (at least 1).
    pub fn with_flows(flows: u32) -> Self {
        Self {
            next: 0,
            bits: vec![0; (Self::WINDOW / 64) as usize],
            unique: 0,
            duplicates: 0,
            reordered: 0,
            gaps: 0,
            longest_gap: 0,
            longest_gap_first: 0,
            last: vec![0; flows.max(1) as usize],
        }
    }

    /// Counts `s` as reordered if a later frame of its flow came first.
    #[inline]
    fn order(&mut self, s: u64) {
        let f = cycle_index(s, self.last.len());
        if s < self.last[f] {
            self.reordered += 1;
        } else {
            self.last[f] = s + 1;
        }
    }

    #[inline]
    fn bit(&mut self, s: u64) -> (&mut u64, u64) {
        let i = (s % Self::WINDOW) as usize;
        (&mut self.bits[i / 64], 1u64 << (i % 64))
    }

    /// Records sequence number `s`.
    #[inline]
    pub fn record(&mut self, s: u64) {
        if s >= self.next {
            let gap = s - self.next;
            if gap >= Self::WINDOW {
                self.bits.iter_mut().for_each(|w| *w = 0);
            } else {
                for missing in self.next..s {
                    let (w, m) = self.bit(missing);
                    *w &= !m;
                }
            }
            self.gaps += gap;
            if gap > self.longest_gap {
                self.longest_gap = gap;
                self.longest_gap_first = self.next;
            }
            let (w, m) = self.bit(s);
            *w |= m;
            self.next = s + 1;
            self.unique += 1;
            self.order(s);
        } else if self.next - s >= Self::WINDOW {
            self.gaps = self.gaps.saturating_sub(1);
            self.unique += 1;
            self.order(s);
        } else {
            let (w, m) = self.bit(s);
            if *w & m != 0 {
                self.duplicates += 1;
            } else {
                *w |= m;
                self.gaps = self.gaps.saturating_sub(1);
                self.unique += 1;
                self.order(s);
            }
        }
    }
}

impl SeqTracker {
    /// How many numbers of the longest gap never arrived (some may have turned up late).
    /// Exact while the gap is within the last [`SeqTracker::WINDOW`] numbers; older gaps
    /// are counted whole.
    pub fn longest_gap_missing(&self) -> u64 {
        let (first, len) = (self.longest_gap_first, self.longest_gap);
        if len == 0 || self.next - first > Self::WINDOW {
            return len;
        }
        (first..first + len)
            .filter(|&q| {
                let i = (q % Self::WINDOW) as usize;
                self.bits[i / 64] & (1u64 << (i % 64)) == 0
            })
            .count() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_gap_is_found_and_late_frames_leave_it() {
        let mut t = SeqTracker::default();
        for s in (0..10).chain(12..20).chain(120..130) {
            t.record(s);
        }
        assert_eq!((t.longest_gap, t.longest_gap_first), (100, 20));
        assert_eq!(t.longest_gap_missing(), 100);
        t.record(50);
        t.record(51);
        assert_eq!((t.longest_gap, t.longest_gap_missing()), (100, 98));
        assert_eq!(t.gaps, 2 + 98);
    }

    fn spec(size: u16, flows: u32, vlan: Option<u16>) -> FrameSpec {
        FrameSpec {
            sizes: vec![size],
            flows,
            src_ip: "169.254.1.1-169.254.1.4".parse().unwrap(),
            dst_ip: "169.254.2.1".parse().unwrap(),
            src_port: "1000-1001".parse().unwrap(),
            dst_port: "9000".parse().unwrap(),
            vlan,
            src_mac: [2, 0, 0, 0, 0, 1],
            dst_mac: [2, 0, 0, 0, 0, 2],
        }
    }

    /// `--flows N` gives N distinct 5-tuples: with the default single values the source port
    /// varies (and the banner says so); ranges that cannot give N tuples are refused.
    #[test]
    fn flows_are_distinct_five_tuples() {
        let mut sp = spec(128, 64, None);
        sp.src_ip = "169.254.1.1".parse().unwrap();
        sp.src_port = "1024".parse().unwrap();
        // The distinct (IPv4 addresses, UDP ports) of the first `n` frames.
        let tuples = |g: &FrameGen, n: u64| -> std::collections::BTreeSet<Vec<u8>> {
            (0..n)
                .map(|i| {
                    let mut out = vec![0u8; 128];
                    g.write(i, 0, &mut out);
                    out[26..38].to_vec()
                })
                .collect()
        };
        let g = FrameGen::new(&sp).unwrap();
        assert_eq!(flows_varying(&sp).unwrap(), "source UDP port 1024-1087");
        assert_eq!(tuples(&g, 64).len(), 64);
        // 4 source IPs x 2 source ports: 8 combinations, not 64.
        let e = FrameGen::new(&spec(128, 64, None)).unwrap_err();
        assert!(e.contains("only 8 distinct 5-tuples"), "{e}");
        let g = FrameGen::new(&spec(128, 8, None)).unwrap();
        assert_eq!(tuples(&g, 8).len(), 8, "every combination once");
        assert_eq!(
            flows_varying(&spec(128, 8, None)).unwrap(),
            "source IP 169.254.1.1-169.254.1.4, source UDP port 1000-1001"
        );
        let mut sp = spec(128, 100, None);
        sp.src_ip = "169.254.1.1".parse().unwrap();
        sp.src_port = "65500".parse().unwrap();
        assert!(FrameGen::new(&sp).unwrap_err().contains("past 65535"));
    }

    #[test]
    fn frames_carry_stamps_with_valid_checksums() {
        for vlan in [None, Some(100)] {
            let g = FrameGen::new(&spec(128, 8, vlan)).unwrap();
            let mut buf = [0u8; 2048];
            for seq in [0u64, 1, 7, 0xdead_beef_1234, u64::MAX] {
                let n = g.write(seq, seq ^ 0x5555, &mut buf);
                assert_eq!(n, 128);
                assert_eq!(read_stamp(&buf[..n]), Some((seq, seq ^ 0x5555)));
                let p = etherparse::SlicedPacket::from_ethernet(&buf[..n]).unwrap();
                let Some(etherparse::NetSlice::Ipv4(ip)) = p.net else {
                    panic!()
                };
                let h = ip.header().to_header();
                assert_eq!(h.header_checksum, h.calc_header_checksum());
                let Some(etherparse::TransportSlice::Udp(u)) = p.transport else {
                    panic!()
                };
                assert_eq!(
                    u.checksum(),
                    u.to_header().calc_checksum_ipv4(&h, u.payload()).unwrap(),
                    "seq {seq}"
                );
                // Flow fields walk the combinations: source port fastest, then source IP.
                let f = (seq % 8) as u32;
                assert_eq!(
                    u32::from(Ipv4Addr::from(h.source)),
                    u32::from(Ipv4Addr::new(169, 254, 1, 1)) + f / 2
                );
                assert_eq!(u.source_port(), 1000 + (f % 2) as u16);
            }
        }
    }

    /// Frames of a size list are cut from the largest template with their IP and UDP
    /// lengths and checksums right, in the cycle's order; `--imix` interleaves 7:4:1.
    #[test]
    fn size_lists_give_valid_frames_of_each_size() {
        for vlan in [None, Some(7)] {
            let mut sp = spec(128, 8, vlan);
            sp.sizes = vec![64, 1518, 128, 62];
            let g = FrameGen::new(&sp).unwrap();
            let mut buf = [0u8; 2048];
            for seq in 0..16u64 {
                let n = g.write(seq, 42, &mut buf);
                assert_eq!(n, usize::from(sp.sizes[(seq % 4) as usize]));
                assert_eq!(n, g.len_of(seq));
                let p = etherparse::SlicedPacket::from_ethernet(&buf[..n]).unwrap();
                let Some(etherparse::NetSlice::Ipv4(ip)) = p.net else {
                    panic!()
                };
                let h = ip.header().to_header();
                assert_eq!(usize::from(h.total_len), n - 14 - vlan.map_or(0, |_| 4));
                assert_eq!(h.header_checksum, h.calc_header_checksum(), "seq {seq}");
                let Some(etherparse::TransportSlice::Udp(u)) = p.transport else {
                    panic!()
                };
                assert_eq!(
                    u.checksum(),
                    u.to_header().calc_checksum_ipv4(&h, u.payload()).unwrap(),
                    "seq {seq} size {n}"
                );
                assert_eq!(read_stamp(&buf[..n]), Some((seq, 42)));
            }
            assert!((g.mean_len() - 443.0).abs() < 1e-9);
        }
        let cycle = size_cycle(&IMIX);
        assert_eq!(cycle.len(), 12);
        assert_eq!(cycle.iter().filter(|&&s| s == 60).count(), 7);
        assert_eq!(cycle.iter().filter(|&&s| s == 590).count(), 4);
        assert_eq!(cycle.iter().filter(|&&s| s == 1514).count(), 1);
        assert!(
            cycle.windows(3).all(|w| w.iter().any(|&s| s != 60)),
            "small frames interleaved: {cycle:?}"
        );
        assert_eq!(size_cycle(&[(64, 1), (128, 1), (1518, 1)]), [64, 128, 1518]);
        let mut sp = spec(128, 1, None);
        sp.sizes = vec![128, 40];
        assert!(FrameGen::new(&sp).unwrap_err().contains("--size 40"));
    }

    /// A capture's timing: frames are due at their capture times over the speed, looping
    /// with a period of the span plus the mean gap; a capture without a span is refused.
    #[test]
    fn capture_pacing_follows_the_timestamps() {
        use std::time::Duration;
        let p = Pacing::capture(&[0, 1_000_000, 3_000_000], 1.0).unwrap();
        // Span 3 ms, mean gap 1.5 ms: a loop is 4.5 ms.
        let ms = |m: f64| Duration::from_secs_f64(m / 1e3);
        assert_eq!(p.due(ms(0.0)), 1);
        assert_eq!(p.due(ms(0.999)), 1);
        assert_eq!(p.due(ms(1.0)), 2);
        assert_eq!(p.due(ms(3.0)), 3);
        assert_eq!(p.due(ms(4.4)), 3);
        assert_eq!(p.due(ms(4.5)), 4);
        assert_eq!(p.due(ms(45.0)), 31);
        for k in 0..20 {
            let at = p.due_at(k);
            assert_eq!(
                p.due(at + Duration::from_nanos(10)),
                k + 1,
                "frame {k} at {at:?}"
            );
        }
        let fast = Pacing::capture(&[0, 1_000_000, 3_000_000], 10.0).unwrap();
        assert_eq!(fast.due(ms(0.45)), 4);
        assert!(fast.due_at(3).abs_diff(ms(0.45)) < Duration::from_nanos(2));
        assert!(Pacing::capture(&[0], 1.0)
            .unwrap_err()
            .contains("spans no time"));
        assert!(Pacing::capture(&[0, 0, 0], 1.0).is_err());
        assert_eq!(Pacing::Rate(1000.0).due(ms(10.0)), 11);
    }

    #[test]
    fn sizes_and_ranges_are_checked() {
        assert!(FrameGen::new(&spec(50, 1, None))
            .unwrap_err()
            .contains("at least 60 bytes"));
        assert!(FrameGen::new(&spec(60, 1, Some(5)))
            .unwrap_err()
            .contains("at least 62 bytes"));
        assert!(FrameGen::new(&spec(62, 1, Some(5))).is_ok());
        assert!("10.0.0.5-10.0.0.1"
            .parse::<IpRange>()
            .unwrap_err()
            .contains("ends before"));
        assert!("10.0.0"
            .parse::<IpRange>()
            .unwrap_err()
            .contains("not an IPv4"));
        assert!("70000".parse::<PortRange>().is_err());
        assert_eq!("10.0.0.1-10.0.0.3".parse::<IpRange>().unwrap().len, 3);
    }

    #[test]
    fn tracker_counts_gaps_duplicates_and_reordering() {
        let mut t = SeqTracker::default();
        for s in [0, 1, 2, 5, 3, 3, 6, 4] {
            t.record(s);
        }
        assert_eq!(t.unique, 7);
        assert_eq!(t.duplicates, 1);
        assert_eq!(t.reordered, 2);
        assert_eq!(t.gaps, 0, "3 and 4 arrived late, nothing lost");
        t.record(10);
        assert_eq!(t.gaps, 3);
        // A far jump clears the window.
        t.record(10 + SeqTracker::WINDOW * 2);
        assert_eq!(t.unique, 9);
    }

    /// Reordering is counted per flow: two flows on two queues interleave freely, a frame
    /// overtaken by a later frame of its own flow counts.
    #[test]
    fn reordering_is_per_flow() {
        let mut t = SeqTracker::with_flows(2);
        // Flow 0: 0 2 4 6, flow 1: 1 3 5 7, delivered a queue at a time.
        for s in [0, 2, 4, 6, 1, 3, 5, 7] {
            t.record(s);
        }
        assert_eq!((t.unique, t.reordered, t.gaps, t.duplicates), (8, 0, 0, 0));
        let mut t = SeqTracker::with_flows(2);
        for s in [0, 4, 2, 1, 3] {
            t.record(s);
        }
        assert_eq!(t.reordered, 1, "2 came after 4, both flow 0");
        // The same arrivals with one flow: every late frame counts.
        let mut t = SeqTracker::with_flows(1);
        for s in [0, 2, 4, 6, 1, 3, 5, 7] {
            t.record(s);
        }
        assert_eq!(t.reordered, 3);
    }

    #[test]
    fn pcap_errors_are_clear() {
        let d = std::env::temp_dir().join(format!("pktgen-pcap-{}", std::process::id()));
        std::fs::write(&d, b"definitely not a pcap").unwrap();
        assert!(load_pcap(&d, 2048)
            .unwrap_err()
            .contains("not a pcap or pcapng file"));
        // A valid header followed by a cut record.
        let mut w = pcap_file::pcap::PcapWriter::new(Vec::new()).unwrap();
        w.write_packet(&pcap_file::pcap::PcapPacket::new(
            std::time::Duration::ZERO,
            60,
            &[0u8; 60],
        ))
        .unwrap();
        let mut bytes = w.into_writer();
        bytes.truncate(bytes.len() - 10);
        std::fs::write(&d, &bytes).unwrap();
        let e = load_pcap(&d, 2048).unwrap_err();
        assert!(e.contains("malformed or truncated"), "{e}");
        let _ = std::fs::remove_file(&d);
    }

    fn frame(n: u8, len: usize) -> Vec<u8> {
        (0..len).map(|i| n.wrapping_add(i as u8)).collect()
    }

    /// A pcapng file (Wireshark's default) replays like a pcap one; records shorter than an
    /// Ethernet header (0 and 3 bytes) are skipped and counted, not sent.
    #[test]
    fn pcapng_is_read_and_short_records_are_skipped_and_counted() {
        use pcap_file::pcapng::blocks::enhanced_packet::EnhancedPacketBlock;
        use pcap_file::pcapng::blocks::interface_description::InterfaceDescriptionBlock;
        use pcap_file::pcapng::PcapNgWriter;
        use std::borrow::Cow;
        let mut w = PcapNgWriter::new(Vec::new()).unwrap();
        w.write_pcapng_block(InterfaceDescriptionBlock {
            linktype: pcap_file::DataLink::ETHERNET,
            snaplen: 0,
            options: vec![],
        })
        .unwrap();
        let lens = [60usize, 0, 3, 1514, 14];
        for (i, len) in lens.iter().enumerate() {
            let data = frame(i as u8, *len);
            w.write_pcapng_block(EnhancedPacketBlock {
                interface_id: 0,
                timestamp: std::time::Duration::from_micros(i as u64),
                original_len: *len as u32,
                data: Cow::Owned(data),
                options: vec![],
            })
            .unwrap();
        }
        let d = std::env::temp_dir().join(format!("pktgen-pcapng-{}", std::process::id()));
        std::fs::write(&d, w.into_inner()).unwrap();
        let cap = load_pcap(&d, 2048).unwrap();
        assert_eq!(cap.skipped_short, 2);
        assert_eq!(cap.frames, vec![frame(0, 60), frame(3, 1514), frame(4, 14)]);
        // The same in a classic pcap.
        let mut w = pcap_file::pcap::PcapWriter::new(Vec::new()).unwrap();
        for (i, len) in lens.iter().enumerate() {
            let data = frame(i as u8, *len);
            w.write_packet(&pcap_file::pcap::PcapPacket::new(
                std::time::Duration::ZERO,
                *len as u32,
                &data,
            ))
            .unwrap();
        }
        std::fs::write(&d, w.into_writer()).unwrap();
        let cap2 = load_pcap(&d, 2048).unwrap();
        assert_eq!(cap2.frames, cap.frames);
        // The capture's own timing: 0, 3 and 4 µs after the first frame (the short records
        // at 1 and 2 µs were skipped); the pcap's frames all at one time.
        assert_eq!(cap.times_ns, vec![0, 3000, 4000]);
        assert_eq!(cap2.times_ns, vec![0, 0, 0]);
        // Nothing but short records: nothing to replay, said so.
        let mut w = pcap_file::pcap::PcapWriter::new(Vec::new()).unwrap();
        w.write_packet(&pcap_file::pcap::PcapPacket::new(
            std::time::Duration::ZERO,
            3,
            &[1, 2, 3],
        ))
        .unwrap();
        std::fs::write(&d, w.into_writer()).unwrap();
        let e = load_pcap(&d, 2048).unwrap_err();
        assert!(e.contains("no frames to replay (1 records shorter"), "{e}");
        let _ = std::fs::remove_file(&d);
    }
}
