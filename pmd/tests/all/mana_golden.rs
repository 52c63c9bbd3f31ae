//! Golden byte vectors for the MANA formats, captured from outside our code: DPDK's net/mana
//! datapath (`gdma.c`, `tx.c`, `rx.c` at DPDK commit 38f72e500b3b, v26.07-4) compiled
//! unchanged and run on zero-filled fake queues; CQEs are DPDK's own `mana.h` structures
//! filled field by field and dumped. Only the bytes DPDK wrote are kept here. Each test builds
//! the same structure with our views and compares, byte for byte.

//!
//! The ring wrap is checked through the same `ring::WorkQueue::post` the driver uses (and
//! read back with the `ring::read_wrapped` the model uses), not through a copy of its own.

use pmd::hw::mana::cqe::{self, hash_type, Cqe, CqeType, OwnerCheck, RxCsum};
use pmd::hw::mana::doorbell;
use pmd::hw::mana::wqe::{
    wqe_size_in_bu, Sge, TxOob, TxOobFields, WqeHeader, LONG_OOB_BYTES, SHORT_OOB_BYTES,
    WQE_HEADER_BYTES,
};
use pmd::hw::mana::BU_BYTES;
use pmd::ring::{read_wrapped, WorkQueue};
use pmd::sys::DevMem;
use std::sync::Arc;

