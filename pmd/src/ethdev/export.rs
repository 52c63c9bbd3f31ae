//! Queue pairs a port hands to another process: a secondary (see `pmd::mp`) polls a queue
//! pair the primary's port created, as DPDK's net/mana secondaries do.
//!
//! The primary's port creates the pair's rings in shared files (through the driver's queue
//! allocator) and does not build or fill its queues; it writes a description of the pair
//! (which files hold which ring, the queue ids, the memory keys of the pool) to
//! `port<P>.queue<Q>.export` in a directory the secondary knows (the file prefix's runtime
//! directory). The secondary maps the files, builds the driver's queues over them and posts
//! its own receive buffers, from the same shared mbuf pool.
//!
//! The description crosses a trust boundary (a file another process wrote): every line is
//! parsed strictly and every value checked by the driver that imports it.
#![deny(unsafe_code)]

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Which queue pairs of a port go to other processes, and where their descriptions go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportConfig {
    /// The queue pairs (each an RX and a TX queue of the same index).
    pub queues: Vec<u16>,
    /// Where the rings' files and the descriptions are written (tmpfs or hugetlbfs).
    pub dir: PathBuf,
}

/// One shared file of an exported queue pair.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Area {
    /// What it holds, in the driver's words (e.g. `sq`, `rx_cq`, `db_page`).
    pub role: String,
    /// The file.
    pub path: PathBuf,
    /// Where in the file they start (a doorbell record within a page of them).
    pub offset: u64,
    /// Bytes of it the queue uses.
    pub len: usize,
}

/// The description of an exported queue pair.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct QueueExport {
    /// The driver that made it (`mana`); only that driver can import it.
    pub driver: String,
    /// The port.
    pub port: u16,
    /// The queue pair.
    pub queue: u16,
    /// The primary's pid (for messages).
    pub pid: u32,
    /// Descriptors per RX queue.
    pub rx_ring_size: u16,
    /// Descriptors per TX queue.
    pub tx_ring_size: u16,
    /// The RX offloads the port was configured with (`RxOffloads` bits).
    pub rx_offloads: u64,
    /// The mbuf pool the queues use (shared by the primary).
    pub pool: String,
    /// The memory key of each of the pool's chunks, for this port's device.
    pub keys: Vec<u32>,
    /// The shared files.
    pub areas: Vec<Area>,
    /// The driver's numbers (queue ids, CQ sizes, ...).
    pub values: Vec<(String, u64)>,
}

/// Why a pair served by a device model on the polling threads cannot be exported.
pub const NEEDS_ENGINE_THREAD: &str = "the device model serves this port on the polling \
    threads (engine=inline); a queue another process polls needs the model's own thread \
    (engine=thread)";

/// The area `role` of `len` bytes at `location` (the shared file a ring or record is in,
/// and where in it: `DevMem::shared_location`).
///
/// # Errors
/// The memory is in no shared file (the queue allocator was not a shared one).
pub fn area(role: &str, location: Option<(&Path, u64)>, len: usize) -> Result<Area, String> {
    let (path, offset) = location.ok_or_else(|| {
        format!("its {role} is not in a shared file (the queue allocator must be shared)")
    })?;
    Ok(Area {
        role: role.to_string(),
        path: path.to_owned(),
        offset,
        len,
    })
}

/// The driver's queue pair `(tx, rx)` at `i` for export: the TX half is taken out of
/// `raw_tx` (which must have a queue `i`: the pair is an RX and a TX queue of one index).
///
/// # Errors
/// [`crate::ethdev::PortError::BadConfig`] when there is no TX queue `i`.
pub fn take_tx<T>(
    raw_tx: &mut [Option<T>],
    i: usize,
    tx_queues: u16,
) -> Result<T, crate::ethdev::PortError> {
    raw_tx
        .get_mut(i)
        .and_then(Option::take)
        .ok_or_else(|| crate::ethdev::PortError::BadConfig {
            what: "exported queue pair",
            requested: format!("queue {i}"),
            allowed: format!("queues below {tx_queues} (the tx queues)"),
        })
}

/// The port's MAC address as a description value (`value mac N`: the six bytes,
/// big-endian), which every driver's description carries.
pub fn mac_value(mac: crate::net::MacAddr) -> u64 {
    mac.0.iter().fold(0u64, |v, &b| v << 8 | u64::from(b))
}

/// The MAC address a description's `mac` value holds.
pub fn mac_of(v: u64) -> crate::net::MacAddr {
    let b = v.to_be_bytes();
    crate::net::MacAddr([b[2], b[3], b[4], b[5], b[6], b[7]])
}

/// Longest description accepted.
const MAX_TEXT: usize = 64 << 10;

