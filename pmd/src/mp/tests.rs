use super::protocol::{
    DecodeError, MemInfo, Msg, PortInfo, Refusal, MAX_PORTS, NEXT_FREE, VERSION,
};
use super::*;
use proptest::prelude::*;
use std::time::Duration;

fn primary(dir: &tempfile::TempDir) -> Primary {
    let p = Primary::start(&MpConfig::new("t").with_dir(dir.path())).unwrap();
    p.publish(0, "emu-mana:wire=loop:a", 4, &[0]);
    p.publish(1, "emu-mana:wire=loop:b", 2, &[]);
    p
}

fn attach(p: &Primary) -> Secondary {
    Secondary::attach_at(p.socket_path(), "t", "test").unwrap()
}

/// Waits for the first event `want` accepts, failing after 5 s.
fn wait_event(p: &Primary, want: impl Fn(&MpEvent) -> bool) -> MpEvent {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while std::time::Instant::now() < deadline {
        if let Some(e) = p.next_event(Duration::from_millis(50)) {
            if want(&e) {
                return e;
            }
        }
    }
    panic!("no such event within 5 s");
}

#[test]
fn a_secondary_sees_the_ports_and_claims_queues_that_are_free() {
    let dir = tempfile::tempdir().unwrap();
    let p = primary(&dir);
    let mut s = attach(&p);
    assert_eq!(s.primary_pid(), Some(std::process::id()));
    assert_eq!(
        s.ports(),
        [
            PortInfo {
                id: 0,
                queues: 4,
                name: "emu-mana:wire=loop:a".into()
            },
            PortInfo {
                id: 1,
                queues: 2,
                name: "emu-mana:wire=loop:b".into()
            }
        ]
    );
    // Queue 0 is the primary's: the next free one is 1.
    assert_eq!(s.claim(0, None).unwrap(), 1);
    assert_eq!(s.claim(0, Some(3)).unwrap(), 3);
    let me = std::process::id();
    assert_eq!(
        p.owners(0).unwrap(),
        [
            Owner::Primary,
            Owner::Secondary(me),
            Owner::Free,
            Owner::Secondary(me)
        ]
    );
    // Refusals name the reason; nothing changes.
    let refused = |r: Result<u16, MpError>| match r {
        Err(MpError::Refused { why, .. }) => why,
        other => panic!("{other:?}"),
    };
    assert_eq!(refused(s.claim(0, Some(0))), Refusal::Taken(0));
    // Claiming again a queue this secondary holds grants it again (with the port's current
    // device descriptor): nothing changes.
    assert_eq!(s.claim(0, Some(1)).unwrap(), 1);
    assert_eq!(s.held().iter().filter(|h| **h == (0, 1)).count(), 1);
    assert_eq!(refused(s.claim(0, Some(4))), Refusal::NoSuchQueue);
    assert_eq!(refused(s.claim(7, None)), Refusal::NoSuchPort);
    let mut other = attach(&p);
    assert_eq!(other.claim(0, None).unwrap(), 2);
    assert_eq!(refused(other.claim(0, None)), Refusal::NoneFree);
    match other.release(0, 1) {
        Err(MpError::Refused { why, .. }) => assert_eq!(why, Refusal::NotYours),
        r => panic!("{r:?}"),
    }
    let msg = MpError::Refused {
        port: 0,
        queue: 1,
        why: Refusal::Taken(42),
    }
    .to_string();
    assert_eq!(msg, "port 0 queue 1: process 42 holds that queue");
    s.release(0, 1).unwrap();
    assert_eq!(s.held(), [(0, 3)]);
    assert_eq!(other.claim(0, Some(1)).unwrap(), 1);
}

