//! Faults that take turns: a [`FaultPlan`] names kinds of fault ([`FaultKind`]) and a period;
//! a model given one ([`EngineHandle::cycle_faults`] on either model,
//! the `faults=` devarg of the device-model ports) runs clean for one period, turns the first
//! kind on for one period, runs clean again, turns on the next, round and round, for as long
//! as it lives. (Clean first: a port comes up, and its link with it, before the first fault.) This is what a soak run (`bench/soak.sh`) leans on: every fault the model can
//! inject, again and again, while traffic flows, so that recovery paths run thousands of
//! times and every frame they cost must still be counted.
//!
//! The schedule is on the clock (phase `k` covers `[k·period, (k+1)·period)` since the plan
//! was set), read once per [`CHECK_EVERY`] engine passes, so a busy engine pays a clock read
//! per 64 passes and an idle one still changes phase within a few milliseconds.
//!
//! Each kind's strength is fixed (each [`FaultKind`] says it, e.g. [`RX_DROP_EVERY`]): strong enough that a
//! phase of a fraction of a second hits hundreds of frames at the soak's rates, not so strong
//! that nothing gets through.
//!
//! [`EngineHandle::cycle_faults`]: crate::emu::handle::EngineHandle::cycle_faults
#![deny(unsafe_code)]

use std::fmt;
use std::time::{Duration, Instant};

/// One kind of fault a device model can inject for a phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FaultKind {
    /// The link goes down for the phase: frames both ways are dropped and counted, the port
    /// sees a link-down event, then a link-up one.
    Link,
    /// Every [`RX_DROP_EVERY`]-th frame from the wire is dropped before it reaches a queue.
    RxDrop,
    /// MANA: every [`RX_ERROR_EVERY`]-th received frame completes as RX_TRUNCATED.
    RxError,
    /// Every [`TX_ERROR_EVERY`]-th TX WQE completes with an error (MANA: TX_VPORT_DISABLED;
    /// mlx5: an error CQE that puts the SQ in error, so the driver recovers the queue).
    TxError,
    /// MANA: completions are held back [`SLOW_COMPLETION_STEPS`] engine passes.
    SlowCompletions,
    /// mlx5: every [`BAD_KEY_EVERY`]-th frame scattered into an RQ WQE meets an unknown
    /// memory key (LOCAL_PROT; the RQ goes to error and the driver recovers it).
    RxBadKey,
    /// mlx5: every [`BAD_KEY_EVERY`]-th gather of an SQ meets an unknown memory key.
    TxBadKey,
    /// mlx5: TX errors as [`FaultKind::TxError`], and the first queue state change of the
    /// phase fails, so the driver's recovery must retry.
    StateChange,
}

/// Frames per wire drop ([`FaultKind::RxDrop`]).
pub const RX_DROP_EVERY: u32 = 50;
/// Received frames per RX error ([`FaultKind::RxError`]).
pub const RX_ERROR_EVERY: u32 = 100;
/// TX WQEs per TX error ([`FaultKind::TxError`], [`FaultKind::StateChange`]).
pub const TX_ERROR_EVERY: u32 = 100;
/// Gathers or scatters per bad key ([`FaultKind::RxBadKey`], [`FaultKind::TxBadKey`]).
pub const BAD_KEY_EVERY: u32 = 200;
/// Engine passes a completion is held back ([`FaultKind::SlowCompletions`]).
pub const SLOW_COMPLETION_STEPS: u32 = 32;
/// Engine passes between two clock reads of a [`FaultCycle`].
pub const CHECK_EVERY: u32 = 64;

/// The kinds the MANA model has, in the order `faults=all` cycles them.
pub const MANA_KINDS: &[FaultKind] = &[
    FaultKind::Link,
    FaultKind::RxDrop,
    FaultKind::RxError,
    FaultKind::TxError,
    FaultKind::SlowCompletions,
];
/// The kinds the mlx5 model has, in the order `faults=all` cycles them.
pub const MLX5_KINDS: &[FaultKind] = &[
    FaultKind::Link,
    FaultKind::RxDrop,
    FaultKind::TxError,
    FaultKind::RxBadKey,
    FaultKind::TxBadKey,
    FaultKind::StateChange,
];

impl FaultKind {
    /// Every kind, in the order a plan lists them.
    pub const ALL: [FaultKind; 8] = [
        Self::Link,
        Self::RxDrop,
        Self::RxError,
        Self::TxError,
        Self::SlowCompletions,
        Self::RxBadKey,
        Self::TxBadKey,
        Self::StateChange,
    ];

