//! Workflow runs in progress: a run's later jobs (those with `needs:`)
//! arrive when its earlier jobs finish, so a run whose first jobs have
//! arrived announces the rest. Learnt per workflow from the runs seen:
//! how many jobs came after a run's first stage, and how long after its
//! first arrival.
//!
//! A run's first stage is its jobs that arrived each within
//! [`STAGE_MILLIS`] of the one before (a scheduled run's hundreds of jobs
//! are queued over minutes, a second or two apart, and are all its first
//! stage); every arrival after a longer pause is a later job. A run with no
//! arrival for [`CLOSE_MILLIS`] is over and is learnt from.

use std::collections::{BTreeMap, VecDeque};

use crate::time::Timestamp;

/// A run's jobs that arrive this close to the one before, from its first
/// on, are its first stage.
const STAGE_MILLIS: i64 = 10_000;
/// A run with no arrival for this long is over.
const CLOSE_MILLIS: i64 = 3_600_000;
/// How many of a workflow's last runs are learnt from.
const RECENT: usize = 20;
/// A workflow is expected to have later jobs once this many runs of it
/// have been seen.
const MIN_RUNS: usize = 3;
/// Bounds on what is kept, whatever arrives.
const MAX_OPEN: usize = 10_000;
const MAX_WORKFLOWS: usize = 1_000;
/// Runs over are looked for at most this often.
const SWEEP_MILLIS: i64 = 60_000;

#[derive(Debug, Clone, PartialEq)]
struct Open {
    workflow: String,
    first: i64,
    last: i64,
    /// Jobs that arrived after the first stage.
    later: u32,
    /// When the first of those arrived.
    first_later: Option<i64>,
}

/// What one run that is over showed.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Seen {
    later: u32,
    /// From the run's first arrival to its first later job.
    delay: Option<i64>,
}

/// What a workflow's recent runs say a new run will bring.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Learnt {
    /// Later jobs per run, at the forecast's quantile.
    later: u32,
    /// When they come after the run's first arrival: the median and the
    /// longest delay seen.
    median_delay: i64,
    longest_delay: i64,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub(super) struct Runs {
    open: BTreeMap<u64, Open>,
    workflows: BTreeMap<String, VecDeque<Seen>>,
    next_sweep: i64,
}

impl Runs {
    /// A job of `run` (of `workflow`) arrived at `at`. True if it is a
    /// later job of the run (its arrival was announced by its first).
    pub(super) fn observe(&mut self, run: u64, workflow: &str, at: Timestamp) -> bool {
        let at = at.as_millis();
        if at >= self.next_sweep {
            self.next_sweep = at + SWEEP_MILLIS;
            let over: Vec<u64> = self
                .open
                .iter()
                .filter(|(_, open)| at - open.last > CLOSE_MILLIS)
                .map(|(id, _)| *id)
                .collect();
            for id in over {
                self.close(id);
            }
        }
        if let Some(open) = self.open.get_mut(&run) {
            if open.later > 0 || at - open.last > STAGE_MILLIS {
                open.later += 1;
                open.first_later.get_or_insert(at);
            }
            open.last = open.last.max(at);
            return open.later > 0;
        }
        if self.open.len() >= MAX_OPEN {
            // The run that has been quiet longest is taken as over.
            if let Some(oldest) = self
                .open
                .iter()
                .min_by_key(|(_, open)| open.last)
                .map(|(id, _)| *id)
            {
                self.close(oldest);
            }
        }
        self.open.insert(
            run,
            Open {
                workflow: workflow.to_owned(),
                first: at,
                last: at,
                later: 0,
                first_later: None,
            },
        );
        false
    }

    fn close(&mut self, run: u64) {
        let Some(open) = self.open.remove(&run) else {
            return;
        };
        if !self.workflows.contains_key(&open.workflow) && self.workflows.len() >= MAX_WORKFLOWS {
            return;
        }
        let recent = self.workflows.entry(open.workflow).or_default();
        recent.push_back(Seen {
            later: open.later,
            delay: open.first_later.map(|at| at - open.first),
        });
        while recent.len() > RECENT {
            recent.pop_front();
        }
    }

    fn learnt(&self, workflow: &str, quantile: f64) -> Option<Learnt> {
        let recent = self.workflows.get(workflow)?;
        if recent.len() < MIN_RUNS {
            return None;
        }
        let mut counts: Vec<u32> = recent.iter().map(|seen| seen.later).collect();
        counts.sort_unstable();
        let rank = (quantile * counts.len() as f64).ceil() as usize;
        let later = counts[rank.clamp(1, counts.len()) - 1];
        let mut delays: Vec<i64> = recent.iter().filter_map(|seen| seen.delay).collect();
        if delays.is_empty() {
            return None;
        }
        delays.sort_unstable();
        Some(Learnt {
            later,
            median_delay: delays[(delays.len() - 1) / 2],
            longest_delay: delays[delays.len() - 1],
        })
    }

