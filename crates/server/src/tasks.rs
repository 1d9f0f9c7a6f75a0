//! Background workers, one shape for all (STYLE rule 7, after garage's
//! `background/worker.rs`): a loop that runs its work every period (or at
//! once when woken), stops when shutdown is signalled — letting work in
//! progress finish within an exit deadline — counts consecutive failures
//! and backs off (doubling, jittered, capped) while they last, and keeps a
//! status that `GET /api/v1/tasks` shows. A leader-only worker skips its
//! rounds on a replica that does not lead.
//!
//! The lease sweeper, the leadership keeper, the reconciler and the GitHub
//! healer's two loops are such workers; `runway serve` starts them
//! (`crate::run`).

use std::collections::BTreeMap;
use std::fmt::Display;
use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use rand::Rng;
use runway_core::Timestamp;
use tokio::sync::{watch, Notify};

use crate::clock::now;

/// How long work in progress may take to finish once shutdown is signalled.
pub const EXIT_DEADLINE: Duration = Duration::from_secs(10);

/// The longest a failing worker waits before trying again (or its period,
/// if longer).
const MAX_BACKOFF: Duration = Duration::from_secs(60);
/// How often a leader-only worker that runs its first round at once checks
/// whether this replica has come to lead.
const FOLLOWER_RECHECK: Duration = Duration::from_secs(1);

/// What a worker is doing now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskState {
    /// Waiting for its next round.
    Idle,
    /// A round is running.
    Running,
    /// Its last round failed; waiting longer than its period.
    BackingOff,
    /// Leader-only, on a replica that does not lead: rounds are skipped.
    Following,
    /// Stopped (shutdown).
    Stopped,
}

impl TaskState {
    pub fn as_str(self) -> &'static str {
        match self {
            TaskState::Idle => "idle",
            TaskState::Running => "running",
            TaskState::BackingOff => "backing_off",
            TaskState::Following => "following",
            TaskState::Stopped => "stopped",
        }
    }
}

/// A worker's status, as `GET /api/v1/tasks` shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskStatus {
    pub name: &'static str,
    pub period: Duration,
    pub leader_only: bool,
    pub state: TaskState,
    /// Rounds run (skipped ones not counted).
    pub runs: u64,
    pub consecutive_failures: u32,
    /// The error of the latest failed round; kept after a success, for
    /// context, until the next failure replaces it.
    pub last_error: Option<String>,
    pub last_started_at: Option<Timestamp>,
    pub last_success_at: Option<Timestamp>,
}

/// The status of every worker of this process.
#[derive(Debug, Default)]
pub struct Tasks {
    statuses: Mutex<BTreeMap<&'static str, TaskStatus>>,
}

impl Tasks {
    /// Every worker's status, by name.
    pub fn snapshot(&self) -> Vec<TaskStatus> {
        self.statuses
            .lock()
            .map(|statuses| statuses.values().cloned().collect())
            .unwrap_or_default()
    }

    fn update(&self, name: &'static str, change: impl FnOnce(&mut TaskStatus)) {
        if let Ok(mut statuses) = self.statuses.lock() {
            if let Some(status) = statuses.get_mut(name) {
                change(status);
            }
        }
    }

    fn register(&self, worker: &Worker<'_>) {
        if let Ok(mut statuses) = self.statuses.lock() {
            statuses.insert(
                worker.name,
                TaskStatus {
                    name: worker.name,
                    period: worker.period,
                    leader_only: worker.leader_only,
                    state: TaskState::Idle,
                    runs: 0,
                    consecutive_failures: 0,
                    last_error: None,
                    last_started_at: None,
                    last_success_at: None,
                },
            );
        }
    }
}

/// How one worker runs.
pub struct Worker<'a> {
    pub name: &'static str,
    /// Between rounds while they succeed.
    pub period: Duration,
    /// Skip rounds unless this replica leads (`Service::is_leader`).
    pub leader_only: bool,
    /// Run the first round at once instead of after one period.
    pub first_round_at_once: bool,
    /// Also run a round when this is notified (the reconciler's
    /// `reconcile_wanted`).
    pub wake: Option<&'a Notify>,
}

