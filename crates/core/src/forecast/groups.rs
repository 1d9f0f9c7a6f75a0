//! Bursts without workflow runs: jobs that come in groups (a matrix, a
//! fan-out, a push to several workflows) from traces or sources that do
//! not say which run a job belongs to. Only arrival times and a key (the
//! repository) are known, so a group is what arrives close together: a
//! key's arrivals each within [`GAP_MILLIS`] of the one before, and within
//! [`SPAN_MILLIS`] of the group's first.
//!
//! Per key, the sizes of its last [`RECENT`] groups and the spacing of
//! their arrivals are kept. While a group is open (its last arrival within
//! the gap), the recent groups that got at least this far say how likely
//! each further job is, and the spacing when it would come: a runner is
//! started for it now when that pays ([`Groups::expected`]).

use std::collections::{HashMap, VecDeque};

use crate::time::Timestamp;

/// A key's arrivals this close to the one before belong to one group (a
/// fan-out's jobs come seconds apart, now and then a longer pause).
const GAP_MILLIS: i64 = 30_000;
/// And a group lasts at most this long (a busy key's steady stream is not
/// one endless group).
const SPAN_MILLIS: i64 = 300_000;
/// Group sizes learnt from, per key.
const RECENT: usize = 200;
/// A key's groups say nothing until this many have reached a size.
const MIN_GROUPS: usize = 5;
/// Keys kept, whatever arrives; the one quiet longest goes first.
const MAX_KEYS: usize = 1_000;

#[derive(Debug, Clone, PartialEq, Default)]
struct Key {
    /// The open group: (first arrival, last arrival, size).
    open: Option<(i64, i64, u32)>,
    sizes: VecDeque<u32>,
    /// The last groups' milliseconds from one arrival to the next (of
    /// groups of two or more).
    spacings: VecDeque<i64>,
    /// `sizes` sorted and the median of `spacings`, kept as groups close
    /// (a forecast is asked far more often than a group closes).
    sorted: Vec<u32>,
    spacing: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub(super) struct Groups {
    keys: HashMap<String, Key>,
}

impl Groups {
    /// A job of `key` arrived at `at` (in time order per key).
    pub(super) fn observe(&mut self, key: &str, at: Timestamp) {
        let at = at.as_millis();
        if !self.keys.contains_key(key) && self.keys.len() >= MAX_KEYS {
            let quietest = self
                .keys
                .iter()
                .min_by_key(|(_, k)| k.open.map_or(i64::MIN, |(_, last, _)| last))
                .map(|(name, _)| name.clone());
            if let Some(name) = quietest {
                self.keys.remove(&name);
            }
        }
        let entry = self.keys.entry(key.to_owned()).or_default();
        match &mut entry.open {
            Some((first, last, size)) if at - *last <= GAP_MILLIS && at - *first <= SPAN_MILLIS => {
                *last = (*last).max(at);
                *size += 1;
            }
            open => {
                if let Some((first, last, size)) = open.take() {
                    entry.sizes.push_back(size);
                    if entry.sizes.len() > RECENT {
                        entry.sizes.pop_front();
                    }
                    if size >= 2 {
                        entry
                            .spacings
                            .push_back((last - first) / i64::from(size - 1));
                        if entry.spacings.len() > RECENT {
                            entry.spacings.pop_front();
                        }
                    }
                    entry.sorted.clear();
                    entry.sorted.extend(entry.sizes.iter().copied());
                    entry.sorted.sort_unstable();
                    let mut spacings: Vec<i64> = entry.spacings.iter().copied().collect();
                    entry.spacing = super::median(&mut spacings);
                }
                entry.open = Some((at, at, 1));
            }
        }
    }