impl QueueExport {
    /// The description's file name in the export directory.
    pub fn file_name(port: u16, queue: u16) -> String {
        format!("port{port}.queue{queue}.export")
    }

    /// The description, as the text written to its file.
    pub fn to_text(&self) -> String {
        let mut t = String::new();
        let _ = writeln!(t, "pmd-queue-export 2");
        let _ = writeln!(t, "driver {}", self.driver);
        let _ = writeln!(t, "port {}", self.port);
        let _ = writeln!(t, "queue {}", self.queue);
        let _ = writeln!(t, "pid {}", self.pid);
        let _ = writeln!(t, "rx_ring_size {}", self.rx_ring_size);
        let _ = writeln!(t, "tx_ring_size {}", self.tx_ring_size);
        let _ = writeln!(t, "rx_offloads {}", self.rx_offloads);
        let _ = writeln!(t, "pool {}", self.pool);
        let keys: Vec<String> = self.keys.iter().map(u32::to_string).collect();
        let _ = writeln!(t, "keys {}", keys.join(" "));
        for a in &self.areas {
            if a.offset == 0 {
                let _ = writeln!(t, "area {} {} {}", a.role, a.len, a.path.display());
            } else {
                let _ = writeln!(
                    t,
                    "area {} {}@{} {}",
                    a.role,
                    a.len,
                    a.offset,
                    a.path.display()
                );
            }
        }
        for (k, v) in &self.values {
            let _ = writeln!(t, "value {k} {v}");
        }
        t
    }

    /// Reads a description.
    ///
    /// # Errors
    /// What is wrong, naming the line.
    pub fn parse(text: &str) -> Result<Self, String> {
        if text.len() > MAX_TEXT {
            return Err(format!("{} bytes, at most {MAX_TEXT}", text.len()));
        }
        let mut lines = text.lines().enumerate();
        match lines.next() {
            Some((_, "pmd-queue-export 2")) => {}
            Some((_, l)) => {
                return Err(format!(
                    "not a queue export of this version (first line '{}')",
                    l.chars().take(40).collect::<String>()
                ))
            }
            None => return Err("empty".into()),
        }
        let mut e = QueueExport::default();
        let mut seen = Vec::new();
        for (n, line) in lines {
            let at = |why: &str| format!("line {}: {why}", n + 1);
            if line.chars().any(|c| c.is_control()) {
                return Err(at("control characters"));
            }
            let (key, rest) = line.split_once(' ').ok_or_else(|| at("no value"))?;
            let num = |what: &str| -> Result<u64, String> {
                rest.parse::<u64>()
                    .map_err(|_| at(&format!("{what} '{rest}' is not a number")))
            };
            let small = |what: &str| -> Result<u16, String> {
                u16::try_from(num(what)?).map_err(|_| at(&format!("{what} {rest} is too large")))
            };
            match key {
                "area" => {
                    let mut f = rest.splitn(3, ' ');
                    let (Some(role), Some(len), Some(path)) = (f.next(), f.next(), f.next()) else {
                        return Err(at("an area is 'area ROLE LEN[@OFFSET] PATH'"));
                    };
                    let (len, offset) = match len.split_once('@') {
                        Some((l, o)) => (
                            l,
                            o.parse::<u64>()
                                .ok()
                                .filter(|&o| o > 0)
                                .ok_or_else(|| at("bad area offset"))?,
                        ),
                        None => (len, 0),
                    };
                    let len = len
                        .parse::<usize>()
                        .ok()
                        .filter(|&l| l > 0)
                        .ok_or_else(|| at("bad area length"))?;
                    if offset.checked_add(len as u64).is_none() {
                        return Err(at("bad area offset"));
                    }
                    if !path.starts_with('/') || role.is_empty() {
                        return Err(at("an area's path must be absolute"));
                    }
                    if e.areas.iter().any(|a| a.role == role) {
                        return Err(at(&format!("area {role} given twice")));
                    }
                    e.areas.push(Area {
                        role: role.to_string(),
                        path: PathBuf::from(path),
                        offset,
                        len,
                    });
                    continue;
                }
                "value" => {
                    let (k, v) = rest.split_once(' ').ok_or_else(|| at("'value NAME N'"))?;
                    let v = v
                        .parse::<u64>()
                        .map_err(|_| at(&format!("value {k} '{v}' is not a number")))?;
                    if e.values.iter().any(|(x, _)| x == k) {
                        return Err(at(&format!("value {k} given twice")));
                    }
                    e.values.push((k.to_string(), v));
                    continue;
                }
                _ => {}
            }
            if seen.contains(&key) {
                return Err(at(&format!("{key} given twice")));
            }
            seen.push(key);
            match key {
                "driver" => e.driver = rest.to_string(),
                "port" => e.port = small("port")?,
                "queue" => e.queue = small("queue")?,
                "pid" => {
                    e.pid = u32::try_from(num("pid")?).map_err(|_| at("pid too large"))?;
                }
                "rx_ring_size" => e.rx_ring_size = small("rx_ring_size")?,
                "tx_ring_size" => e.tx_ring_size = small("tx_ring_size")?,
                "rx_offloads" => e.rx_offloads = num("rx_offloads")?,
                "pool" => e.pool = rest.to_string(),
                "keys" => {
                    e.keys = rest
                        .split(' ')
                        .filter(|k| !k.is_empty())
                        .map(|k| k.parse::<u32>().map_err(|_| at(&format!("key '{k}'"))))
                        .collect::<Result<_, _>>()?;
                }
                other => return Err(at(&format!("unknown field '{other}'"))),
            }
        }
        for need in [
            "driver",
            "port",
            "queue",
            "rx_ring_size",
            "tx_ring_size",
            "pool",
            "keys",
        ] {
            if !seen.contains(&need) {
                return Err(format!("no {need}"));
            }
        }
        Ok(e)
    }

