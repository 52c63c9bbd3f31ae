//! The cable's tests: two ends in one process or in two.

use super::*;

fn with_shm_dir<R>(f: impl FnOnce(&Path) -> R) -> R {
    let d = tempfile::tempdir().unwrap();
    f(d.path())
}

#[test]
fn shm_pairs_and_refuses_a_third_end() {
    with_shm_dir(|d| {
        let p = d.join("w");
        let mut a = Shm::open_at("w", &p).unwrap();
        // The second end comes from the same process here; liveness is by pid, and a
        // live holder of end A keeps it. End B is free, so we get it.
        let mut b = Shm::open_at("w", &p).unwrap();
        assert!(a.describe().contains("end A") && b.describe().contains("end B"));
        let mut buf = [0u8; 16];
        assert!(a.send(b"x"));
        a.flush();
        assert_eq!(b.recv(&mut buf), Some(1));
        assert!(a.peer_alive() && b.peer_alive());
        let e = Shm::open_at("w", &p).unwrap_err();
        assert!(matches!(e, WireError::CableFull { .. }), "{e}");
        drop(b);
        assert!(!a.peer_alive(), "peer gone");
        drop(a);
        assert!(!p.exists(), "last end removes the file");
    });
}

/// Frames the far end took before it closed are not stranded, even those it had not
/// published as taken yet (it publishes lazily); those it never took are.
#[test]
fn frames_the_closing_end_took_are_not_stranded() {
    with_shm_dir(|d| {
        let p = d.join("strand");
        let mut a = Shm::open_at("strand", &p).unwrap();
        let mut b = Shm::open_at("strand", &p).unwrap();
        let stranded = |a: &Shm| {
            a.stats()
                .into_iter()
                .find(|x| x.name == TX_STRANDED)
                .map(|x| x.value)
        };
        for i in 0..10u8 {
            assert!(a.send(&[i; 60]));
        }
        a.flush();
        assert_eq!(stranded(&a), Some(0), "a far end is attached");
        let mut buf = [0u8; 64];
        for _ in 0..4 {
            assert_eq!(b.recv(&mut buf), Some(60));
        }
        drop(b);
        assert_eq!(stranded(&a), Some(6), "the 6 end B never took");
    });
}

#[test]
fn shm_peer_attached_once_the_second_end_opens_and_until_it_goes() {
    with_shm_dir(|d| {
        let p = d.join("attach");
        let a = Shm::open_at("attach", &p).unwrap();
        assert!(!a.peer_attached(), "no end B yet");
        let b = Shm::open_at("attach", &p).unwrap();
        assert!(a.peer_attached() && b.peer_attached());
        drop(b);
        assert!(!a.peer_attached(), "end B closed");
        let b = Shm::open_at("attach", &p).unwrap();
        assert!(a.peer_attached() && b.peer_attached(), "end B again");
        std::mem::forget(b);
        // End B's process dies without closing: its pid stays in the slot.
        a.header().set_pid(End::B, DEAD, Ordering::Release);
        assert!(!a.peer_attached(), "end B's process is gone");
    });
}

#[test]
fn shm_refuses_foreign_and_incompatible_files() {
    with_shm_dir(|d| {
        let p = d.join("foreign");
        std::fs::write(&p, vec![0xffu8; 4096]).unwrap();
        let e = Shm::open_at("foreign", &p).unwrap_err();
        assert!(
            e.to_string().contains("not a pmd shared-memory wire"),
            "{e}"
        );

        let p = d.join("v1");
        let a = Shm::open_at("v1", &p).unwrap();
        // A 1.x peer (fixed slots) is refused by its major version.
        a.header().set_major(1);
        a.header().set_minor(0);
        let e = Shm::open_at("v1", &p).unwrap_err();
        assert!(
            e.to_string()
                .contains("peer uses wire format 1.0, this build speaks 2.x"),
            "{e}"
        );
        assert!(
            e.to_string().contains(&format!("rm -f {}", p.display())),
            "{e}"
        );
        a.header().set_major(SHM_MAJOR);
        a.header().set_minor(SHM_MINOR);
        a.header().set_ring_bytes(3 << 20);
        let e = Shm::open_at("v1", &p).unwrap_err();
        assert!(e.to_string().contains("wire format 2.1"), "{e}");
        a.header().set_ring_bytes(SHM_RING_BYTES);
        a.header().set_incompat(0x8);
        let e = Shm::open_at("v1", &p).unwrap_err();
        assert!(e.to_string().contains("requires wire features 0x8"), "{e}");
    });
}