    /// The jobs still to come of the groups open at `now` that are worth a
    /// runner started now, when a minute of a job's wait is worth
    /// `wait_value` minutes of a runner and a runner started now is ready
    /// in `horizon_millis`.
    ///
    /// A runner started now for a group's j-th job still to come saves
    /// that job the time until it would have arrived (the key's usual
    /// spacing, j times, from the group's last arrival; at most a boot)
    /// and costs nothing more if used — it would have booted at the job's
    /// arrival anyway. Unused, it costs its boot and its idling before it
    /// is removed, taken as two horizons. It is worth starting when
    /// `p × wait_value × saved ≥ (1 − p) × 2 horizons`, p being the share
    /// of the key's recent groups that got this far and brought at least j
    /// more. Jobs a few seconds away save little: a group arriving within
    /// seconds gets runners only for the jobs nearly certain to come.
    pub(super) fn expected(&self, now: Timestamp, horizon_millis: i64, wait_value: f64) -> u32 {
        let now = now.as_millis();
        let unused = 2.0 * horizon_millis as f64;
        let mut total = 0u32;
        for key in self.keys.values() {
            let Some((first, last, size)) = key.open else {
                continue;
            };
            if now - last > GAP_MILLIS || now - first > SPAN_MILLIS {
                continue;
            }
            // The recent groups that got this far.
            let reached = &key.sorted[key.sorted.partition_point(|s| *s < size)..];
            if reached.len() < MIN_GROUPS {
                continue;
            }
            let spacing = if size >= 2 {
                (last - first) / i64::from(size - 1)
            } else {
                match key.spacing {
                    Some(spacing) => spacing,
                    None => continue,
                }
            };
            total = total.saturating_add(worth(
                reached,
                size,
                last + spacing.max(0) - now,
                spacing.max(0),
                horizon_millis,
                wait_value,
                unused,
            ));
        }
        total
    }
}

/// How many of a group's further jobs are worth a runner now: `reached`
/// the sizes (sorted) of the recent groups that got to `size` — what each
/// brought after it is its size less `size` —, the next job `first_in`
/// milliseconds away and each one after `spacing` later. The j-th is worth it when `p × wait_value × saved ≥ (1 − p) ×
/// unused` with p the share of `rest` at least j and `saved` its time away
/// (at most a horizon). p is constant between the sizes, so this
/// counts per value, not per job: a key whose groups run to thousands
/// costs what one of twos does.
fn worth(
    reached: &[u32],
    size: u32,
    first_in: i64,
    spacing: i64,
    horizon_millis: i64,
    wait_value: f64,
    unused: f64,
) -> u32 {
    let n = reached.len();
    let mut total = 0u32;
    let mut previous = 0u32; // the jobs counted so far: j ≤ previous
    let mut index = 0;
    while index < n {
        let value = reached[index] - size;
        if value > previous {
            let p = (n - index) as f64 / n as f64;
            // The least time saved that pays for a runner at this p.
            let needed = (1.0 - p) * unused / (p * wait_value.max(f64::MIN_POSITIVE));
            // The first j (from 1) whose job is far enough away.
            let first = if needed <= 0.0 {
                1
            } else if needed > horizon_millis as f64 || spacing == 0 {
                u32::MAX
            } else {
                // first_in + (j − 1) × spacing ≥ needed
                let j = ((needed - first_in as f64) / spacing as f64).ceil() + 1.0;
                j.clamp(1.0, f64::from(u32::MAX)) as u32
            };
            let from = first.max(previous + 1);
            if from <= value {
                total = total.saturating_add(value - from + 1);
            }
            previous = value;
        }
        index += 1;
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(millis: i64) -> Timestamp {
        Timestamp::from_millis(millis)
    }

    /// Groups of `size` jobs a second apart, every ten minutes.
    fn groups(groups: &mut Groups, key: &str, sizes: &[u32]) -> i64 {
        let mut t = 0;
        for size in sizes {
            for i in 0..*size {
                groups.observe(key, at(t + i64::from(i) * 1_000));
            }
            t += 600_000;
        }
        t
    }

    #[test]
    fn a_groups_first_arrivals_announce_the_rest() {
        let mut g = Groups::default();
        let t = groups(&mut g, "org/a", &[12; 10]);
        let horizon = 20_000;
        assert_eq!(g.expected(at(t), horizon, 1.75), 0, "no group open");
        g.observe("org/a", at(t));
        g.observe("org/a", at(t + 1_000));
        g.observe("org/a", at(t + 2_000));
        // Every group brought 12: the other 9 are certain.
        assert_eq!(g.expected(at(t + 2_000), horizon, 1.75), 9);
        // Another key's groups say nothing about this one.
        g.observe("org/b", at(t + 2_600));
        assert_eq!(g.expected(at(t + 2_700), horizon, 1.75), 9);
        // Once the group has gone quiet, nothing more is expected of it.
        assert_eq!(g.expected(at(t + 2_000 + GAP_MILLIS + 1), horizon, 1.75), 0);
    }

    #[test]
    fn single_arrivals_expect_nothing_and_sizes_are_conditional() {
        let mut g = Groups::default();
        let t = groups(&mut g, "", &[1; 20]);
        g.observe("", at(t));
        assert_eq!(g.expected(at(t), 20_000, 9.5), 0, "a trickle has no groups");

        // Half the groups are 2, half 20: after 3 arrivals only the big
        // ones got that far.
        let mut g = Groups::default();
        let t = groups(&mut g, "k", &[2, 20, 2, 20, 2, 20, 2, 20, 2, 20, 2, 20]);
        g.observe("k", at(t));
        // A second job is certain; more a coin toss, not worth a runner
        // a second away.
        assert_eq!(g.expected(at(t), 20_000, 1.75), 1);
        g.observe("k", at(t + 1_000));
        g.observe("k", at(t + 2_000));
        assert_eq!(g.expected(at(t + 2_000), 20_000, 1.75), 17);
    }

    /// `worth`, one job at a time: the rule as written.
    fn worth_job_by_job(
        rest: &[u32],
        first_in: i64,
        spacing: i64,
        horizon: i64,
        wait_value: f64,
        unused: f64,
    ) -> u32 {
        let most = rest.iter().copied().max().unwrap_or(0);
        (1..=most)
            .filter(|j| {
                let p = rest.iter().filter(|r| **r >= *j).count() as f64 / rest.len() as f64;
                let saved = (first_in + i64::from(j - 1) * spacing).clamp(0, horizon) as f64;
                p * wait_value * saved >= (1.0 - p) * unused
            })
            .count() as u32
    }

    proptest::proptest! {
        #[test]
        fn worth_counts_per_value_what_job_by_job_counts(
            mut rest in proptest::collection::vec(0u32..60, 1..40),
            first_in in -20_000i64..60_000,
            spacing in 0i64..20_000,
            wait_value in 0.3f64..20.0,
        ) {
            rest.sort_unstable();
            let (horizon, unused) = (190_000, 380_000.0);
            proptest::prop_assert_eq!(
                worth(&rest, 0, first_in, spacing, horizon, wait_value, unused),
                worth_job_by_job(&rest, first_in, spacing, horizon, wait_value, unused)
            );
        }
    }

    #[test]
    fn keys_are_bounded() {
        let mut g = Groups::default();
        for i in 0..(MAX_KEYS as i64 + 50) {
            g.observe(&format!("k{i}"), at(i));
        }
        assert!(g.keys.len() <= MAX_KEYS);
    }
}