impl Worker<'_> {
    /// The wait after `failures` consecutive failed rounds: the period,
    /// then doubling, capped, jittered so replicas do not retry in step.
    pub fn wait(&self, failures: u32) -> Duration {
        if failures == 0 {
            return self.period;
        }
        let backoff = self
            .period
            .saturating_mul(2u32.saturating_pow(failures.min(6)));
        backoff
            .min(MAX_BACKOFF.max(self.period))
            .mul_f64(rand::thread_rng().gen_range(0.5..1.0))
    }
}

impl<'a> Worker<'a> {
    /// Runs `work` round after round until `shutdown` becomes true, keeping
    /// its status in `tasks`. `leading` says whether this replica leads
    /// (asked before each round of a leader-only worker).
    pub async fn run<F, Fut, E>(
        self,
        tasks: &Tasks,
        leading: &(dyn Fn() -> bool + Send + Sync),
        mut shutdown: watch::Receiver<bool>,
        mut work: F,
    ) where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<(), E>>,
        E: Display,
    {
        tasks.register(&self);
        let name = self.name;
        let mut failures: u32 = 0;
        let mut first = self.first_round_at_once;
        loop {
            if !first {
                let wait = self.wait(failures);
                let woken = async {
                    match self.wake {
                        Some(notify) => notify.notified().await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    _ = shutdown.changed() => {}
                    () = tokio::time::sleep(wait) => {}
                    () = woken => {}
                }
            }
            first = false;
            if *shutdown.borrow() {
                break;
            }
            if self.leader_only && !leading() {
                tasks.update(name, |s| s.state = TaskState::Following);
                if self.first_round_at_once {
                    // Its first round runs as soon as this replica leads
                    // (on PostgreSQL the lock comes a moment after start),
                    // not a whole period later.
                    tokio::select! {
                        _ = shutdown.changed() => {}
                        () = tokio::time::sleep(FOLLOWER_RECHECK.min(self.period)) => {}
                    }
                    first = true;
                }
                continue;
            }
            tasks.update(name, |s| {
                s.state = TaskState::Running;
                s.last_started_at = Some(now());
            });
            let round = work();
            tokio::pin!(round);
            let finished = tokio::select! {
                result = &mut round => Some(result),
                () = async {
                    // The guard `wait_for` returns must not live across an await.
                    let _ = shutdown.wait_for(|stop| *stop).await;
                } => {
                    // Shutdown mid-round: let it finish within the deadline.
                    tokio::time::timeout(EXIT_DEADLINE, &mut round).await.ok()
                }
            };
            let Some(result) = finished else {
                tracing::warn!(task = name, deadline = ?EXIT_DEADLINE, "a round did not finish within the exit deadline; abandoned");
                break;
            };
            match result {
                Ok(()) => {
                    failures = 0;
                    tasks.update(name, |s| {
                        s.state = TaskState::Idle;
                        s.runs += 1;
                        s.consecutive_failures = 0;
                        s.last_success_at = Some(now());
                    });
                }
                Err(error) => {
                    failures += 1;
                    let message = error.to_string();
                    tracing::warn!(task = name, error = %message, consecutive_failures = failures, "background task failed; backing off");
                    tasks.update(name, |s| {
                        s.state = TaskState::BackingOff;
                        s.runs += 1;
                        s.consecutive_failures = failures;
                        s.last_error = Some(message);
                    });
                }
            }
        }
        tasks.update(name, |s| s.state = TaskState::Stopped);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;

    fn worker(name: &'static str) -> Worker<'static> {
        Worker {
            name,
            period: Duration::from_secs(1),
            leader_only: false,
            first_round_at_once: true,
            wake: None,
        }
    }

    #[test]
    fn backoff_doubles_is_capped_and_jittered() {
        let w = worker("w");
        assert_eq!(w.wait(0), Duration::from_secs(1));
        for failures in 1..20 {
            let expected = Duration::from_secs(2u64.pow(failures.min(6))).min(MAX_BACKOFF);
            let wait = w.wait(failures);
            assert!(
                wait >= expected / 2 && wait <= expected,
                "{failures}: {wait:?}"
            );
        }
    }

    /// Failures are counted and shown, a success resets the count, a
    /// follower skips its rounds, and shutdown stops the worker.
    #[tokio::test(start_paused = true)]
    async fn status_follows_the_rounds() {
        let tasks = Arc::new(Tasks::default());
        let (stop, stopped) = watch::channel(false);
        let calls = Arc::new(AtomicU32::new(0));
        let running = {
            let (tasks, calls) = (tasks.clone(), calls.clone());
            tokio::spawn(async move {
                worker("flaky")
                    .run(&tasks, &|| true, stopped, || {
                        let n = calls.fetch_add(1, Ordering::SeqCst);
                        async move {
                            if n < 2 {
                                Err(format!("failure {n}"))
                            } else {
                                Ok(())
                            }
                        }
                    })
                    .await
            })
        };
        let status = |tasks: &Tasks| tasks.snapshot().into_iter().next().unwrap();
        while calls.load(Ordering::SeqCst) < 2 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        tokio::task::yield_now().await;
        let failing = status(&tasks);
        assert_eq!(failing.state, TaskState::BackingOff);
        assert_eq!(failing.consecutive_failures, 2);
        assert_eq!(failing.last_error.as_deref(), Some("failure 1"));
        while calls.load(Ordering::SeqCst) < 3 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        tokio::task::yield_now().await;
        let recovered = status(&tasks);
        assert_eq!(
            (
                recovered.state,
                recovered.consecutive_failures,
                recovered.runs
            ),
            (TaskState::Idle, 0, 3)
        );
        stop.send(true).unwrap();
        running.await.unwrap();
        assert_eq!(status(&tasks).state, TaskState::Stopped);

        // A leader-only worker on a follower runs nothing.
        let (_stop, stopped) = watch::channel(false);
        let follower = Worker {
            leader_only: true,
            ..worker("follower")
        };
        let ran = Arc::new(AtomicU32::new(0));
        let handle = {
            let (tasks, ran) = (tasks.clone(), ran.clone());
            tokio::spawn(async move {
                follower
                    .run(&tasks, &|| false, stopped, || {
                        ran.fetch_add(1, Ordering::SeqCst);
                        async { Ok::<(), String>(()) }
                    })
                    .await
            })
        };
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(ran.load(Ordering::SeqCst), 0);
        let following = tasks
            .snapshot()
            .into_iter()
            .find(|s| s.name == "follower")
            .unwrap();
        assert_eq!(following.state, TaskState::Following);
        handle.abort();
    }

    /// On PostgreSQL the lead comes a moment after start: a leader-only
    /// worker that runs its first round at once (retention, with a period
    /// of minutes) runs it within a second of leading, not a period later.
    #[tokio::test(start_paused = true)]
    async fn a_first_round_runs_as_soon_as_the_lead_comes() {
        let tasks = Arc::new(Tasks::default());
        let (_stop, stopped) = watch::channel(false);
        let leading = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let ran = Arc::new(AtomicU32::new(0));
        let handle = {
            let (tasks, ran, leading) = (tasks.clone(), ran.clone(), leading.clone());
            tokio::spawn(async move {
                let hourly = Worker {
                    leader_only: true,
                    period: Duration::from_secs(3600),
                    ..worker("hourly")
                };
                let is_leading = move || leading.load(Ordering::SeqCst);
                hourly
                    .run(&tasks, &is_leading, stopped, || {
                        ran.fetch_add(1, Ordering::SeqCst);
                        async { Ok::<(), String>(()) }
                    })
                    .await
            })
        };
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(ran.load(Ordering::SeqCst), 0, "a follower runs nothing");
        leading.store(true, Ordering::SeqCst);
        tokio::time::sleep(FOLLOWER_RECHECK * 2).await;
        assert_eq!(ran.load(Ordering::SeqCst), 1, "the first round, at once");
        tokio::time::sleep(Duration::from_secs(600)).await;
        assert_eq!(ran.load(Ordering::SeqCst), 1, "then once a period");
        handle.abort();
    }
}
