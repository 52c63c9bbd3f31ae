//! [`PcapTap`]: records what any wire carries to a pcap file.
#![deny(unsafe_code)]

use super::{Wire, WireError, MAX_FRAME};
use std::cell::{Cell, RefCell};
use std::io::Write;
use std::path::{Path, PathBuf};

/// The classic pcap file header (libpcap's savefile format, `pcap_file_header`): magic
/// `0xa1b2c3d4` (microsecond timestamps), version 2.4, no time zone offset, the snap length,
/// link type 1 (Ethernet); little-endian, which readers tell from the magic.
fn file_header() -> [u8; 24] {
    let mut h = [0u8; 24];
    h[0..4].copy_from_slice(&0xa1b2_c3d4u32.to_le_bytes());
    h[4..6].copy_from_slice(&2u16.to_le_bytes());
    h[6..8].copy_from_slice(&4u16.to_le_bytes());
    h[16..20].copy_from_slice(&(MAX_FRAME as u32).to_le_bytes());
    h[20..24].copy_from_slice(&1u32.to_le_bytes());
    h
}

/// Records every frame a wire carries, both directions, to a pcap file (Ethernet link type).
///
/// Records go through a write buffer; reading the tap's [`Wire::stats`] (slow path: a
/// port's statistics) writes it out, so a failure (a full disk) shows there while the port
/// is open, including for the last frames when a tool reads its ports' statistics before
/// closing them. A write that fails leaves the file ending at the last whole record (a
/// reader sees a valid capture) and counts every frame not in it as `pcap_unrecorded`.
pub struct PcapTap {
    inner: Box<dyn Wire>,
    /// The file and its buffer (`None` once finished). A `RefCell` so that [`Wire::stats`]
    /// (`&self`) can write it out; the datapath reaches it through `&mut self` (`get_mut`,
    /// no run-time check).
    out: RefCell<Option<Capture>>,
    path: PathBuf,
    /// Failed writes (at most 1: the capture stops at the first), the OS error of that one
    /// (0 if it had none) and the frames not recorded: reported in [`Wire::stats`] so that a
    /// tool can fail with the reason instead of a log line alone.
    write_errors: Cell<u64>,
    errno: Cell<u64>,
    unrecorded: Cell<u64>,
}

/// Write buffer size: a jumbo frame's record fits many times over (a small buffer would
/// write each one straight through, a system call per frame).
const BUFFER_BYTES: usize = 1 << 20;
/// Smallest record: its header and a 60-byte frame (what the end offsets are sized for).
const MIN_RECORD_BYTES: usize = 16 + 60;

/// A capture file with the records not written to it yet.
struct Capture {
    file: std::fs::File,
    /// Records not yet in the file.
    buf: Vec<u8>,
    /// Where each record in `buf` ends: after a short write, the records wholly in the file.
    ends: Vec<usize>,
    /// Bytes of the file written so far (header and whole records).
    on_disk: u64,
}

impl Capture {
    fn new(file: std::fs::File) -> Self {
        Self {
            file,
            buf: Vec::with_capacity(BUFFER_BYTES),
            ends: Vec::with_capacity(BUFFER_BYTES / MIN_RECORD_BYTES + 1),
            on_disk: file_header().len() as u64,
        }
    }

    /// Appends one record (header and frame); `Err` with the frames lost (this one and any
    /// buffered that did not reach the file) if writing out the buffer to make room failed.
    fn push(&mut self, header: &[u8; 16], frame: &[u8]) -> Result<(), (std::io::Error, u64)> {
        if self.buf.len() + header.len() + frame.len() > self.buf.capacity() {
            self.write_out().map_err(|(e, lost)| (e, lost + 1))?;
        }
        self.buf.extend_from_slice(header);
        self.buf.extend_from_slice(frame);
        self.ends.push(self.buf.len());
        Ok(())
    }

    /// Writes the buffered records to the file. On failure the file is cut back to its last
    /// whole record (a reader then sees a shorter, valid capture) and the error comes back
    /// with the number of records that are not in the file.
    fn write_out(&mut self) -> Result<(), (std::io::Error, u64)> {
        let mut written = 0;
        let result = loop {
            if written == self.buf.len() {
                break Ok(());
            }
            match self.file.write(&self.buf[written..]) {
                Ok(0) => break Err(std::io::ErrorKind::WriteZero.into()),
                Ok(n) => written += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => break Err(e),
            }
        };
        let whole = self.ends.partition_point(|&end| end <= written);
        let kept = if whole == 0 { 0 } else { self.ends[whole - 1] };
        let lost = (self.ends.len() - whole) as u64;
        self.on_disk += kept as u64;
        self.buf.clear();
        self.ends.clear();
        match result {
            Ok(()) => Ok(()),
            Err(e) => {
                if written > kept {
                    // A torn record at the end: cut it off (best effort; the error that
                    // stopped the capture is the one reported).
                    let _ = self.file.set_len(self.on_disk);
                }
                Err((e, lost))
            }
        }
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
        let mut file = std::fs::OpenOptions::new()
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
        file.write_all(&file_header()).map_err(err)?;
        Ok(Self {
            inner,
            out: RefCell::new(Some(Capture::new(file))),
            path: path.into(),
            write_errors: Cell::new(0),
            errno: Cell::new(0),
            unrecorded: Cell::new(0),
        })
    }

