//! The mlx5 device model against the spec (mlx5.md §2–6, §8): the tests play the driver by
//! hand — build WQEs with the `hw::mlx5` views, write the doorbell records and the UAR
//! doorbell, step the engine, and check what reaches a loopback wire and what lands in the
//! CQ, byte for byte.

use pmd::emu::mlx5::{Faults, Model, ModelHandle, RxHashFields, VENDOR_ERR_INJECTED};
use pmd::emu::wire::{Loopback, Wire};
use pmd::hw::mlx5::cqe::{
    csum_ok, hash_type, hdr_type, mini_slot, sw_owned, Cqe, CqeFormat, CqeOpcode, Syndrome,
};
use pmd::hw::mlx5::doorbell::{cq_set_ci, rq_record, sq_record, CQ_SET_CI, RCV_DBR, SND_DBR};
use pmd::hw::mlx5::wqe::{
    eth_seg_units, inline_seg_units, CtrlSeg, DataSeg, EthSeg, InlineSeg, MprqByteCnt, MprqWqe,
    CE_ALWAYS, CE_FIRST_ERROR, CS_L3, CS_L4, INVALID_LKEY, MPRQ_WQE_BYTES, SEG_BYTES,
};
use pmd::hw::mlx5::{wqebbs, Opcode, DS_BYTES, WQEBB_BYTES};
use pmd::mlx5::{Mprq, RawCq, RawRq, RawSq};
use pmd::net::{parse, toeplitz};
use pmd::ring::write_wrapped;
use pmd::sys::DevMem;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

static CABLE: AtomicU32 = AtomicU32::new(0);

/// A model on one end of a loopback cable, paused (stepped by the test), and the other end.
fn world(min_inline: u16) -> (Model, ModelHandle, Loopback) {
    let name = format!(
        "mlx5-emu-{}-{}",
        std::process::id(),
        CABLE.fetch_add(1, Ordering::SeqCst)
    );
    let wire = Loopback::open(&name).unwrap();
    let peer = Loopback::open(&name).unwrap();
    let model = Model::new(Box::new(wire), min_inline, 0).unwrap();
    let h = model.handle();
    h.pause();
    (model, h, peer)
}

/// Packet memory registered with the model.
struct Buf {
    mem: Arc<DevMem>,
    lkey: u32,
}

impl Buf {
    fn new(m: &Model, bytes: usize) -> Self {
        let mem = Arc::new(DevMem::anon(bytes).unwrap());
        let lkey = m.reg_mr(&mem).unwrap();
        Self { mem, lkey }
    }
    fn addr(&self, off: usize) -> u64 {
        (self.mem.addr() + off) as u64
    }
}

fn udp_frame(sport: u16, payload: usize) -> Vec<u8> {
    let mut f = Vec::new();
    etherparse::PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
        .ipv4([10, 0, 0, 1], [10, 0, 0, 2], 64)
        .udp(sport, 4791)
        .write(&mut f, &vec![0xab; payload])
        .unwrap();
    f
}

fn tcp_frame(payload: usize) -> Vec<u8> {
    let mut f = Vec::new();
    etherparse::PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
        .ipv4([10, 0, 0, 1], [10, 0, 0, 2], 64)
        .tcp(1000, 80, 5000, 65535)
        .ack(1)
        .write(&mut f, &(0..payload).map(|i| i as u8).collect::<Vec<_>>())
        .unwrap();
    f
}

/// The frame with its IPv4 header and L4 checksums zeroed (what a driver hands the NIC).
fn without_checksums(f: &[u8]) -> Vec<u8> {
    let mut g = f.to_vec();
    g[24..26].fill(0);
    let l4 = 14 + 20;
    match g[23] {
        17 => g[l4 + 6..l4 + 8].fill(0),
        _ => g[l4 + 16..l4 + 18].fill(0),
    }
    g
}

/// The driver's side of one SQ.
struct Sq {
    q: RawSq,
    pi: u16,
    /// Where the last WQE posted starts (its control segment is the doorbell).
    last: u16,
    cq_ci: u32,
}

/// What a WQE carries after its Ethernet segment.
enum Seg<'a> {
    Ptr(u64, u32, u32),
    Inline(&'a [u8]),
}

impl Sq {
    fn new(m: &Model, wqe_cnt: u32, cqe: u32) -> Self {
        let cq = m.create_cq(cqe).unwrap();
        Self {
            q: m.create_sq(wqe_cnt, &cq).unwrap(),
            pi: 0,
            last: 0,
            cq_ci: 0,
        }
    }

    /// Builds a WQE at `pi` (ctrl, eseg with `inline` header or a VLAN command, `segs`),
    /// copies it into the ring across its end, and returns its index. `index` overrides
    /// the WQE index written in the control segment.
    #[allow(clippy::too_many_arguments)]
    fn post(
        &mut self,
        opcode: Opcode,
        ce: u8,
        cs: u8,
        mss: u16,
        inline: &[u8],
        vlan: Option<u16>,
        segs: &[Seg],
        index: Option<u16>,
    ) -> u16 {
        let mut w = [0u8; 1024];
        let mut off = SEG_BYTES;
        {
            let mut e = EthSeg::new_checked(&mut w[off..off + SEG_BYTES]).unwrap();
            match vlan {
                Some(tci) => e.write_vlan_insert(cs, tci),
                None => e.write(cs, mss, inline),
            }
        }
        if inline.len() > 2 {
            w[off + SEG_BYTES..off + SEG_BYTES + inline.len() - 2].copy_from_slice(&inline[2..]);
        }
        off += eth_seg_units(inline.len()) * DS_BYTES;
        for s in segs {
            match s {
                Seg::Ptr(addr, lkey, len) => {
                    DataSeg::new_checked(&mut w[off..off + 16]).unwrap().set(
                        mempool::Iova(*addr),
                        mempool::Lkey(*lkey),
                        *len,
                    );
                    off += 16;
                }
                Seg::Inline(data) => {
                    w[off..off + 4]
                        .copy_from_slice(&InlineSeg::header(data.len() as u32).to_be_bytes());
                    w[off + 4..off + 4 + data.len()].copy_from_slice(data);
                    off += inline_seg_units(data.len()) * DS_BYTES;
                }
            }
        }
        let ds = off / DS_BYTES;
        let at = self.pi;
        CtrlSeg::new_checked(&mut w[..16]).unwrap().write(
            opcode,
            0,
            index.unwrap_or(at),
            self.q.sqn,
            ds as u8,
            ce,
        );
        let bytes = wqebbs(ds) * WQEBB_BYTES;
        write_wrapped(&self.q.buf, u32::from(at) * WQEBB_BYTES as u32, &w[..bytes]);
        self.pi = at.wrapping_add(wqebbs(ds) as u16);
        self.last = at;
        at
    }

    /// A SEND of `frame` (already in `buf` at `off`) with `inline` bytes inlined.
    fn send(&mut self, buf: &Buf, off: usize, frame: &[u8], inline: usize, ce: u8, cs: u8) -> u16 {
        self.post(
            Opcode::Send,
            ce,
            cs,
            0,
            &frame[..inline],
            None,
            &[Seg::Ptr(
                buf.addr(off + inline),
                buf.lkey,
                (frame.len() - inline) as u32,
            )],
            None,
        )
    }

    /// The doorbell (§3.1): the SQ record, then the UAR write of the last WQE's first 8
    /// bytes.
    fn ring(&self) {
        self.record();
        self.uar(self.doorbell());
    }

    /// Writes the SQ doorbell record only.
    fn record(&self) {
        self.q.dbrec.store_u32(
            SND_DBR,
            u32::from_ne_bytes(sq_record(u32::from(self.pi))),
            Ordering::Release,
        );
    }

    /// The first 8 bytes of the last WQE posted, as the ring holds them.
    fn doorbell(&self) -> [u8; 8] {
        let slot = u32::from(self.last) & (self.q.wqe_cnt - 1);
        let mut b = [0u8; 8];
        self.q.buf.read(slot as usize * WQEBB_BYTES, &mut b);
        b
    }

    /// The 8-byte UAR write (the bytes verbatim).
    fn uar(&self, v: [u8; 8]) {
        self.q.bf_reg.ring(0, u64::from_ne_bytes(v));
    }

    /// Takes the next CQE if software owns it, and updates SET_CI.
    fn poll(&mut self) -> Option<[u8; 64]> {
        let c = poll_cq(&self.q.cq, self.cq_ci)?;
        self.cq_ci += 1;
        set_ci(&self.q.cq, self.cq_ci);
        Some(c)
    }
}

fn poll_cq(cq: &RawCq, ci: u32) -> Option<[u8; 64]> {
    let mut b = [0u8; 64];
    cq.buf.read((ci & (cq.cqe_cnt - 1)) as usize * 64, &mut b);
    sw_owned(b[63], ci, cq.cqe_cnt).then_some(b)
}

fn set_ci(cq: &RawCq, ci: u32) {
    cq.dbrec.store_u32(
        CQ_SET_CI,
        u32::from_ne_bytes(cq_set_ci(ci)),
        Ordering::Release,
    );
}

fn recv(peer: &mut Loopback) -> Option<Vec<u8>> {
    let mut b = vec![0u8; 70000];
    peer.recv(&mut b).map(|n| b[..n].to_vec())
}