fn hex(s: &str) -> Vec<u8> {
    let s: String = s.chars().filter(|c| !c.is_whitespace()).collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// (a) TX, short OOB, one SGE: sq_id 0x012345, cq_id 0x098765, tx_vp_offset 5; IPv4, IP and
/// UDP checksum requested; SGE {0x1122334455667788, lkey 0xaabbccdd, 60 bytes}; head 0.
const TX_SHORT_1SGE_BYTES: &str =
    "00000000 01020000 54658709 00200105 8877665544332211 ddccbbaa 3c000000";
/// (b) TX, long OOB: VLAN 100 PCP 3 inserted, IPv4, TCP checksum at transport offset 34,
/// CQE suppressed; SGEs {0x1000, 0x11, 14} and {0x2000, 0x22, 46}.
const TX_LONG_VLAN_2SGE_BYTES: &str =
    "00000000 02060000 a5658709 22200105 08004306 00000000 00000000 00000000
     0010000000000000 11000000 0e000000 0020000000000000 22000000 2e000000";
/// (c) TX wrap: 4096-byte ring, head at BU 127; short OOB (IPv4 only), 3 SGEs
/// {0xa000,0x101,20} {0xb000,0x102,30} {0xc000,0x103,40}: the slot at 0xfe0, then offset 0.
const TX_WRAP_AT_FE0_BYTES: &str =
    "00000000 03020000 04658709 00200105 00a0000000000000 01010000 14000000";
const TX_WRAP_AT_0_BYTES: &str =
    "00b0000000000000 02010000 1e000000 00c0000000000000 03010000 28000000";
/// (d) RX WQE: one SGE {0x7f0000001080, lkey 0x1234, 2048}; the OOB slot is not written.
const RX_WQE_BYTES: &str = "00000000 01020000 0000000000000000 80100000007f0000 34120000 00080000";
/// (f1) RX_OKAY CQE: VLAN 100 stripped, IP and UDP checksum OK, hash type UDP_IPV4,
/// ppi[0] {60 bytes, hash 0xdeadbeef}, rx_wqe_offset 0x40, RQ 0x054321, owner 1.
const CQE_RX_OKAY_BYTES: &str =
    "41000000 64100422 3c000000 00000000 efbeadde 00000000 00000000 00000000
     00000000 00000000 00000000 00000000 00000000 00000000 40000000 21430520";
/// (f2) TX_OKAY CQE: tx_wqe_offset 7, SQ 0x012345, owner 2.
const CQE_TX_OKAY_BYTES: &str =
    "60000000 00000000 e0000000 00000000 00000000 00000000 00000000 00000000
     00000000 00000000 00000000 00000000 00000000 00000000 00000000 45230141";
/// (f3) RX_COALESCED_4 CQE: IP and UDP checksum OK, hash type UDP_IPV4, packets
/// {60, hash 1} {1514, hash 2} {64, hash 3}, RQ 0x054321, owner 7.
const CQE_RX_COALESCED_BYTES: &str =
    "42000000 00000422 3c000000 00000000 01000000 ea050000 00000000 02000000
     40000000 00000000 03000000 00000000 00000000 00000000 00000000 214305e0";

#[test]
fn tx_short_oob_one_sge_matches_dpdk() {
    let mut wqe = [0u8; 32];
    WqeHeader::new_checked(&mut wqe[..8])
        .unwrap()
        .init(SHORT_OOB_BYTES, 1);
    let f = TxOobFields {
        outer_ipv4: true,
        ip_csum: true,
        udp_csum: true,
        vcq_num: 0x09_8765,
        sq_id: 0x01_2345,
        vp_offset: 5,
        ..Default::default()
    };
    TxOob::new_checked(&mut wqe[8..16]).unwrap().write(&f);
    Sge::new_checked(&mut wqe[16..32]).unwrap().set(
        mempool::Iova(0x1122_3344_5566_7788),
        mempool::Lkey(0xaabb_ccdd),
        60,
    );
    assert_eq!(wqe.to_vec(), hex(TX_SHORT_1SGE_BYTES));
    assert_eq!(wqe_size_in_bu(SHORT_OOB_BYTES, 1), 1);
    // DPDK rang the SQ doorbell with head 1 BU = 32 bytes.
    assert_eq!(
        doorbell::sq(0x01_2345, 32).to_le_bytes().to_vec(),
        hex("4523010020000000")
    );
}

#[test]
fn tx_long_oob_vlan_two_sges_matches_dpdk() {
    let mut wqe = [0u8; 64];
    WqeHeader::new_checked(&mut wqe[..8])
        .unwrap()
        .init(LONG_OOB_BYTES, 2);
    let f = TxOobFields {
        outer_ipv4: true,
        tcp_csum: true,
        suppress_cqe: true,
        vcq_num: 0x09_8765,
        sq_id: 0x01_2345,
        vp_offset: 5,
        trans_off: 34,
        vlan: Some((3, false, 100)),
        ..Default::default()
    };
    assert_eq!(f.oob_bytes(), LONG_OOB_BYTES);
    TxOob::new_checked(&mut wqe[8..32]).unwrap().write(&f);
    Sge::new_checked(&mut wqe[32..48])
        .unwrap()
        .set(mempool::Iova(0x1000), mempool::Lkey(0x11), 14);
    Sge::new_checked(&mut wqe[48..64])
        .unwrap()
        .set(mempool::Iova(0x2000), mempool::Lkey(0x22), 46);
    assert_eq!(wqe.to_vec(), hex(TX_LONG_VLAN_2SGE_BYTES));
    let o = TxOob::new_checked(&wqe[8..32]).unwrap();
    assert_eq!(o.vlan(), (3, false, 100));
    assert_eq!(o.trans_off(), 34);
}

#[test]
fn tx_wqe_wrapping_the_ring_matches_dpdk() {
    let mem = Arc::new(DevMem::anon(4096).unwrap());
    let mut wq = WorkQueue::new(Arc::clone(&mem), BU_BYTES);
    let mut wqe = [0u8; 64];
    WqeHeader::new_checked(&mut wqe[..8])
        .unwrap()
        .init(SHORT_OOB_BYTES, 3);
    let f = TxOobFields {
        outer_ipv4: true,
        vcq_num: 0x09_8765,
        sq_id: 0x01_2345,
        vp_offset: 5,
        ..Default::default()
    };
    TxOob::new_checked(&mut wqe[8..16]).unwrap().write(&f);
    for (i, (a, k, n)) in [
        (0xa000u64, 0x101u32, 20u32),
        (0xb000, 0x102, 30),
        (0xc000, 0x103, 40),
    ]
    .into_iter()
    .enumerate()
    {
        Sge::new_checked(&mut wqe[16 + 16 * i..32 + 16 * i])
            .unwrap()
            .set(mempool::Iova(a), mempool::Lkey(k), n);
    }
    // Bring the producer to BU 127 (the last slot) the way the driver gets there.
    let head_bu: u32 = 127;
    for _ in 0..head_bu {
        wq.post(&[0u8; BU_BYTES]).unwrap();
    }
    wq.complete(head_bu);
    assert_eq!(
        wq.post(&wqe[..WQE_HEADER_BYTES + SHORT_OOB_BYTES + 48]),
        Some(2)
    );
    let mut ring = vec![0u8; 4096];
    mem.read(0, &mut ring);
    // The model's read of the same WQE, across the end, gives back what was posted.
    let mut back = [0u8; 64];
    read_wrapped(&mem, head_bu * 32, &mut back);
    assert_eq!(back, wqe);
    assert_eq!(ring[0xfe0..].to_vec(), hex(TX_WRAP_AT_FE0_BYTES));
    assert_eq!(ring[..32].to_vec(), hex(TX_WRAP_AT_0_BYTES));
    assert!(ring[32..0xfe0].iter().all(|&b| b == 0));
    // New head 129 BUs; the doorbell carries the unmasked byte position 0x1020.
    let new_head = head_bu + wqe_size_in_bu(SHORT_OOB_BYTES, 3);
    assert_eq!(new_head, 129);
    assert_eq!(wq.head_bytes(), new_head * 32);
    assert_eq!(doorbell::sq(0x01_2345, new_head * 32) >> 32, 0x1020);
}

#[test]
fn rx_wqe_matches_dpdk() {
    let mut wqe = [0u8; 32];
    WqeHeader::new_checked(&mut wqe[..8])
        .unwrap()
        .init(SHORT_OOB_BYTES, 1);
    Sge::new_checked(&mut wqe[16..32]).unwrap().set(
        mempool::Iova(0x7f00_0000_1080),
        mempool::Lkey(0x1234),
        2048,
    );
    assert_eq!(wqe.to_vec(), hex(RX_WQE_BYTES));
    assert_eq!(
        doorbell::rq(0x05_4321, 32).to_le_bytes().to_vec(),
        hex("2143050020000000")
    );
}

#[test]
fn doorbells_match_dpdk() {
    assert_eq!(
        doorbell::rq(0x05_4321, 64 * 32).to_le_bytes().to_vec(),
        hex("2143050000080000")
    );
    assert_eq!(
        doorbell::cq(0x09_8765, 600 % (64 << 3), true)
            .to_le_bytes()
            .to_vec(),
        hex("6587090058000080")
    );
    assert_eq!(
        (
            doorbell::SQ_OFFSET,
            doorbell::RQ_OFFSET,
            doorbell::CQ_OFFSET
        ),
        (0, 1024, 2048)
    );
}

#[test]
fn rx_okay_cqe_reads_and_writes_like_dpdk() {
    let bytes = hex(CQE_RX_OKAY_BYTES);
    let c = Cqe::new_checked(&bytes[..]).unwrap();
    assert_eq!(c.cqe_type(), CqeType::RxOkay);
    assert_eq!(c.client_type(), 1);
    assert_eq!(c.rx_vlan(), Some(100));
    assert_eq!(
        c.rx_csum(),
        RxCsum {
            ip_ok: true,
            udp_ok: true,
            ..Default::default()
        }
    );
    assert_eq!(c.rx_hash_type(), hash_type::UDP_IPV4);
    assert_eq!((c.rx_pkt_len(0), c.rx_pkt_hash(0)), (60, 0xdead_beef));
    assert_eq!(
        (1..4).map(|k| c.rx_pkt_len(k)).collect::<Vec<_>>(),
        [0, 0, 0]
    );
    assert_eq!(c.rx_wqe_offset(), 0x40);
    assert_eq!(
        (c.wq_num(), c.is_sq(), c.owner_bits()),
        (0x05_4321, false, 1)
    );

    let mut ours = [0u8; 64];
    let mut w = Cqe::new_checked(&mut ours[..]).unwrap();
    w.set_header(CqeType::RxOkay, 1, 0);
    w.set_rx_vlan(Some(100));
    w.set_rx_csum(RxCsum {
        ip_ok: true,
        udp_ok: true,
        ..Default::default()
    });
    w.set_rx_hash_type(hash_type::UDP_IPV4);
    w.set_rx_pkt(0, 60, 0xdead_beef);
    w.set_rx_wqe_offset(0x40);
    w.set_info(0x05_4321, false, 1);
    assert_eq!(ours.to_vec(), bytes);
}

#[test]
fn tx_okay_cqe_reads_and_writes_like_dpdk() {
    let bytes = hex(CQE_TX_OKAY_BYTES);
    let c = Cqe::new_checked(&bytes[..]).unwrap();
    assert_eq!(c.cqe_type(), CqeType::TxOkay);
    assert_eq!(
        (c.tx_data_offset(), c.tx_sgl_offset(), c.tx_wqe_offset()),
        (0, 0, 7)
    );
    assert_eq!(
        (c.wq_num(), c.is_sq(), c.owner_bits()),
        (0x01_2345, true, 2)
    );
    let mut ours = [0u8; 64];
    let mut w = Cqe::new_checked(&mut ours[..]).unwrap();
    w.set_header(CqeType::TxOkay, 1, 0);
    w.set_tx(0, 0, 7);
    w.set_info(0x01_2345, true, 2);
    assert_eq!(ours.to_vec(), bytes);
}

#[test]
fn coalesced_cqe_reads_and_writes_like_dpdk() {
    let bytes = hex(CQE_RX_COALESCED_BYTES);
    let c = Cqe::new_checked(&bytes[..]).unwrap();
    assert_eq!(c.cqe_type(), CqeType::RxCoalesced4);
    let pkts: Vec<_> = (0..4)
        .map(|k| (c.rx_pkt_len(k), c.rx_pkt_hash(k)))
        .collect();
    assert_eq!(pkts, [(60, 1), (1514, 2), (64, 3), (0, 0)]);
    assert_eq!(c.rx_vlan(), None);
    assert_eq!(c.owner_bits(), 7);
    let mut ours = [0u8; 64];
    let mut w = Cqe::new_checked(&mut ours[..]).unwrap();
    w.set_header(CqeType::RxCoalesced4, 1, 0);
    w.set_rx_csum(RxCsum {
        ip_ok: true,
        udp_ok: true,
        ..Default::default()
    });
    w.set_rx_hash_type(hash_type::UDP_IPV4);
    for (k, (len, h)) in [(60u16, 1u32), (1514, 2), (64, 3)].into_iter().enumerate() {
        w.set_rx_pkt(k, len, h);
    }
    w.set_info(0x05_4321, false, 7);
    assert_eq!(ours.to_vec(), bytes);
}

/// DPDK's `gdma_poll_completion_queue` on a 4-entry CQ, head starting at 4: slots 0 and 1 of
/// pass 1 are taken (head 6), then nothing; a slot with owner 2 while 1 is expected is an
/// overflow and is not taken.
#[test]
fn owner_bit_polling_agrees_with_dpdk() {
    let owners = [1u8, 1, 0, 0];
    let mut head = 4u32;
    while cqe::check_owner(owners[(head % 4) as usize], head, 4) == OwnerCheck::New {
        head += 1;
    }
    assert_eq!(head, 6);
    assert_eq!(cqe::check_owner(2, 4, 4), OwnerCheck::Overflow);
    assert_eq!(cqe::check_owner(2, 5, 4), OwnerCheck::Overflow);
}