/// A pid no process has (pids stop well below it).
const DEAD: u64 = u32::MAX as u64 - 1;

fn stale(w: &Shm) -> u64 {
    w.stats()
        .iter()
        .find(|x| x.name == "rx_stale")
        .map(|x| x.value)
        .expect("rx_stale is always reported")
}

#[test]
fn shm_stale_file_from_dead_processes_is_taken_over_without_its_frames() {
    with_shm_dir(|d| {
        let p = d.join("stale");
        let mut a = Shm::open_at("stale", &p).unwrap();
        // Pretend both ends belonged to processes that died.
        let hdr = a.header();
        hdr.set_pid(End::A, DEAD, Ordering::Release);
        hdr.set_pid(End::B, DEAD - 1, Ordering::Release);
        assert!(a.tx.push(b"stale frame"));
        a.tx.publish();
        std::mem::forget(a);
        let mut fresh = Shm::open_at("stale", &p).unwrap();
        let mut buf = [0u8; 32];
        assert_eq!(fresh.recv(&mut buf), None);
        assert_eq!(stale(&fresh), 1, "the old frame is counted, not delivered");
        let mut other = Shm::open_at("stale", &p).unwrap();
        assert!(fresh.peer_attached() && other.peer_attached());
        assert_eq!(stale(&other), 0);
        assert!(other.send(b"new"));
        other.flush();
        assert_eq!(fresh.recv(&mut buf), Some(3));
        drop((fresh, other));
        assert!(!p.exists(), "the last end out removes the taken-over file");
    });
}

#[test]
fn a_new_attachment_starts_a_new_generation_without_the_old_frames() {
    with_shm_dir(|d| {
        let p = d.join("gen");
        let mut a = Shm::open_at("gen", &p).unwrap();
        assert_eq!(a.header().generation(Ordering::Acquire), 1);
        // Sent before anyone is at the other end.
        for _ in 0..3 {
            assert!(a.send(&[1u8; 60]));
            a.flush();
        }
        let mut b = Shm::open_at("gen", &p).unwrap();
        let mut buf = [0u8; 64];
        assert_eq!(b.recv(&mut buf), None, "frames sent to nobody are stale");
        assert_eq!(stale(&b), 3);
        assert_eq!(a.header().generation(Ordering::Acquire), 2);
        assert!(a.send(&[2u8; 60]));
        a.flush();
        assert_eq!(b.recv(&mut buf), Some(60));
        assert_eq!(buf[0], 2, "frames sent while attached arrive");
        // End B's process dies without closing (SIGKILL): its pid stays in the slot.
        b.header().set_pid(End::B, DEAD, Ordering::Release);
        std::mem::forget(b);
        assert!(!a.peer_attached());
        for _ in 0..2 {
            assert!(a.send(&[3u8; 60]));
            a.flush();
        }
        let mut b2 = Shm::open_at("gen", &p).unwrap();
        assert!(b2.describe().contains("end B"), "{}", b2.describe());
        assert_eq!(
            b2.recv(&mut buf),
            None,
            "frames sent to the dead holder are stale"
        );
        assert_eq!(stale(&b2), 2);
        assert_eq!(a.header().generation(Ordering::Acquire), 3);
        assert!(a.send(&[4u8; 60]));
        a.flush();
        assert_eq!(b2.recv(&mut buf), Some(60));
        assert_eq!(buf[0], 4);
        // What the dead holder sent while it lived still reaches the live end.
        assert!(b2.send(&[5u8; 60]));
        b2.flush();
        assert_eq!(a.recv(&mut buf), Some(60));
        assert_eq!(stale(&a), 0);
    });
}