fn cqe(b: &[u8; 64]) -> Cqe<&[u8]> {
    Cqe::new_checked(&b[..]).unwrap()
}

#[test]
fn a_send_with_the_minimum_inline_header_goes_out_byte_for_byte_with_checksums() {
    let (m, h, mut peer) = world(18);
    let buf = Buf::new(&m, 4096);
    let mut sq = Sq::new(&m, 64, 63);
    let want = udp_frame(1234, 100);
    let posted = without_checksums(&want);
    buf.mem.write(0, &posted);
    let idx = sq.send(&buf, 0, &posted, 18, CE_ALWAYS, CS_L3 | CS_L4);
    sq.ring();
    assert_eq!(h.step(), 1);
    let got = recv(&mut peer).expect("a frame on the wire");
    assert_eq!(got, want);
    let p = etherparse::SlicedPacket::from_ethernet(&got).unwrap();
    assert!(matches!(p.net, Some(etherparse::NetSlice::Ipv4(_))));
    let c = sq.poll().expect("a CQE for CE = 2");
    let c = cqe(&c);
    assert_eq!(c.opcode(), CqeOpcode::Req);
    assert_eq!(c.format(), CqeFormat::Normal);
    assert_eq!(c.wqe_counter(), idx);
    assert_eq!(c.sop(), u8::from(Opcode::Send));
    assert_eq!(c.qpn_or_flow_tag(), sq.q.sqn);
    assert!(!c.owner());
    assert_eq!(h.stats().tx_frames, 1);
}

#[test]
fn short_frames_are_padded_and_tcp_checksums_computed_whatever_the_field_held() {
    let (m, h, mut peer) = world(0);
    let buf = Buf::new(&m, 4096);
    let mut sq = Sq::new(&m, 8, 7);
    let want = tcp_frame(0); // 54 bytes
    let mut posted = without_checksums(&want);
    posted[14 + 20 + 16] = 0x5a; // garbage in the checksum field: mlx5 ignores it
    buf.mem.write(0, &posted);
    sq.send(&buf, 0, &posted, 0, CE_ALWAYS, CS_L3 | CS_L4);
    sq.ring();
    h.step();
    let got = recv(&mut peer).unwrap();
    assert_eq!(got.len(), 60);
    assert_eq!(&got[..54], &want[..]);
    assert_eq!(&got[54..], &[0; 6]);
}

#[test]
fn cqes_only_for_ce_2_with_owner_bits_over_many_laps_of_sq_and_cq() {
    let (m, h, mut peer) = world(0);
    let buf = Buf::new(&m, 4096);
    let frame = udp_frame(7, 40);
    buf.mem.write(0, &frame);
    // 8 WQEBBs, 4 CQEs: 48 WQEs wrap the SQ 6 times and the CQ 6 times.
    let mut sq = Sq::new(&m, 8, 3);
    assert_eq!(sq.q.cq.cqe_cnt, 4);
    let mut signalled = Vec::new();
    for round in 0..12u16 {
        for k in 0..4 {
            let ce = if k % 2 == 1 {
                CE_ALWAYS
            } else {
                CE_FIRST_ERROR
            };
            let idx = sq.send(&buf, 0, &frame, 0, ce, 0);
            if ce == CE_ALWAYS {
                signalled.push(idx);
            }
        }
        sq.ring();
        assert_eq!(h.step(), 4, "round {round}");
        for _ in 0..4 {
            assert!(recv(&mut peer).is_some());
        }
        for _ in 0..2 {
            let lap = (sq.cq_ci / 4) & 1 == 1;
            let c = sq.poll().expect("one CQE per CE = 2 WQE");
            let c = cqe(&c);
            assert_eq!(c.owner(), lap);
            assert_eq!(c.wqe_counter(), signalled.remove(0));
        }
        assert!(sq.poll().is_none(), "no CQE for CE = 1");
    }
    assert_eq!(h.stats().tx_frames, 48);
    assert_eq!(sq.pi, 48);
}

#[test]
fn a_wqe_that_wraps_the_ring_is_read_across_its_end() {
    let (m, h, mut peer) = world(0);
    let buf = Buf::new(&m, 4096);
    let mut sq = Sq::new(&m, 4, 7);
    let frame = udp_frame(9, 80);
    buf.mem.write(0, &frame);
    for _ in 0..3 {
        sq.send(&buf, 0, &frame, 0, CE_FIRST_ERROR, 0);
    }
    sq.ring();
    h.step();
    for _ in 0..3 {
        recv(&mut peer).unwrap();
    }
    // A fully inlined 122-byte frame: 2 + ceil(120/16) = 10 units, 3 WQEBBs from slot 3.
    let idx = sq.post(Opcode::Send, CE_ALWAYS, 0, 0, &frame, None, &[], None);
    assert_eq!((idx, sq.pi), (3, 6));
    sq.ring();
    assert_eq!(h.step(), 1);
    assert_eq!(recv(&mut peer).unwrap(), frame);
    assert_eq!(cqe(&sq.poll().unwrap()).wqe_counter(), 3);
}

#[test]
fn a_full_cq_stalls_the_sq_until_set_ci_moves() {
    let (m, h, mut peer) = world(0);
    let buf = Buf::new(&m, 4096);
    let frame = udp_frame(1, 40);
    buf.mem.write(0, &frame);
    let mut sq = Sq::new(&m, 8, 1); // 2 CQEs
    for _ in 0..4 {
        sq.send(&buf, 0, &frame, 0, CE_ALWAYS, 0);
    }
    sq.ring();
    h.run_until_idle(10);
    assert_eq!(h.stats().tx_frames, 2);
    assert!(h.stats().tx_cq_stalls > 0);
    assert!(recv(&mut peer).is_some() && recv(&mut peer).is_some());
    assert!(recv(&mut peer).is_none());
    // Reading without SET_CI frees nothing; writing it lets the rest through.
    let (a, b) = (poll_cq(&sq.q.cq, 0).unwrap(), poll_cq(&sq.q.cq, 1).unwrap());
    assert_eq!((cqe(&a).wqe_counter(), cqe(&b).wqe_counter()), (0, 1));
    h.step();
    assert_eq!(h.stats().tx_frames, 2);
    set_ci(&sq.q.cq, 2);
    h.run_until_idle(10);
    assert_eq!(h.stats().tx_frames, 4);
    let c = poll_cq(&sq.q.cq, 2).unwrap();
    assert!(cqe(&c).owner());
    assert_eq!(cqe(&c).wqe_counter(), 2);
}

#[test]
fn a_bad_lkey_fails_with_local_prot_then_flushes_until_reset() {
    let (m, h, mut peer) = world(0);
    let buf = Buf::new(&m, 4096);
    let frame = udp_frame(1, 40);
    buf.mem.write(0, &frame);
    let mut sq = Sq::new(&m, 16, 15);
    sq.send(&buf, 0, &frame, 0, CE_FIRST_ERROR, 0);
    let bad = sq.post(
        Opcode::Send,
        CE_FIRST_ERROR,
        0,
        0,
        &[],
        None,
        &[Seg::Ptr(buf.addr(0), buf.lkey + 100, frame.len() as u32)],
        None,
    );
    let after = sq.send(&buf, 0, &frame, 0, CE_FIRST_ERROR, 0);
    // Out of the region's range: LOCAL_PROT too (checked after the reset below).
    sq.ring();
    h.step();
    assert!(recv(&mut peer).is_some());
    assert!(recv(&mut peer).is_none());
    let e = sq.poll().expect("an error CQE even for CE = 1");
    let e = cqe(&e);
    assert_eq!(e.opcode(), CqeOpcode::ReqErr);
    assert_eq!(e.syndrome(), Syndrome::LocalProt);
    assert_eq!(e.wqe_counter(), bad);
    assert_eq!(e.sop(), u8::from(Opcode::Send));
    assert_eq!(e.qpn_or_flow_tag(), sq.q.sqn);
    let f = sq.poll().expect("a flush CQE for the WQE after it");
    assert_eq!(cqe(&f).syndrome(), Syndrome::WrFlush);
    assert_eq!(cqe(&f).wqe_counter(), after);
    assert_eq!((h.stats().tx_errors, h.stats().tx_flushed), (1, 1));

    // The driver's recovery: RESET -> RTS, indices from 0.
    m.reset_sq(sq.q.sqn).unwrap();
    sq.pi = 0;
    let oob = sq.post(
        Opcode::Send,
        CE_FIRST_ERROR,
        0,
        0,
        &[],
        None,
        &[Seg::Ptr(buf.addr(4000), buf.lkey, 200)],
        None,
    );
    sq.ring();
    h.step();
    let e = sq.poll().unwrap();
    assert_eq!(cqe(&e).syndrome(), Syndrome::LocalProt);
    assert_eq!(cqe(&e).wqe_counter(), oob);
    m.reset_sq(sq.q.sqn).unwrap();
    sq.pi = 0;
    sq.send(&buf, 0, &frame, 0, CE_ALWAYS, 0);
    sq.ring();
    h.step();
    assert_eq!(recv(&mut peer).unwrap(), frame);
    assert_eq!(cqe(&sq.poll().unwrap()).opcode(), CqeOpcode::Req);
}

