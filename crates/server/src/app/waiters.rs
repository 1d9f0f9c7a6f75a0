//! The runners long-polling on this replica for a job (`jobs/request`),
//! and which of them a job wakes.
//!
//! Every woken runner pays a claim, and only one can get the job. So a job
//! whose labels are known wakes *one* waiter: of the job's pool, the one
//! waiting longest among those whose labels cover the job's and that the
//! job has not excluded (it declined it), skipping waiters already woken
//! and not yet looking again. A waiter that leaves before a look settled
//! its wake-up (took a job, or found none it could take) passes it on: its
//! runner was draining, its poll ended, its claim failed. Wake-ups whose job is not known (a reload, another replica's, a
//! lost listener) wake every waiter of a pool, or of every pool. The long
//! poll has no timed re-poll: [`safety_net`] (one look per pool every
//! [`SAFETY_NET`]) is the fallback for anything missed.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use runway_core::{Job, JobState, RunnerId};
use runway_store::Wanted;
use tokio::sync::Notify;

use crate::telemetry::metrics::PoolLabel;

/// What a runner may take, as its claim says.
#[derive(Debug, Clone)]
struct Serves {
    runner: RunnerId,
    /// Lowercase; `None`: any labels.
    labels: Option<Vec<String>>,
}

impl Serves {
    fn job(&self, job: &JobWanted) -> bool {
        !job.excluded.contains(&self.runner)
            && self.labels.as_ref().is_none_or(|mine| {
                job.labels
                    .iter()
                    .all(|wanted| mine.iter().any(|have| have == wanted))
            })
    }
}

/// A job a wake-up is for: what a waiter must serve to be worth waking.
#[derive(Debug, Clone, PartialEq, Eq)]
struct JobWanted {
    /// Lowercase.
    labels: Vec<String>,
    excluded: BTreeSet<RunnerId>,
}

impl JobWanted {
    fn of(job: &Job) -> JobWanted {
        JobWanted {
            labels: job.labels.iter().map(|l| l.to_lowercase()).collect(),
            excluded: job.excluded_runners.clone(),
        }
    }

    /// What another replica's wake-up says its jobs want.
    fn announced(wanted: &Wanted) -> JobWanted {
        JobWanted {
            labels: wanted.labels.iter().map(|l| l.to_lowercase()).collect(),
            excluded: wanted.excluded.iter().copied().map(RunnerId).collect(),
        }
    }
}

