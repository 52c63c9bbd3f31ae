//! Per-object state tracking that turns double frees and uses after free into panics naming
//! the object. On with the `audit` feature and in every debug build; otherwise the type is
//! empty and every check compiles to nothing.
#![deny(unsafe_code)]

/// Whether object states are tracked in this build.
pub const AUDIT_ENABLED: bool = cfg!(any(debug_assertions, feature = "audit"));

#[cfg(any(debug_assertions, feature = "audit"))]
mod imp {
    use std::sync::atomic::{AtomicU8, Ordering};

    const FREE: u8 = 0;
    const IN_USE: u8 = 1;

    /// One state byte per object: free (in the ring or a cache) or in use (handed out).
    pub(crate) struct Audit {
        states: States,
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
            }
        }

        /// States kept in a shared pool's control block (all FREE in a fresh file: zeros).
        pub(crate) fn shared(states: crate::shm::SharedStates) -> Self {
            Audit {
                states: States::Shared(states),
            }
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
            let prev = self.state(pool, kind, idx).swap(IN_USE, Ordering::AcqRel);
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
                prev == IN_USE,
                "mempool '{pool}': double free of {kind} index {idx} (it is already free)"
            );
        }

        /// An object is about to be freed (before its header is read): it must be in use.
        #[inline]
        pub(crate) fn check_before_free(&self, pool: &str, kind: &str, idx: u32) {
            let s = self.state(pool, kind, idx).load(Ordering::Acquire);
            assert!(
                s == IN_USE,
                "mempool '{pool}': double free of {kind} index {idx} (it is already free)"
            );
        }

        /// `what` is about to touch an object: it must be in use.
        #[inline]
        pub(crate) fn check_in_use(&self, pool: &str, kind: &str, idx: u32, what: &str) {
            let s = self.state(pool, kind, idx).load(Ordering::Acquire);
            assert!(
                s == IN_USE,
                "mempool '{pool}': use after free of {kind} index {idx} ({what} on an object \
                 that is back in the pool)"
            );
        }
    }
}

#[cfg(not(any(debug_assertions, feature = "audit")))]
mod imp {
    /// Audit disabled: no state, no checks.
    pub(crate) struct Audit;

    impl Audit {
        pub(crate) fn new(_count: u32) -> Self {
            Audit
        }
        pub(crate) fn shared(_states: crate::shm::SharedStates) -> Self {
            Audit
        }
        #[inline(always)]
        pub(crate) fn on_get(&self, _pool: &str, _kind: &str, _idx: u32) {}
        #[inline(always)]
        pub(crate) fn on_put(&self, _pool: &str, _kind: &str, _idx: u32) {}
        #[inline(always)]
        pub(crate) fn check_before_free(&self, _pool: &str, _kind: &str, _idx: u32) {}
        #[inline(always)]
        pub(crate) fn check_in_use(&self, _pool: &str, _kind: &str, _idx: u32, _what: &str) {}
    }
}

pub(crate) use imp::Audit;
