//! The GitHub request budget under arbitrary traffic.

use std::time::Duration;

use proptest::prelude::*;
use runway_core::github_budget::{Budget, Priority};
use runway_core::Timestamp;

/// At a time (s): an attempt (priority, whether the caller wants to send)
/// or rate-limit headers (remaining, reset in s, Retry-After in s).
type Event = (
    i64,
    Option<(Priority, bool)>,
    Option<(u32, i64, Option<u64>)>,
);

fn priority() -> impl Strategy<Value = Priority> {
    prop::sample::select(Priority::ALL.to_vec())
}

proptest! {
    /// Whatever the traffic: a request that follows `permit` never takes
    /// runway past its hourly cap, and whenever a less important request
    /// may go, every more important one may too.
    #[test]
    fn the_cap_holds_and_priorities_are_monotonic(
        max in 1u32..60,
        attempts in prop::collection::vec((priority(), 0i64..20_000, any::<bool>()), 1..400),
        headers in prop::collection::vec((0i64..20_000, 0u32..80, 0i64..3_600, prop::option::of(0u64..120)), 0..10),
    ) {
        let mut budget = Budget::new(max);
        let mut events: Vec<Event> = attempts
            .iter()
            .map(|(p, t, go)| (*t, Some((*p, *go)), None))
            .chain(headers.iter().map(|(t, remaining, reset, retry)| (*t, None, Some((*remaining, *reset, *retry)))))
            .collect();
        events.sort_by_key(|e| e.0);
        let mut sent: Vec<i64> = Vec::new();
        for (t, attempt, header) in events {
            let now = Timestamp::from_millis(t * 1000);
            if let Some((remaining, reset, retry)) = header {
                budget.observe(
                    Some(remaining),
                    Some(100),
                    Some(Timestamp::from_millis((t + reset) * 1000)),
                    retry.map(Duration::from_secs),
                    now,
                );
            }
            for (i, p) in Priority::ALL.iter().enumerate() {
                if budget.permit(*p, now).is_ok() {
                    for q in &Priority::ALL[..i] {
                        prop_assert!(budget.permit(*q, now).is_ok(), "{p:?} allowed but {q:?} not");
                    }
                }
            }
            if let Some((p, go)) = attempt {
                if go && budget.permit(p, now).is_ok() {
                    budget.spend(now);
                    sent.push(t);
                }
            }
        }
        for (i, start) in sent.iter().enumerate() {
            let in_hour = sent[i..].iter().take_while(|t| **t < start + 3600).count();
            prop_assert!(in_hour as u32 <= max, "{in_hour} requests within an hour of {start}, cap {max}");
        }
    }

    /// After a Retry-After, nothing goes out before it ends.
    #[test]
    fn retry_after_stops_everything(wait in 1u64..600, probe in 0u64..600) {
        let mut budget = Budget::new(1_000);
        let start = Timestamp::from_millis(1_000_000);
        let reset = Some(start.plus(Duration::from_secs(3_600)));
        budget.observe(Some(1_000), Some(1_000), reset, Some(Duration::from_secs(wait)), start);
        let now = start.plus(Duration::from_secs(probe));
        for p in Priority::ALL {
            prop_assert_eq!(budget.permit(p, now).is_ok(), probe >= wait);
        }
    }
}

/// A lookup only for a label (the run's event) waits until GitHub has said
/// what is left, and then spends only the top half of it.
#[test]
fn run_event_lookups_wait_for_githubs_word_and_keep_half() {
    let start = Timestamp::from_millis(1_000_000);
    let mut budget = Budget::new(5_000);
    assert!(budget.permit(Priority::RunEvent, start).is_err());
    assert!(budget.permit(Priority::Redeliver, start).is_ok());
    let reset = Some(start.plus(Duration::from_secs(3_600)));
    budget.observe(Some(2_600), Some(5_000), reset, None, start);
    assert!(budget.permit(Priority::RunEvent, start).is_ok());
    budget.observe(Some(2_500), Some(5_000), reset, None, start);
    assert!(budget.permit(Priority::RunEvent, start).is_err());
    assert!(budget.permit(Priority::Redeliver, start).is_ok());
}
