//! Frames replayed from a pcap or pcapng capture.
#![deny(unsafe_code)]

use std::path::Path;

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