    /// Records the first write failure (the capture stops there) and the frames it lost.
    fn fail(&self, e: &std::io::Error, lost: u64) {
        tracing::error!(target: "pmd::emu::wire", path = %self.path.display(), error = %e, "pcap capture stopped: frames from now on are not recorded");
        self.write_errors.set(self.write_errors.get() + 1);
        self.errno.set(
            e.raw_os_error()
                .map_or(0, |n| u64::try_from(n).unwrap_or(0)),
        );
        self.unrecorded.set(self.unrecorded.get() + lost);
    }

    fn failed(&self) -> bool {
        self.write_errors.get() > 0
    }

    fn record(&mut self, frame: &[u8]) {
        if self.failed() {
            self.unrecorded.set(self.unrecorded.get() + 1);
            return;
        }
        let Some(out) = self.out.get_mut().as_mut() else {
            return;
        };
        let ts = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        // The record header (pcap_pkthdr on disk): seconds, microseconds, captured length,
        // original length.
        let len = frame.len() as u32;
        let mut h = [0u8; 16];
        h[0..4].copy_from_slice(&(ts.as_secs() as u32).to_le_bytes());
        h[4..8].copy_from_slice(&ts.subsec_micros().to_le_bytes());
        h[8..12].copy_from_slice(&len.to_le_bytes());
        h[12..16].copy_from_slice(&len.to_le_bytes());
        if let Err((e, lost)) = out.push(&h, frame) {
            self.fail(&e, lost);
        }
    }

    /// Writes out what is buffered (unless the capture already failed); a failure is
    /// recorded as any other.
    fn flush_buffered(&self) {
        if self.failed() {
            return;
        }
        let Ok(mut out) = self.out.try_borrow_mut() else {
            return;
        };
        if let Some(Err((e, lost))) = out.as_mut().map(Capture::write_out) {
            drop(out);
            self.fail(&e, lost);
        }
    }

    /// Writes out and closes the file; later frames are passed on but not recorded.
    ///
    /// # Errors
    /// The write error.
    pub fn finish(&mut self) -> std::io::Result<()> {
        let out = self.out.get_mut().take();
        match out.map(|mut c| c.write_out()) {
            Some(Err((e, lost))) => {
                self.fail(&e, lost);
                Err(e)
            }
            _ => Ok(()),
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
        self.record(&buf[..end]);
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
    /// The inner wire's, then the capture's, after writing out what is buffered:
    /// `pcap_write_errors` (a write failed after the file opened, e.g. the disk filled up:
    /// the capture stopped), `pcap_write_errno` (its OS error number, 0 if none) and
    /// `pcap_unrecorded` (frames passed on that are not in the file: those after the
    /// failure, and those still buffered when it happened). Frames recorded after the last
    /// call are written when the tap is dropped; a failure there is only logged.
    fn stats(&self) -> Vec<crate::ethdev::Xstat> {
        use crate::ethdev::{Loss, Xstat};
        self.flush_buffered();
        let mut v = self.inner.stats();
        // The capture's, not the traffic's: no frame on the wire is lost with them.
        v.extend([
            Xstat::new("pcap_write_errors", self.write_errors.get(), Loss::None),
            Xstat::new("pcap_write_errno", self.errno.get(), Loss::None),
            Xstat::new("pcap_unrecorded", self.unrecorded.get(), Loss::None),
        ]);
        v
    }

    /// The capture's failure, once a write failed. Writes nothing itself: it is asked from
    /// the model's link watch, which an inline engine runs on a polling core; what is
    /// buffered is written when the buffer fills or [`Wire::stats`] is read (the models read
    /// this right after it there).
    fn capture_error(&self) -> Option<i32> {
        self.failed()
            .then(|| i32::try_from(self.errno.get()).unwrap_or(0))
            .or_else(|| self.inner.capture_error())
    }
}

impl Drop for PcapTap {
    fn drop(&mut self) {
        if self.failed() {
            // Already reported, and nothing was buffered since.
            return;
        }
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

    /// Reading the tap's statistics writes out its buffer: the file holds every frame so far
    /// while the tap is still open (so a full disk shows in the statistics, not at close).
    #[test]
    fn stats_write_out_what_is_buffered() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("live.pcap");
        let mut tap = PcapTap::new(Box::new(Loopback::open("t-pcap5").unwrap()), &path).unwrap();
        let _peer = Loopback::open("t-pcap5").unwrap();
        assert!(tap.send(&[7u8; 60]));
        tap.flush();
        assert_eq!(std::fs::read(&path).unwrap().len(), 24, "buffered");
        let _ = tap.stats();
        let data = std::fs::read(&path).unwrap();
        assert_eq!(data.len(), 24 + 16 + 60);
        let mut r = pcap_file::pcap::PcapReader::new(&data[..]).unwrap();
        assert_eq!(r.header().datalink, pcap_file::DataLink::ETHERNET);
        let p = r.next_packet().unwrap().unwrap();
        assert_eq!((&*p.data, p.orig_len), (&[7u8; 60][..], 60));
    }

    #[test]
    fn pcap_tap_records_both_directions() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("cap.pcap");
        let a = Loopback::open("t-pcap").unwrap();
        let mut b = Loopback::open("t-pcap").unwrap();
        let mut tap = PcapTap::new(Box::new(a), &path).unwrap();
        assert!(tap.send(&[1u8; 60]));
        tap.flush();
        assert!(b.send(&[2u8; 70]));
        b.flush();
        let mut buf = [0u8; 128];
        assert_eq!(tap.recv(&mut buf), Some(70));
        // A capture that records reports no failure.
        let stats = tap.stats();
        for name in ["pcap_write_errors", "pcap_write_errno", "pcap_unrecorded"] {
            assert!(
                stats.iter().any(|x| x.name == name && x.value == 0),
                "{name}: {stats:?}"
            );
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
