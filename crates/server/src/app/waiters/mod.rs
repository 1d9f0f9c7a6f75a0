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
//!
//! Every wake-up of a pool moves its *epoch* on. A runner whose look found
//! nothing is remembered with the epoch its look began at; while the
//! epoch stands still, its next poll begins without a look (it is
//! *spared*): a fleet waiting on an empty queue makes no store query but
//! its authentication, however often its polls are renewed. What a
//! spared poll could miss is what a wake-up missed, and the safety net
//! finds it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
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
    /// Lowercase; `None`: any labels. Shared with the runner's remembered
    /// look ([`FoundNothing`]), so a renewal copies no labels.
    labels: Option<Arc<[String]>>,
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
    /// Shared by every slot of the pool ([`PoolSeries::name`]).
    pool: Arc<str>,
    serves: Serves,
    notify: Notify,
    woken: Mutex<Woken>,
}

/// A runner's latest look found nothing it could take: in `pool`, with
/// `labels`, as of the pool's `epoch`.
struct FoundNothing {
    pool: Arc<str>,
    labels: Option<Arc<[String]>>,
    epoch: u64,
}

/// Whether `given` (as a poll names them) are `lowercase` (as a look
/// remembered them), without building their lowercase copy.
fn same_labels(lowercase: Option<&[String]>, given: Option<&[String]>) -> bool {
    // `lower` is a lowercase copy, so for ASCII this is the whole test.
    let same = |lower: &String, given: &String| {
        if given.is_ascii() {
            given.eq_ignore_ascii_case(lower)
        } else {
            given.to_lowercase() == *lower
        }
    };
    match (lowercase, given) {
        (None, None) => true,
        (Some(lowercase), Some(given)) => {
            lowercase.len() == given.len() && lowercase.iter().zip(given).all(|(l, g)| same(l, g))
        }
        _ => false,
    }
}

/// A pool's name and its series, looked up once: a poll counts in them
/// without a label built and hashed into each family every time.
struct PoolSeries {
    name: Arc<str>,
    polling: Gauge,
    woken: Counter,
    looks: Counter,
    spared: Counter,
}

impl PoolSeries {
    fn of<'a>(
        series: &'a mut HashMap<String, PoolSeries>,
        metrics: &WaiterMetrics,
        pool: &str,
    ) -> &'a PoolSeries {
        if !series.contains_key(pool) {
            let label = PoolLabel {
                pool: pool.to_owned(),
            };
            let made = PoolSeries {
                name: Arc::from(pool),
                polling: metrics.polling.get_or_create(&label).clone(),
                woken: metrics.woken.get_or_create(&label).clone(),
                looks: metrics.looks.get_or_create(&label).clone(),
                spared: metrics.spared.get_or_create(&label).clone(),
            };
            series.insert(pool.to_owned(), made);
        }
        &series[pool]
    }
}

fn as_count(count: usize) -> u64 {
    u64::try_from(count).unwrap_or(u64::MAX)
}

/// Past this many remembered looks, the stale ones are forgotten.
const FOUND_NOTHING_PRUNE: usize = 4_096;

#[derive(Default)]
struct Pools {
    next_id: u64,
    /// Per pool, its waiters by slot id: longest waiting first, and one
    /// leaves in O(log n), not a scan of everyone waiting (at 10,000
    /// waiters a scan per renewal was a quarter of the idle CPU).
    waiting: HashMap<String, BTreeMap<u64, Arc<Slot>>>,
    /// Each waiting runner's slots (one, unless it holds several polls).
    by_runner: HashMap<RunnerId, Vec<Arc<Slot>>>,
    /// Per pool, how many of its waiters are woken and have not looked
    /// yet: the safety net's "quiet" pools are those at 0, read without
    /// visiting every waiter (that scan was a tenth of the idle CPU with
    /// 10,000 waiting). Kept under this lock: every change of a waiter's
    /// `woken` is made holding it.
    woken: HashMap<String, usize>,
    /// Moves on at every wake-up of every pool.
    epoch_all: u64,
    /// Per pool, moves on at every wake-up of it: whatever may have made
    /// a job claimable there (queued here or on another replica, a
    /// requeue, a reload, a key's slot freed, the safety net) wakes it.
    epochs: HashMap<String, u64>,
    /// Per runner between its polls, what its latest look found nothing
    /// in: while its pool's epoch has not moved, its next poll need not
    /// look again.
    found_nothing: HashMap<RunnerId, FoundNothing>,
    /// How many `found_nothing` held after its latest pruning.
    pruned_to: usize,
    /// Each pool's name and series, once it had a waiter.
    series: HashMap<String, PoolSeries>,
}