#[test]
fn a_secondary_leaving_gives_its_queues_back_and_the_primary_hears_why() {
    let dir = tempfile::tempdir().unwrap();
    let p = primary(&dir);
    let mut s = attach(&p);
    s.claim(1, None).unwrap();
    s.claim(1, None).unwrap();
    drop(s);
    let e = wait_event(&p, |e| matches!(e, MpEvent::Detached { .. }));
    assert_eq!(
        e,
        MpEvent::Detached {
            pid: std::process::id(),
            clean: true
        }
    );
    assert_eq!(p.owners(1).unwrap(), [Owner::Free, Owner::Free]);
    let released: Vec<_> = p
        .events()
        .into_iter()
        .chain([])
        .filter(|e| matches!(e, MpEvent::Released { .. }))
        .collect();
    // Both were reported before the detach (already read above), so none remain.
    assert!(released.is_empty(), "{released:?}");
}

#[test]
fn a_connection_that_closes_without_goodbye_counts_as_exited() {
    let dir = tempfile::tempdir().unwrap();
    let p = primary(&dir);
    let conn = crate::sys::seqpacket::SeqConn::connect(p.socket_path()).unwrap();
    conn.send(&Msg::Hello { app: "raw".into() }.encode())
        .unwrap();
    let mut buf = [0u8; 4096];
    let (n, _) = conn.recv(&mut buf).unwrap();
    assert!(matches!(Msg::decode(&buf[..n]), Ok(Msg::Welcome { .. })));
    conn.send(&Msg::Claim { port: 0, queue: 2 }.encode())
        .unwrap();
    let (n, _) = conn.recv(&mut buf).unwrap();
    assert_eq!(
        Msg::decode(&buf[..n]).unwrap(),
        Msg::Granted {
            port: 0,
            queue: 2,
            device_gen: 0
        }
    );
    drop(conn);
    let e = wait_event(&p, |e| matches!(e, MpEvent::Released { .. }));
    assert_eq!(
        e,
        MpEvent::Released {
            pid: std::process::id(),
            port: 0,
            queue: 2,
            why: ReleaseWhy::Exited
        }
    );
    assert_eq!(p.owners(0).unwrap()[2], Owner::Free);
}

#[test]
fn bad_records_cut_that_secondary_off_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let p = primary(&dir);
    let mut good = attach(&p);
    good.claim(0, Some(1)).unwrap();
    let mut buf = [0u8; 4096];
    let records: Vec<Vec<u8>> = vec![
        b"GET / HTTP/1.1\r\n".to_vec(),
        Msg::Claim { port: 0, queue: 2 }.encode(), // before its hello
        {
            let mut r = Msg::Hello { app: "x".into() }.encode();
            r.push(0); // trailing byte
            r
        },
    ];
    for rec in records {
        let conn = crate::sys::seqpacket::SeqConn::connect(p.socket_path()).unwrap();
        conn.set_timeouts(Some(Duration::from_secs(5)), None)
            .unwrap();
        conn.send(&rec).unwrap();
        // The primary closes the connection without granting anything.
        assert_eq!(conn.recv(&mut buf).unwrap().0, 0, "{rec:?}");
    }
    // A secondary of another version hears which version the primary speaks.
    let conn = crate::sys::seqpacket::SeqConn::connect(p.socket_path()).unwrap();
    conn.set_timeouts(Some(Duration::from_secs(5)), None)
        .unwrap();
    let mut hello = Msg::Hello { app: "old".into() }.encode();
    hello[2] = VERSION + 1;
    conn.send(&hello).unwrap();
    let (n, _) = conn.recv(&mut buf).unwrap();
    assert_eq!(
        Msg::decode(&buf[..n]).unwrap(),
        Msg::Refused {
            port: 0,
            queue: 0,
            why: Refusal::Version(VERSION)
        }
    );
    // The good secondary kept its queue and goes on.
    assert_eq!(
        p.owners(0).unwrap()[1],
        Owner::Secondary(std::process::id())
    );
    assert_eq!(good.claim(0, None).unwrap(), 2);
    assert!(good.primary_gone().is_none());
}