#[test]
fn fewer_inline_bytes_than_the_queue_minimum_is_a_local_qp_op_error() {
    let (m, h, mut peer) = world(18);
    let buf = Buf::new(&m, 4096);
    let frame = udp_frame(1, 40);
    buf.mem.write(0, &frame);
    let mut sq = Sq::new(&m, 8, 7);
    let idx = sq.send(&buf, 0, &frame, 14, CE_FIRST_ERROR, 0);
    sq.ring();
    h.step();
    assert!(recv(&mut peer).is_none());
    let e = sq.poll().unwrap();
    assert_eq!(cqe(&e).opcode(), CqeOpcode::ReqErr);
    assert_eq!(cqe(&e).syndrome(), Syndrome::LocalQpOp);
    assert_eq!(cqe(&e).wqe_counter(), idx);
}

#[test]
fn a_wqe_index_other_than_the_device_counter_is_a_local_qp_op_error() {
    let (m, h, _peer) = world(0);
    let mut sq = Sq::new(&m, 8, 7);
    sq.post(Opcode::Nop, CE_ALWAYS, 0, 0, &[], None, &[], None);
    sq.post(Opcode::Nop, CE_ALWAYS, 0, 0, &[], None, &[], Some(5));
    // The doorbell names the next WQE (one naming index 5 would be refused: the ring holds
    // no such WQE there).
    sq.post(Opcode::Nop, CE_ALWAYS, 0, 0, &[], None, &[], None);
    sq.ring();
    h.step();
    let ok = sq.poll().unwrap();
    assert_eq!((cqe(&ok).opcode(), cqe(&ok).sop()), (CqeOpcode::Req, 0));
    let e = sq.poll().unwrap();
    assert_eq!(cqe(&e).syndrome(), Syndrome::LocalQpOp);
    assert_eq!(cqe(&e).wqe_counter(), 1);
}

#[test]
fn injected_tx_errors_carry_the_vendor_syndrome() {
    let (m, h, _peer) = world(0);
    let buf = Buf::new(&m, 4096);
    let frame = udp_frame(1, 40);
    buf.mem.write(0, &frame);
    let mut sq = Sq::new(&m, 8, 7);
    h.set_faults(Faults {
        tx_error_every: 2,
        ..Faults::default()
    });
    sq.send(&buf, 0, &frame, 0, CE_FIRST_ERROR, 0);
    let second = sq.send(&buf, 0, &frame, 0, CE_FIRST_ERROR, 0);
    sq.ring();
    h.step();
    let e = sq.poll().unwrap();
    assert_eq!(cqe(&e).wqe_counter(), second);
    assert_eq!(cqe(&e).vendor_err_synd(), VENDOR_ERR_INJECTED);
}

#[test]
fn vlan_insert_command_tags_the_frame() {
    let (m, h, mut peer) = world(0);
    let buf = Buf::new(&m, 4096);
    let frame = udp_frame(1, 40);
    buf.mem.write(0, &frame);
    let mut sq = Sq::new(&m, 8, 7);
    sq.post(
        Opcode::Send,
        CE_ALWAYS,
        0,
        0,
        &[],
        Some(0x2064),
        &[Seg::Ptr(buf.addr(0), buf.lkey, frame.len() as u32)],
        None,
    );
    sq.ring();
    h.step();
    let got = recv(&mut peer).unwrap();
    assert_eq!(&got[..12], &frame[..12]);
    assert_eq!(&got[12..16], &[0x81, 0x00, 0x20, 0x64]);
    assert_eq!(&got[16..], &frame[12..]);
}

#[test]
fn tso_cuts_the_payload_into_mss_pieces_with_valid_checksums() {
    let (m, h, mut peer) = world(0);
    let buf = Buf::new(&m, 8192);
    let pkt = without_checksums(&tcp_frame(2500));
    buf.mem.write(0, &pkt);
    let mut sq = Sq::new(&m, 8, 7);
    let hdr = 54;
    sq.post(
        Opcode::Tso,
        CE_ALWAYS,
        CS_L3 | CS_L4,
        1000,
        &pkt[..hdr],
        None,
        &[Seg::Ptr(buf.addr(hdr), buf.lkey, (pkt.len() - hdr) as u32)],
        None,
    );
    sq.ring();
    h.step();
    let mut seq = 5000;
    for want in [1000, 1000, 500] {
        let f = recv(&mut peer).expect("a segment");
        assert_eq!(f.len(), hdr + want);
        let (ip, _) = etherparse::Ipv4Header::from_slice(&f[14..]).unwrap();
        assert_eq!(ip.header_checksum, ip.calc_header_checksum());
        let (tcp, _) = etherparse::TcpHeader::from_slice(&f[34..]).unwrap();
        assert_eq!(tcp.sequence_number, seq);
        assert_eq!(
            tcp.checksum,
            tcp.calc_checksum_ipv4(&ip, &f[hdr..]).unwrap()
        );
        seq += want as u32;
    }
    assert!(recv(&mut peer).is_none());
    assert_eq!(cqe(&sq.poll().unwrap()).sop(), u8::from(Opcode::Tso));
}

#[test]
fn empw_sends_one_packet_per_descriptor() {
    let (m, h, mut peer) = world(0);
    let buf = Buf::new(&m, 4096);
    let (a, b, c) = (udp_frame(1, 30), udp_frame(2, 200), udp_frame(3, 20));
    buf.mem.write(0, &a);
    buf.mem.write(1024, &b);
    let mut sq = Sq::new(&m, 8, 7);
    sq.post(
        Opcode::Empw,
        CE_ALWAYS,
        0,
        0,
        &[],
        None,
        &[
            Seg::Ptr(buf.addr(0), buf.lkey, a.len() as u32),
            Seg::Inline(&c),
            Seg::Ptr(buf.addr(1024), buf.lkey, b.len() as u32),
        ],
        None,
    );
    sq.ring();
    assert_eq!(h.step(), 1);
    assert_eq!(recv(&mut peer).unwrap(), a);
    assert_eq!(recv(&mut peer).unwrap(), c);
    assert_eq!(recv(&mut peer).unwrap(), b);
    assert_eq!(cqe(&sq.poll().unwrap()).sop(), u8::from(Opcode::Empw));
}

/// Jumbo frames in one eMPW WQE, one pointer descriptor each (what DPDK posts for a burst of
/// single-segment packets): eight frames of 9014 bytes, more than a TSO packet's worth in
/// all, each leave as it was, and the WQE completes.
#[test]
fn empw_carries_a_burst_of_jumbo_frames() {
    let (m, h, mut peer) = world(0);
    m.set_mtu(9000);
    let buf = Buf::new(&m, 8 * 9216);
    let frames: Vec<Vec<u8>> = (0..8).map(|k| udp_frame(k, 8972)).collect();
    let segs: Vec<Seg> = frames
        .iter()
        .enumerate()
        .map(|(k, f)| {
            assert_eq!(f.len(), 9014);
            buf.mem.write(k * 9216, f);
            Seg::Ptr(buf.addr(k * 9216), buf.lkey, f.len() as u32)
        })
        .collect();
    let mut sq = Sq::new(&m, 8, 7);
    sq.post(Opcode::Empw, CE_ALWAYS, 0, 0, &[], None, &segs, None);
    sq.ring();
    assert_eq!(h.step(), 1);
    for (k, f) in frames.iter().enumerate() {
        assert_eq!(recv(&mut peer).as_ref(), Some(f), "frame {k}");
    }
    let c = sq.poll().unwrap();
    assert_eq!(cqe(&c).opcode(), CqeOpcode::Req, "completes without error");
    assert_eq!((h.stats().tx_frames, h.stats().tx_mtu_drops), (8, 0));
}

/// The driver's side of one RQ: every WQE one 2 KiB buffer (and the unused entries ended).
struct Rq {
    q: RawRq,
    buf: Buf,
    posted: u32,
    cq_ci: u32,
}

const RX_BUF: usize = 2048;

impl Rq {
    fn new(m: &Model, wqe_cnt: u32, max_sge: u32, cqe: u32, strip: bool) -> Self {
        let cq = m.create_cq(cqe).unwrap();
        let q = m.create_rq(wqe_cnt, max_sge, &cq, strip).unwrap();
        let buf = Buf::new(m, q.wqe_cnt as usize * RX_BUF);
        Self {
            q,
            buf,
            posted: 0,
            cq_ci: 0,
        }
    }

    /// Posts `n` WQEs of one `len`-byte buffer each and writes the record.
    fn post(&mut self, n: u32, len: u32) {
        for _ in 0..n {
            let slot = (self.posted & (self.q.wqe_cnt - 1)) as usize;
            let mut w = vec![0u8; self.q.stride as usize];
            for (k, e) in w.chunks_exact_mut(16).enumerate() {
                let mut d = DataSeg::new_checked(e).unwrap();
                if k == 0 {
                    d.set(
                        mempool::Iova(self.buf.addr(slot * RX_BUF)),
                        mempool::Lkey(self.buf.lkey),
                        len,
                    );
                } else {
                    d.set(mempool::Iova(0), INVALID_LKEY, 0);
                }
            }
            self.q.buf.write(slot * self.q.stride as usize, &w);
            self.posted += 1;
        }
        self.q.dbrec.store_u32(
            RCV_DBR,
            u32::from_ne_bytes(rq_record(self.posted)),
            Ordering::Release,
        );
    }

