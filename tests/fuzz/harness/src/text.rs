//! Frames, devargs, capture files, telemetry requests and multi-process records: the parsers of bytes that come from
//! outside.

use crate::input::Input;
use pmd::net::{csum, parse, toeplitz, tso};
use pmd::port::PortSpec;

/// A frame from the wire through every parser a device model, the wires and the apps run on
/// received bytes: classification and the RSS input, the IP header parser, the Toeplitz hash,
/// the TX checksum completion and TSO segmentation. Invariants: nothing panics; the checksum
/// completion keeps the frame's length; TSO's segments carry the whole payload in order, each
/// at most the headers and one MSS.
pub fn net_parse(data: &[u8]) {
    let mut input = Input::new(data);
    let ctl: [u8; 6] = input.array();
    let frame = input.rest();
    let c = parse::classify(frame);
    let (bytes, n) = c.rss_input(frame);
    let key = pmd::ethdev::RssConfig::default().key;
    let table = toeplitz::Table::new(&key);
    assert_eq!(
        table.hash(&bytes[..n]),
        toeplitz::hash(&key, &bytes[..n]),
        "the table and the bitwise Toeplitz hash agree"
    );
    if let Some((at, et)) = parse::l3_start(frame) {
        if let Some(ip) = parse::IpHeader::parse(frame, at, et) {
            let _ = ip.addresses(frame);
        }
    }
    let req = csum::TxCsum {
        ipv4: ctl[0] & 1 != 0,
        tcp: ctl[0] & 2 != 0,
        udp: ctl[0] & 4 != 0,
    };
    let mut copy = frame.to_vec();
    csum::apply_tx(&mut copy, req);
    assert_eq!(copy.len(), frame.len());
    let mut copy = frame.to_vec();
    csum::apply_tx_full(&mut copy, req);
    assert_eq!(copy.len(), frame.len());

    let t = tso::Tso {
        header_bytes: usize::from(ctl[1]),
        l4_start: usize::from(ctl[2]),
        mss: usize::from(u16::from_le_bytes([ctl[3], ctl[4]])),
    };
    let headroom = usize::from(ctl[5] & 7);
    let mut buf = Vec::new();
    let mut payload = Vec::new();
    let mut segments = 0;
    let r = tso::segment(frame, &t, headroom, &mut buf, |seg| {
        segments += 1;
        assert!(
            seg.len() >= headroom + t.header_bytes,
            "a segment holds the headers"
        );
        let body = &seg[headroom + t.header_bytes..];
        assert!(body.len() <= t.mss, "a segment carries at most one MSS");
        payload.extend_from_slice(body);
    });
    if let Ok(n) = r {
        assert_eq!(n, segments);
        assert_eq!(
            payload,
            frame[t.header_bytes..],
            "the payload, whole and in order"
        );
    }
}

/// A devargs string (`--port`), as every tool parses it. Invariants: nothing panics; a spec
/// that parses prints as a string that parses to the same spec.
pub fn devargs(data: &[u8]) {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(spec) = s.parse::<PortSpec>() {
        let printed = spec.to_string();
        let again: PortSpec = printed
            .parse()
            .unwrap_or_else(|e| panic!("{s:?} parsed, printed as {printed:?}, which fails: {e}"));
        assert_eq!(again, spec, "{s:?} printed as {printed:?}");
    }
}

/// A capture file for pktgen's `--pcap` (classic pcap or pcapng). Invariants: nothing panics;
/// a capture that loads has frames, each of at least an Ethernet header and at most the
/// limit, and one timestamp per frame, never decreasing.
pub fn pcap_file(data: &[u8]) {
    const MAX: usize = 9018;
    if let Ok(c) = apps::pktgen::parse_pcap("fuzz.pcap", data, MAX) {
        assert!(!c.frames.is_empty());
        assert_eq!(c.frames.len(), c.times_ns.len());
        assert!(c.frames.iter().all(|f| (14..=MAX).contains(&f.len())));
        assert!(c.times_ns.windows(2).all(|w| w[0] <= w[1]));
    }
}