#[test]
fn the_primary_stopping_tells_its_secondaries_why() {
    let dir = tempfile::tempdir().unwrap();
    let p = primary(&dir);
    let mut s = attach(&p);
    s.claim(0, None).unwrap();
    assert_eq!(s.primary_gone(), None);
    p.shutdown("SIGINT");
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while s.primary_gone().is_none() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(s.primary_gone().as_deref(), Some("SIGINT"));
    assert!(matches!(s.claim(0, None), Err(MpError::Stopped(r)) if r == "SIGINT"));
    // The socket file went with it: a new secondary finds no primary.
    let err = Secondary::attach_at(&dir.path().join(SOCKET_NAME), "t", "late").unwrap_err();
    assert!(matches!(err, MpError::NoPrimary { .. }), "{err}");
    assert!(err.to_string().contains("start the primary first"), "{err}");
}

#[test]
fn a_second_primary_on_a_prefix_is_refused_with_the_first_ones_pid() {
    let dir = tempfile::tempdir().unwrap();
    let _p = primary(&dir);
    let err = Primary::start(&MpConfig::new("t").with_dir(dir.path())).unwrap_err();
    assert!(
        matches!(err, MpError::PrimaryRunning { pid: Some(pid), .. } if pid == std::process::id()),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains("already runs with file prefix 't'"),
        "{err}"
    );
}

#[test]
fn a_socket_left_by_a_dead_primary_says_gone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(SOCKET_NAME);
    // A bound socket nobody listens on: what a killed primary leaves.
    use nix::sys::socket::{bind, socket, AddressFamily, SockFlag, SockType, UnixAddr};
    use std::os::fd::AsRawFd;
    let left = socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::empty(),
        None,
    )
    .unwrap();
    bind(left.as_raw_fd(), &UnixAddr::new(&path).unwrap()).unwrap();
    let err = Secondary::attach_at(&path, "t", "s").unwrap_err();
    assert!(matches!(err, MpError::PrimaryGone { .. }), "{err}");
    // A new primary takes the place over.
    let p = Primary::start(&MpConfig::new("t").with_dir(dir.path())).unwrap();
    p.publish(0, "x", 1, &[]);
    assert_eq!(attach(&p).ports().len(), 1);
}

#[test]
fn bad_prefixes_are_refused() {
    for bad in ["", ".", "..", "a/b"] {
        assert!(matches!(
            Secondary::attach(bad, "s"),
            Err(MpError::BadPrefix(_))
        ));
        assert!(matches!(
            Primary::start(&MpConfig::new(bad)),
            Err(MpError::BadPrefix(_))
        ));
    }
}

#[test]
fn decode_names_what_is_wrong() {
    let ok = Msg::Claim { port: 1, queue: 2 }.encode();
    assert_eq!(Msg::decode(&ok[..5]), Err(DecodeError::Short("port")));
    let mut m = ok.clone();
    m[0] = b'X';
    assert!(matches!(Msg::decode(&m), Err(DecodeError::Magic(_))));
    let mut m = ok.clone();
    m[3] = 99;
    assert_eq!(Msg::decode(&m), Err(DecodeError::Kind(99)));
    let rel = Msg::Release {
        port: 0,
        queue: NEXT_FREE,
    }
    .encode();
    assert_eq!(Msg::decode(&rel), Err(DecodeError::Field("queue")));
    assert_eq!(
        Msg::decode(&vec![0u8; protocol::MAX_RECORD + 1]),
        Err(DecodeError::TooLong(protocol::MAX_RECORD + 1))
    );
    // A name with a control character, written by hand (encode would replace it).
    let mut h = vec![b'P', b'M', VERSION, 1, 2, 0];
    h.extend_from_slice(b"a\n");
    assert_eq!(Msg::decode(&h), Err(DecodeError::Text("application name")));
    // Two ports with one id.
    let w = Msg::Welcome {
        memory: vec![],
        ports: vec![
            PortInfo {
                id: 3,
                queues: 1,
                name: "a".into(),
            },
            PortInfo {
                id: 3,
                queues: 1,
                name: "b".into(),
            },
        ],
    }
    .encode();
    assert_eq!(Msg::decode(&w), Err(DecodeError::Field("port id (twice)")));
}