    /// Its name in `faults=` (`link`, `rx-drop`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            Self::Link => "link",
            Self::RxDrop => "rx-drop",
            Self::RxError => "rx-error",
            Self::TxError => "tx-error",
            Self::SlowCompletions => "slow-completions",
            Self::RxBadKey => "rx-bad-key",
            Self::TxBadKey => "tx-bad-key",
            Self::StateChange => "state-change",
        }
    }
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a `faults=` value was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FaultPlanError {
    /// A name that is no kind of this model.
    #[error("'{name}' is no fault of this model: it has {}, or all", names(.kinds))]
    Unknown {
        /// What was given.
        name: String,
        /// The kinds the model has.
        kinds: &'static [FaultKind],
    },
    /// A kind named twice.
    #[error("'{0}' named twice")]
    Twice(FaultKind),
    /// Nothing named.
    #[error("no fault named: write KIND[+KIND...] or all")]
    Empty,
}

fn names(kinds: &[FaultKind]) -> String {
    kinds
        .iter()
        .map(|k| k.name())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Which faults take turns, and how long each phase lasts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FaultPlan {
    /// The kinds, in the order they take turns.
    pub kinds: Vec<FaultKind>,
    /// How long each fault phase, and each clean phase between two, lasts.
    pub period: Duration,
}

/// Phase length when `fault-period=` is not given.
pub const DEFAULT_PERIOD: Duration = Duration::from_secs(1);

impl FaultPlan {
    /// Parses `KIND[+KIND...]` or `all` against the kinds a model has (`model`:
    /// [`MANA_KINDS`] or [`MLX5_KINDS`]).
    ///
    /// # Errors
    /// An unknown or repeated name, or none.
    pub fn parse(
        text: &str,
        model: &'static [FaultKind],
        period: Duration,
    ) -> Result<Self, FaultPlanError> {
        if text == "all" {
            return Ok(Self {
                kinds: model.to_vec(),
                period,
            });
        }
        let mut kinds = Vec::new();
        for name in text.split('+') {
            if name.is_empty() {
                return Err(FaultPlanError::Empty);
            }
            let kind = model
                .iter()
                .copied()
                .find(|k| k.name() == name)
                .ok_or_else(|| FaultPlanError::Unknown {
                    name: name.into(),
                    kinds: model,
                })?;
            if kinds.contains(&kind) {
                return Err(FaultPlanError::Twice(kind));
            }
            kinds.push(kind);
        }
        Ok(Self { kinds, period })
    }

    /// The `faults=` value that parses back to these kinds (`all` is spelled out).
    pub fn kinds_text(&self) -> String {
        self.kinds
            .iter()
            .map(|k| k.name())
            .collect::<Vec<_>>()
            .join("+")
    }
}

/// A running schedule: the faults of each phase (`F`, a model's own fault settings, one per
/// kind of the plan), taking turns with clean phases (`F::default()`).
#[derive(Debug)]
pub struct FaultCycle<F> {
    phases: Vec<(FaultKind, F)>,
    period: Duration,
    start: Instant,
    calls: u32,
    /// The phase in force: an index into the sequence clean, fault 0, clean, fault 1, ...
    current: Option<usize>,
}

impl<F: Clone + Default> FaultCycle<F> {
    /// A schedule from now: clean phases take turns with `phases` (a fault setting per kind),
    /// each `period` long (at least a millisecond), a clean one first.
    pub fn new(phases: Vec<(FaultKind, F)>, period: Duration) -> Self {
        Self {
            phases,
            period: period.max(Duration::from_millis(1)),
            start: Instant::now(),
            calls: 0,
            current: None,
        }
    }

    /// The schedule of `plan`, with `phase` giving a model's faults for each kind (`None`: a
    /// kind the model does not have).
    ///
    /// # Errors
    /// The first kind `phase` has no faults for.
    pub fn from_plan(
        plan: &FaultPlan,
        phase: impl Fn(FaultKind) -> Option<F>,
    ) -> Result<Self, FaultKind> {
        let phases = plan
            .kinds
            .iter()
            .map(|&k| phase(k).map(|f| (k, f)).ok_or(k))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self::new(phases, plan.period))
    }

    /// What a model's `cycle_faults` does with its `cycle` and `faults`: a new schedule for
    /// `plan` from now, or, for `None`, no schedule and no faults.
    ///
    /// # Errors
    /// The first kind of `plan` that `phase` has no faults for (nothing changes then).
    pub fn restart(
        cycle: &mut Option<Self>,
        faults: &mut F,
        plan: Option<&FaultPlan>,
        phase: impl Fn(FaultKind) -> Option<F>,
    ) -> Result<(), FaultKind> {
        match plan {
            Some(p) => *cycle = Some(Self::from_plan(p, phase)?),
            None => {
                *cycle = None;
                *faults = F::default();
            }
        }
        Ok(())
    }

    /// Called once per engine pass: the faults to set now when the phase changed since the
    /// last call (the first call always answers), else `None`. Reads the clock once per
    /// [`CHECK_EVERY`] calls.
    pub fn poll(&mut self) -> Option<F> {
        if self.phases.is_empty() {
            return None;
        }
        self.calls = self.calls.wrapping_add(1);
        if self.current.is_some() && !self.calls.is_multiple_of(CHECK_EVERY) {
            return None;
        }
        self.at(Instant::now())
    }

    /// [`poll`](Self::poll) at `now`, whatever the count of calls.
    fn at(&mut self, now: Instant) -> Option<F> {
        if self.phases.is_empty() {
            return None;
        }
        let n = self.phases.len() * 2;
        let elapsed = now.saturating_duration_since(self.start).as_nanos();
        let k = (elapsed / self.period.as_nanos().max(1) % n as u128) as usize;
        if self.current == Some(k) {
            return None;
        }
        self.current = Some(k);
        Some(if k % 2 == 1 {
            let (kind, f) = &self.phases[k / 2];
            tracing::debug!(target: "pmd::emu", "fault phase: {kind}");
            f.clone()
        } else {
            F::default()
        })
    }

    /// The fault in force (`None`: a clean phase, or not started).
    pub fn current(&self) -> Option<FaultKind> {
        self.current
            .filter(|k| k % 2 == 1)
            .map(|k| self.phases[k / 2].0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_parse_against_the_model_s_kinds() {
        let p = FaultPlan::parse("link+tx-error", MANA_KINDS, DEFAULT_PERIOD).unwrap();
        assert_eq!(p.kinds, [FaultKind::Link, FaultKind::TxError]);
        assert_eq!(p.kinds_text(), "link+tx-error");
        let all = FaultPlan::parse("all", MLX5_KINDS, DEFAULT_PERIOD).unwrap();
        assert_eq!(all.kinds, MLX5_KINDS);
        let e = FaultPlan::parse("rx-bad-key", MANA_KINDS, DEFAULT_PERIOD).unwrap_err();
        assert_eq!(
            e.to_string(),
            "'rx-bad-key' is no fault of this model: it has link, rx-drop, rx-error, tx-error, \
             slow-completions, or all"
        );
        assert_eq!(
            FaultPlan::parse("link+link", MANA_KINDS, DEFAULT_PERIOD),
            Err(FaultPlanError::Twice(FaultKind::Link))
        );
        assert_eq!(
            FaultPlan::parse("link+", MANA_KINDS, DEFAULT_PERIOD),
            Err(FaultPlanError::Empty)
        );
        for k in FaultKind::ALL {
            assert!(MANA_KINDS.contains(&k) || MLX5_KINDS.contains(&k), "{k}");
        }
    }

    #[test]
    fn phases_take_turns_with_clean_ones_on_the_clock() {
        let period = Duration::from_millis(40);
        let mut c = FaultCycle::new(
            vec![(FaultKind::Link, 1u32), (FaultKind::RxDrop, 2)],
            period,
        );
        // The first call answers at once: the clean phase.
        assert_eq!(c.poll(), Some(0));
        assert_eq!(c.current(), None);
        // Then only when the clock crosses into another phase: fault, clean, fault, clean,
        // round and round.
        let start = c.start;
        let mid = |k: u32| start + period * k + period / 2;
        let (t0, t1, t2, t3, t4, t5) = (mid(0), mid(1), mid(2), mid(3), mid(4), mid(8));
        assert_eq!(c.at(t0), None);
        assert_eq!(c.at(t1), Some(1));
        assert_eq!(c.current(), Some(FaultKind::Link));
        assert_eq!(c.at(t2), Some(0));
        assert_eq!(c.current(), None);
        assert_eq!(c.at(t3), Some(2));
        assert_eq!(c.current(), Some(FaultKind::RxDrop));
        assert_eq!(c.at(t4), Some(0));
        assert_eq!(c.at(t5), None, "phase 8 is the clean one before link again");
        assert_eq!(c.at(mid(9)), Some(1));
    }

    #[test]
    fn an_empty_plan_never_answers() {
        let mut c: FaultCycle<u32> = FaultCycle::new(Vec::new(), DEFAULT_PERIOD);
        assert_eq!(c.poll(), None);
        assert_eq!(c.current(), None);
    }
}