/// What `job` wants of a runner, as a wake-up to other replicas says it.
pub fn wanted(job: &Job) -> Wanted {
    let JobWanted { labels, excluded } = JobWanted::of(job);
    Wanted {
        labels,
        excluded: excluded.into_iter().map(|runner| runner.0).collect(),
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Woken {
    /// Looking or waiting, not woken since it last looked.
    No,
    /// Woken for the queue as a whole.
    ForAny,
    /// Woken for this job.
    For(JobWanted),
}

struct Slot {
    id: u64,
    serves: Serves,
    notify: Notify,
    woken: Mutex<Woken>,
}

#[derive(Default)]
struct Pools {
    next_id: u64,
    /// Per pool, its waiters, longest waiting first.
    waiting: HashMap<String, Vec<Arc<Slot>>>,
}

/// The waiters of this replica, by pool.
#[derive(Default)]
pub struct Waiters {
    pools: Mutex<Pools>,
    /// How many wait, by pool (`runway_runners_polling`).
    gauge: Family<PoolLabel, Gauge>,
    /// How many were woken, by pool (`runway_runners_woken_total`).
    woken: Family<PoolLabel, Counter>,
}

impl Waiters {
    /// Waiters that keep `gauge` at how many wait in each pool and count
    /// in `woken` each waiter woken.
    pub fn counted(gauge: Family<PoolLabel, Gauge>, woken: Family<PoolLabel, Counter>) -> Waiters {
        Waiters {
            pools: Mutex::default(),
            gauge,
            woken,
        }
    }

    fn count_woken(&self, pool: &str, woken: usize) {
        self.woken
            .get_or_create(&PoolLabel {
                pool: pool.to_owned(),
            })
            .inc_by(u64::try_from(woken).unwrap_or(u64::MAX));
    }

    fn count(&self, pool: &str, waiting: usize) {
        self.gauge
            .get_or_create(&PoolLabel {
                pool: pool.to_owned(),
            })
            .set(i64::try_from(waiting).unwrap_or(i64::MAX));
    }

    /// Registers a runner that will wait for jobs of `pool` it can take
    /// (`labels`: its labels, `None` for any). It stays registered until
    /// the returned [`Waiting`] is dropped.
    pub fn enter(&self, pool: &str, runner: RunnerId, labels: Option<&[String]>) -> Waiting<'_> {
        let mut pools = lock(&self.pools);
        pools.next_id += 1;
        let slot = Arc::new(Slot {
            id: pools.next_id,
            serves: Serves {
                runner,
                labels: labels.map(|labels| labels.iter().map(|l| l.to_lowercase()).collect()),
            },
            notify: Notify::new(),
            woken: Mutex::new(Woken::No),
        });
        let slots = pools.waiting.entry(pool.to_owned()).or_default();
        slots.push(slot.clone());
        self.count(pool, slots.len());
        Waiting {
            waiters: self,
            pool: pool.to_owned(),
            slot,
            pending: None,
        }
    }

    /// `job` may be queued: if it is, wakes one waiter of its pool that can
    /// take it and is not already woken. False when none was woken.
    pub fn job_queued(&self, job: &Job) -> bool {
        match &job.pool {
            Some(pool) if job.state == JobState::Queued => self.wake_one(pool, JobWanted::of(job)),
            _ => false,
        }
    }

    /// Another replica queued `count` jobs of `pool` that each want
    /// `wanted`: wakes up to `count` waiters here that can take one, as
    /// [`Waiters::job_queued`] does for each.
    pub fn jobs_queued(&self, pool: &str, wanted: &Wanted, count: u32) {
        let wanted = JobWanted::announced(wanted);
        for _ in 0..count {
            if !self.wake_one(pool, wanted.clone()) {
                break;
            }
        }
    }

    fn wake_one(&self, pool: &str, wanted: JobWanted) -> bool {
        let pools = lock(&self.pools);
        let Some(slots) = pools.waiting.get(pool) else {
            return false;
        };
        for slot in slots {
            if !slot.serves.job(&wanted) {
                continue;
            }
            let mut woken = lock(&slot.woken);
            if *woken == Woken::No {
                *woken = Woken::For(wanted);
                slot.notify.notify_one();
                self.count_woken(pool, 1);
                return true;
            }
        }
        false
    }

    /// Wakes every waiter of `pool`, or of every pool.
    pub fn wake_all(&self, pool: Option<&str>) {
        let pools = lock(&self.pools);
        let slots: Vec<(&String, &Vec<Arc<Slot>>)> = match pool {
            Some(pool) => pools.waiting.get_key_value(pool).into_iter().collect(),
            None => pools.waiting.iter().collect(),
        };
        for (pool, slots) in slots {
            for slot in slots {
                *lock(&slot.woken) = Woken::ForAny;
                slot.notify.notify_one();
            }
            self.count_woken(pool, slots.len());
        }
    }

    /// The pools with runners waiting here, none of them woken and not
    /// yet looking: where a missed wake-up would leave a job unclaimed.
    pub fn quiet_pools(&self) -> Vec<String> {
        let pools = lock(&self.pools);
        pools
            .waiting
            .iter()
            .filter(|(_, slots)| slots.iter().all(|slot| *lock(&slot.woken) == Woken::No))
            .map(|(pool, _)| pool.clone())
            .collect()
    }

    /// Wakes `job`'s pool's longest-waiting runner that can take it, or,
    /// when none can, the longest-waiting of any labels (its claim finds
    /// what it can take). False when nobody waits there.
    pub fn wake_for(&self, job: &Job) -> bool {
        let Some(pool) = job.pool.as_deref() else {
            return false;
        };
        if self.wake_one(pool, JobWanted::of(job)) {
            return true;
        }
        let pools = lock(&self.pools);
        let Some(slot) = pools.waiting.get(pool).and_then(|slots| slots.first()) else {
            return false;
        };
        let mut woken = lock(&slot.woken);
        if *woken == Woken::No {
            *woken = Woken::ForAny;
            slot.notify.notify_one();
            self.count_woken(pool, 1);
        }
        true
    }

    /// Wakes `runner`'s own long poll here, if it waits: it changed (it
    /// drains, or stops) and should look at itself again.
    pub fn wake_runner(&self, runner: RunnerId) {
        let pools = lock(&self.pools);
        for slot in pools.waiting.values().flatten() {
            if slot.serves.runner == runner {
                let mut woken = lock(&slot.woken);
                if *woken == Woken::No {
                    *woken = Woken::ForAny;
                }
                slot.notify.notify_one();
            }
        }
    }

    /// How many runners wait here now.
    pub fn waiting(&self) -> usize {
        lock(&self.pools).waiting.values().map(Vec::len).sum()
    }
}

/// A runner registered as waiting ([`Waiters::enter`]).
pub struct Waiting<'a> {
    waiters: &'a Waiters,
    pool: String,
    slot: Arc<Slot>,
    /// The job its latest look acts on, until [`Waiting::settled`].
    pending: Option<JobWanted>,
}