    /// Writes the description to `dir` (replacing an older one).
    ///
    /// # Errors
    /// The write failed.
    pub fn write_to(&self, dir: &Path) -> std::io::Result<PathBuf> {
        let path = dir.join(Self::file_name(self.port, self.queue));
        let tmp = dir.join(format!(".{}.tmp", Self::file_name(self.port, self.queue)));
        std::fs::write(&tmp, self.to_text())?;
        std::fs::rename(&tmp, &path)?;
        Ok(path)
    }

    /// The marker a process leaves next to a description when it attaches, so that no
    /// second process attaches to rings that hold the first one's state.
    pub fn used_marker(dir: &Path, port: u16, queue: u16) -> PathBuf {
        dir.join(format!("{}.used", Self::file_name(port, queue)))
    }

    /// Marks the pair as taken by this process.
    ///
    /// # Errors
    /// Another process took it since it was exported (naming it), or the marker could not
    /// be written.
    pub fn mark_used(&self, dir: &Path) -> Result<(), String> {
        let marker = Self::used_marker(dir, self.port, self.queue);
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&marker)
        {
            Ok(mut f) => {
                use std::io::Write as _;
                let _ = writeln!(f, "{}", std::process::id());
                Ok(())
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let who = std::fs::read_to_string(&marker)
                    .ok()
                    .and_then(|s| s.trim().parse::<u32>().ok())
                    .map_or_else(|| "another process".to_string(), |p| format!("process {p}"));
                Err(format!(
                    "{who} attached to port {} queue pair {} since the primary exported it, and \
                     its rings hold that process's state: the primary rebuilds the pair \
                     (Port::rebuild_queues) before another process may attach",
                    self.port, self.queue
                ))
            }
            Err(e) => Err(format!("{}: {e}", marker.display())),
        }
    }

    /// Reads the description of `port`'s queue pair `queue` from `dir`.
    ///
    /// # Errors
    /// Unreadable, or [`QueueExport::parse`]'s error, naming the file.
    pub fn read_from(dir: &Path, port: u16, queue: u16) -> Result<Self, String> {
        let path = dir.join(Self::file_name(port, queue));
        let text = std::fs::read_to_string(&path).map_err(|e| {
            format!(
                "{}: {e} (does the primary export port {port} queue {queue}?)",
                path.display()
            )
        })?;
        let e = Self::parse(&text).map_err(|why| format!("{}: {why}", path.display()))?;
        // Only files of the export directory: a description names nothing else to map.
        for a in &e.areas {
            let inside = a.path.parent() == Some(dir)
                && a.path
                    .file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n != ".." && n != "." && !n.is_empty());
            if !inside {
                return Err(format!(
                    "{}: area {} is {}, outside the export directory {}",
                    path.display(),
                    a.role,
                    a.path.display(),
                    dir.display()
                ));
            }
        }
        if (e.port, e.queue) != (port, queue) {
            return Err(format!(
                "{} describes port {} queue {}",
                path.display(),
                e.port,
                e.queue
            ));
        }
        Ok(e)
    }

    /// The area `role`.
    ///
    /// # Errors
    /// It is missing.
    pub fn area(&self, role: &str) -> Result<&Area, String> {
        self.areas
            .iter()
            .find(|a| a.role == role)
            .ok_or_else(|| format!("no area {role}"))
    }

    /// What every driver checks first when it imports a description: that `driver` made
    /// it, that its queues use `pool` (the primary's, attached here), ring sizes that are
    /// powers of two of at least `min_desc`, keys of the pool's chunks and known RX
    /// offloads. Returns the keys and the offloads.
    ///
    /// # Errors
    /// The first of these that does not hold.
    pub fn check_common(
        &self,
        driver: &str,
        pool: &mempool::MbufPool,
        min_desc: u16,
    ) -> Result<(mempool::ChunkKeys, crate::ethdev::RxOffloads), String> {
        if self.driver != driver {
            return Err(format!("it is a {} queue, not a {driver} one", self.driver));
        }
        if self.pool != pool.name() {
            return Err(format!(
                "its queues use pool '{}', not '{}' (attach to the primary's pool)",
                self.pool,
                pool.name()
            ));
        }
        for (what, n) in [("rx", self.rx_ring_size), ("tx", self.tx_ring_size)] {
            if !n.is_power_of_two() || n < min_desc {
                return Err(format!("{what} ring of {n} descriptors"));
            }
        }
        let keys: Vec<mempool::Lkey> = self.keys.iter().map(|&k| mempool::Lkey(k)).collect();
        let keys = pool.keys_from(&keys).map_err(|err| err.to_string())?;
        let rx_offloads = u32::try_from(self.rx_offloads)
            .ok()
            .and_then(crate::ethdev::RxOffloads::from_bits)
            .ok_or_else(|| format!("unknown rx offloads {:#x}", self.rx_offloads))?;
        Ok((keys, rx_offloads))
    }

    /// The value `name`.
    ///
    /// # Errors
    /// It is missing.
    pub fn value(&self, name: &str) -> Result<u64, String> {
        self.values
            .iter()
            .find(|(k, _)| k == name)
            .map(|&(_, v)| v)
            .ok_or_else(|| format!("no value {name}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> QueueExport {
        QueueExport {
            driver: "mana".into(),
            port: 3,
            queue: 1,
            pid: 42,
            rx_ring_size: 256,
            tx_ring_size: 512,
            rx_offloads: 5,
            pool: "p".into(),
            keys: vec![7, 8],
            areas: vec![
                Area {
                    role: "sq".into(),
                    path: "/dev/shm/x y".into(),
                    offset: 0,
                    len: 8192,
                },
                Area {
                    role: "dbrec".into(),
                    path: "/dev/shm/d@b".into(),
                    offset: 64,
                    len: 8,
                },
            ],
            values: vec![("sq_id".into(), 9)],
        }
    }

    #[test]
    fn a_description_reads_back_as_written() {
        let e = sample();
        assert_eq!(QueueExport::parse(&e.to_text()).unwrap(), e);
        assert_eq!(e.area("sq").unwrap().len, 8192);
        assert!(e.to_text().contains("area dbrec 8@64 /dev/shm/d@b\n"));
        assert_eq!(e.value("sq_id").unwrap(), 9);
        assert!(e.value("cq_id").is_err());
    }

    #[test]
    fn bad_descriptions_are_refused_naming_the_line() {
        let t = sample().to_text();
        for (bad, why) in [
            (t.replace("port 3", "port 70000"), "too large"),
            (
                t.replace("pmd-queue-export 2", "pmd-queue-export 1"),
                "version",
            ),
            (t.replace("port 3\n", ""), "no port"),
            (t.replace("area sq 8192 /", "area sq 8192 "), "absolute"),
            (t.replace("8@64", "8@x"), "bad area offset"),
            (t.replace("8@64", "8@0"), "bad area offset"),
            (
                t.replace("8@64", "8@18446744073709551615"),
                "bad area offset",
            ),
            (t.replace("8@64", "0@64"), "bad area length"),
            (t.replace("keys 7 8", "keys 7 x"), "key 'x'"),
            (format!("{t}queue 2\n"), "given twice"),
            (format!("{t}value sq_id 3\n"), "given twice"),
            (format!("{t}colour blue\n"), "unknown field"),
            (format!("{t}value x\u{7}y 1\n"), "control"),
        ] {
            let err = QueueExport::parse(&bad).unwrap_err();
            assert!(err.contains(why), "{why}: {err}");
        }
    }

    #[test]
    fn a_description_names_only_files_of_its_directory() {
        let dir = tempfile::tempdir().unwrap();
        let mut e = sample();
        e.areas[0].path = dir.path().join("ring");
        e.areas[1].path = dir.path().join("records");
        e.write_to(dir.path()).unwrap();
        assert_eq!(QueueExport::read_from(dir.path(), 3, 1).unwrap(), e);
        e.areas[0].path = "/etc/passwd".into();
        e.write_to(dir.path()).unwrap();
        let err = QueueExport::read_from(dir.path(), 3, 1).unwrap_err();
        assert!(err.contains("outside the export directory"), "{err}");
        let err = QueueExport::read_from(dir.path(), 3, 2).unwrap_err();
        assert!(
            err.contains("does the primary export port 3 queue 2"),
            "{err}"
        );
    }
}