#[test]
fn the_last_end_out_removes_the_file_also_when_the_other_died() {
    with_shm_dir(|d| {
        let p = d.join("last");
        let a = Shm::open_at("last", &p).unwrap();
        let b = Shm::open_at("last", &p).unwrap();
        b.header().set_pid(End::B, DEAD, Ordering::Release);
        std::mem::forget(b);
        drop(a);
        assert!(!p.exists(), "a dead peer does not keep the file");
        assert_eq!(
            std::fs::read_dir(d).unwrap().count(),
            0,
            "no temporary file left either"
        );
    });
}

#[test]
fn of_two_ends_closing_at_once_one_removes_the_file() {
    with_shm_dir(|d| {
        let p = d.join("both");
        let a = Shm::open_at("both", &p).unwrap();
        let b = Shm::open_at("both", &p).unwrap();
        // B has marked itself closing and is about to look at A: A, closing now, must
        // not leave the file to B (which may have seen A still live and backed off).
        b.header()
            .set_pid(End::B, CLOSING | u64::from(pid()), Ordering::SeqCst);
        std::mem::forget(b);
        drop(a);
        assert!(!p.exists(), "a closing peer does not keep the file");
        // A live peer does.
        let a = Shm::open_at("both", &p).unwrap();
        let b = Shm::open_at("both", &p).unwrap();
        drop(a);
        assert!(p.exists(), "the live end keeps it");
        drop(b);
        assert!(!p.exists(), "the last end out removes it");
    });
}

#[test]
fn a_half_made_file_is_refused_with_its_name_and_how_to_remove_it() {
    with_shm_dir(|d| {
        // What a run of an older build that died while creating the file left: the
        // full size, no header.
        let p = d.join("pmd-wire-half");
        std::fs::write(&p, vec![0u8; 4 << 20]).unwrap();
        let e = Shm::open_at("half", &p).unwrap_err();
        assert!(matches!(e, WireError::HalfMade { .. }), "{e}");
        let msg = e.to_string();
        assert!(msg.contains(&format!("rm -f {}", p.display())), "{msg}");
        assert!(msg.contains("has no header"), "{msg}");
        std::fs::remove_file(&p).unwrap();
        let a = Shm::open_at("half", &p).unwrap();
        assert!(a.describe().contains("end A"), "works once removed");
    });
}

#[test]
fn a_file_that_cannot_be_made_leaves_nothing_and_falls_back_to_the_next_place() {
    with_shm_dir(|d| {
        // The first place cannot take a file (its directory is a regular file), the
        // second can.
        std::fs::write(d.join("notadir"), b"").unwrap();
        let bad = d.join("notadir").join("pmd-wire-fb");
        let good = d.join("pmd-wire-fb");
        let places = [
            Place {
                path: bad.clone(),
                create: true,
            },
            Place {
                path: good.clone(),
                create: true,
            },
        ];
        let a = Shm::open_places("fb", &places).unwrap();
        assert_eq!(a.path(), good);
        // The other end finds it there too.
        let b = Shm::open_places("fb", &places).unwrap();
        assert!(b.describe().contains("end B"));
        drop((a, b));
        // With no place left to fall back to, the error names the file.
        let e = Shm::open_places("fb", &places[..1]).unwrap_err();
        assert!(e.to_string().contains(&bad.display().to_string()), "{e}");
        let left: Vec<_> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(
            left,
            vec![std::ffi::OsString::from("notadir")],
            "nothing half-made"
        );
    });
}