impl Pools {
    /// One of `pool`'s woken waiters looked, or left.
    fn unwoken(&mut self, pool: &str) {
        if let Some(count) = self.woken.get_mut(pool) {
            *count = count.saturating_sub(1);
        }
    }

    /// Where `pool` stands: changes whenever a wake-up may have made a job
    /// claimable there.
    fn epoch(&self, pool: &str) -> u64 {
        self.epoch_all
            .wrapping_add(self.epochs.get(pool).copied().unwrap_or(0))
    }

    fn move_on(&mut self, pool: Option<&str>) {
        match pool {
            None => self.epoch_all = self.epoch_all.wrapping_add(1),
            Some(pool) => match self.epochs.get_mut(pool) {
                Some(epoch) => *epoch = epoch.wrapping_add(1),
                None => {
                    self.epochs.insert(pool.to_owned(), 1);
                }
            },
        }
    }

    fn remember_nothing(&mut self, runner: RunnerId, found: FoundNothing) {
        self.found_nothing.insert(runner, found);
        if self.found_nothing.len() > FOUND_NOTHING_PRUNE.max(2 * self.pruned_to) {
            let epochs = (self.epoch_all, self.epochs.clone());
            let current = |pool: &str| {
                epochs
                    .0
                    .wrapping_add(epochs.1.get(pool).copied().unwrap_or(0))
            };
            self.found_nothing
                .retain(|_, found| found.epoch == current(&found.pool));
            self.pruned_to = self.found_nothing.len();
        }
    }
}

/// What the waiters count, by pool.
#[derive(Default, Clone)]
pub struct WaiterMetrics {
    /// How many wait (`runway_runners_polling`).
    pub polling: Family<PoolLabel, Gauge>,
    /// How many were woken (`runway_runners_woken_total`).
    pub woken: Family<PoolLabel, Counter>,
    /// Looks at the store long polls made (`runway_long_poll_looks_total`).
    pub looks: Family<PoolLabel, Counter>,
    /// Polls that began without a look: the runner's latest look found
    /// nothing and no wake-up has come since
    /// (`runway_long_poll_looks_spared_total`).
    pub spared: Family<PoolLabel, Counter>,
}

/// The waiters of this replica, by pool.
#[derive(Default)]
pub struct Waiters {
    pools: Mutex<Pools>,
    metrics: WaiterMetrics,
}

impl Waiters {
    /// Waiters that keep `metrics`.
    pub fn counted(metrics: WaiterMetrics) -> Waiters {
        Waiters {
            pools: Mutex::default(),
            metrics,
        }
    }