    fn poll(&mut self) -> Option<[u8; 64]> {
        let c = poll_cq(&self.q.cq, self.cq_ci)?;
        self.cq_ci += 1;
        set_ci(&self.q.cq, self.cq_ci);
        Some(c)
    }

    fn data(&self, wqe_counter: u16, len: usize) -> Vec<u8> {
        let slot = (u32::from(wqe_counter) & (self.q.wqe_cnt - 1)) as usize;
        let mut b = vec![0u8; len];
        self.buf.mem.read(slot * RX_BUF, &mut b);
        b
    }
}

#[test]
fn rx_lands_in_posted_buffers_with_cqe_fields_and_owner_bits() {
    let (m, h, mut peer) = world(0);
    let mut rq = Rq::new(&m, 4, 1, 3, false);
    rq.post(4, RX_BUF as u32);
    for round in 0..10u32 {
        let udp = udp_frame(round as u16, 100);
        let tcp = tcp_frame(50);
        assert!(peer.send(&udp) && peer.send(&tcp));
        peer.flush();
        assert_eq!(h.step(), 2);
        for (want, l4) in [(&udp, hdr_type::L4_UDP), (&tcp, hdr_type::L4_TCP_ACK_DATA)] {
            let lap = (rq.cq_ci / 4) & 1 == 1;
            let c = rq.poll().expect("a responder CQE");
            let c = cqe(&c);
            assert_eq!(c.opcode(), CqeOpcode::RespSend);
            assert_eq!(c.owner(), lap);
            assert_eq!(c.byte_cnt() as usize, want.len());
            assert_eq!(c.wqe_counter(), (rq.cq_ci - 1) as u16);
            assert_eq!(c.hds_ip_ext(), csum_ok::L2 | csum_ok::L3 | csum_ok::L4);
            assert_eq!(c.l4_l3_hdr_type(), hdr_type::L3_IPV4 | l4);
            assert_eq!((c.rx_hash_res(), c.rx_hash_type()), (0, 0));
            assert_eq!(c.vlan(), None);
            assert_eq!(c.lro_num_seg(), 0);
            assert_eq!(&rq.data(c.wqe_counter(), want.len()), want);
        }
        rq.post(2, RX_BUF as u32);
    }
    assert_eq!(h.stats().rx_frames, 20);
}

/// A WQ's RDY → RESET → RDY (the driver zeroes the record before RDY): the device's RQ
/// counter restarts at 0, while its CQ carries on where it was.
#[test]
fn reset_rq_restarts_the_rq_counter_and_the_cq_carries_on() {
    let (m, h, mut peer) = world(0);
    let mut rq = Rq::new(&m, 4, 1, 3, false);
    rq.post(3, RX_BUF as u32);
    for i in 0..3u16 {
        assert!(peer.send(&udp_frame(i, 60)));
        peer.flush();
    }
    assert_eq!(h.step(), 3);
    for i in 0..3u16 {
        assert_eq!(cqe(&rq.poll().unwrap()).wqe_counter(), i);
    }
    h.engine().reset_rq(rq.q.rqn).unwrap();
    assert!(h.engine().reset_rq(rq.q.rqn + 1000).is_err());
    rq.posted = 0;
    rq.post(2, RX_BUF as u32);
    let f = udp_frame(9, 60);
    assert!(peer.send(&f) && peer.send(&f));
    peer.flush();
    assert_eq!(h.step(), 2);
    for i in 0..2u16 {
        // CQ entries 3 and 4: the second is on the CQ's second lap (4 entries).
        let lap = (rq.cq_ci / 4) & 1 == 1;
        let c = rq.poll().expect("the CQ continues");
        assert_eq!(cqe(&c).owner(), lap);
        assert_eq!(cqe(&c).wqe_counter(), i);
        assert_eq!(rq.data(i, f.len()), f);
    }
}

#[test]
fn no_posted_wqe_counts_a_drop_and_an_oversize_frame_consumes_its_wqe_with_local_length() {
    let (m, h, mut peer) = world(0);
    let mut rq = Rq::new(&m, 4, 2, 7, false);
    assert!(peer.send(&udp_frame(1, 60)));
    peer.flush();
    h.step();
    assert_eq!(h.stats().rx_no_wqe, 1);
    assert!(rq.poll().is_none());
    rq.post(2, 128);
    let big = udp_frame(2, 200);
    let small = udp_frame(3, 40);
    assert!(peer.send(&big) && peer.send(&small));
    peer.flush();
    h.step();
    let e = rq.poll().unwrap();
    assert_eq!(cqe(&e).opcode(), CqeOpcode::RespErr);
    assert_eq!(cqe(&e).syndrome(), Syndrome::LocalLength);
    assert_eq!(cqe(&e).wqe_counter(), 0);
    let ok = rq.poll().unwrap();
    assert_eq!(cqe(&ok).opcode(), CqeOpcode::RespSend);
    assert_eq!(cqe(&ok).wqe_counter(), 1);
    assert_eq!(rq.data(1, small.len()), small);
    assert_eq!((h.stats().rx_oversize, h.stats().rx_frames), (1, 1));
}

#[test]
fn a_frame_is_scattered_over_the_entries_of_one_wqe() {
    let (m, h, mut peer) = world(0);
    let cq = m.create_cq(7).unwrap();
    let q = m.create_rq(4, 4, &cq, false).unwrap();
    assert_eq!(q.stride, 64);
    let buf = Buf::new(&m, 4096);
    // Entries of 40, 30 and 1000 bytes, then an ended list.
    let mut w = [0u8; 64];
    for (k, (off, len)) in [(0, 40), (100, 30), (200, 1000)].into_iter().enumerate() {
        DataSeg::new_checked(&mut w[k * 16..k * 16 + 16])
            .unwrap()
            .set(mempool::Iova(buf.addr(off)), mempool::Lkey(buf.lkey), len);
    }
    DataSeg::new_checked(&mut w[48..])
        .unwrap()
        .set(mempool::Iova(0), INVALID_LKEY, 0);
    q.buf.write(0, &w);
    q.dbrec
        .store_u32(RCV_DBR, u32::from_ne_bytes(rq_record(1)), Ordering::Release);
    let f = udp_frame(5, 100);
    assert!(peer.send(&f));
    peer.flush();
    h.step();
    let c = poll_cq(&cq, 0).unwrap();
    assert_eq!(cqe(&c).byte_cnt() as usize, f.len());
    let mut got = vec![0u8; f.len()];
    buf.mem.read(0, &mut got[..40]);
    buf.mem.read(100, &mut got[40..70]);
    buf.mem.read(200, &mut got[70..]);
    assert_eq!(got, f);
}

#[test]
fn vlan_stripping_reports_the_tci_and_delivers_the_untagged_frame() {
    let (m, h, mut peer) = world(0);
    let mut rq = Rq::new(&m, 4, 1, 7, true);
    rq.post(4, RX_BUF as u32);
    let f = udp_frame(1, 60);
    let mut tagged = f[..12].to_vec();
    tagged.extend_from_slice(&[0x81, 0x00, 0xa0, 0x07]);
    tagged.extend_from_slice(&f[12..]);
    assert!(peer.send(&tagged));
    peer.flush();
    h.step();
    let c = rq.poll().unwrap();
    let c = cqe(&c);
    assert_eq!(c.vlan(), Some(0xa007));
    assert_eq!(
        c.l4_l3_hdr_type(),
        hdr_type::CVLAN | hdr_type::L3_IPV4 | hdr_type::L4_UDP
    );
    assert_eq!(c.byte_cnt() as usize, f.len());
    assert_eq!(rq.data(0, f.len()), f);
}

#[test]
fn rss_hashes_the_configured_fields_and_picks_the_queue_by_the_low_bits() {
    let (m, h, mut peer) = world(0);
    let mut rqs = [Rq::new(&m, 64, 1, 63, false), Rq::new(&m, 64, 1, 63, false)];
    for r in &mut rqs {
        r.post(64, RX_BUF as u32);
    }
    let key = [
        0x2c, 0xc6, 0x81, 0xd1, 0x5b, 0xdb, 0xf4, 0xf7, 0xfc, 0xa2, 0x83, 0x19, 0xdb, 0x1a, 0x3e,
        0x94, 0x6b, 0x9e, 0x38, 0xd9, 0x2c, 0x9c, 0x03, 0xd1, 0xad, 0x99, 0x44, 0xa7, 0xd9, 0x56,
        0x3d, 0x59, 0x06, 0x3c, 0x25, 0xf3, 0xfc, 0x1f, 0xdc, 0x2a,
    ];
    let fields = RxHashFields::SRC_IPV4
        | RxHashFields::DST_IPV4
        | RxHashFields::SRC_PORT_UDP
        | RxHashFields::DST_PORT_UDP;
    m.set_rss(key, fields, &[rqs[0].q.rqn, rqs[1].q.rqn])
        .unwrap();
    let mut per_queue = [0; 2];
    for sport in 0..32u16 {
        let f = udp_frame(1000 + sport, 20);
        assert!(peer.send(&f));
        peer.flush();
        h.step();
        let mut input = [0u8; 12];
        let n = toeplitz::ipv4_input(
            [10, 0, 0, 1],
            [10, 0, 0, 2],
            Some((1000 + sport, 4791)),
            &mut input,
        );
        let want = toeplitz::hash(&key, &input[..n]);
        let q = (want & 1) as usize;
        let c = rqs[q]
            .poll()
            .expect("the frame on the queue its hash picks");
        assert!(rqs[1 - q].poll().is_none());
        assert_eq!(cqe(&c).rx_hash_res(), want);
        assert_eq!(cqe(&c).rx_hash_type(), hash_type::IPV4 | hash_type::UDP);
        per_queue[q] += 1;
    }
    assert!(per_queue[0] > 0 && per_queue[1] > 0, "{per_queue:?}");
    // A non-IP frame hashes to 0: entry 0.
    let mut arp = udp_frame(1, 20);
    arp[12..14].copy_from_slice(&[0x08, 0x06]);
    assert!(peer.send(&arp));
    peer.flush();
    h.step();
    let c = rqs[0].poll().unwrap();
    assert_eq!((cqe(&c).rx_hash_res(), cqe(&c).rx_hash_type()), (0, 0));
    assert_eq!(cqe(&c).l4_l3_hdr_type(), 0);
    let _ = parse::ETHERTYPE_VLAN;
}

