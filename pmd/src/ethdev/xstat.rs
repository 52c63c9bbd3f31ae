//! Extended counters with what they say about lost frames: every driver, device model and
//! wire declares each counter's [`Loss`] where it declares the counter, and
//! [`crate::port::Port::stats`] adds the frames a port's device dropped up from those kinds
//! ([`DeviceDrops`]). No reader has to guess a loss from a counter's name.
#![deny(unsafe_code)]

use std::sync::atomic::AtomicU64;

/// What an extended counter says about frames lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Loss {
    /// Not lost frames: traffic, events, state changes, recoveries.
    None,
    /// Frames lost that the port's basic counters already hold (`imissed`, `ierrors`,
    /// `oerrors`): shown among the losses, never added again.
    Counted,
    /// Frames that reached the port and were lost where its driver cannot see them (no
    /// completion for them): added to [`DeviceDrops::rx`].
    Rx,
    /// Frames the driver handed to the device, completed normally, that never left it (a
    /// full cable, a link down, a far end gone): added to [`DeviceDrops::tx`].
    Tx,
}

impl Loss {
    /// Whether the counter counts lost frames (however they are accounted).
    pub fn is_loss(self) -> bool {
        self != Loss::None
    }
}

/// One extended counter: its name, its value, and what it says about lost frames.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Xstat {
    /// The name (`rx_cqe_errors`, `dev_tx_wire_drops`, `wire_tx_stranded`, ...).
    pub name: String,
    /// The value.
    pub value: u64,
    /// Its kind.
    pub loss: Loss,
}

impl Xstat {
    /// A counter `name` of `value`, of kind `loss`.
    pub fn new(name: impl Into<String>, value: u64, loss: Loss) -> Self {
        Self {
            name: name.into(),
            value,
            loss,
        }
    }

    /// The same counter under the name `prefix` + its name (a wire's counters as the port
    /// shows them: `wire_...`).
    pub fn prefixed(self, prefix: &str) -> Self {
        Self {
            name: format!("{prefix}{}", self.name),
            ..self
        }
    }
}

/// Adds each counter of `more` to the one of the same name in `into` (or appends it).
pub fn sum_into(into: &mut Vec<Xstat>, more: impl IntoIterator<Item = Xstat>) {
    for x in more {
        match into.iter_mut().find(|y| y.name == x.name) {
            Some(y) => y.value = y.value.wrapping_add(x.value),
            None => into.push(x),
        }
    }
}

/// Frames a port's device dropped, by direction: what a tool adds to the frames it counted
/// itself so that every frame sent is accounted for ([`crate::ethdev::Stats::device_drops`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceDrops {
    /// Frames the port's driver accepted for sending that never left the device: those the
    /// driver saw fail (`oerrors`: error completions, and the frames of WQEs flushed with
    /// them), plus the counters of kind [`Loss::Tx`] (a device model's frames dropped after
    /// a normal completion: a full cable, a link down, on mlx5 a frame over the MTU; a cable
    /// end's frames that no far end will read).
    pub tx: u64,
    /// Frames that reached the port and never made it to the application: `imissed` (no
    /// receive buffer, a full ring under the port), plus those the driver saw fail
    /// (`ierrors`: error completions, a frame truncated or too long, a bad key), plus the
    /// counters of kind [`Loss::Rx`] (a device model's frames lost without a completion: a
    /// fault, a full completion queue, a queue destroyed under them).
    pub rx: u64,
}

impl DeviceDrops {
    /// The drops of a port whose basic counters are `imissed`, `ierrors` and `oerrors` and
    /// whose extended counters are `xstats`. Each frame is counted once: a frame whose
    /// completion failed is the driver's (`ierrors`, `oerrors`), whatever a device model
    /// counts of it too (those counters are [`Loss::Counted`]).
    pub fn of(imissed: u64, ierrors: u64, oerrors: u64, xstats: &[Xstat]) -> Self {
        let mut d = Self {
            tx: oerrors,
            rx: imissed + ierrors,
        };
        for x in xstats {
            match x.loss {
                Loss::Rx => d.rx += x.value,
                Loss::Tx => d.tx += x.value,
                _ => {}
            }
        }
        d
    }

