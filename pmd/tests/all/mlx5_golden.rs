//! Golden byte vectors for the mlx5 formats, captured from outside our code: rdma-core v44's
//! own inline helpers of `<infiniband/mlx5dv.h>` (`mlx5dv_set_ctrl_seg`, `mlx5dv_set_eth_seg`,
//! `mlx5dv_set_data_seg`, the CQE owner/opcode accessors) called on zero-filled buffers, and,
//! for what rdma-core lacks (eMPW, TSO fields, mini CQEs, RX CQE fields), DPDK's
//! `mlx5_prm.h` structures filled the way its datapath fills them (DPDK 38f72e500b3b,
//! v26.07-4); both references agreed byte for byte where both cover a vector. Only the bytes
//! are kept here. Each test builds the same structure with our views (or our TX queue) and
//! compares.

use mempool::{MbufPool, MbufPoolConfig, OffloadFlags, Registration};
use pmd::ethdev::Burst;
use pmd::hw::mlx5::cqe::{
    csum_ok, hash_type, hdr_type, mini_slot, op_own, Cqe, CqeFields, CqeFormat, CqeOpcode, MiniCqe,
    Syndrome,
};
use pmd::hw::mlx5::doorbell::{cq_set_ci, rq_record, sq_record, uar_write};
use pmd::hw::mlx5::wqe::{
    eth_seg_units, inline_seg_units, CtrlSeg, DataSeg, EthSeg, InlineSeg, MprqByteCnt, MprqWqe,
    CE_ALWAYS, CS_L3, CS_L4,
};
use pmd::hw::mlx5::Opcode;
use pmd::mlx5::{QueueState, RawCq, RawSq, SetupError, TxQueue};
use pmd::sys::DevMem;
use std::sync::Arc;

