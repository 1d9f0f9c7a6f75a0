//! The console's live view, computed once a tick for every open tab of
//! this replica: the pools' counts, the live runners, and the jobs the
//! tabs follow (each tab's page) with why each waits. A tab's stream
//! takes from the latest snapshot only what its page shows; a snapshot
//! younger than a tick is shared, so ten tabs cost one read, not ten.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use runway_core::{Job, JobId, Runner};
use runway_store::{JobCount, PausedPool, StoreError};

use crate::app::explain::Explanation;
use crate::app::Service;

/// One read of what the console shows live.
pub struct Snapshot {
    pub taken: Instant,
    pub counts: Vec<JobCount>,
    pub runners: Vec<Runner>,
    pub paused: Vec<PausedPool>,
    /// Every followed job still stored, with its explanation if it waits.
    pub jobs: HashMap<JobId, (Job, Option<Explanation>)>,
}

/// The open tabs' followed jobs and the latest snapshot.
#[derive(Default)]
pub struct Board {
    latest: tokio::sync::Mutex<Option<Arc<Snapshot>>>,
    followers: std::sync::Mutex<HashMap<u64, Vec<JobId>>>,
    next: AtomicU64,
}

/// A tab's registration: its followed jobs are read while it lives.
pub struct Following {
    board: Arc<Board>,
    id: u64,
}

impl Drop for Following {
    fn drop(&mut self) {
        if let Ok(mut followers) = self.board.followers.lock() {
            followers.remove(&self.id);
        }
    }
}

impl Board {
    /// Registers a tab following `jobs`.
    pub fn follow(self: &Arc<Board>, jobs: Vec<JobId>) -> Following {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut followers) = self.followers.lock() {
            followers.insert(id, jobs);
        }
        Following {
            board: self.clone(),
            id,
        }
    }

    /// How many tabs are open.
    pub fn tabs(&self) -> usize {
        self.followers.lock().map(|f| f.len()).unwrap_or(0)
    }

    /// The latest snapshot if younger than `fresh` and taken no earlier
    /// than `not_before`, else a new one (one reader at a time; the others
    /// wait for it and share it). A tab asks for one taken after it opened
    /// (its page was rendered before that: an older snapshot would undo
    /// what the page shows, such as a pause just made), then for one no
    /// older than the last it got.
    pub async fn snapshot(
        &self,
        service: &Service,
        fresh: Duration,
        not_before: Instant,
    ) -> Result<Arc<Snapshot>, StoreError> {
        let mut latest = self.latest.lock().await;
        if let Some(snapshot) = latest
            .as_ref()
            .filter(|s| s.taken.elapsed() < fresh && s.taken >= not_before)
        {
            return Ok(snapshot.clone());
        }
        let started = Instant::now();
        let followed: BTreeSet<JobId> = self
            .followers
            .lock()
            .map(|f| f.values().flatten().copied().collect())
            .unwrap_or_default();
        let ids: Vec<JobId> = followed.into_iter().collect();
        let jobs = service.store.get_jobs(&ids).await?;
        let explained: BTreeMap<JobId, Explanation> =
            crate::app::explain::explain_jobs(service, &jobs).await?;
        let snapshot = Arc::new(Snapshot {
            taken: started,
            counts: service.store.live_job_counts().await?,
            runners: service.store.list_live_runners(None).await?,
            paused: service.store.paused_pools().await?,
            jobs: jobs
                .into_iter()
                .map(|job| {
                    let why = explained.get(&job.id).cloned();
                    (job.id, (job, why))
                })
                .collect(),
        });
        service
            .metrics
            .console_snapshot_seconds
            .observe(started.elapsed().as_secs_f64());
        *latest = Some(snapshot.clone());
        Ok(snapshot)
    }
}