/// The verification key and table of Microsoft's RSS documentation ("Verifying the RSS Hash
/// Calculation"): source, destination (address, port), the hash over the addresses, the
/// hash over addresses and ports. Data from outside this project: the TIR's input order
/// (source address, destination address, source port, destination port) is checked
/// against it, not against our own reading.
const MS_KEY: [u8; 40] = [
    0x6d, 0x5a, 0x56, 0xda, 0x25, 0x5b, 0x0e, 0xc2, 0x41, 0x67, 0x25, 0x3d, 0x43, 0xa3, 0x8f, 0xb0,
    0xd0, 0xca, 0x2b, 0xcb, 0xae, 0x7b, 0x30, 0xb4, 0x77, 0xcb, 0x2d, 0xa3, 0x80, 0x30, 0xf2, 0x0c,
    0x6a, 0x42, 0xb7, 0x3b, 0xbe, 0xac, 0x01, 0xfa,
];
type MsRow = (([u8; 4], u16), ([u8; 4], u16), u32, u32);
const MS_IPV4: [MsRow; 5] = [
    (
        ([66, 9, 149, 187], 2794),
        ([161, 142, 100, 80], 1766),
        0x323e_8fc2,
        0x51cc_c178,
    ),
    (
        ([199, 92, 111, 2], 14230),
        ([65, 69, 140, 83], 4739),
        0xd718_262a,
        0xc626_b0ea,
    ),
    (
        ([24, 19, 198, 95], 12898),
        ([12, 22, 207, 184], 38024),
        0xd2d0_a5de,
        0x5c2b_394a,
    ),
    (
        ([38, 27, 205, 30], 48228),
        ([209, 142, 163, 6], 2217),
        0x8298_9176,
        0xafc7_327f,
    ),
    (
        ([153, 39, 163, 191], 44251),
        ([202, 188, 127, 2], 1303),
        0x5d18_09c5,
        0x10e8_28a2,
    ),
];

/// An IPv4 frame from `src` to `dst`: TCP (6), UDP (17) or an ICMP echo (1).
fn ipv4_frame(proto: u8, src: ([u8; 4], u16), dst: ([u8; 4], u16)) -> Vec<u8> {
    let b = etherparse::PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
        .ipv4(src.0, dst.0, 64);
    let mut f = Vec::new();
    match proto {
        6 => b.tcp(src.1, dst.1, 1, 1000).write(&mut f, &[0; 8]),
        17 => b.udp(src.1, dst.1).write(&mut f, &[0; 8]),
        _ => b.icmpv4_echo_request(1, 1).write(&mut f, &[0; 8]),
    }
    .unwrap();
    f
}

/// One hashing TIR per traffic type (what a port asking for IPv4, TCP and UDP gets): each
/// frame hashes its own 4-tuple (TCP and UDP alike) or, with no ports, its addresses; the
/// values are Microsoft's, and the queue is the hash's low bit.
#[test]
fn per_type_tirs_give_the_microsoft_verification_hashes() {
    let (m, h, mut peer) = world(0);
    let mut rqs = [Rq::new(&m, 64, 1, 63, false), Rq::new(&m, 64, 1, 63, false)];
    for r in &mut rqs {
        r.post(64, RX_BUF as u32);
    }
    let fields = RxHashFields::SRC_IPV4
        | RxHashFields::DST_IPV4
        | RxHashFields::SRC_PORT_TCP
        | RxHashFields::DST_PORT_TCP
        | RxHashFields::SRC_PORT_UDP
        | RxHashFields::DST_PORT_UDP;
    m.set_rss(MS_KEY, fields, &[rqs[0].q.rqn, rqs[1].q.rqn])
        .unwrap();
    for (src, dst, ip_hash, l4_hash) in MS_IPV4 {
        for (proto, want, ty) in [
            (6, l4_hash, hash_type::IPV4 | hash_type::TCP),
            (17, l4_hash, hash_type::IPV4 | hash_type::UDP),
            (1, ip_hash, hash_type::IPV4),
        ] {
            assert!(peer.send(&ipv4_frame(proto, src, dst)));
            peer.flush();
            h.step();
            let q = (want & 1) as usize;
            let c = rqs[q]
                .poll()
                .unwrap_or_else(|| panic!("protocol {proto} {src:?}: not on queue {q}"));
            assert!(rqs[1 - q].poll().is_none());
            assert_eq!(
                (cqe(&c).rx_hash_res(), cqe(&c).rx_hash_type()),
                (want, ty),
                "protocol {proto} {src:?} -> {dst:?}"
            );
        }
    }
    assert_eq!(h.stats().rx_hash_wrong_type, 0);
}

/// TIRs chosen by the port's steering: a frame hashes on the TIR its rule names; one of
/// another type than that TIR hashes (UDP on a TCP TIR) gets hash 0, entry 0, and counts as
/// `rx_hash_wrong_type`. Fields no TIR takes are refused, as the kernel refuses them.
#[test]
fn a_steered_tir_hashes_only_its_own_type_and_counts_the_others() {
    let (m, h, mut peer) = world(0);
    let mut rqs = [Rq::new(&m, 64, 1, 63, false), Rq::new(&m, 64, 1, 63, false)];
    for r in &mut rqs {
        r.post(64, RX_BUF as u32);
    }
    let table = vec![rqs[0].q.rqn, rqs[1].q.rqn];
    let tcp = RxHashFields::SRC_IPV4
        | RxHashFields::DST_IPV4
        | RxHashFields::SRC_PORT_TCP
        | RxHashFields::DST_PORT_TCP;
    // Every frame to the TCP TIR, as one hashing QP with a catch-all rule would have it.
    let steer: pmd::emu::mlx5::Steer = Arc::new(|_: &[u8]| Some(0));
    h.engine()
        .set_tirs(vec![(MS_KEY, tcp, table.clone())], Arc::clone(&steer))
        .unwrap();
    let (src, dst, _, l4_hash) = MS_IPV4[0];
    assert!(peer.send(&ipv4_frame(6, src, dst)));
    assert!(peer.send(&ipv4_frame(17, src, dst)));
    peer.flush();
    h.step();
    let q = (l4_hash & 1) as usize;
    let mut got = Vec::new();
    for (i, r) in rqs.iter_mut().enumerate() {
        while let Some(c) = r.poll() {
            got.push((i, cqe(&c).rx_hash_res(), cqe(&c).rx_hash_type()));
        }
    }
    got.sort();
    let mut want = vec![(q, l4_hash, hash_type::IPV4 | hash_type::TCP), (0, 0, 0)];
    want.sort();
    assert_eq!(got, want);
    assert_eq!(h.stats().rx_hash_wrong_type, 1);

    // create_rss_raw_qp_tir's refusals.
    let both = tcp | RxHashFields::SRC_PORT_UDP;
    let mixed = RxHashFields::SRC_IPV4 | RxHashFields::DST_IPV6;
    for bad in [both, mixed] {
        let e = h
            .engine()
            .set_tirs(vec![(MS_KEY, bad, table.clone())], Arc::clone(&steer))
            .unwrap_err();
        assert!(e.to_string().contains("one address family"), "{e}");
    }
    let e = h
        .engine()
        .set_tirs(
            vec![(MS_KEY, RxHashFields::empty(), table.clone())],
            Arc::clone(&steer),
        )
        .unwrap_err();
    assert!(e.to_string().contains("one-entry table"), "{e}");
    h.engine()
        .set_tirs(vec![(MS_KEY, RxHashFields::empty(), vec![table[1]])], steer)
        .unwrap();
}

#[test]
fn rx_drop_and_link_down_faults_drop_frames_before_the_rq() {
    let (m, h, mut peer) = world(0);
    let mut rq = Rq::new(&m, 16, 1, 15, false);
    rq.post(16, RX_BUF as u32);
    h.set_faults(Faults {
        rx_drop_every: 2,
        ..Faults::default()
    });
    for _ in 0..4 {
        assert!(peer.send(&udp_frame(1, 20)));
        peer.flush();
    }
    h.step();
    assert_eq!((h.stats().rx_frames, h.stats().rx_fault_drops), (2, 2));
    h.set_faults(Faults {
        link_down: true,
        ..Faults::default()
    });
    h.step();
    assert!(peer.send(&udp_frame(1, 20)));
    peer.flush();
    h.step();
    assert_eq!(h.stats().rx_fault_drops, 3);
}