fn hex(s: &str) -> Vec<u8> {
    let s: String = s
        .lines()
        .map(|l| l.split_once(':').map_or(l, |(_, r)| r))
        .collect::<String>()
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// The first 18 bytes of frame F (V1): two MACs, IPv4 EtherType, the IP header's start.
const F18: [u8; 18] = [
    2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0x08, 0x00, 0x45, 0x00, 0x00, 0x2e,
];
const QPN: u32 = 0xab_cd12;
const LKEY: u32 = 0x0011_2233;
const F_ADDR: u64 = 0x0000_7f00_1234_5666;

/// V1: SEND, one WQEBB, 18 bytes inline, L3+L4 checksums, CE=2.
const V1: &str = "
0000: 0012340a abcd1204 00000008 00000000
0010: 00000000 c0000000 00000000 00120200
0020: 00000002 02000000 00010800 4500002e
0030: 0000002a 00112233 00007f00 12345678";
/// V2a: hardware VLAN insertion (TCI 100) through the Ethernet segment, ds 3.
const V2A: &str = "
0000: 0012340a abcd1203 00000008 00000000
0010: 00000000 c0000000 00000000 80000064
0020: 0000003c 00112233 00007f00 12345666
0030: 00000000 00000000 00000000 00000000";
/// V2b: software VLAN insertion into the 18-byte inline copy; the pointer starts at 14.
const V2B: &str = "
0000: 0012340a abcd1204 00000008 00000000
0010: 00000000 c0000000 00000000 00120200
0020: 00000002 02000000 00018100 00640800
0030: 0000002e 00112233 00007f00 12345674";
/// V3: TSO, mss 1448, a 54-byte header inline, two pointer segments (ds 8, 2 WQEBBs).
const V3: &str = "
0000: 0001000e abcd1208 00000008 00000000
0010: 00000000 c00005a8 00000000 00360200
0020: 00000002 02000000 00010800 45000b78
0030: 1c464000 40060000 c0a80001 c0a80002
0040: 30390050 00000001 00000000 5018ffff
0050: 00000000 00000000 00000000 00000000
0060: 000005a8 00112233 00007f00 12400036
0070: 000005a8 00445566 00007f00 12500000";
/// V4a: eMPW title and three pointer descriptors (60, 60, 64 bytes), ds 5.
const V4A: &str = "
0000: 00020029 abcd1205 00000008 00000000
0010: 00000000 c0000000 00000000 00000000
0020: 0000003c 00112233 00007f00 00010000
0030: 0000003c 00112233 00007f00 00010800
0040: 00000040 00112233 00007f00 00011000";
/// V6: responder CQE: IPv4/UDP hashed (0xdeadbeef), L3+L4 OK, VLAN 100 stripped, 60 bytes,
/// WQE counter 0x0102, owner 1.
const V6: &str = "
0000: 00000000 00000000 00000000 deadbeef
0010: 84000000 00000000 00000000 06290064
0020: 00000000 00000000 00000000 0000003c
0030: 00000000 00000000 00000000 01020021";
/// V7: requester CQE for SEND WQE 0x1234 of SQ 0xabcd12, owner 0.
const V7: &str = "
0000: 00000000 00000000 00000000 00000000
0010: 00000000 00000000 00000000 00000000
0020: 00000000 00000000 00000000 00000000
0030: 00000000 00000000 0aabcd12 12340000";
/// V8: REQ_ERR, vendor syndrome 0x42, syndrome LOCAL_PROT (0x04), WQE 7 (SEND, 0xabcd12).
const V8_PROT: &str = "
0000: 00000000 00000000 00000000 00000000
0010: 00000000 00000000 00000000 00000000
0020: 00000000 00000000 00000000 00000000
0030: 00000000 00004204 0aabcd12 000700d0";
/// V9: basic-layout session of 8: the title (format 3, byte_cnt = 8) ...
const V9_TITLE: &str = "
0000: 00000000 00000000 00000000 00000001
0010: 84000000 00000000 00000000 06280000
0020: 00000000 00000000 00000000 00000008
0030: 00000000 00000000 00000000 0102002c";
/// ... and the mini array at title + 1: hashes 1..8, lengths 60..67.
const V9_ARRAY: &str = "
0000: 00000001 0000003c 00000002 0000003d
0010: 00000003 0000003e 00000004 0000003f
0020: 00000005 00000040 00000006 00000041
0030: 00000007 00000042 00000008 00000043";

/// V11 (from the spec's tables, §4.2 and §5.1, not captured from a reference driver): a
/// striding-RQ WQE posting 64 strides of 2048 bytes (bytes 0–15 zero, the data segment at
/// 16), ...
const V11_WQE: &str = "
0000: 00000000 00000000 00000000 00000000
0010: 00020000 00112233 00007f00 12340000";
/// ... a responder CQE for a 1400-byte packet in 1 stride at stride 12 of WQE 7 (`wqe_id`
/// bytes 2–3, `byte_cnt` strides in bits 29:16, `wqe_counter` = stride index), owner 0, ...
const V11_CQE: &str = "
0000: 00000007 00000000 00000000 00000000
0010: 00000000 00000000 00000000 00000000
0020: 00000000 00000000 00000000 00010578
0030: 00000000 00000000 00000000 000c0020";
/// ... and the filler that closes WQE 7 from stride 13 (51 strides, bit 31 set).
const V11_FILLER: &str = "
0000: 00000007 00000000 00000000 00000000
0010: 00000000 00000000 00000000 00000000
0020: 00000000 00000000 00000000 80330000
0030: 00000000 00000000 00000000 000d0020";

fn ctrl(b: &mut [u8], op: Opcode, idx: u16, ds: u8) {
    CtrlSeg::new_checked(&mut b[..16])
        .unwrap()
        .write(op, 0, idx, QPN, ds, CE_ALWAYS);
}

#[test]
fn v1_send_with_18_inline_bytes_matches_rdma_core() {
    let mut w = [0u8; 64];
    ctrl(&mut w, Opcode::Send, 0x1234, 4);
    EthSeg::new_checked(&mut w[16..32])
        .unwrap()
        .write(CS_L3 | CS_L4, 0, &F18);
    w[32..48].copy_from_slice(&F18[2..]);
    DataSeg::new_checked(&mut w[48..64]).unwrap().set(
        mempool::Iova(F_ADDR + 18),
        mempool::Lkey(LKEY),
        42,
    );
    assert_eq!(w.to_vec(), hex(V1));
    assert_eq!(1 + eth_seg_units(18) + 1, 4);
    // Read back.
    let c = CtrlSeg::new_checked(&w[..]).unwrap();
    assert_eq!(
        (c.opcode(), c.wqe_index(), c.qpn(), c.ds(), c.ce()),
        (Opcode::Send, 0x1234, QPN, 4, 2)
    );
    assert_eq!(uar_write(&w).to_vec(), hex("0012340a abcd1204"));
}

#[test]
fn v2_vlan_insert_command_and_software_tag_match_dpdk() {
    let mut w = [0u8; 64];
    ctrl(&mut w, Opcode::Send, 0x1234, 3);
    EthSeg::new_checked(&mut w[16..32])
        .unwrap()
        .write_vlan_insert(CS_L3 | CS_L4, 100);
    DataSeg::new_checked(&mut w[32..48]).unwrap().set(
        mempool::Iova(F_ADDR),
        mempool::Lkey(LKEY),
        60,
    );
    assert_eq!(w.to_vec(), hex(V2A));
    assert_eq!(
        EthSeg::new_checked(&w[16..]).unwrap().vlan_insert(),
        Some(100)
    );

    let mut tagged = [0u8; 18];
    tagged[..12].copy_from_slice(&F18[..12]);
    tagged[12..16].copy_from_slice(&[0x81, 0, 0, 100]);
    tagged[16..].copy_from_slice(&F18[12..14]);
    let mut w = [0u8; 64];
    ctrl(&mut w, Opcode::Send, 0x1234, 4);
    EthSeg::new_checked(&mut w[16..32])
        .unwrap()
        .write(CS_L3 | CS_L4, 0, &tagged);
    w[32..48].copy_from_slice(&tagged[2..]);
    DataSeg::new_checked(&mut w[48..64]).unwrap().set(
        mempool::Iova(F_ADDR + 14),
        mempool::Lkey(LKEY),
        46,
    );
    assert_eq!(w.to_vec(), hex(V2B));
}

#[test]
fn v3_tso_header_inline_and_two_segments_match_rdma_core() {
    let want = hex(V3);
    let hdr = &want[30..30 + 54];
    let mut w = [0u8; 128];
    ctrl(&mut w, Opcode::Tso, 0x0100, 8);
    EthSeg::new_checked(&mut w[16..32])
        .unwrap()
        .write(CS_L3 | CS_L4, 1448, hdr);
    w[32..32 + 52].copy_from_slice(&hdr[2..]);
    assert_eq!(1 + eth_seg_units(54) + 2, 8);
    DataSeg::new_checked(&mut w[96..112]).unwrap().set(
        mempool::Iova(0x7f00_1240_0036),
        mempool::Lkey(LKEY),
        1448,
    );
    DataSeg::new_checked(&mut w[112..128]).unwrap().set(
        mempool::Iova(0x7f00_1250_0000),
        mempool::Lkey(0x0044_5566),
        1448,
    );
    assert_eq!(w.to_vec(), want);
    let e = EthSeg::new_checked(&w[16..]).unwrap();
    assert_eq!((e.mss(), e.inline_hdr_sz(), e.cs_flags()), (1448, 54, 0xc0));
    assert_eq!(e.inline(), hdr);
}

#[test]
fn v4_empw_title_and_descriptors_match_dpdk() {
    let mut w = [0u8; 80];
    ctrl(&mut w, Opcode::Empw, 0x0200, 5);
    EthSeg::new_checked(&mut w[16..32])
        .unwrap()
        .write(CS_L3 | CS_L4, 0, &[]);
    for (k, (off, len)) in [(0x1_0000u64, 60u32), (0x1_0800, 60), (0x1_1000, 64)]
        .into_iter()
        .enumerate()
    {
        let at = 32 + 16 * k;
        DataSeg::new_checked(&mut w[at..at + 16]).unwrap().set(
            mempool::Iova(0x7f00_0000_0000 + off),
            mempool::Lkey(LKEY),
            len,
        );
    }
    assert_eq!(w.to_vec(), hex(V4A));
    // Inline descriptors: the marker and length, then the bytes (V4b's first one).
    assert_eq!(InlineSeg::header(60).to_be_bytes(), [0x80, 0, 0, 0x3c]);
    assert_eq!(InlineSeg::len(0x8000_003c), Some(60));
    assert_eq!(InlineSeg::len(0x0000_003c), None);
    assert_eq!(inline_seg_units(60), 4);
    assert_eq!(inline_seg_units(64), 5);
}

#[test]
fn v5_doorbell_records_are_big_endian_and_masked() {
    let mut qp = [0u8; 8];
    qp[..4].copy_from_slice(&rq_record(0x42));
    qp[4..].copy_from_slice(&sq_record(0x1234));
    assert_eq!(qp.to_vec(), hex("00000042 00001234"));
    assert_eq!(sq_record(0x12345).to_vec(), hex("00002345"));
    assert_eq!(cq_set_ci(0x1234).to_vec(), hex("00001234"));
    assert_eq!(cq_set_ci(0x0123_4567).to_vec(), hex("00234567"));
}

#[test]
fn v6_v7_v8_cqes_match_rdma_core_and_dpdk() {
    let mut b = [0u8; 64];
    Cqe::new_checked(&mut b[..]).unwrap().write(&CqeFields {
        opcode: 2,
        owner: true,
        rx_hash_res: 0xdead_beef,
        rx_hash_type: hash_type::IPV4 | hash_type::UDP,
        hds_ip_ext: csum_ok::L3 | csum_ok::L4,
        l4_l3_hdr_type: hdr_type::CVLAN | hdr_type::L3_IPV4 | hdr_type::L4_UDP,
        vlan_info: 100,
        byte_cnt: 60,
        wqe_counter: 0x0102,
        ..Default::default()
    });
    assert_eq!(b.to_vec(), hex(V6));
    let want = hex(V6);
    let c = Cqe::new_checked(&want[..]).unwrap();
    assert_eq!(
        (
            c.opcode(),
            c.format(),
            c.owner(),
            c.byte_cnt(),
            c.vlan(),
            c.rx_hash_res()
        ),
        (
            CqeOpcode::RespSend,
            CqeFormat::Normal,
            true,
            60,
            Some(100),
            0xdead_beef
        )
    );

    let mut b = [0u8; 64];
    Cqe::new_checked(&mut b[..]).unwrap().write(&CqeFields {
        opcode: 0,
        sop: 0x0a,
        qpn: QPN,
        wqe_counter: 0x1234,
        ..Default::default()
    });
    assert_eq!(b.to_vec(), hex(V7));

    let mut b = [0u8; 64];
    Cqe::new_checked(&mut b[..]).unwrap().write(&CqeFields {
        opcode: 13,
        sop: 0x0a,
        qpn: QPN,
        wqe_counter: 7,
        syndrome: 0x04,
        vendor_err_synd: 0x42,
        ..Default::default()
    });
    assert_eq!(b.to_vec(), hex(V8_PROT));
    let c = Cqe::new_checked(&b[..]).unwrap();
    assert_eq!(
        (
            c.opcode(),
            c.syndrome(),
            c.wqe_counter(),
            c.sop(),
            c.qpn_or_flow_tag()
        ),
        (CqeOpcode::ReqErr, Syndrome::LocalProt, 7, 0x0a, QPN)
    );
    assert_eq!(op_own(13, 0, false), 0xd0);
}

#[test]
fn v9_compressed_session_title_and_mini_array_match_dpdk() {
    let mut t = [0u8; 64];
    Cqe::new_checked(&mut t[..]).unwrap().write(&CqeFields {
        opcode: 2,
        format: 3,
        rx_hash_res: 1,
        rx_hash_type: hash_type::IPV4 | hash_type::UDP,
        hds_ip_ext: csum_ok::L3 | csum_ok::L4,
        l4_l3_hdr_type: hdr_type::L3_IPV4 | hdr_type::L4_UDP,
        byte_cnt: 8,
        wqe_counter: 0x0102,
        ..Default::default()
    });
    assert_eq!(t.to_vec(), hex(V9_TITLE));
    let mut a = [0u8; 64];
    {
        let mut c = Cqe::new_checked(&mut a[..]).unwrap();
        for i in 0..8u32 {
            c.set_mini(i as usize, i + 1, 60 + i);
        }
    }
    assert_eq!(a.to_vec(), hex(V9_ARRAY));
    // A decompressor's view: the count from the title, each packet from its mini.
    let title = Cqe::new_checked(&t[..]).unwrap();
    assert_eq!(
        (title.format(), title.byte_cnt()),
        (CqeFormat::Compressed, 8)
    );
    let arr = Cqe::new_checked(&a[..]).unwrap();
    for i in 0..8u32 {
        assert_eq!(mini_slot(0, i), (1, i as usize));
        let m = arr.mini(i as usize);
        assert_eq!((m.rx_hash_result(), m.byte_cnt()), (i + 1, 60 + i));
    }
}

#[test]
fn v10_mini_cqe_formats_match_dpdk() {
    let h = hex("11223344 000005ea");
    let m = MiniCqe::new_checked(&h[..]).unwrap();
    assert_eq!((m.rx_hash_result(), m.byte_cnt()), (0x1122_3344, 1514));
    let c = hex("beef0000 000005ea");
    let m = MiniCqe::new_checked(&c[..]).unwrap();
    assert_eq!((m.checksum(), m.byte_cnt()), (0xbeef, 1514));
    let s = hex("28000005 000005ea");
    let m = MiniCqe::new_checked(&s[..]).unwrap();
    assert_eq!((m.stride_idx(), m.byte_cnt()), (5, 1514));
}

#[test]
fn v11_striding_rq_wqe_cqe_and_filler_match_the_spec_tables() {
    let mut w = [0xeeu8; 32];
    MprqWqe::new_checked(&mut w[..]).unwrap().write(
        mempool::Iova(0x7f00_1234_0000),
        mempool::Lkey(LKEY),
        64 * 2048,
    );
    assert_eq!(w.to_vec(), hex(V11_WQE));
    let mut c = [0u8; 64];
    Cqe::new_checked(&mut c[..]).unwrap().write(&CqeFields {
        opcode: 2,
        wqe_id: 7,
        byte_cnt: MprqByteCnt {
            filler: false,
            strides: 1,
            len: 1400,
        }
        .word(),
        wqe_counter: 12,
        ..Default::default()
    });
    assert_eq!(c.to_vec(), hex(V11_CQE));
    let mut f = [0u8; 64];
    Cqe::new_checked(&mut f[..]).unwrap().write(&CqeFields {
        opcode: 2,
        wqe_id: 7,
        byte_cnt: MprqByteCnt {
            filler: true,
            strides: 51,
            len: 0,
        }
        .word(),
        wqe_counter: 13,
        ..Default::default()
    });
    assert_eq!(f.to_vec(), hex(V11_FILLER));
    // A driver's view of the bytes.
    let want = hex(V11_FILLER);
    let v = Cqe::new_checked(&want[..]).unwrap();
    let b = MprqByteCnt::from_word(v.byte_cnt());
    assert_eq!(
        (b.filler, b.strides, b.len, v.wqe_id(), v.wqe_counter()),
        (true, 51, 0, 7, 13)
    );
}

/// A QP whose state never changes: this test sees no error completion.
struct NoStateChange;

impl QueueState for NoStateChange {
    fn reset(&self) -> Result<(), SetupError> {
        Err(SetupError::Device("no state changes in this test".into()))
    }
    fn ready(&self) -> Result<(), SetupError> {
        Err(SetupError::Device("no state changes in this test".into()))
    }
}

/// Our TX queue, with an 18-byte minimum inline and V1's frame, writes V1's WQE (its own
/// addresses and key aside, and CE 1: a single packet asks for no completion).
#[test]
fn the_tx_queue_builds_v1() {
    let pool = MbufPool::new(MbufPoolConfig::new("mlx5-golden", 64)).unwrap();
    let keys = pool
        .register_chunks(|_| Ok(Registration::new(mempool::Lkey(LKEY))))
        .unwrap();
    let sq = Arc::new(DevMem::anon(64 * 64).unwrap());
    let mem = || Arc::new(DevMem::anon(4096).unwrap());
    let cq = mem();
    for i in 0..8 {
        cq.write(i * 64 + 63, &[0xf0]);
    }
    let raw = RawSq {
        buf: Arc::clone(&sq),
        wqe_cnt: 64,
        sqn: QPN,
        dbrec: mem(),
        bf_reg: pmd::sys::Mmio::new(mem()),
        bf_size: 256,
        min_inline: 18,
        cq: RawCq {
            buf: cq,
            cqe_cnt: 8,
            dbrec: mem(),
            cqn: 1,
        },
        owner: Arc::new(()),
        parked: pmd::ethdev::Parked::new(),
        state: Arc::new(NoStateChange),
        kick: None,
    };
    let mut q = TxQueue::new(
        raw,
        64,
        Arc::clone(&pool),
        keys,
        Arc::default(),
        Arc::default(),
    );
    let mut m = mempool::lcache::alloc(&pool).unwrap();
    let mut f = F18.to_vec();
    f.resize(60, 0x5a);
    m.extend_from_slice(&f).unwrap();
    m.set_ol_flags(OffloadFlags::TX_IP_CKSUM | OffloadFlags::TX_UDP_CKSUM);
    let addr = m.data().as_ptr() as u64;
    let mut b = Burst::with_capacity(1);
    b.push(m).unwrap();
    assert_eq!(q.tx_burst(&mut b), 1);
    let mut w = [0u8; 64];
    sq.read(0, &mut w);
    let mut want = hex(V1);
    // WQE index 0 (the queue's first WQE), CE 1, our buffer's address.
    want[1..3].copy_from_slice(&[0, 0]);
    want[11] = 0x04;
    want[56..64].copy_from_slice(&(addr + 18).to_be_bytes());
    assert_eq!(w.to_vec(), want);
    drop(q);
    assert_eq!(pool.in_use(), 0);
}
