//! [`PcapTap`]: records what any wire carries to a pcap file.
#![deny(unsafe_code)]

use super::{Wire, WireError, MAX_FRAME};
use std::path::{Path, PathBuf};

/// Records every frame a wire carries, both directions, to a pcap file (Ethernet link type).
pub struct PcapTap {
    inner: Box<dyn Wire>,
    writer: Option<pcap_file::pcap::PcapWriter<WriteThroughFirst>>,
    path: PathBuf,
    failed: bool,
    /// Failed writes (at most 1: the capture stops at the first), the OS error of that one
    /// (0 if it had none) and the frames not recorded since: reported in [`Wire::stats`] so
    /// that a tool can fail with the reason instead of a log line alone.
    write_errors: u64,
    errno: u64,
    unrecorded: u64,
}

/// A buffered file whose first write goes straight to the file: the start of the pcap header,
/// so a file that cannot be written fails when the tap opens, not at the first frame.
struct WriteThroughFirst {
    out: std::io::BufWriter<std::fs::File>,
    first: bool,
}

impl std::io::Write for WriteThroughFirst {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if std::mem::take(&mut self.first) {
            self.out.get_mut().write_all(buf)?;
            return Ok(buf.len());
        }
        self.out.write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

impl std::fmt::Debug for PcapTap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "PcapTap({} -> {})",
            self.inner.describe(),
            self.path.display()
        )
    }
}

impl PcapTap {
    /// Wraps `inner`, writing to a new pcap file at `path`. The file is locked (`flock`) while
    /// the tap records, so a second capture into it, from another port of this process or
    /// from another process, is refused instead of interleaving with this one; it is
    /// truncated only once locked, and the header is written through at once, so a file that
    /// cannot be written (a full disk, `/dev/full`) fails here.
    ///
    /// # Errors
    /// [`WireError::Pcap`] if the file cannot be created, locked or written.
    pub fn new(inner: Box<dyn Wire>, path: &Path) -> Result<Self, WireError> {
        let err = |source| WireError::Pcap {
            path: path.into(),
            source,
        };
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(err)?;
        if !crate::sys::lockfile::flock_exclusive_nonblocking(&file).map_err(err)? {
            return Err(err(std::io::Error::new(
                std::io::ErrorKind::WouldBlock,
                "another port (of this or another process) is recording to this file; give each port its own pcap= file",
            )));
        }
        if file.metadata().map_err(err)?.is_file() {
            file.set_len(0).map_err(err)?;
        }
        let header = pcap_file::pcap::PcapHeader {
            datalink: pcap_file::DataLink::ETHERNET,
            snaplen: MAX_FRAME as u32,
            ..Default::default()
        };
        let writer = pcap_file::pcap::PcapWriter::with_header(
            WriteThroughFirst {
                out: std::io::BufWriter::new(file),
                first: true,
            },
            header,
        )
        .map_err(|e| {
            err(match e {
                pcap_file::PcapError::IoError(io) => io,
                other => std::io::Error::other(other.to_string()),
            })
        })?;
        Ok(Self {
            inner,
            writer: Some(writer),
            path: path.into(),
            failed: false,
            write_errors: 0,
            errno: 0,
            unrecorded: 0,
        })
    }

    fn record(&mut self, frame: &[u8]) {
        if self.failed {
            self.unrecorded += 1;
            return;
        }
        let Some(writer) = self.writer.as_mut() else {
            return;
        };
        let ts = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let pkt = pcap_file::pcap::PcapPacket::new(ts, frame.len() as u32, frame);
        if let Err(e) = writer.write_packet(&pkt) {
            tracing::error!(target: "pmd::emu::wire", path = %self.path.display(), error = %e, "pcap capture stopped: frames from now on are not recorded");
            self.failed = true;
            self.write_errors += 1;
            self.unrecorded += 1;
            if let pcap_file::PcapError::IoError(io) = &e {
                self.errno = io.raw_os_error().map_or(0, |n| n as u64);
            }
        }
    }

    /// Flushes and closes the file; later frames are passed on but not recorded.
    ///
    /// # Errors
    /// The write error.
    pub fn finish(&mut self) -> std::io::Result<()> {
        use std::io::Write;
        match self.writer.take() {
            Some(w) => w.into_writer().flush(),
            None => Ok(()),
        }
    }
}