impl Waiting<'_> {
    /// Call before each look at the queue: a wake-up from here on is for
    /// what that look may miss, and one before it is what it acts on.
    pub fn looking(&mut self) {
        let woken = std::mem::replace(&mut *lock(&self.slot.woken), Woken::No);
        if let Woken::For(job) = woken {
            if let Some(earlier) = self.pending.replace(job) {
                self.waiters.wake_one(&self.pool, earlier);
            }
        }
    }

    /// The look took a job, or found none this runner could take (so the
    /// job it was woken for went to another): its wake-up is spent.
    pub fn settled(&mut self) {
        self.pending = None;
    }

    /// Until woken (at once if woken since the last [`Waiting::looking`]).
    pub async fn woken(&self) {
        self.slot.notify.notified().await;
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        {
            let mut pools = lock(&self.waiters.pools);
            if let Some(slots) = pools.waiting.get_mut(&self.pool) {
                slots.retain(|slot| slot.id != self.slot.id);
                self.waiters.count(&self.pool, slots.len());
                if slots.is_empty() {
                    pools.waiting.remove(&self.pool);
                }
            }
        }
        // Woken for a job and gone before a look settled it: someone else
        // should look.
        let woken = std::mem::replace(&mut *lock(&self.slot.woken), Woken::No);
        let unsettled = self.pending.take();
        for job in unsettled.into_iter().chain(match woken {
            Woken::For(job) => Some(job),
            _ => None,
        }) {
            self.waiters.wake_one(&self.pool, job);
        }
    }
}

/// How often the safety net looks: what a missed wake-up costs a job at
/// most, beyond one claim.
pub const SAFETY_NET: std::time::Duration = std::time::Duration::from_secs(2);

/// The safety net under the wake-ups (every replica, every [`SAFETY_NET`]):
/// for each pool whose runners all wait here unwoken, one look at the
/// head of its queue; a job there means a wake-up was missed (a lost
/// notification, a requeue no wake-up followed), and one waiter is woken
/// for it. One indexed read per such pool, not one per waiter, and none
/// where nobody waits.
pub async fn safety_net(
    service: Arc<crate::app::Service>,
    shutdown: tokio::sync::watch::Receiver<bool>,
) {
    crate::tasks::Worker {
        name: "long_poll_safety_net",
        period: SAFETY_NET,
        leader_only: false,
        first_round_at_once: false,
        wake: None,
    }
    .run(&service.tasks, &|| true, shutdown, || {
        let service = service.clone();
        async move { safety_net_round(&service).await.map(drop) }
    })
    .await
}