#[test]
fn compressed_sessions_put_minis_at_title_plus_one_and_every_eighth_slot() {
    let (m, h, mut peer) = world(0);
    let mut rq = Rq::new(&m, 16, 1, 31, false);
    rq.post(16, RX_BUF as u32);
    m.set_rx_compression(rq.q.rqn, Some(64)).unwrap();
    let frames: Vec<_> = (0..11).map(|k| udp_frame(1, 20 + k)).collect();
    for f in &frames {
        assert!(peer.send(f));
        peer.flush();
    }
    h.step();
    let title = poll_cq(&rq.q.cq, 0).expect("the title");
    let t = cqe(&title);
    assert_eq!(t.format(), CqeFormat::Compressed);
    assert_eq!(t.opcode(), CqeOpcode::RespSend);
    assert_eq!(t.byte_cnt(), 11);
    assert_eq!(t.wqe_counter(), 0);
    assert_eq!(t.l4_l3_hdr_type(), hdr_type::L3_IPV4 | hdr_type::L4_UDP);
    for (i, f) in frames.iter().enumerate() {
        let (slot, entry) = mini_slot(0, i as u32);
        let mut b = [0u8; 64];
        rq.q.cq.buf.read(slot as usize * 64, &mut b);
        assert_eq!(cqe(&b).mini(entry).byte_cnt() as usize, f.len(), "mini {i}");
        assert_eq!(rq.data(i as u16, f.len()), *f);
    }
    // The holes (slots 2..8) were not written: still INVALID.
    let mut b = [0u8; 64];
    rq.q.cq.buf.read(2 * 64, &mut b);
    assert_eq!(b[63], 0xf0);
    assert_eq!(h.stats().rx_compressed_sessions, 1);
    // The next completion follows the session; a lone completion is a normal CQE.
    set_ci(&rq.q.cq, 11);
    assert!(peer.send(&frames[0]));
    peer.flush();
    h.step();
    let c = poll_cq(&rq.q.cq, 11).unwrap();
    assert_eq!(cqe(&c).format(), CqeFormat::Normal);
    assert_eq!(cqe(&c).wqe_counter(), 11);
}

#[test]
fn compressed_sessions_straddle_the_ring_end_with_the_title_s_owner_bit() {
    let (m, h, mut peer) = world(0);
    let mut rq = Rq::new(&m, 32, 1, 15, false); // 16 CQEs
    rq.post(32, RX_BUF as u32);
    // 12 normal completions first, consumed.
    for k in 0..12 {
        assert!(peer.send(&udp_frame(k, 20)));
        peer.flush();
        h.step();
        assert_eq!(cqe(&rq.poll().unwrap()).format(), CqeFormat::Normal);
    }
    m.set_rx_compression(rq.q.rqn, Some(8)).unwrap();
    for k in 0..10 {
        assert!(peer.send(&udp_frame(1, 30 + k)));
        peer.flush();
    }
    h.step();
    // Session 1: title at 12 (lap 0), 8 completions, its array at 13.
    let t1 = poll_cq(&rq.q.cq, 12).expect("title 1");
    assert_eq!(
        (cqe(&t1).format(), cqe(&t1).byte_cnt()),
        (CqeFormat::Compressed, 8)
    );
    assert_eq!(cqe(&t1).wqe_counter(), 12);
    let mut a = [0u8; 64];
    rq.q.cq.buf.read(13 * 64, &mut a);
    for i in 0..8 {
        assert_eq!(cqe(&a).mini(i).byte_cnt() as usize, 30 + i + 42);
    }
    // Session 2 starts at 20 = slot 4 of lap 1: owner 1; its array at 21 = slot 5.
    set_ci(&rq.q.cq, 20);
    let t2 = poll_cq(&rq.q.cq, 20).expect("title 2, owned by software on lap 1");
    assert!(cqe(&t2).owner());
    assert_eq!((cqe(&t2).byte_cnt(), cqe(&t2).wqe_counter()), (2, 20));
    rq.q.cq.buf.read(5 * 64, &mut a);
    assert_eq!(cqe(&a).mini(0).byte_cnt(), 38 + 42);
    assert_eq!(cqe(&a).mini(1).byte_cnt(), 39 + 42);
    assert_eq!(h.stats().rx_compressed_sessions, 2);
}

/// A receive WQE whose key is not registered: RESP_ERR LOCAL_PROT for the frame that lands
/// on it, the RQ in error: every other posted WQE comes back with WR_FLUSH, in order, and
/// frames are dropped (no usable WQE). RESET restarts the consumer at 0 (frames meanwhile
/// are no-WQE drops); after RDY, record 0 and a fresh posting, frames land from WQE 0.
#[test]
fn a_bad_rx_key_puts_the_rq_in_error_until_reset_and_rdy() {
    let (m, h, mut peer) = world(0);
    let mut rq = Rq::new(&m, 8, 1, 15, false);
    rq.post(2, RX_BUF as u32);
    // WQE 2 names a key the model never registered.
    let mut w = vec![0u8; rq.q.stride as usize];
    DataSeg::new_checked(&mut w[..16]).unwrap().set(
        mempool::Iova(rq.buf.addr(2 * RX_BUF)),
        mempool::Lkey(rq.buf.lkey + 77),
        RX_BUF as u32,
    );
    rq.q.buf.write(2 * rq.q.stride as usize, &w);
    rq.posted += 1;
    rq.post(3, RX_BUF as u32);
    let frames: Vec<_> = (0..4).map(|k| udp_frame(k, 30)).collect();
    for f in &frames {
        assert!(peer.send(f));
        peer.flush();
    }
    h.step();
    for (k, f) in frames[..2].iter().enumerate() {
        let c = rq.poll().unwrap();
        assert_eq!(cqe(&c).opcode(), CqeOpcode::RespSend);
        assert_eq!(rq.data(k as u16, f.len()), *f);
    }
    let e = rq.poll().unwrap();
    assert_eq!(cqe(&e).opcode(), CqeOpcode::RespErr);
    assert_eq!(cqe(&e).syndrome(), Syndrome::LocalProt);
    assert_eq!(
        (cqe(&e).wqe_counter(), cqe(&e).qpn_or_flow_tag()),
        (2, rq.q.rqn)
    );
    // The frame after it found the RQ in error; the next step flushes WQEs 3..6.
    assert!(rq.poll().is_none());
    h.step();
    for k in 3..6u16 {
        let f = rq.poll().expect("a flush for every posted WQE");
        assert_eq!(cqe(&f).opcode(), CqeOpcode::RespErr);
        assert_eq!(cqe(&f).syndrome(), Syndrome::WrFlush);
        assert_eq!(cqe(&f).wqe_counter(), k);
    }
    assert!(rq.poll().is_none());
    let s = h.stats();
    assert_eq!((s.rx_frames, s.rx_prot_errors, s.rx_flushed), (2, 1, 3));
    assert_eq!(s.rx_no_wqe, 1, "the frame after the error");
    // Posting more while in error: flushed too.
    rq.post(1, RX_BUF as u32);
    h.step();
    assert_eq!(cqe(&rq.poll().unwrap()).syndrome(), Syndrome::WrFlush);
    // RESET: no frame lands; the consumer restarts at 0.
    rq.q.state.reset().unwrap();
    assert!(peer.send(&frames[0]));
    peer.flush();
    h.step();
    assert!(rq.poll().is_none());
    assert_eq!(h.stats().rx_no_wqe, 2);
    assert_eq!(h.stats().rq_resets, 1);
    // Record 0, then RDY (only from RESET: a second RDY is refused), then a fresh posting.
    rq.q.dbrec
        .store_u32(RCV_DBR, u32::from_ne_bytes(rq_record(0)), Ordering::Release);
    rq.q.state.ready().unwrap();
    assert!(rq.q.state.ready().is_err(), "RDY → RDY is no transition");
    rq.posted = 0;
    rq.post(8, RX_BUF as u32);
    let again = udp_frame(9, 44);
    assert!(peer.send(&again));
    peer.flush();
    h.step();
    let c = rq.poll().unwrap();
    assert_eq!(cqe(&c).opcode(), CqeOpcode::RespSend);
    assert_eq!(
        cqe(&c).wqe_counter(),
        0,
        "the device's counter restarted at 0"
    );
    assert_eq!(rq.data(0, again.len()), again);
}

/// The `rx_bad_key_every` fault takes the same path as a bad key: every n-th frame that
/// reaches a WQE fails with LOCAL_PROT and the RQ goes to error.
#[test]
fn the_rx_bad_key_fault_fails_every_nth_frame_with_local_prot() {
    let (m, h, mut peer) = world(0);
    let mut rq = Rq::new(&m, 8, 1, 15, false);
    rq.post(8, RX_BUF as u32);
    h.set_faults(Faults {
        rx_bad_key_every: 3,
        ..Faults::default()
    });
    for k in 0..3 {
        assert!(peer.send(&udp_frame(k, 30)));
        peer.flush();
    }
    h.step();
    assert_eq!(cqe(&rq.poll().unwrap()).opcode(), CqeOpcode::RespSend);
    assert_eq!(cqe(&rq.poll().unwrap()).opcode(), CqeOpcode::RespSend);
    let e = rq.poll().unwrap();
    assert_eq!(cqe(&e).syndrome(), Syndrome::LocalProt);
    assert_eq!(cqe(&e).wqe_counter(), 2);
    h.step();
    let mut flushed = 0;
    while let Some(f) = rq.poll() {
        assert_eq!(cqe(&f).syndrome(), Syndrome::WrFlush);
        flushed += 1;
    }
    assert_eq!(flushed, 5);
}