fn any_text(max: usize) -> impl Strategy<Value = String> {
    proptest::collection::vec(
        any::<char>().prop_filter("printable", |c| !c.is_control()),
        0..max,
    )
    .prop_map(|v| v.into_iter().collect::<String>())
    .prop_filter("fits", move |s| s.len() <= max)
}

fn any_refusal() -> impl Strategy<Value = Refusal> {
    prop_oneof![
        any::<u8>().prop_map(Refusal::Version),
        Just(Refusal::NoSuchPort),
        Just(Refusal::NoSuchQueue),
        any::<u32>().prop_map(Refusal::Taken),
        Just(Refusal::NoneFree),
        Just(Refusal::NotYours),
        Just(Refusal::TooMany),
    ]
}

fn any_msg() -> impl Strategy<Value = Msg> {
    let port_ = (0u16..NEXT_FREE - 1, 1u16..NEXT_FREE - 1, any_text(20))
        .prop_map(|(id, queues, name)| PortInfo { id, queues, name });
    let mem = (
        any_text(64),
        any_text(100),
        1u64..u64::MAX / 2,
        1u64..u64::MAX / 2,
        any::<bool>(),
    )
        .prop_map(|(name, path, addr, len, pool)| MemInfo {
            kind: if pool {
                MemKind::MbufPool
            } else {
                MemKind::Region
            },
            name,
            path: format!("/{path}"),
            addr,
            len,
        });
    let port = (0u16..NEXT_FREE - 1, 1u16..NEXT_FREE - 1, any_text(20))
        .prop_map(|(id, queues, name)| PortInfo { id, queues, name });
    prop_oneof![
        any_text(64).prop_map(|app| Msg::Hello { app }),
        (any::<u16>(), any::<u16>()).prop_map(|(port, queue)| Msg::Claim { port, queue }),
        (any::<u16>(), 0..NEXT_FREE).prop_map(|(port, queue)| Msg::Release { port, queue }),
        Just(Msg::Bye),
        proptest::collection::vec(port, 0..MAX_PORTS).prop_map(|mut ports| {
            let mut seen = std::collections::HashSet::new();
            ports.retain(|p| seen.insert(p.id));
            Msg::Welcome {
                ports,
                memory: vec![],
            }
        }),
        (
            proptest::collection::vec(port_, 0..4),
            proptest::collection::vec(mem, 0..protocol::MAX_MEMORY)
        )
            .prop_map(|(mut ports, memory)| {
                let mut seen = std::collections::HashSet::new();
                ports.retain(|p: &PortInfo| seen.insert(p.id));
                Msg::Welcome { ports, memory }
            }),
        (any::<u16>(), 0..NEXT_FREE, any::<u64>()).prop_map(|(port, queue, device_gen)| {
            Msg::Granted {
                port,
                queue,
                device_gen,
            }
        }),
        (any::<u16>(), 0..NEXT_FREE).prop_map(|(port, queue)| Msg::Released { port, queue }),
        (any::<u16>(), any::<u16>(), any_refusal()).prop_map(|(port, queue, why)| Msg::Refused {
            port,
            queue,
            why
        }),
        (any_text(256), any::<bool>())
            .prop_map(|(reason, closed)| Msg::Shutdown { reason, closed }),
    ]
}

proptest! {
    #[test]
    fn every_message_round_trips(m in any_msg()) {
        let rec = m.encode();
        prop_assert!(rec.len() <= protocol::MAX_RECORD);
        prop_assert_eq!(Msg::decode(&rec), Ok(m));
    }

    #[test]
    fn any_record_decodes_or_fails_without_panic(rec in proptest::collection::vec(any::<u8>(), 0..300)) {
        if let Ok(m) = Msg::decode(&rec) {
            // Whatever decodes encodes back to the same bytes.
            prop_assert_eq!(m.encode(), rec);
        }
    }
}