    /// Both directions.
    pub fn total(&self) -> u64 {
        self.tx + self.rx
    }
}

/// Adds `n` to a counter only the calling core writes (see [`crate::ethdev::counters::bump`]).
#[inline]
pub fn add(c: &AtomicU64, n: u64) {
    super::counters::bump(c, n);
}

/// Declares a set of per-queue extended counters: a struct of `AtomicU64`s, each with its
/// name and its [`Loss`], written by the one core that owns the queue (`add`, no locked
/// read-modify-write) and read as a list of [`Xstat`]s (`list`, or `sum` over queues).
///
/// ```
/// pmd::queue_xstats! {
///     /// Counters of one queue.
///     pub struct MyXstats {
///         /// Error completions.
///         cqe_errors: "rx_cqe_errors", Counted;
///         /// Recoveries.
///         recoveries: "rx_recoveries", None;
///     }
/// }
/// let x = MyXstats::default();
/// MyXstats::add(&x.cqe_errors, 2);
/// let l = x.list();
/// assert_eq!((l[0].name.as_str(), l[0].value), ("rx_cqe_errors", 2));
/// assert_eq!(l[1].loss, pmd::ethdev::Loss::None);
/// ```
#[macro_export]
macro_rules! queue_xstats {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident {
            $( $(#[$fmeta:meta])* $field:ident : $label:literal, $loss:ident; )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Default)]
        $vis struct $name {
            $( $(#[$fmeta])* pub $field: ::std::sync::atomic::AtomicU64, )*
        }

        impl $name {
            /// Adds `n` (only the queue's owning core calls this).
            #[inline]
            #[allow(dead_code)]
            pub fn add(c: &::std::sync::atomic::AtomicU64, n: u64) {
                $crate::ethdev::xstat::add(c, n);
            }

            /// Adds one (only the queue's owning core calls this).
            #[inline]
            #[allow(dead_code)]
            pub fn bump(c: &::std::sync::atomic::AtomicU64) {
                Self::add(c, 1);
            }

            /// Every counter, in declaration order.
            pub fn list(&self) -> Vec<$crate::ethdev::Xstat> {
                vec![$(
                    $crate::ethdev::Xstat::new(
                        $label,
                        self.$field.load(::std::sync::atomic::Ordering::Relaxed),
                        $crate::ethdev::Loss::$loss,
                    ),
                )*]
            }

            /// Every counter summed over `queues`, in declaration order.
            #[allow(dead_code)]
            pub fn sum(queues: &[::std::sync::Arc<Self>]) -> Vec<$crate::ethdev::Xstat> {
                let mut out = Self::default().list();
                for q in queues {
                    for (slot, x) in out.iter_mut().zip(q.list()) {
                        slot.value += x.value;
                    }
                }
                out
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_drops_add_each_kind_once() {
        let x = [
            Xstat::new("dev_tx_wire_drops", 500, Loss::Tx),
            Xstat::new("dev_tx_errors", 7, Loss::Counted),
            Xstat::new("dev_rx_fault_drops", 3, Loss::Rx),
            Xstat::new("dev_rx_no_wqe", 9, Loss::Counted),
            Xstat::new("wire_tx_stranded", 30, Loss::Tx),
            Xstat::new("dev_tx_frames", 1000, Loss::None),
        ];
        let d = DeviceDrops::of(4, 2, 7, &x);
        assert_eq!(d, DeviceDrops { tx: 537, rx: 9 });
        assert_eq!(d.total(), 546);
        assert_eq!(DeviceDrops::of(1, 2, 3, &[]), DeviceDrops { tx: 3, rx: 3 });
    }

    #[test]
    fn sums_by_name_and_keeps_kinds() {
        let mut a = vec![Xstat::new("a", 1, Loss::Rx)];
        sum_into(
            &mut a,
            [Xstat::new("a", 2, Loss::Rx), Xstat::new("b", 5, Loss::None)],
        );
        assert_eq!(
            a,
            [Xstat::new("a", 3, Loss::Rx), Xstat::new("b", 5, Loss::None)]
        );
        assert_eq!(
            Xstat::new("tx_stranded", 1, Loss::Tx).prefixed("wire_"),
            Xstat::new("wire_tx_stranded", 1, Loss::Tx)
        );
    }
}