    /// `pool`'s series (made at its first use).
    fn series<'a>(&self, pools: &'a mut Pools, pool: &str) -> &'a PoolSeries {
        PoolSeries::of(&mut pools.series, &self.metrics, pool)
    }

    /// Registers a runner that will wait for jobs of `pool` it can take
    /// (`labels`: its labels, `None` for any). It stays registered until
    /// the returned [`Waiting`] is dropped.
    pub fn enter(&self, pool: &str, runner: RunnerId, labels: Option<&[String]>) -> Waiting<'_> {
        let mut guard = lock(&self.pools);
        let pools = &mut *guard;
        pools.next_id += 1;
        let epoch = pools.epoch(pool);
        // What the runner's previous look found nothing with: its labels,
        // if they are these, are shared rather than built again.
        let found = pools.found_nothing.remove(&runner);
        let remembered = found
            .as_ref()
            .filter(|found| same_labels(found.labels.as_deref(), labels))
            .map(|found| found.labels.clone());
        let known_empty = remembered.is_some()
            && found
                .as_ref()
                .is_some_and(|found| &*found.pool == pool && found.epoch == epoch);
        let labels = remembered.unwrap_or_else(|| {
            labels.map(|labels| labels.iter().map(|l| l.to_lowercase()).collect())
        });
        let id = pools.next_id;
        let series = self.series(pools, pool);
        if known_empty {
            series.spared.inc();
        }
        let slot = Arc::new(Slot {
            id,
            pool: series.name.clone(),
            serves: Serves { runner, labels },
            notify: Notify::new(),
            woken: Mutex::new(Woken::No),
        });
        let polling = series.polling.clone();
        pools
            .by_runner
            .entry(runner)
            .or_default()
            .push(slot.clone());
        let slots = match pools.waiting.get_mut(pool) {
            Some(slots) => slots,
            None => pools.waiting.entry(pool.to_owned()).or_default(),
        };
        slots.insert(slot.id, slot.clone());
        polling.set(i64::try_from(slots.len()).unwrap_or(i64::MAX));
        Waiting {
            waiters: self,
            slot,
            pending: None,
            known_empty,
            looked_at: None,
            // Spared a look, it still knows what the previous one found.
            found_nothing_at: known_empty.then_some(epoch),
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
        let mut guard = lock(&self.pools);
        let pools = &mut *guard;
        pools.move_on(Some(pool));
        let Some(slots) = pools.waiting.get(pool) else {
            return false;
        };
        for slot in slots.values() {
            if !slot.serves.job(&wanted) {
                continue;
            }
            let mut woken = lock(&slot.woken);
            if *woken == Woken::No {
                *woken = Woken::For(wanted);
                *pools.woken.entry(pool.to_owned()).or_default() += 1;
                slot.notify.notify_one();
                drop(woken);
                self.series(pools, pool).woken.inc();
                return true;
            }
        }
        false
    }

    /// Wakes every waiter of `pool`, or of every pool.
    pub fn wake_all(&self, pool: Option<&str>) {
        let mut guard = lock(&self.pools);
        let pools = &mut *guard;
        pools.move_on(pool);
        let slots: Vec<(&String, &BTreeMap<u64, Arc<Slot>>)> = match pool {
            Some(pool) => pools.waiting.get_key_value(pool).into_iter().collect(),
            None => pools.waiting.iter().collect(),
        };
        for (pool, slots) in slots {
            for slot in slots.values() {
                let was = std::mem::replace(&mut *lock(&slot.woken), Woken::ForAny);
                if was == Woken::No {
                    *pools.woken.entry(pool.clone()).or_default() += 1;
                }
                slot.notify.notify_one();
            }
            PoolSeries::of(&mut pools.series, &self.metrics, pool)
                .woken
                .inc_by(as_count(slots.len()));
        }
    }

    /// The pools with runners waiting here, none of them woken and not
    /// yet looking: where a missed wake-up would leave a job unclaimed.
    pub fn quiet_pools(&self) -> Vec<String> {
        let pools = lock(&self.pools);
        pools
            .waiting
            .keys()
            .filter(|pool| pools.woken.get(*pool).copied().unwrap_or(0) == 0)
            .cloned()
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
        let mut guard = lock(&self.pools);
        let pools = &mut *guard;
        let Some(slot) = pools
            .waiting
            .get(pool)
            .and_then(|slots| slots.values().next())
        else {
            return false;
        };
        let mut woken = lock(&slot.woken);
        if *woken == Woken::No {
            *woken = Woken::ForAny;
            *pools.woken.entry(pool.to_owned()).or_default() += 1;
            slot.notify.notify_one();
            drop(woken);
            self.series(pools, pool).woken.inc();
        }
        true
    }

    /// Wakes `runner`'s own long poll here, if it waits: it changed (it
    /// drains, or stops) and should look at itself again.
    pub fn wake_runner(&self, runner: RunnerId) {
        let mut guard = lock(&self.pools);
        let pools = &mut *guard;
        pools.found_nothing.remove(&runner);
        for slot in pools.by_runner.get(&runner).into_iter().flatten() {
            let mut woken = lock(&slot.woken);
            if *woken == Woken::No {
                *woken = Woken::ForAny;
                *pools.woken.entry(slot.pool.to_string()).or_default() += 1;
            }
            slot.notify.notify_one();
        }
    }

    /// How many runners wait here now.
    pub fn waiting(&self) -> usize {
        lock(&self.pools).waiting.values().map(BTreeMap::len).sum()
    }
}

