//! The leader's lease, as its own clock knows it, and the gate every side
//! effect outside the store passes (`Service::may_act`).
//!
//! The store fences a deposed leader's writes by term; a cloud, a GARM
//! provider or GitHub cannot check a term. So before each such call the
//! leader asks itself two things: does the lease it renewed still run by
//! its own monotonic clock (a process that wakes from a pause finds the
//! deadline passed before it does anything), and has no later term begun
//! in the store (a session that ended, a replica that took over while
//! this one was busy). A call that fails either is not made.
//!
//! The first check cannot see a lock whose session the server ended while
//! its holder ran (an administrator's `pg_terminate_backend`, a proxy
//! cutting the connection): the old holder learns only at its next check,
//! and its lease runs until then. So a replica that takes over a shared
//! lead from a holder that did not release it (`Store::end_term`) makes no
//! side effect for one whole silence after it took the lock: by then every
//! lease an earlier holder renewed has run out by its own clock.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Set only by `RUNWAY_UNSAFE_NO_FENCING=1` (read once at `runway serve`'s
/// start, with a warning): every gate lets every side effect through. It
/// exists for the chaos soak's control run, which shows the soak catches
/// what fencing prevents (BENCHMARKS.md); never set it in production.
static UNFENCED: AtomicBool = AtomicBool::new(false);

/// Whether the gates are switched off (see [`UNFENCED`]).
pub fn unfenced() -> bool {
    UNFENCED.load(Ordering::Relaxed)
}

/// Switches the gates off for this process (see [`UNFENCED`]).
pub fn switch_fencing_off() {
    UNFENCED.store(true, Ordering::Relaxed);
}

/// What this replica knows of its lead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lease {
    /// No leadership keeper runs (a test's service): the `leading` flag
    /// and, once a term is recorded, the store's term decide.
    Unmanaged,
    /// Held in `term` until `until` unless renewed; no side effect before
    /// `from` (the previous holder's lease may still run until then).
    Held {
        term: i64,
        until: Instant,
        from: Instant,
    },
    /// Not held.
    NotHeld,
}

/// How much of the silence the server allows a lease may use: the lock
/// is held for `silence` after the holder's last statement ended, which
/// is after the check that renewed the lease began; a fifth is left for
/// the two clocks' rates and the call about to be made.
const USABLE: f64 = 0.8;

impl Lease {
    /// A lease of `term` renewed by a check that began at `checked`, for a
    /// lock the server keeps `silence` after its holder's last statement.
    pub fn renewed(term: i64, checked: Instant, silence: Duration) -> Lease {
        Lease::Held {
            term,
            until: checked + silence.mul_f64(USABLE),
            from: checked,
        }
    }

    /// A lease just taken at `taken`, for a lock the server keeps
    /// `silence` after its holder's last statement, after a holder that
    /// may not have let go in order (`waits`): acting starts one whole
    /// silence later. An earlier holder's lease ran from a check that
    /// began before the lock was free, for 80 % of the silence, so it has
    /// run out by then with a fifth to spare for the two clocks.
    pub fn taken(term: i64, taken: Instant, silence: Duration, waits: bool) -> Lease {
        let lease = Lease::renewed(term, taken, silence);
        if waits {
            lease.acting_from(taken + silence)
        } else {
            lease
        }
    }

    /// The same lease with acting starting no earlier than `from` (a
    /// renewal keeps the wait a new lease began with).
    pub fn acting_from(self, from: Instant) -> Lease {
        match self {
            Lease::Held {
                term,
                until,
                from: own,
            } => Lease::Held {
                term,
                until,
                from: own.max(from),
            },
            other => other,
        }
    }

    /// When this lease lets its holder act, if it is held.
    pub fn acting_at(&self) -> Option<Instant> {
        match *self {
            Lease::Held { from, .. } => Some(from),
            _ => None,
        }
    }

    /// The term this lease lets its holder act in at `now`; `Err` with why
    /// not. `Ok(None)`: unmanaged, no term to check.
    pub fn term_at(&self, now: Instant) -> Result<Option<i64>, Deposed> {
        match *self {
            Lease::Unmanaged => Ok(None),
            Lease::NotHeld => Err(Deposed::NotLeading),
            Lease::Held { from, .. } if now < from => {
                Err(Deposed::PreviousLease { left: from - now })
            }
            Lease::Held { term, until, .. } if now < until => Ok(Some(term)),
            Lease::Held { .. } => Err(Deposed::LeaseExpired),
        }
    }
}

/// Why a side effect was not made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Deposed {
    #[error("this replica does not lead")]
    NotLeading,
    #[error("this replica's lease ran out (paused or cut off) before it was renewed")]
    LeaseExpired,
    #[error(
        "this replica has just taken the lead and waits {left:?} more for the previous \
         leader's lease to run out"
    )]
    PreviousLease { left: Duration },
    #[error("a later term ({current}) has begun; this replica's was {mine}")]
    LaterTerm { mine: i64, current: i64 },
    #[error("the store cannot confirm the term: {0}")]
    Unconfirmed(String),
}

impl Deposed {
    /// The metric label of the reason.
    pub fn code(&self) -> &'static str {
        match self {
            Deposed::NotLeading => "not_leading",
            Deposed::LeaseExpired => "lease_expired",
            Deposed::PreviousLease { .. } => "previous_lease",
            Deposed::LaterTerm { .. } => "later_term",
            Deposed::Unconfirmed(_) => "unconfirmed",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_runs_for_most_of_the_silence_from_its_check() {
        let checked = Instant::now();
        let lease = Lease::renewed(7, checked, Duration::from_secs(10));
        assert_eq!(lease.term_at(checked), Ok(Some(7)));
        assert_eq!(
            lease.term_at(checked + Duration::from_millis(7_999)),
            Ok(Some(7))
        );
        assert_eq!(
            lease.term_at(checked + Duration::from_secs(8)),
            Err(Deposed::LeaseExpired)
        );
        assert_eq!(Lease::NotHeld.term_at(checked), Err(Deposed::NotLeading));
        assert_eq!(Lease::Unmanaged.term_at(checked), Ok(None));
    }

    #[test]
    fn a_lead_taken_over_waits_out_the_silence_before_acting_and_keeps_waiting_when_renewed() {
        let silence = Duration::from_secs(5);
        let taken = Instant::now();
        let lease = Lease::taken(3, taken, silence, true);
        assert!(matches!(
            lease.term_at(taken),
            Err(Deposed::PreviousLease { left }) if left == silence
        ));
        // A renewal two seconds later does not end the wait…
        let renewed = Lease::renewed(3, taken + Duration::from_secs(2), silence)
            .acting_from(lease.acting_at().unwrap_or(taken));
        assert!(matches!(
            renewed.term_at(taken + Duration::from_millis(4_999)),
            Err(Deposed::PreviousLease { .. })
        ));
        // …which ends when the silence has passed, the lease then running.
        assert_eq!(renewed.term_at(taken + silence), Ok(Some(3)));
        // Any lease the previous holder renewed before `taken` has run out
        // by then, by its own clock.
        let previous = Lease::renewed(2, taken, silence);
        assert_eq!(
            previous.term_at(taken + silence),
            Err(Deposed::LeaseExpired)
        );
        // A lead taken after a release (or of a store one process owns)
        // acts at once.
        assert_eq!(
            Lease::taken(3, taken, silence, false).term_at(taken),
            Ok(Some(3))
        );
    }
}