    /// Later jobs of the runs in progress expected to arrive before
    /// `now + horizon_millis`: for each run none of whose later jobs has
    /// arrived yet, its workflow's average, once its median delay is
    /// within the horizon and until its longest delay (and a horizon) has
    /// passed with none.
    pub(super) fn expected(&self, now: Timestamp, horizon_millis: i64, quantile: f64) -> u32 {
        let now = now.as_millis();
        let mut learnt: BTreeMap<&str, Option<Learnt>> = BTreeMap::new();
        let mut total = 0u32;
        for open in self.open.values() {
            if open.later > 0 || now - open.last > CLOSE_MILLIS {
                continue;
            }
            let Some(workflow) = *learnt
                .entry(open.workflow.as_str())
                .or_insert_with(|| self.learnt(&open.workflow, quantile))
            else {
                continue;
            };
            let due = open.first + workflow.median_delay <= now + horizon_millis;
            let late = now > open.first + workflow.longest_delay + horizon_millis;
            if due && !late {
                total = total.saturating_add(workflow.later);
            }
        }
        total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_millis(seconds * 1000)
    }

    /// A run of `workflow` at `start`: `first` jobs at once, `later` jobs
    /// `delay` seconds on.
    fn run(
        runs: &mut Runs,
        id: u64,
        workflow: &str,
        start: i64,
        first: u32,
        later: u32,
        delay: i64,
    ) {
        for _ in 0..first {
            runs.observe(id, workflow, at(start));
        }
        for _ in 0..later {
            runs.observe(id, workflow, at(start + delay));
        }
    }

    #[test]
    fn a_workflow_that_fans_out_announces_its_later_jobs() {
        let mut runs = Runs::default();
        for id in 0..5 {
            run(&mut runs, id, "ci", i64::from(id as u32) * 7_200, 1, 8, 90);
        }
        // A new run two hours after the fifth: its arrival closes the
        // fifth, so five runs have been learnt from.
        let start = 5 * 7_200;
        runs.observe(99, "ci", at(start));
        // Its later jobs come 90 s after it: within a 160 s horizon now.
        assert_eq!(runs.expected(at(start), 160, 0.5), 0, "horizon in millis");
        assert_eq!(runs.expected(at(start), 160_000, 0.5), 8);
        // Not before the median delay is within the horizon.
        assert_eq!(runs.expected(at(start), 60_000, 0.5), 0);
        // Once they have come, nothing more is expected of the run.
        runs.observe(99, "ci", at(start + 90));
        assert_eq!(runs.expected(at(start + 90), 160_000, 0.5), 0);
    }

    /// A scheduled run's jobs queued over minutes, seconds apart, are all
    /// its first stage (the batch recognition sees them); a pause of more
    /// than ten seconds starts its later jobs.
    #[test]
    fn a_runs_first_stage_is_what_arrives_without_a_pause() {
        let mut runs = Runs::default();
        for i in 0..150 {
            assert!(!runs.observe(7, "nightly", at(i)), "job {i} is first stage");
        }
        assert!(
            runs.observe(7, "nightly", at(149 + 11)),
            "after a pause: later"
        );
        assert!(runs.observe(7, "nightly", at(149 + 12)), "and all after it");
    }

    #[test]
    fn a_workflow_without_later_jobs_announces_nothing() {
        let mut runs = Runs::default();
        for id in 0..6 {
            run(
                &mut runs,
                id,
                "nightly",
                i64::from(id as u32) * 86_400,
                40,
                0,
                0,
            );
        }
        runs.observe(100, "nightly", at(6 * 86_400));
        assert_eq!(runs.expected(at(6 * 86_400), 160_000, 0.5), 0);
    }

    #[test]
    fn a_run_whose_later_jobs_never_come_stops_being_expected() {
        let mut runs = Runs::default();
        for id in 0..5 {
            run(&mut runs, id, "ci", i64::from(id as u32) * 7_200, 1, 4, 60);
        }
        let start = 5 * 7_200;
        runs.observe(42, "ci", at(start));
        assert_eq!(runs.expected(at(start), 160_000, 0.5), 4);
        // Its plan failed: after the longest delay and a horizon, none.
        assert_eq!(runs.expected(at(start + 60 + 161), 160_000, 0.5), 0);
    }

    #[test]
    fn what_is_kept_is_bounded() {
        let mut runs = Runs::default();
        for id in 0..(MAX_OPEN as u64 + 50) {
            runs.observe(id, &format!("w{}", id % 2_000), at(id as i64));
        }
        assert!(runs.open.len() <= MAX_OPEN);
        assert!(runs.workflows.len() <= MAX_WORKFLOWS);
    }
}