/// One direction of a shared-memory cable as the other process (possibly hostile, possibly
/// crashed mid-write) leaves it: the fuzzer's bytes are the ring's producer and consumer
/// counters and its records, and keep changing them between our reads (the peer writes
/// concurrently). Our consumer pops frames and drops the rest; our producer pushes frames
/// against a consumer counter the peer sets. The ring's memory is exactly its size, so a
/// read or write outside the ring (into the other direction or past the file) panics.
/// Invariants: nothing panics; a frame is at most the ring's largest; every call returns.
pub fn shm_ring(data: &[u8]) {
    use pmd::emu::wire::ring::{ring_bytes, FrameRing};
    use pmd::sys::DevMem;
    use std::sync::atomic::Ordering;
    use std::sync::Arc;
    const DATA: usize = 32 << 10;
    const MAX: usize = 9208;
    let mut input = Input::new(data);
    let mem = Arc::new(DevMem::anon(ring_bytes(DATA)).expect("ring memory"));
    // Counters: small (a ring in use) or anything.
    let counter = |input: &mut Input<'_>| {
        let v = u64::from(input.u32());
        if input.u8() & 1 == 0 {
            v % (4 * DATA as u64)
        } else {
            v << 32 | u64::from(input.u32())
        }
    };
    let (p, c) = (counter(&mut input), counter(&mut input));
    mem.store_u64(0, p, Ordering::Release);
    mem.store_u64(64, c, Ordering::Release);
    let mut consumer = FrameRing::new(Arc::clone(&mem), 0, DATA, MAX);
    let mut producer = FrameRing::new(Arc::clone(&mem), 0, DATA, MAX);
    let mut buf = vec![0u8; MAX + 64];
    for _ in 0..1024 {
        if input.done() {
            break;
        }
        match input.u8() % 6 {
            // The peer writes a record header (a length, maybe WRAP) somewhere.
            0 => {
                let at = 128 + (usize::from(input.u16()) * 64) % DATA;
                mem.store_u32(at, input.u32(), Ordering::Release);
            }
            // The peer moves its counter.
            1 => mem.store_u64(0, counter(&mut input), Ordering::Release),
            2 => mem.store_u64(64, counter(&mut input), Ordering::Release),
            // We read up to 64 frames.
            3 => {
                for _ in 0..64 {
                    let cut = usize::from(input.u16()) % buf.len();
                    match consumer.pop(&mut buf[..cut]) {
                        Some(n) => assert!(n <= MAX, "a frame of {n} bytes"),
                        None => break,
                    }
                }
                consumer.publish_consumed();
            }
            4 => {
                let _ = consumer.discard_all();
                let _ = consumer.unread_frames();
            }
            // We send a frame.
            _ => {
                let len = usize::from(input.u16()) % (MAX + 1);
                let _ = producer.push(&buf[..len]);
                producer.publish();
            }
        }
    }
}

