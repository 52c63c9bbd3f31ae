//! Per-object state tracking that turns double frees and uses after free into panics naming
//! the object. On with the `audit` feature and in every debug build; otherwise the checks
//! compile to nothing.
//!
//! A shared pool's states (one byte per object in its file) also say, in every build, which
//! process holds each object in use: the byte is the process's owner id
//! ([`crate::shm::Ctl::claim_owner`]) while the object is out, 0 while it is free. That is
//! what lets a survivor return what a dead process held outside its caches
//! ([`crate::Mempool::reclaim_owned`]). In builds without the audit that tag is all that is
//! written: one byte store per object taken or returned, on shared pools only.
#![deny(unsafe_code)]

/// Whether object states are tracked in this build.
pub const AUDIT_ENABLED: bool = cfg!(any(debug_assertions, feature = "audit"));

#[cfg(any(debug_assertions, feature = "audit"))]
mod imp {
    use std::sync::atomic::{AtomicU8, Ordering};

    const FREE: u8 = 0;
    const IN_USE: u8 = 1;

    /// One state byte per object: free (in the ring or a cache), or in use (handed out),
    /// holding `tag` (the owner id of this process in a shared pool).
    pub(crate) struct Audit {
        states: States,
        tag: u8,
    }

    /// Where the states are: this process's heap, or a shared pool's file (so that every
    /// process sees an object freed by another).
    enum States {
        Owned(Box<[AtomicU8]>),
        Shared(crate::shm::SharedStates),
    }

    impl std::ops::Deref for States {
        type Target = [AtomicU8];
        fn deref(&self) -> &[AtomicU8] {
            match self {
                States::Owned(b) => b,
                States::Shared(s) => s,
            }
        }
    }

    impl Audit {
        pub(crate) fn new(count: u32) -> Self {
            Audit {
                states: States::Owned((0..count).map(|_| AtomicU8::new(FREE)).collect()),
                tag: IN_USE,
            }
        }

        /// States kept in a shared pool's control block (all FREE in a fresh file: zeros);
        /// objects this process takes are tagged `tag` (its owner id).
        pub(crate) fn shared(states: crate::shm::SharedStates, tag: u8) -> Self {
            Audit {
                states: States::Shared(states),
                tag,
            }
        }

        /// The tag of objects this process takes.
        pub(crate) fn tag(&self) -> u8 {
            self.tag
        }

        /// Whether `on_get` / `on_put` do anything (always, with the audit on).
        #[inline(always)]
        pub(crate) fn tracks(&self) -> bool {
            true
        }

        fn state(&self, pool: &str, kind: &str, idx: u32) -> &AtomicU8 {
            match self.states.get(idx as usize) {
                Some(s) => s,
                None => panic!(
                    "mempool '{pool}': {kind} index {idx} does not belong to this pool \
                     (it has {} objects)",
                    self.states.len()
                ),
            }
        }

        /// An object leaves the pool.
        #[inline]
        pub(crate) fn on_get(&self, pool: &str, kind: &str, idx: u32) {
            let prev = self.state(pool, kind, idx).swap(self.tag, Ordering::AcqRel);
            assert!(
                prev == FREE,
                "mempool '{pool}': {kind} index {idx} handed out while already in use: the free \
                 list is corrupt (was it freed twice without the audit noticing?)"
            );
        }

        /// An object comes back to the pool.
        #[inline]
        pub(crate) fn on_put(&self, pool: &str, kind: &str, idx: u32) {
            let prev = self.state(pool, kind, idx).swap(FREE, Ordering::AcqRel);
            assert!(
                prev != FREE,
                "mempool '{pool}': double free of {kind} index {idx} (it is already free)"
            );
        }

        /// An object is about to be freed (before its header is read): it must be in use.
        #[inline]
        pub(crate) fn check_before_free(&self, pool: &str, kind: &str, idx: u32) {
            let s = self.state(pool, kind, idx).load(Ordering::Acquire);
            assert!(
                s != FREE,
                "mempool '{pool}': double free of {kind} index {idx} (it is already free)"
            );
        }

        /// `what` is about to touch an object: it must be in use.
        #[inline]
        pub(crate) fn check_in_use(&self, pool: &str, kind: &str, idx: u32, what: &str) {
            let s = self.state(pool, kind, idx).load(Ordering::Acquire);
            assert!(
                s != FREE,
                "mempool '{pool}': use after free of {kind} index {idx} ({what} on an object \
                 that is back in the pool)"
            );
        }
    }
}

#[cfg(not(any(debug_assertions, feature = "audit")))]
mod imp {
    use std::sync::atomic::Ordering;

    /// Audit disabled: no checks. A shared pool's objects are still tagged with the owner id
    /// of the process that holds them (see the module docs).
    pub(crate) struct Audit {
        shared: Option<(crate::shm::SharedStates, u8)>,
    }

    impl Audit {
        pub(crate) fn new(_count: u32) -> Self {
            Audit { shared: None }
        }
        pub(crate) fn shared(states: crate::shm::SharedStates, tag: u8) -> Self {
            Audit {
                shared: Some((states, tag)),
            }
        }
        pub(crate) fn tag(&self) -> u8 {
            self.shared.as_ref().map_or(0, |s| s.1)
        }
        #[inline(always)]
        pub(crate) fn on_get(&self, _pool: &str, _kind: &str, idx: u32) {
            if let Some((states, tag)) = &self.shared {
                if let Some(s) = states.get(idx as usize) {
                    s.store(*tag, Ordering::Relaxed);
                }
            }
        }
        #[inline(always)]
        pub(crate) fn on_put(&self, _pool: &str, _kind: &str, idx: u32) {
            if let Some((states, _)) = &self.shared {
                if let Some(s) = states.get(idx as usize) {
                    s.store(0, Ordering::Relaxed);
                }
            }
        }
        /// Whether `on_get` / `on_put` do anything (a shared pool).
        #[inline(always)]
        pub(crate) fn tracks(&self) -> bool {
            self.shared.is_some()
        }
        #[inline(always)]
        pub(crate) fn check_before_free(&self, _pool: &str, _kind: &str, _idx: u32) {}
        #[inline(always)]
        pub(crate) fn check_in_use(&self, _pool: &str, _kind: &str, _idx: u32, _what: &str) {}
    }
}

pub(crate) use imp::Audit;