/// SQ state machine: in RESET the device reads nothing, however far the record is; RTS only
/// from RESET; back in RTS the WQE counter is 0. The `tx_bad_key_every` fault fails a pointer
/// segment with LOCAL_PROT like an unregistered key, and `fail_state_changes` refuses state
/// changes (the queue keeps its state).
#[test]
fn sq_reset_stops_the_device_and_rts_resumes_from_wqe_0() {
    let (m, h, mut peer) = world(0);
    let buf = Buf::new(&m, 4096);
    let frame = udp_frame(1, 40);
    buf.mem.write(0, &frame);
    let mut sq = Sq::new(&m, 16, 15);
    assert!(
        sq.q.state.ready().is_err(),
        "RTS → RTS is no transition here"
    );
    sq.q.state.reset().unwrap();
    for _ in 0..3 {
        sq.send(&buf, 0, &frame, 0, CE_ALWAYS, 0);
    }
    sq.ring();
    assert_eq!(h.run_until_idle(5), 0, "an SQ in RESET is not read");
    assert!(recv(&mut peer).is_none());
    // The driver's side of the restart: record 0 in RESET, then RTS, then WQEs from 0.
    sq.pi = 0;
    sq.record();
    sq.q.state.ready().unwrap();
    h.set_faults(Faults {
        tx_bad_key_every: 2,
        ..Faults::default()
    });
    let first = sq.send(&buf, 0, &frame, 0, CE_ALWAYS, 0);
    let second = sq.send(&buf, 0, &frame, 0, CE_FIRST_ERROR, 0);
    sq.ring();
    h.step();
    assert_eq!(first, 0);
    assert_eq!(recv(&mut peer).unwrap(), frame);
    assert!(recv(&mut peer).is_none());
    assert_eq!(cqe(&sq.poll().unwrap()).wqe_counter(), 0);
    let e = sq.poll().unwrap();
    assert_eq!(cqe(&e).syndrome(), Syndrome::LocalProt);
    assert_eq!(cqe(&e).wqe_counter(), second);
    // A refused RESET leaves the SQ in error (a later WQE is flushed).
    h.set_faults(Faults {
        fail_state_changes: 1,
        ..Faults::default()
    });
    assert!(sq.q.state.reset().is_err());
    sq.send(&buf, 0, &frame, 0, CE_FIRST_ERROR, 0);
    sq.ring();
    h.step();
    assert_eq!(cqe(&sq.poll().unwrap()).syndrome(), Syndrome::WrFlush);
    assert_eq!(h.stats().state_change_failures, 1);
    sq.q.state.reset().unwrap();
    sq.pi = 0;
    sq.record();
    sq.q.state.ready().unwrap();
    sq.send(&buf, 0, &frame, 0, CE_ALWAYS, 0);
    sq.ring();
    h.step();
    assert_eq!(recv(&mut peer).unwrap(), frame);
    assert_eq!(cqe(&sq.poll().unwrap()).opcode(), CqeOpcode::Req);
    assert_eq!(h.stats().sq_resets, 2);
}

/// The SQ starts on the UAR write, not on the record (§3.1, §8 item 2): WQEs the record
/// announces go nowhere until the 8-byte write names the last of them.
#[test]
fn the_record_without_the_uar_write_sends_nothing() {
    let (m, h, mut peer) = world(0);
    let buf = Buf::new(&m, 4096);
    let frame = udp_frame(3, 40);
    buf.mem.write(0, &frame);
    let mut sq = Sq::new(&m, 16, 15);
    sq.send(&buf, 0, &frame, 0, CE_FIRST_ERROR, 0);
    sq.send(&buf, 0, &frame, 0, CE_ALWAYS, 0);
    sq.record();
    assert_eq!(
        h.run_until_idle(5),
        0,
        "a record store alone is no doorbell"
    );
    assert!(recv(&mut peer).is_none());
    assert!(sq.poll().is_none());
    assert_eq!(h.stats().tx_wqes, 0);
    sq.uar(sq.doorbell());
    assert_eq!(h.step(), 2);
    assert_eq!(recv(&mut peer).unwrap(), frame);
    assert_eq!(recv(&mut peer).unwrap(), frame);
    assert_eq!(cqe(&sq.poll().unwrap()).wqe_counter(), 1);
    assert_eq!(h.stats().tx_bad_doorbells, 0);
}

/// A UAR write that names a WQE index the ring does not hold there, another QP, or a WQE
/// beyond the record is a device error: counted, nothing sent for it, the SQ not in error;
/// the right write then sends.
#[test]
fn a_uar_write_naming_the_wrong_wqe_or_qp_is_counted_and_sends_nothing() {
    let (m, h, mut peer) = world(0);
    let buf = Buf::new(&m, 4096);
    let frame = udp_frame(4, 40);
    buf.mem.write(0, &frame);
    let mut sq = Sq::new(&m, 16, 15);
    let other = Sq::new(&m, 16, 15);
    sq.send(&buf, 0, &frame, 0, CE_ALWAYS, 0);
    sq.record();
    let good = sq.doorbell();
    let mut wrong_index = good;
    wrong_index[1..3].copy_from_slice(&7u16.to_be_bytes());
    let mut other_qpn = good;
    other_qpn[4..7].copy_from_slice(&other.q.sqn.to_be_bytes()[1..]);
    let mut next = good;
    next[1..3].copy_from_slice(&1u16.to_be_bytes());
    for (n, bad) in [wrong_index, other_qpn, next].into_iter().enumerate() {
        sq.uar(bad);
        h.run_until_idle(5);
        assert_eq!(h.stats().tx_bad_doorbells, n as u64 + 1, "{bad:02x?}");
        assert!(recv(&mut peer).is_none());
        assert!(sq.poll().is_none());
    }
    assert_eq!((h.stats().tx_wqes, h.stats().tx_errors), (0, 0));
    sq.uar(good);
    assert_eq!(h.step(), 1);
    assert_eq!(recv(&mut peer).unwrap(), frame);
    assert_eq!(cqe(&sq.poll().unwrap()).opcode(), CqeOpcode::Req);
    assert_eq!(h.stats().tx_bad_doorbells, 3);
}

/// The driver's side of one striding RQ: WQE `i` posts the `i`-th `wqe_bytes` of one buffer.
struct StridingRq {
    q: RawRq,
    geo: Mprq,
    buf: Buf,
    posted: u32,
    cq_ci: u32,
}

impl StridingRq {
    fn new(m: &Model, wqe_cnt: u32, geo: Mprq, cqe: u32) -> Self {
        let cq = m.create_cq(cqe).unwrap();
        let q = m.create_mprq(wqe_cnt, geo, &cq, false).unwrap();
        assert_eq!((q.stride, q.mprq), (32, Some(geo)));
        let buf = Buf::new(m, q.wqe_cnt as usize * geo.wqe_bytes() as usize);
        Self {
            q,
            geo,
            buf,
            posted: 0,
            cq_ci: 0,
        }
    }

    fn wqe_bytes(&self) -> usize {
        self.geo.wqe_bytes() as usize
    }

    /// Posts `n` WQEs and writes the record.
    fn post(&mut self, n: u32) {
        for _ in 0..n {
            let slot = (self.posted & (self.q.wqe_cnt - 1)) as usize;
            let mut w = [0u8; MPRQ_WQE_BYTES];
            MprqWqe::new_checked(&mut w[..]).unwrap().write(
                mempool::Iova(self.buf.addr(slot * self.wqe_bytes())),
                mempool::Lkey(self.buf.lkey),
                self.wqe_bytes() as u32,
            );
            self.q.buf.write(slot * MPRQ_WQE_BYTES, &w);
            self.posted += 1;
        }
        self.q.dbrec.store_u32(
            RCV_DBR,
            u32::from_ne_bytes(rq_record(self.posted)),
            Ordering::Release,
        );
    }

    fn poll(&mut self) -> Option<[u8; 64]> {
        let c = poll_cq(&self.q.cq, self.cq_ci)?;
        self.cq_ci += 1;
        set_ci(&self.q.cq, self.cq_ci);
        Some(c)
    }

    /// `len` bytes at stride `stride` of WQE `wqe`.
    fn data(&self, wqe: u16, stride: u16, len: usize) -> Vec<u8> {
        let slot = (u32::from(wqe) & (self.q.wqe_cnt - 1)) as usize;
        let mut b = vec![0u8; len];
        self.buf.mem.read(
            slot * self.wqe_bytes() + usize::from(stride) * self.geo.stride_bytes() as usize,
            &mut b,
        );
        b
    }
}

/// A UDP frame of exactly `len` bytes (at least 42).
fn udp_len(sport: u16, len: usize) -> Vec<u8> {
    let f = udp_frame(sport, len - 42);
    assert_eq!(f.len(), len);
    f
}

/// 8 strides of 64 bytes.
const SMALL: Mprq = Mprq {
    log_stride_bytes: 6,
    log_strides: 3,
};

