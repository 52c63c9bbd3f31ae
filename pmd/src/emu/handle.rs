//! The handle a test or a tool holds on a running device model, one for both models: step
//! it (or let its thread run), inject faults, read its counters. [`DeviceModel`] is what an
//! engine offers the handle; a port's memory registration holds a guard from it, so that the
//! engine forgets the region when the pool lets go of it.
#![deny(unsafe_code)]

use super::faults::{FaultKind, FaultPlan};
use super::thread::{EngineCore, Nic};
use crate::ethdev::Xstat;
use std::sync::{Arc, MutexGuard, Weak};

/// What a device model's engine offers its handle.
pub trait DeviceModel: Nic {
    /// The faults it can have (its own knobs: the MANA and mlx5 models differ).
    type Faults;
    /// Its counters.
    type Stats;
    /// Sets the faults.
    fn set_faults(&mut self, f: Self::Faults);
    /// Has the faults of `plan` take turns; `None` stops them.
    ///
    /// # Errors
    /// The first kind of `plan` the model does not have.
    fn cycle_faults(&mut self, plan: Option<&FaultPlan>) -> Result<(), FaultKind>;
    /// Its counters now.
    fn stats(&self) -> Self::Stats;
    /// Its wire's counters ([`crate::emu::wire::Wire::stats`]).
    fn wire_stats(&self) -> Vec<Xstat>;
    /// Forgets the memory region of `lkey`; `false` if there was none.
    fn remove_mr(&mut self, lkey: u32) -> bool;
}

/// Implements [`DeviceModel`] for an engine type whose inherent methods of the same names
/// (`set_faults`, `cycle_faults`, `stats`, `wire_stats`, `remove_mr`) do the work.
macro_rules! device_model {
    ($engine:ty, $faults:ty, $stats:ty) => {
        impl $crate::emu::handle::DeviceModel for $engine {
            type Faults = $faults;
            type Stats = $stats;
            fn set_faults(&mut self, f: $faults) {
                <$engine>::set_faults(self, f);
            }
            fn cycle_faults(
                &mut self,
                plan: Option<&$crate::emu::faults::FaultPlan>,
            ) -> Result<(), $crate::emu::faults::FaultKind> {
                <$engine>::cycle_faults(self, plan)
            }
            fn stats(&self) -> $stats {
                <$engine>::stats(self)
            }
            fn wire_stats(&self) -> Vec<$crate::ethdev::Xstat> {
                <$engine>::wire_stats(self)
            }
            fn remove_mr(&mut self, lkey: u32) -> bool {
                <$engine>::remove_mr(self, lkey)
            }
        }
    };
}
pub(crate) use device_model;

/// A handle on a running model's engine (cheap to clone; the engine lives while a handle or
/// its port does).
pub struct EngineHandle<E: Nic>(Arc<EngineCore<E>>);

impl<E: Nic> Clone for EngineHandle<E> {
    fn clone(&self) -> Self {
        Self(Arc::clone(&self.0))
    }
}

impl<E: Nic> std::fmt::Debug for EngineHandle<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "EngineHandle({})", self.0.lock().describe())
    }
}

impl<E: DeviceModel> EngineHandle<E> {
    /// A handle on `core`.
    pub fn new(core: Arc<EngineCore<E>>) -> Self {
        Self(core)
    }

    /// Stops the engine thread from running steps (it keeps sleeping); drive with
    /// [`step`](Self::step). When this returns no step of the thread is in progress and
    /// none starts until [`resume`](Self::resume) (see [`EngineCore::pause`]).
    pub fn pause(&self) {
        self.0.pause();
    }

    /// Lets the engine thread run again.
    pub fn resume(&self) {
        self.0.resume();
    }

    /// One engine pass; returns the work done.
    pub fn step(&self) -> usize {
        self.0.step()
    }

    /// Steps until a pass does nothing (at most `max` passes); returns the total work.
    pub fn run_until_idle(&self, max: usize) -> usize {
        self.0.run_until_idle(max)
    }

    /// Sets the faults. The model's link watch runs at once, so a link-down fault set or
    /// cleared is a port event now, not at the next look.
    pub fn set_faults(&self, f: E::Faults) {
        self.0.update(|e| e.set_faults(f));
    }

    /// Has the faults of `plan` take turns from now on; `None` stops them. Link phases reach
    /// the port's events within [`crate::emu::events::LINK_POLL`].
    ///
    /// # Errors
    /// A kind of fault the model does not have.
    pub fn cycle_faults(&self, plan: Option<&FaultPlan>) -> Result<(), FaultKind> {
        self.0.lock().cycle_faults(plan)
    }

    /// The model's counters.
    pub fn stats(&self) -> E::Stats {
        self.0.lock().stats()
    }

    /// The wire's own counters.
    pub fn wire_stats(&self) -> Vec<Xstat> {
        self.0.lock().wire_stats()
    }

    /// The engine, locked, for anything the handle does not offer. No step runs while the
    /// guard lives.
    pub fn engine(&self) -> MutexGuard<'_, E> {
        self.0.lock()
    }

    /// A guard that makes the engine forget the memory region of `lkey` when it drops (what
    /// a port's memory registration holds), without keeping the engine alive.
    pub(crate) fn mr_guard(&self, lkey: u32) -> MrGuard<E> {
        MrGuard {
            core: Arc::downgrade(&self.0),
            lkey,
        }
    }
}

/// Deregisters a memory region from its engine when the pool drops its registration (before
/// the memory is unmapped); nothing if the model is gone.
pub(crate) struct MrGuard<E: DeviceModel> {
    core: Weak<EngineCore<E>>,
    lkey: u32,
}

impl<E: DeviceModel> Drop for MrGuard<E> {
    fn drop(&mut self) {
        if let Some(c) = self.core.upgrade() {
            c.lock().remove_mr(self.lkey);
        }
    }
}