#[test]
fn a_temporary_file_of_a_dead_creator_is_swept() {
    with_shm_dir(|d| {
        let p = d.join("pmd-wire-sweep");
        let dead = temp_path(&p, DEAD as u32);
        std::fs::write(&dead, b"").unwrap();
        let a = Shm::open_at("sweep", &p).unwrap();
        assert!(!dead.exists(), "the dead creator's temporary file is gone");
        let left: Vec<_> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(
            left,
            vec![std::ffi::OsString::from("pmd-wire-sweep")],
            "ours was linked in and its temporary name removed"
        );
        drop(a);
    });
}

#[test]
fn holders_by_pid_slot() {
    let me = u64::from(pid());
    assert_eq!(holder(0), Holder::Free);
    assert_eq!(holder(me), Holder::Live);
    assert_eq!(holder(DEAD), Holder::Dead);
    assert_eq!(holder(CLOSING | me), Holder::Closing);
    assert_eq!(holder(CLOSING | DEAD), Holder::Dead);
    assert_eq!(holder(ATTACHING | me), Holder::Attaching);
    assert_eq!(holder(ATTACHING | DEAD), Holder::Dead);
    assert_eq!(holder(1 << 40), Holder::Dead, "not a pid");
}

/// A header written out by hand from the layout table in the module docs, with a distinct
/// value in every field: signature "PMDWIRE\0", major 0x0102, minor 0x0304, compat
/// 0x0a0b0c0d, incompat 0x1a1b1c1d, ring_bytes 1024 (0x400), max_frame 9216 (0x2400),
/// pid_a 0x1122334455667788, pid_b 0x99aabbccddeeff00, generation 0x0123456789abcdef.
#[rustfmt::skip]
const HEADER_BYTES: [u8; 128] = [
    // +0 signature
    b'P', b'M', b'D', b'W', b'I', b'R', b'E', 0x00,
    // +8 major, +10 minor
    0x02, 0x01, 0x04, 0x03,
    // +12 compat
    0x0d, 0x0c, 0x0b, 0x0a,
    // +16 incompat
    0x1d, 0x1c, 0x1b, 0x1a,
    // +20 ring_bytes
    0x00, 0x04, 0x00, 0x00,
    // +24 max_frame
    0x00, 0x24, 0x00, 0x00,
    // +28 reserved
                            0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    // +64 pid_a
    0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11,
    // +72 pid_b
    0x00, 0xff, 0xee, 0xdd, 0xcc, 0xbb, 0xaa, 0x99,
    // +80 generation
    0xef, 0xcd, 0xab, 0x89, 0x67, 0x45, 0x23, 0x01,
    // +88 reserved
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
];

fn header_mem() -> DevMem {
    DevMem::anon(Header::LEN).unwrap()
}

fn header_bytes(mem: &DevMem) -> [u8; 128] {
    let mut b = [0u8; 128];
    mem.read(0, &mut b);
    b
}

#[test]
fn header_setters_write_the_documented_layout() {
    let mem = header_mem();
    let h = Header::new_checked(&mem).unwrap();
    h.set_major(0x0102);
    h.set_minor(0x0304);
    h.set_compat(0x0a0b_0c0d);
    h.set_incompat(0x1a1b_1c1d);
    h.set_ring_bytes(1024);
    h.set_max_frame(9216);
    h.set_pid(End::A, 0x1122_3344_5566_7788, Ordering::Relaxed);
    h.set_pid(End::B, 0x99aa_bbcc_ddee_ff00, Ordering::Relaxed);
    h.set_generation(0x0123_4567_89ab_cdef, Ordering::Relaxed);
    h.set_signature(SHM_SIGNATURE);
    assert_eq!(header_bytes(&mem), HEADER_BYTES);
}