#[test]
fn striding_rq_places_frames_at_stride_boundaries_and_fills_the_rest_of_a_wqe() {
    let (m, h, mut peer) = world(0);
    let mut rq = StridingRq::new(&m, 4, SMALL, 31);
    rq.post(2);
    // (length, first stride, strides): 60, 64 take one; 65, 128 two; 300 five (does not fit
    // the 2 left: a filler for strides 6..8, then stride 0 of WQE 1).
    let frames: Vec<_> = [60, 64, 65, 128, 300]
        .iter()
        .enumerate()
        .map(|(i, &len)| udp_len(i as u16, len))
        .collect();
    for f in &frames {
        assert!(peer.send(f));
        peer.flush();
    }
    h.step();
    let next = |rq: &mut StridingRq, want: &[u8], wqe: u16, stride: u16, strides: u16| {
        let c = rq.poll().expect("a CQE");
        let c = cqe(&c);
        assert_eq!(
            (c.opcode(), c.format()),
            (CqeOpcode::RespSend, CqeFormat::Normal)
        );
        assert_eq!(
            MprqByteCnt::from_word(c.byte_cnt()),
            MprqByteCnt {
                filler: false,
                strides,
                len: want.len() as u16
            }
        );
        assert_eq!((c.wqe_id(), c.wqe_counter()), (wqe, stride));
        assert_eq!(c.l4_l3_hdr_type(), hdr_type::L3_IPV4 | hdr_type::L4_UDP);
        assert_eq!(rq.data(wqe, stride, want.len()), want);
    };
    next(&mut rq, &frames[0], 0, 0, 1);
    next(&mut rq, &frames[1], 0, 1, 1);
    next(&mut rq, &frames[2], 0, 2, 2);
    next(&mut rq, &frames[3], 0, 4, 2);
    let filler = rq.poll().expect("the filler");
    let f = cqe(&filler);
    assert_eq!(f.opcode(), CqeOpcode::RespSend);
    assert_eq!(
        MprqByteCnt::from_word(f.byte_cnt()),
        MprqByteCnt {
            filler: true,
            strides: 2,
            len: 0
        }
    );
    assert_eq!((f.wqe_id(), f.wqe_counter()), (0, 6));
    assert_eq!(f.byte_cnt() >> 31, 1);
    next(&mut rq, &frames[4], 1, 0, 5);
    assert!(rq.poll().is_none());
    let s = h.stats();
    assert_eq!((s.rx_frames, s.rx_fillers, s.rx_no_wqe), (5, 1, 0));
}

#[test]
fn striding_rq_without_a_posted_wqe_drops_and_counts_rx_no_wqe() {
    let (m, h, mut peer) = world(0);
    let mut rq = StridingRq::new(&m, 4, SMALL, 31);
    assert!(peer.send(&udp_len(0, 60)));
    peer.flush();
    h.step();
    assert_eq!(h.stats().rx_no_wqe, 1, "nothing posted yet");
    rq.post(1);
    // Eight one-stride frames fill WQE 0; the ninth finds no WQE.
    for k in 0..9 {
        assert!(peer.send(&udp_len(k, 64)));
        peer.flush();
    }
    h.step();
    for k in 0..8u16 {
        let c = rq.poll().expect("a CQE");
        assert_eq!((cqe(&c).wqe_id(), cqe(&c).wqe_counter()), (0, k));
    }
    assert!(rq.poll().is_none());
    assert_eq!((h.stats().rx_no_wqe, h.stats().rx_frames), (2, 8));
    // Posting again takes the next frame at stride 0 of WQE 1.
    rq.post(1);
    let f = udp_len(20, 100);
    assert!(peer.send(&f));
    peer.flush();
    h.step();
    let c = rq.poll().expect("a CQE");
    assert_eq!((cqe(&c).wqe_id(), cqe(&c).wqe_counter()), (1, 0));
    assert_eq!(rq.data(1, 0, f.len()), f);
    // A frame that does not fit WQE 1's rest closes it with a filler even when no WQE
    // follows; the frame itself is then dropped.
    assert!(peer.send(&udp_len(21, 500)));
    peer.flush();
    h.step();
    let c = rq.poll().expect("the filler");
    assert!(MprqByteCnt::from_word(cqe(&c).byte_cnt()).filler);
    assert_eq!(MprqByteCnt::from_word(cqe(&c).byte_cnt()).strides, 6);
    assert!(rq.poll().is_none());
    assert_eq!((h.stats().rx_no_wqe, h.stats().rx_fillers), (3, 1));
}

#[test]
fn a_frame_longer_than_a_striding_wqe_is_local_length_and_uses_up_the_wqe() {
    let (m, h, mut peer) = world(0);
    let mut rq = StridingRq::new(&m, 4, SMALL, 31);
    rq.post(4);
    let small = udp_len(1, 60);
    assert!(peer.send(&small) && peer.send(&udp_len(2, 600)) && peer.send(&small));
    peer.flush();
    h.step();
    assert_eq!(cqe(&rq.poll().unwrap()).opcode(), CqeOpcode::RespSend);
    let e = rq.poll().unwrap();
    let e = cqe(&e);
    assert_eq!(
        (e.opcode(), e.syndrome()),
        (CqeOpcode::RespErr, Syndrome::LocalLength)
    );
    assert_eq!((e.wqe_id(), e.wqe_counter()), (0, 1));
    assert_eq!(MprqByteCnt::from_word(e.byte_cnt()).strides, 7);
    let c = rq.poll().unwrap();
    assert_eq!((cqe(&c).wqe_id(), cqe(&c).wqe_counter()), (1, 0));
    assert_eq!(h.stats().rx_oversize, 1);
}

#[test]
fn a_striding_geometry_outside_the_caps_is_refused() {
    let (m, _h, _peer) = world(0);
    let cq = m.create_cq(15).unwrap();
    for geo in [
        Mprq {
            log_stride_bytes: 5,
            log_strides: 6,
        },
        Mprq {
            log_stride_bytes: 11,
            log_strides: 17,
        },
    ] {
        let e = m.create_mprq(4, geo, &cq, false).unwrap_err().to_string();
        assert!(e.contains("striding geometry"), "{e}");
    }
    assert!(pmd::emu::mlx5::MPRQ_CAPS.allows(Mprq::DEFAULT));
}

/// Striding-RQ sessions carry CSUM_STRIDX minis (§6.1): stride index in bytes 2–3, the packed
/// `byte_cnt` in 4–7; the title is packet 0's CQE with format 3 and the count. Completions
/// of another flow (another hash, which the minis cannot carry) start a new session.
#[test]
fn striding_rq_sessions_carry_stride_indices_and_break_on_another_hash() {
    let (m, h, mut peer) = world(0);
    let geo = Mprq {
        log_stride_bytes: 6,
        log_strides: 6,
    };
    let mut rq = StridingRq::new(&m, 4, geo, 511);
    rq.post(4);
    let key = pmd::ethdev::RssConfig::default().key;
    let fields = RxHashFields::SRC_IPV4
        | RxHashFields::DST_IPV4
        | RxHashFields::SRC_PORT_UDP
        | RxHashFields::DST_PORT_UDP;
    m.set_rss(key, fields, &[rq.q.rqn]).unwrap();
    m.set_rx_compression(rq.q.rqn, Some(64)).unwrap();
    // 11 frames of flow 7 (1 to 3 strides each), then 3 of flow 8.
    let lens: Vec<usize> = (0..11).map(|k| 60 + k * 17).collect();
    let frames: Vec<_> = lens
        .iter()
        .map(|&l| udp_len(7, l))
        .chain((0..3).map(|k| udp_len(8, 70 + k)))
        .collect();
    for f in &frames {
        assert!(peer.send(f));
        peer.flush();
    }
    h.step();
    let title = poll_cq(&rq.q.cq, 0).expect("the title");
    let t = cqe(&title);
    assert_eq!((t.format(), t.byte_cnt()), (CqeFormat::Compressed, 11));
    assert_eq!((t.wqe_id(), t.wqe_counter()), (0, 0));
    assert_ne!(t.rx_hash_res(), 0);
    let mut stride = 0u16;
    for (i, f) in frames[..11].iter().enumerate() {
        let (slot, entry) = mini_slot(0, i as u32);
        let mut b = [0u8; 64];
        rq.q.cq.buf.read(slot as usize * 64, &mut b);
        let arr = cqe(&b);
        let mini = arr.mini(entry);
        let need = f.len().div_ceil(64) as u16;
        assert_eq!(mini.stride_idx(), stride, "mini {i}");
        assert_eq!(
            MprqByteCnt::from_word(mini.byte_cnt()),
            MprqByteCnt {
                filler: false,
                strides: need,
                len: f.len() as u16
            },
            "mini {i}"
        );
        assert_eq!(rq.data(0, stride, f.len()), *f);
        stride += need;
    }
    // Flow 8's session follows at slot 11, its hash in its own title.
    let t2 = poll_cq(&rq.q.cq, 11).expect("the second title");
    let t2 = cqe(&t2);
    assert_eq!(
        (t2.format(), t2.byte_cnt(), t2.wqe_counter()),
        (CqeFormat::Compressed, 3, stride)
    );
    assert_ne!(t2.rx_hash_res(), t.rx_hash_res());
    assert_eq!(h.stats().rx_compressed_sessions, 2);
}