fn shared_region(tag: &str) -> mempool::Region {
    let dir = if std::path::Path::new("/dev/shm").is_dir() {
        std::path::PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    let path = dir.join(format!("pmd-mp-{tag}-{}", std::process::id()));
    mempool::Region::new(
        1 << 16,
        &mempool::RegionOptions::with_policy(mempool::PagePolicy::Normal).shared_file(path),
    )
    .unwrap()
}

#[test]
fn a_secondary_whose_mapping_address_is_taken_is_refused_with_the_address() {
    let dir = tempfile::tempdir().unwrap();
    let p = primary(&dir);
    let region = shared_region("taken");
    p.share_memory("pool0", &region).unwrap();
    // In this process the primary's own mapping holds the address.
    let err = Secondary::attach_at(p.socket_path(), "t", "s").unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, MpError::Memory { .. }), "{msg}");
    assert!(
        msg.starts_with("shared memory 'pool0': cannot map"),
        "{msg}"
    );
    assert!(msg.contains(&format!("{:#x}", region.addr())), "{msg}");
    // Private memory cannot be shared.
    let private = mempool::Region::new(4096, &mempool::RegionOptions::default()).unwrap();
    let err = p.share_memory("private", &private).unwrap_err();
    assert!(err.to_string().contains("no shared file"), "{err}");
}

#[test]
fn the_largest_welcome_fits_a_record() {
    let ports = (0..protocol::MAX_PORTS as u16)
        .map(|id| PortInfo {
            id,
            queues: 16,
            name: "p".repeat(protocol::MAX_NAME),
        })
        .collect();
    let memory = (0..protocol::MAX_MEMORY as u64)
        .map(|i| MemInfo {
            kind: MemKind::MbufPool,
            name: "m".repeat(protocol::MAX_NAME),
            path: format!("/{}", "d".repeat(protocol::MAX_PATH - 1)),
            addr: 0x7f00_0000_0000 + (i << 30),
            len: 1 << 30,
        })
        .collect();
    let w = Msg::Welcome { ports, memory };
    let rec = w.encode();
    assert!(rec.len() <= protocol::MAX_RECORD, "{} bytes", rec.len());
    assert_eq!(Msg::decode(&rec), Ok(w));
}

#[test]
fn a_holder_whose_pid_is_unknown_is_not_called_the_primary() {
    let why = Refusal::Taken(protocol::UNKNOWN_PID).to_string();
    assert_eq!(why, "another secondary holds that queue");
}

/// The device descriptor a primary publishes for a port reaches a secondary with the grant
/// of one of its queue pairs (`SCM_RIGHTS`): the same open file, so that what the secondary
/// maps from it is what the primary's device uses. A port without one gives none; an
/// unpublished port is refused.
#[test]
fn a_ports_device_descriptor_goes_with_each_grant() {
    use std::io::{Read, Seek, Write};
    use std::os::fd::AsFd;
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let p = primary(&dir);
    let mut dev = tempfile::tempfile().unwrap();
    dev.write_all(b"doorbell page").unwrap();
    p.publish_device(0, dev.as_fd(), 3).unwrap();
    assert!(
        p.publish_device(0, dev.as_fd(), 0).is_err(),
        "generation 0 means none"
    );
    let err = p.publish_device(7, dev.as_fd(), 1).unwrap_err();
    assert!(err.to_string().contains("port 7"), "{err}");
    assert!(err.to_string().contains("not published"), "{err}");

    let mut s = attach(&p);
    assert!(s.device(0).is_none(), "nothing before a grant");
    s.claim(0, None).unwrap();
    s.claim(1, None).unwrap();
    assert!(s.device(1).is_none(), "port 1 published no descriptor");
    let got = s
        .device(0)
        .expect("port 0's descriptor came with the grant");
    assert_eq!(got.generation, 3);
    let mut f = std::fs::File::from(got.fd.try_clone_to_owned().unwrap());
    let (a, b) = (f.metadata().unwrap(), dev.metadata().unwrap());
    assert_eq!((a.dev(), a.ino()), (b.dev(), b.ino()), "the same file");
    let mut text = String::new();
    f.rewind().unwrap();
    f.read_to_string(&mut text).unwrap();
    assert_eq!(text, "doorbell page");
}