impl Wire for PcapTap {
    fn send(&mut self, frame: &[u8]) -> bool {
        self.record(frame);
        self.inner.send(frame)
    }
    fn flush(&mut self) {
        self.inner.flush();
    }
    fn holds_arrivals(&self) -> bool {
        self.inner.holds_arrivals()
    }
    fn recv(&mut self, buf: &mut [u8]) -> Option<usize> {
        let n = self.inner.recv(buf)?;
        let end = n.min(buf.len());
        let frame = buf[..end].to_vec();
        self.record(&frame);
        Some(n)
    }
    fn peer_alive(&self) -> bool {
        self.inner.peer_alive()
    }
    fn peer_attached(&self) -> bool {
        self.inner.peer_attached()
    }
    fn describe(&self) -> String {
        format!(
            "{} (capturing to {})",
            self.inner.describe(),
            self.path.display()
        )
    }
    /// The inner wire's, then the capture's: `pcap_write_errors` (a write failed after the
    /// file opened, e.g. the disk filled up: the capture stopped), `pcap_write_errno` (its OS
    /// error number, 0 if none) and `pcap_unrecorded` (frames passed on but not recorded
    /// since). Frames still in the write buffer are written when the tap is dropped; a
    /// failure there is only logged.
    fn stats(&self) -> Vec<(String, u64)> {
        let mut v = self.inner.stats();
        v.extend([
            ("pcap_write_errors".to_string(), self.write_errors),
            ("pcap_write_errno".to_string(), self.errno),
            ("pcap_unrecorded".to_string(), self.unrecorded),
        ]);
        v
    }
}

impl Drop for PcapTap {
    fn drop(&mut self) {
        if let Err(e) = self.finish() {
            tracing::warn!(target: "pmd::emu::wire", path = %self.path.display(), error = %e, "pcap capture incomplete");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::emu::wire::Loopback;

    #[test]
    fn a_file_is_recorded_by_one_tap_at_a_time() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("one.pcap");
        let first = PcapTap::new(Box::new(Loopback::open("t-pcap2").unwrap()), &path).unwrap();
        let e = PcapTap::new(Box::new(Loopback::open("t-pcap2").unwrap()), &path).unwrap_err();
        assert!(
            e.to_string().contains("another port") && e.to_string().contains("one.pcap"),
            "{e}"
        );
        drop(first);
        // Free again once the first tap is gone.
        PcapTap::new(Box::new(Loopback::open("t-pcap3").unwrap()), &path).unwrap();
    }

    #[test]
    fn a_file_that_cannot_be_written_fails_at_open() {
        let e = PcapTap::new(
            Box::new(Loopback::open("t-pcap4").unwrap()),
            Path::new("/dev/full"),
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("/dev/full") && e.to_string().contains("No space left"),
            "{e}"
        );
    }

    #[test]
    fn pcap_tap_records_both_directions() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("cap.pcap");
        let a = Loopback::open("t-pcap").unwrap();
        let mut b = Loopback::open("t-pcap").unwrap();
        let mut tap = PcapTap::new(Box::new(a), &path).unwrap();
        assert!(tap.send(&[1u8; 60]));
        assert!(b.send(&[2u8; 70]));
        let mut buf = [0u8; 128];
        assert_eq!(tap.recv(&mut buf), Some(70));
        // A capture that records reports no failure.
        let stats = tap.stats();
        for name in ["pcap_write_errors", "pcap_write_errno", "pcap_unrecorded"] {
            assert!(stats.contains(&(name.to_string(), 0)), "{name}: {stats:?}");
        }
        drop(tap);
        let data = std::fs::read(&path).unwrap();
        let mut r = pcap_file::pcap::PcapReader::new(&data[..]).unwrap();
        let p1 = r.next_packet().unwrap().unwrap();
        assert_eq!(&*p1.data, &[1u8; 60][..]);
        let p2 = r.next_packet().unwrap().unwrap();
        assert_eq!(&*p2.data, &[2u8; 70][..]);
        assert!(r.next_packet().is_none());
    }
}
