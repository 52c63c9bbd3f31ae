//! [`SharedMbuf`]: one packet owned by several places at once, counted in the header's
//! atomic `refcnt`.
#![allow(unsafe_code)]

use std::fmt;
use std::mem::ManuallyDrop;
use std::ops::Deref;
use std::sync::atomic::{fence, Ordering};

use super::handle::Mbuf;

impl Mbuf {
    /// Turns this handle into a shared, read-only one.
    pub fn into_shared(self) -> SharedMbuf {
        SharedMbuf(ManuallyDrop::new(self))
    }
}

/// A shared, read-only mbuf: `Clone` adds an owner (atomic `refcnt` on the header), the last
/// drop frees the chain. Derefs to [`Mbuf`] for reading.
pub struct SharedMbuf(ManuallyDrop<Mbuf>);

impl SharedMbuf {
    /// Owners of the buffer.
    pub fn refcnt(&self) -> u16 {
        self.0.h().refcnt.load(Ordering::Acquire)
    }

    /// The owned `Mbuf` back when this is the only owner, else `self`.
    pub fn try_unwrap(self) -> Result<Mbuf, SharedMbuf> {
        if self.refcnt() != 1 {
            return Err(self);
        }
        let mut me = ManuallyDrop::new(self);
        // SAFETY: `me` is never dropped, so the `Mbuf` inside is moved out exactly once; as
        // the only owner (refcnt 1, and only a `SharedMbuf` can add owners) it is unique.
        Ok(unsafe { ManuallyDrop::take(&mut me.0) })
    }
}

impl Clone for SharedMbuf {
    fn clone(&self) -> Self {
        let old = self.0.h().refcnt.fetch_add(1, Ordering::Relaxed);
        if old == u16::MAX {
            // Wrapped to 0: the count is meaningless now; like `Arc`, give up loudly.
            std::process::abort();
        }
        SharedMbuf(ManuallyDrop::new(Mbuf { hdr: self.0.hdr }))
    }
}

impl Drop for SharedMbuf {
    fn drop(&mut self) {
        if self.0.h().refcnt.fetch_sub(1, Ordering::Release) != 1 {
            return;
        }
        // Pairs with the other owners' Release decrements: their reads happen before the free.
        fence(Ordering::Acquire);
        self.0.h().refcnt.store(1, Ordering::Relaxed);
        // SAFETY: we were the last owner, and `self.0` is not used after this.
        unsafe { ManuallyDrop::drop(&mut self.0) };
    }
}

impl Deref for SharedMbuf {
    type Target = Mbuf;
    fn deref(&self) -> &Mbuf {
        &self.0
    }
}

impl fmt::Debug for SharedMbuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("SharedMbuf").field(&*self.0).finish()
    }
}

#[cfg(test)]
mod tests {
    use crate::mbuf::test_pool as pool;

    #[test]
    fn shared_mbuf_frees_on_last_drop() {
        let p = pool(4);
        let mut m = p.alloc().unwrap();
        m.extend_from_slice(b"abc").unwrap();
        let s = m.into_shared();
        let s2 = s.clone();
        assert_eq!(s.refcnt(), 2);
        assert_eq!(&s2[..], b"abc");
        let s = s.try_unwrap().unwrap_err();
        drop(s2);
        assert_eq!(p.in_use(), 1);
        let m = s.try_unwrap().unwrap();
        drop(m);
        assert_eq!(p.in_use(), 0);
    }
}