/// One look of the [`safety_net`]: how many waiters it woke.
pub async fn safety_net_round(
    service: &crate::app::Service,
) -> Result<u32, runway_store::StoreError> {
    let mut woken = 0;
    for pool in service.waiters.quiet_pools() {
        let head = service
            .store
            .list_jobs(&runway_store::JobFilter {
                pool: Some(pool.clone()),
                state: Some(JobState::Queued),
                limit: Some(1),
                ..runway_store::JobFilter::default()
            })
            .await?;
        if let Some(job) = head.first() {
            if service.waiters.wake_for(job) {
                woken += 1;
                service
                    .metrics
                    .safety_net_wakeups
                    .get_or_create(&PoolLabel { pool })
                    .inc();
            }
        }
    }
    Ok(woken)
}

/// `mutex`'s guard, poisoned or not (nothing held in these mutexes is left
/// half-changed by a panic).
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use runway_core::job::NewJob;
    use runway_core::{JobId, Timestamp};
    use std::future::Future;

    fn job(pool: &str, labels: &[&str]) -> Job {
        NewJob::api("j", pool, labels).initial(JobId(1), Timestamp::from_millis(0))
    }

    fn labels(labels: &[&str]) -> Vec<String> {
        labels.iter().map(|l| (*l).to_owned()).collect()
    }

    /// Whether `waiting` has been woken, without waiting.
    fn woken(waiting: &Waiting<'_>) -> bool {
        let mut woken = Box::pin(waiting.woken());
        let mut context = std::task::Context::from_waker(std::task::Waker::noop());
        woken.as_mut().poll(&mut context).is_ready()
    }

    /// How many waiters of `pool` were woken, as the metric counts them.
    fn woken_in(waiters: &Waiters, pool: &str) -> u64 {
        waiters
            .woken
            .get_or_create(&PoolLabel {
                pool: pool.to_owned(),
            })
            .get()
    }

    #[test]
    fn jobs_another_replica_queued_wake_as_many_runners_that_can_take_them() {
        let waiters = Waiters::default();
        let linux = labels(&["self-hosted", "linux"]);
        let excluded = waiters.enter("default", RunnerId(1), None);
        let windows = waiters.enter("default", RunnerId(2), Some(&labels(&["windows"])));
        let first = waiters.enter("default", RunnerId(3), Some(&linux));
        let second = waiters.enter("default", RunnerId(4), None);
        let third = waiters.enter("default", RunnerId(5), Some(&linux));
        let elsewhere = waiters.enter("other", RunnerId(6), None);
        // Two jobs that want `Linux` and declined runner 1.
        let wanted = Wanted {
            labels: vec!["Linux".into()],
            excluded: vec![1],
        };
        waiters.jobs_queued("default", &wanted, 2);
        assert!(woken(&first) && woken(&second));
        assert!(!woken(&excluded) && !woken(&windows) && !woken(&third) && !woken(&elsewhere));
        assert_eq!(woken_in(&waiters, "default"), 2);
        // More jobs than runners that can take them: each such runner once.
        waiters.jobs_queued("default", &wanted, 5);
        assert!(woken(&third) && !woken(&excluded) && !woken(&windows));
        assert_eq!(woken_in(&waiters, "default"), 3);
        // A wake-up of the whole pool wakes and counts each of its runners.
        waiters.wake_all(Some("default"));
        assert!(woken(&excluded) && woken(&windows) && !woken(&elsewhere));
        assert_eq!(woken_in(&waiters, "default"), 8);
        assert_eq!(woken_in(&waiters, "other"), 0);
    }

    #[test]
    fn a_job_wakes_the_longest_waiting_runner_that_can_take_it() {
        let waiters = Waiters::default();
        let linux = labels(&["self-hosted", "Linux"]);
        let gpu = labels(&["self-hosted", "linux", "gpu"]);
        let mut first = waiters.enter("default", RunnerId(1), Some(&linux));
        let second = waiters.enter("default", RunnerId(2), Some(&gpu));
        let third = waiters.enter("default", RunnerId(3), Some(&gpu));
        let elsewhere = waiters.enter("other", RunnerId(4), None);

        // Labels compare without case; only the first is woken.
        assert!(waiters.job_queued(&job("default", &["LINUX"])));
        assert!(woken(&first));
        assert!(!woken(&second) && !woken(&third) && !woken(&elsewhere));

        // The first is woken and has not looked again: a second job wakes
        // the next waiter that can take it.
        assert!(waiters.job_queued(&job("default", &["linux"])));
        assert!(woken(&second));
        // Only the gpu runners can take a gpu job, and the second is busy
        // looking: the third.
        assert!(waiters.job_queued(&job("default", &["gpu"])));
        assert!(woken(&third));
        // Everyone who could is woken: nobody left to wake.
        assert!(!waiters.job_queued(&job("default", &["gpu"])));
        // Once looking again, a waiter can be woken again.
        let mut second = second;
        second.looking();
        assert!(waiters.job_queued(&job("default", &["gpu"])));
        assert!(woken(&second));
        // Nobody takes a job of a pool nobody waits in, or a label nobody
        // has; a job no longer queued wakes nobody.
        assert!(!waiters.job_queued(&job("empty", &["linux"])));
        first.looking();
        assert!(!waiters.job_queued(&job("default", &["arm64"])));
        let mut running = job("default", &["linux"]);
        running.state = JobState::Running;
        assert!(!waiters.job_queued(&running));
    }

    #[test]
    fn the_gauge_counts_the_waiters_of_each_pool() {
        let gauge = Family::<PoolLabel, Gauge>::default();
        let waiters = Waiters::counted(gauge.clone(), Family::default());
        let of = |pool: &str| {
            gauge
                .get_or_create(&PoolLabel {
                    pool: pool.to_owned(),
                })
                .get()
        };
        let a = waiters.enter("default", RunnerId(1), None);
        let b = waiters.enter("default", RunnerId(2), None);
        let c = waiters.enter("other", RunnerId(3), None);
        assert_eq!((of("default"), of("other")), (2, 1));
        drop(a);
        drop(c);
        assert_eq!((of("default"), of("other")), (1, 0));
        drop(b);
        assert_eq!(of("default"), 0);
    }

    #[test]
    fn a_job_never_wakes_the_runner_it_excluded() {
        let waiters = Waiters::default();
        let declined = waiters.enter("default", RunnerId(1), None);
        let other = waiters.enter("default", RunnerId(2), None);
        let mut requeued = job("default", &["linux"]);
        requeued.excluded_runners.insert(RunnerId(1));
        assert!(waiters.job_queued(&requeued));
        assert!(!woken(&declined));
        assert!(woken(&other));
    }

    #[test]
    fn a_waiter_that_leaves_before_its_wakeup_is_settled_passes_it_on() {
        let waiters = Waiters::default();
        let leaving = waiters.enter("default", RunnerId(1), None);
        let mut staying = waiters.enter("default", RunnerId(2), None);
        // Woken, gone without looking.
        assert!(waiters.job_queued(&job("default", &["linux"])));
        assert!(!woken(&staying));
        drop(leaving);
        assert!(woken(&staying), "the job still needs a runner");
        assert_eq!(waiters.waiting(), 1);

        // Woken, looked, gone before the look settled (its claim failed,
        // its runner is draining).
        let mut next = waiters.enter("default", RunnerId(3), None);
        staying.looking();
        staying.settled();
        assert!(waiters.job_queued(&job("default", &["linux"])));
        staying.looking();
        drop(staying);
        assert!(woken(&next), "passed on");

        // A look that settled passes nothing on.
        let last = waiters.enter("default", RunnerId(4), None);
        next.looking();
        next.settled();
        drop(next);
        assert!(!woken(&last));
        drop(last);
        assert_eq!(waiters.waiting(), 0, "pools nobody waits in are forgotten");
    }

    #[test]
    fn a_wakeup_of_a_pool_or_of_every_pool_wakes_all_their_waiters() {
        let waiters = Waiters::default();
        let a = waiters.enter("default", RunnerId(1), None);
        let b = waiters.enter("default", RunnerId(2), None);
        let c = waiters.enter("other", RunnerId(3), None);
        waiters.wake_all(Some("default"));
        assert!(woken(&a) && woken(&b));
        assert!(!woken(&c));
        waiters.wake_all(None);
        assert!(woken(&b) && woken(&c));
        // A wake-up of everyone is passed on by nobody.
        drop(a);
        assert!(!woken(&b));
    }
}