#[test]
fn header_getters_read_the_documented_layout() {
    let mem = header_mem();
    mem.write(0, &HEADER_BYTES);
    let h = Header::new_checked(&mem).unwrap();
    assert_eq!(h.signature(), *b"PMDWIRE\0");
    assert_eq!((h.major(), h.minor()), (0x0102, 0x0304));
    assert_eq!((h.compat(), h.incompat()), (0x0a0b_0c0d, 0x1a1b_1c1d));
    assert_eq!((h.ring_bytes(), h.max_frame()), (1024, 9216));
    assert_eq!(h.pid(End::A, Ordering::Relaxed), 0x1122_3344_5566_7788);
    assert_eq!(h.pid(End::B, Ordering::Relaxed), 0x99aa_bbcc_ddee_ff00);
    assert_eq!(h.generation(Ordering::Relaxed), 0x0123_4567_89ab_cdef);
}

#[test]
fn header_needs_a_whole_header() {
    let short = DevMem::anon(Header::LEN - 1).unwrap();
    assert!(Header::new_checked(&short).is_none());
}

#[test]
fn a_new_wire_file_starts_with_the_version_2_1_header() {
    with_shm_dir(|d| {
        let p = d.join("golden");
        let a = Shm::open_at("golden", &p).unwrap();
        let file = std::fs::read(&p).unwrap();
        // Written by hand from the layout table: version 2.1, no features, rings of
        // 8 MiB (0x00800000) of records, frames up to 9208 bytes (0x23f8), end A held by
        // this process, end B free, generation 1, reserved bytes zero.
        let mut want = [0u8; 128];
        want[0..8].copy_from_slice(b"PMDWIRE\0");
        want[8..10].copy_from_slice(&[0x02, 0x00]);
        want[10..12].copy_from_slice(&[0x01, 0x00]);
        want[20..24].copy_from_slice(&[0x00, 0x00, 0x80, 0x00]);
        want[24..28].copy_from_slice(&[0xf8, 0x23, 0x00, 0x00]);
        want[64..72].copy_from_slice(&u64::from(std::process::id()).to_le_bytes());
        want[80..88].copy_from_slice(&[0x01, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(file[..128], want);
        assert_eq!(file.len() % (2 << 20), 0, "whole 2 MiB pages");
        drop(a);
    });
}

proptest::proptest! {
    #[test]
    fn header_fields_round_trip_without_touching_their_neighbours(
        major: u16, minor: u16, compat: u32, incompat: u32,
        ring: u32, max_frame: u32, pid_a: u64, pid_b: u64, generation: u64, sig: [u8; 8],
    ) {
        let mem = header_mem();
        mem.fill(0, Header::LEN, 0xa5);
        let h = Header::new_checked(&mem).unwrap();
        h.set_signature(sig);
        h.set_major(major);
        h.set_minor(minor);
        h.set_compat(compat);
        h.set_incompat(incompat);
        h.set_ring_bytes(ring);
        h.set_max_frame(max_frame);
        h.set_pid(End::A, pid_a, Ordering::Relaxed);
        h.set_pid(End::B, pid_b, Ordering::Relaxed);
        h.set_generation(generation, Ordering::Relaxed);
        proptest::prop_assert_eq!(h.signature(), sig);
        proptest::prop_assert_eq!((h.major(), h.minor()), (major, minor));
        proptest::prop_assert_eq!((h.compat(), h.incompat()), (compat, incompat));
        proptest::prop_assert_eq!((h.ring_bytes(), h.max_frame()), (ring, max_frame));
        proptest::prop_assert_eq!(h.pid(End::A, Ordering::Relaxed), pid_a);
        proptest::prop_assert_eq!(h.pid(End::B, Ordering::Relaxed), pid_b);
        proptest::prop_assert_eq!(h.generation(Ordering::Relaxed), generation);
        let bytes = header_bytes(&mem);
        proptest::prop_assert!(bytes[28..64].iter().chain(&bytes[88..128]).all(|b| *b == 0xa5),
            "reserved bytes untouched");
    }
}
