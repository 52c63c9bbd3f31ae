//! An exclusive, advisory lock on a file (`flock(2)`), holding the locker's pid.
//!
//! The lock belongs to the open file: the kernel drops it when the holder closes the file or
//! dies, however it dies (SIGKILL included). A file left behind by a dead holder is therefore
//! simply locked again by the next process; its stale pid is overwritten. Files are never
//! deleted: deleting a lock file lets two processes lock two different inodes of one name.
#![allow(unsafe_code)]

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A held lock; dropping it releases the lock (the file stays, emptied).
#[derive(Debug)]
pub struct LockFile {
    file: File,
    path: PathBuf,
}

/// What [`try_lock`] found.
#[derive(Debug)]
pub enum TryLock {
    /// We hold the lock now.
    Acquired(LockFile),
    /// Another open file holds it (another process, or this one through another open).
    Held {
        /// The holder's pid as written in the file; `None` if it has not written one yet.
        pid: Option<u32>,
    },
}

/// `flock(fd, LOCK_EX | LOCK_NB)`: `Ok(true)` when locked, `Ok(false)` when another open file
/// holds the lock.
fn flock_exclusive_nonblocking(file: &File) -> io::Result<bool> {
    loop {
        // SAFETY: flock(2) takes a descriptor and flags only; `file` keeps the descriptor
        // open for the duration of the call.
        let r = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if r == 0 {
            return Ok(true);
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EWOULDBLOCK) => return Ok(false),
            Some(libc::EINTR) => continue,
            _ => return Err(e),
        }
    }
}

fn read_pid(file: &mut File) -> Option<u32> {
    let mut s = String::new();
    file.seek(SeekFrom::Start(0)).ok()?;
    file.read_to_string(&mut s).ok()?;
    s.trim().parse().ok().filter(|&p| p > 0)
}

/// Tries to lock `path` (created with mode 0644 if missing) without waiting; on success
/// writes this process's pid into it.
///
/// # Errors
/// The file cannot be opened or written, or `flock` failed for another reason than "held".
pub fn try_lock(path: &Path) -> io::Result<TryLock> {
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o644)
        .open(path)?;
    if !flock_exclusive_nonblocking(&file)? {
        // The holder writes its pid right after locking: give it a moment.
        let mut pid = read_pid(&mut file);
        for _ in 0..20 {
            if pid.is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
            pid = read_pid(&mut file);
        }
        return Ok(TryLock::Held { pid });
    }
    file.set_len(0)?;
    file.seek(SeekFrom::Start(0))?;
    writeln!(file, "{}", std::process::id())?;
    file.flush()?;
    Ok(TryLock::Acquired(LockFile {
        file,
        path: path.to_path_buf(),
    }))
}

impl LockFile {
    /// The locked file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for LockFile {
    fn drop(&mut self) {
        // Empty the file so no stale pid is shown; closing it releases the lock.
        let _ = self.file.set_len(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_open_is_refused_with_the_holders_pid_until_the_first_goes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("port.lock");
        let TryLock::Acquired(held) = try_lock(&path).unwrap() else {
            panic!("a fresh file must lock");
        };
        assert_eq!(
            std::fs::read_to_string(&path).unwrap().trim(),
            std::process::id().to_string()
        );
        // flock conflicts between two opens even in one process.
        match try_lock(&path).unwrap() {
            TryLock::Held { pid } => assert_eq!(pid, Some(std::process::id())),
            TryLock::Acquired(_) => panic!("locked twice"),
        }
        drop(held);
        assert!(matches!(try_lock(&path).unwrap(), TryLock::Acquired(_)));
    }

    #[test]
    fn a_stale_file_of_a_dead_holder_is_taken_silently() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stale.lock");
        std::fs::write(&path, "999999999\n").unwrap();
        let TryLock::Acquired(l) = try_lock(&path).unwrap() else {
            panic!("nobody holds a stale file");
        };
        assert_eq!(l.path(), path);
        assert_eq!(
            std::fs::read_to_string(&path).unwrap().trim(),
            std::process::id().to_string()
        );
    }
}