/// A runner registered as waiting ([`Waiters::enter`]).
pub struct Waiting<'a> {
    waiters: &'a Waiters,
    slot: Arc<Slot>,
    /// The job its latest look acts on, until [`Waiting::settled`].
    pending: Option<JobWanted>,
    /// The runner's previous look found nothing, and nothing has been
    /// queued in its pool since.
    known_empty: bool,
    /// The pool's epoch when the latest look began.
    looked_at: Option<u64>,
    /// The pool's epoch when the latest look that found nothing began.
    found_nothing_at: Option<u64>,
}

impl Waiting<'_> {
    /// Whether the poll may wait without a first look: the runner's
    /// previous poll looked, found nothing it could take, and no wake-up
    /// of its pool has come since. Whatever is queued from here on wakes
    /// it; what a wake-up missed, the [`safety_net`] finds.
    pub fn known_empty(&self) -> bool {
        self.known_empty
    }

    /// Call before each look at the queue: a wake-up from here on is for
    /// what that look may miss, and one before it is what it acts on.
    pub fn looking(&mut self) {
        let pool = &*self.slot.pool;
        let (woken, mut epoch) = {
            let mut guard = lock(&self.waiters.pools);
            let pools = &mut *guard;
            let woken = std::mem::replace(&mut *lock(&self.slot.woken), Woken::No);
            if woken != Woken::No {
                pools.unwoken(pool);
            }
            self.waiters.series(pools, pool).looks.inc();
            (woken, pools.epoch(pool))
        };
        if let Woken::For(job) = woken {
            if let Some(earlier) = self.pending.replace(job) {
                self.waiters.wake_one(pool, earlier);
                epoch = lock(&self.waiters.pools).epoch(pool);
            }
        }
        // Only this look's outcome is remembered: one that neither took
        // a job nor found nothing (its runner changed) spares no poll.
        self.found_nothing_at = None;
        self.looked_at = Some(epoch);
    }

    /// The look took a job, or it was given up: its wake-up is spent.
    pub fn settled(&mut self) {
        self.pending = None;
        self.found_nothing_at = None;
    }

    /// The look found no job this runner could take (so the job it was
    /// woken for, if any, went to another): its wake-up is spent, and
    /// until a wake-up moves the pool on, the runner's next poll need not
    /// look.
    pub fn found_nothing(&mut self) {
        self.pending = None;
        self.found_nothing_at = self.looked_at;
    }

    /// Until woken (at once if woken since the last [`Waiting::looking`]).
    pub async fn woken(&self) {
        self.slot.notify.notified().await;
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let pool = &*self.slot.pool;
        let runner = self.slot.serves.runner;
        let woken = {
            let mut guard = lock(&self.waiters.pools);
            let pools = &mut *guard;
            if let Some(slots) = pools.waiting.get_mut(pool) {
                let removed = slots.remove(&self.slot.id).is_some();
                let left = slots.len();
                if removed && *lock(&self.slot.woken) != Woken::No {
                    pools.unwoken(pool);
                }
                let polling = &self.waiters.series(pools, pool).polling;
                polling.set(i64::try_from(left).unwrap_or(i64::MAX));
                if left == 0 {
                    pools.waiting.remove(pool);
                    pools.woken.remove(pool);
                }
            }
            if let Some(slots) = pools.by_runner.get_mut(&runner) {
                slots.retain(|slot| slot.id != self.slot.id);
                if slots.is_empty() {
                    pools.by_runner.remove(&runner);
                }
            }
            // Wake-ups are made under this lock, and none reaches the
            // slot from here on.
            let woken = std::mem::replace(&mut *lock(&self.slot.woken), Woken::No);
            if let (Some(epoch), Woken::No) = (self.found_nothing_at, &woken) {
                let found = FoundNothing {
                    pool: self.slot.pool.clone(),
                    labels: self.slot.serves.labels.clone(),
                    epoch,
                };
                pools.remember_nothing(runner, found);
            }
            woken
        };
        // Woken for a job and gone before a look settled it: someone else
        // should look.
        let unsettled = self.pending.take();
        for job in unsettled.into_iter().chain(match woken {
            Woken::For(job) => Some(job),
            _ => None,
        }) {
            self.waiters.wake_one(pool, job);
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
mod tests;