/// A telemetry client's request record and an answer's data (the fuzzer's bytes make both:
/// a client is any local process that can reach the socket; an answer holds port names,
/// devargs and error texts). Invariants: nothing panics; a parsed request's command is
/// non-empty and holds no `,` or NUL; every answer record is JSON, an object whose one key
/// is the command (at most [`MAX_CMD_LEN`] bytes of it), and stays within the size the
/// client reads whenever the smallest answer (`{"CMD":null}`) does.
///
/// [`MAX_CMD_LEN`]: pmd::telemetry::MAX_CMD_LEN
pub fn telemetry(data: &[u8]) {
    use pmd::telemetry::protocol::{parse, render, Data, MAX_REQUEST_LEN};
    let mut input = Input::new(data);
    let [a, b] = input.array::<2>();
    let max_len = 16 + usize::from(u16::from_le_bytes([a, b])) % (16 * 1024);
    let shape: [u8; 64] = input.array();
    let record = input.rest();
    let text = String::from_utf8_lossy(&record[..record.len().min(MAX_REQUEST_LEN)]);
    let req = parse(&text);
    if let Some(r) = req {
        assert!(!r.cmd.is_empty() && !r.cmd.contains([',', '\0']), "{r:?}");
        assert!(
            r.param.is_none_or(|p| !p.is_empty() && !p.contains('\0')),
            "{r:?}"
        );
    }
    // An answer built from the request's own text, shaped by the fuzzer.
    let words: Vec<&str> = text.split([',', ' ']).collect();
    let mut data = Data::dict();
    let mut list = Vec::new();
    for (i, &s) in shape.iter().enumerate() {
        let w = words[i % words.len()];
        let v = match s % 6 {
            0 => Data::Str(w.to_string()),
            1 => Data::Uint(u64::from(s) << (s % 56)),
            2 => Data::Int(-i64::from(s)),
            3 => Data::Float(f64::from(s) / 7.0),
            4 => Data::Array(std::mem::take(&mut list)),
            _ => Data::Null,
        };
        if s & 0x80 != 0 {
            list.push(v);
        } else {
            data.add(w, v);
        }
    }
    let whole = data.to_json();
    let parsed: serde_json::Value =
        serde_json::from_str(&whole).unwrap_or_else(|e| panic!("{whole:?}: {e}"));
    assert!(parsed.is_object());
    let cmd = req.map(|r| r.cmd);
    let (out, _skipped) = render(cmd, Some(&data), max_len);
    let v: serde_json::Value =
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{out:?}: {e}"));
    let obj = v.as_object().expect("an answer is an object");
    assert_eq!(obj.len(), 1, "{out}");
    let key = obj.keys().next().expect("one key");
    let name = cmd.unwrap_or("none");
    assert!(name.starts_with(key.as_str()), "{key:?} names {name:?}");
    assert!(key.len() <= pmd::telemetry::MAX_CMD_LEN, "{key:?}");
    let (smallest, _) = render(cmd, None, usize::MAX);
    if smallest.len() <= max_len {
        assert!(
            out.len() <= max_len,
            "{} bytes over {max_len}: {out}",
            out.len()
        );
    }
}

/// A multi-process control record from a peer (a secondary or a primary: another local
/// process, hostile, buggy or of another build): a sequence of records, each a two-byte
/// length (up to one over the longest record) and that many bytes. Invariants: nothing panics; a record that decodes encodes back to
/// exactly its bytes (no field is read loosely); one that fails names why.
pub fn mp_control(data: &[u8]) {
    use pmd::mp::protocol::Msg;
    let mut input = Input::new(data);
    while !input.done() {
        let n = usize::from(input.u16()) % (pmd::mp::protocol::MAX_RECORD + 2);
        let rec = input.take(n);
        match Msg::decode(rec) {
            Ok(m) => assert_eq!(m.encode(), rec, "{m:?}"),
            Err(e) => assert!(!e.to_string().is_empty()),
        }
    }
}

/// The description of an exported queue pair, as a secondary reads it from the primary's
/// runtime directory (a file another process wrote): any text. Invariants: nothing panics;
/// a description that parses prints as text that parses to the same description; one that
/// fails says why.
pub fn queue_export(data: &[u8]) {
    use pmd::ethdev::QueueExport;
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match QueueExport::parse(text) {
        Ok(e) => assert_eq!(
            QueueExport::parse(&e.to_text()).as_ref(),
            Ok(&e),
            "{text:?}"
        ),
        Err(why) => assert!(!why.is_empty()),
    }
}

/// A shared mbuf pool's file, as a process that attaches reads it (another process made it:
/// hostile, buggy, of another build, or truncated): any bytes, as a whole file.
/// Invariants: nothing panics; [`mempool::Mempool::inspect_shared`] either refuses the file
/// saying why, or describes a pool whose objects fit the file before its control block.
pub fn shared_pool(data: &[u8]) {
    use std::io::Write as _;
    let dir = if std::path::Path::new("/dev/shm").is_dir() {
        std::path::PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    let path = dir.join(format!("fuzz-shared-pool-{}", std::process::id()));
    let Ok(mut f) = std::fs::File::create(&path) else {
        return;
    };
    if f.write_all(data).is_err() {
        return;
    }
    drop(f);
    match mempool::Mempool::inspect_shared(&path) {
        Ok(info) => {
            let span = info.obj_bytes as u64 * u64::from(info.objects);
            assert!(
                span <= data.len() as u64,
                "{info:?} in {} bytes",
                data.len()
            );
            assert!(!info.name.is_empty() && info.addr != 0, "{info:?}");
        }
        Err(e) => assert!(!e.to_string().is_empty()),
    }
    let _ = std::fs::remove_file(&path);
}
