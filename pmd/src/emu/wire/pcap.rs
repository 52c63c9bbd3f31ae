//! [`PcapTap`]: records what any wire carries to a pcap file.
#![deny(unsafe_code)]

use super::{Wire, WireError, MAX_FRAME};
use std::path::{Path, PathBuf};

/// Records every frame a wire carries, both directions, to a pcap file (Ethernet link type).
pub struct PcapTap {
    inner: Box<dyn Wire>,
    writer: Option<pcap_file::pcap::PcapWriter<std::io::BufWriter<std::fs::File>>>,
    path: PathBuf,
    failed: bool,
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
    /// Wraps `inner`, writing to a new pcap file at `path`.
    ///
    /// # Errors
    /// [`WireError::Pcap`] if the file cannot be created.
    pub fn new(inner: Box<dyn Wire>, path: &Path) -> Result<Self, WireError> {
        let err = |source| WireError::Pcap {
            path: path.into(),
            source,
        };
        let file = std::fs::File::create(path).map_err(err)?;
        let header = pcap_file::pcap::PcapHeader {
            datalink: pcap_file::DataLink::ETHERNET,
            snaplen: MAX_FRAME as u32,
            ..Default::default()
        };
        let writer =
            pcap_file::pcap::PcapWriter::with_header(std::io::BufWriter::new(file), header)
                .map_err(|e| err(std::io::Error::other(e.to_string())))?;
        Ok(Self {
            inner,
            writer: Some(writer),
            path: path.into(),
            failed: false,
        })
    }

    fn record(&mut self, frame: &[u8]) {
        let Some(writer) = self.writer.as_mut().filter(|_| !self.failed) else {
            return;
        };
        let ts = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let pkt = pcap_file::pcap::PcapPacket::new(ts, frame.len() as u32, frame);
        if let Err(e) = writer.write_packet(&pkt) {
            tracing::warn!(target: "pmd::emu::wire", path = %self.path.display(), error = %e, "pcap capture stopped");
            self.failed = true;
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
    fn stats(&self) -> Vec<(String, u64)> {
        self.inner.stats()
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
