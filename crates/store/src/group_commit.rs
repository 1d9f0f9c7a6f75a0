//! Group commit: queue writes from many callers and commit them together.
//!
//! Every acknowledged write must be on disk, and a disk flush costs far more
//! than the statement it makes durable (about 0.3 ms on this project's
//! machines, against a few microseconds for the UPDATE itself). So writes
//! that arrive while a commit is in flight wait for the next one and share
//! its flush, as River's batch completer and PostgreSQL's own `commit_delay`
//! do. No write waits on purpose: a committer takes whatever is queued the
//! moment it is free, so a lone write commits at once, alone.
//!
//! A caller hears back only after the transaction holding its write has
//! committed, so a reply still means "durable". If a shared transaction fails
//! (a deadlock victim, a lost connection), each of its writes is retried in a
//! transaction of its own, so one bad write never fails its neighbours.
//!
//! Only writes that cannot fail on their own data go through here: claims,
//! idempotent enqueues and compare-and-set replaces (of a job, or of a job
//! and its runner together).

use std::sync::Arc;

use async_trait::async_trait;
use runway_core::job::NewJob;
use runway_core::{GuardedChange, Job, JobId, Runner, RunnerId, Timestamp};
use tokio::sync::{mpsc, oneshot, Mutex};

use crate::rows::Columns;
use crate::{Claim, Delivery, Enqueued, StoreError};

/// How many writes one transaction takes at most.
const MAX_BATCH: usize = 128;
/// How many writes may wait before callers are slowed down.
const QUEUE_CAPACITY: usize = 4_096;

pub(crate) enum Op {
    Enqueue {
        job: NewJob,
        delivery: Option<Delivery>,
        now: Timestamp,
    },
    RecordDelivery {
        delivery: Delivery,
    },
    Replace {
        id: JobId,
        version: i64,
        next: Box<Columns>,
        /// The history line of this change (`rows::history_line`).
        step: String,
    },
    /// A job and its runner together: both compare-and-sets hold, or
    /// neither row is written (a savepoint within a shared transaction).
    ReplaceWithRunner {
        id: JobId,
        version: i64,
        next: Box<Columns>,
        runner: RunnerId,
        runner_version: i64,
        runner_next: Box<Columns>,
        step: String,
    },
    /// A job change decided by its guard, in one statement.
    Guarded {
        id: JobId,
        change: GuardedChange,
        step: String,
    },
    Claim {
        claim: Claim,
        now: Timestamp,
    },
    /// A claim of one job that starts it at once: the job running under
    /// the lease and its runner busy with it, both or neither.
    ClaimStart {
        claim: Claim,
        /// The version the runner must still have.
        runner_version: i64,
        /// The runner's next row, its job left for the claim to fill in.
        runner_next: Box<Runner>,
        /// The history lines of the claim and of the start, in order.
        steps: String,
        now: Timestamp,
    },
    /// A guarded job change, its runner's compare-and-set and optionally
    /// the job's log: all written, or nothing.
    GuardedWithRunner {
        id: JobId,
        change: GuardedChange,
        step: String,
        runner: RunnerId,
        runner_version: i64,
        runner_next: Box<Runner>,
        log: Option<(Option<i64>, String)>,
    },
    /// A completion that starts the runner's next job: the
    /// [`Op::GuardedWithRunner`] of the ended job, then, if it applied, the
    /// [`Op::ClaimStart`] of the freed runner, in one transaction (a
    /// savepoint within a shared one) and so one commit.
    CompleteNext(Box<CompleteNext>),
}

/// What [`Op::CompleteNext`] writes.
pub(crate) struct CompleteNext {
    /// The completion: its job, change and history line.
    pub id: JobId,
    pub change: GuardedChange,
    pub step: String,
    /// The runner that ran it, at the version it must still have.
    pub runner: RunnerId,
    pub runner_version: i64,
    /// The runner after its job, when no next job starts.
    pub finished: Runner,
    pub log: Option<(Option<i64>, String)>,
    /// The claim of the next job: this runner's, of one job.
    pub claim: Claim,
    /// The runner busy with the next job, its job left to fill in.
    pub busy: Runner,
    /// The history lines of the claim and of the start.
    pub steps: String,
    pub now: Timestamp,
}

pub(crate) enum Outcome {
    /// The job, and whether the delivery that came with it was new.
    Enqueued(Box<Enqueued>, bool),
    Replaced(bool),
    Claimed(Vec<Job>),
    Recorded(bool),
    /// The job after a guarded change; `None` when the guard did not hold.
    Changed(Option<Box<Job>>),
    /// [`Op::ClaimStart`]: the started job, or, when none started, the
    /// runner's stored version if the statement read it (`None`: not read).
    ClaimedStart(Result<Box<Job>, Option<i64>>),
    /// [`Op::CompleteNext`]: the ended job (`None`, and nothing written,
    /// when its guard or the runner's version did not hold) and the job
    /// that started, if one did.
    CompletedNext(Option<Box<Job>>, Option<Box<Job>>),
}

impl Op {
    /// Whether the op writes with a single statement (reads aside), so it
    /// is atomic without a transaction of its own.
    pub fn is_one_statement(&self) -> bool {
        match self {
            Op::Enqueue { delivery, .. } => delivery.is_none(),
            // Opens its own (nested) transaction for its two writes, or
            // is one statement, or one script under a savepoint of its own.
            Op::ReplaceWithRunner { .. }
            | Op::ClaimStart { .. }
            | Op::GuardedWithRunner { .. }
            | Op::CompleteNext(_) => true,
            Op::RecordDelivery { .. }
            | Op::Replace { .. }
            | Op::Guarded { .. }
            | Op::Claim { .. } => true,
        }
    }

    /// The order writes run in within a transaction: inserts by key, then
    /// updates by id, then claims. Every committer locks rows in this same
    /// order, so two concurrent batches cannot deadlock on each other.
    fn order_key(&self) -> (u8, String, i64) {
        match self {
            Op::Enqueue { job, .. } => {
                (0, format!("{}/{}", job.source.as_str(), job.external_id), 0)
            }
            Op::RecordDelivery { delivery } => (1, delivery.id.clone(), 0),
            // The job row first, then its runner: every writer that
            // changes both locks them in this order.
            Op::Replace { id, .. }
            | Op::ReplaceWithRunner { id, .. }
            | Op::Guarded { id, .. }
            | Op::GuardedWithRunner { id, .. } => (2, String::new(), id.0),
            Op::CompleteNext(next) => (2, String::new(), next.id.0),
            Op::Claim { .. } | Op::ClaimStart { .. } => (3, String::new(), 0),
        }
    }
}

/// Runs writes in one transaction and commits it.
#[async_trait]
pub(crate) trait BatchExecutor: Send + Sync + 'static {
    async fn execute(&self, ops: &[&Op]) -> Result<Vec<Outcome>, StoreError>;
}

pub(crate) struct Pending {
    op: Op,
    reply: oneshot::Sender<Result<Outcome, StoreError>>,
}

pub(crate) enum GroupCommit {
    /// Writes queue for committer tasks that share transactions.
    Batched { sender: mpsc::Sender<Pending> },
    /// Each write runs at once in the caller's task, on its own.
    Direct { executor: Arc<dyn BatchExecutor> },
}

impl GroupCommit {
    /// Starts `committers` tasks on the current tokio runtime. They stop when
    /// the `GroupCommit` is dropped and the queue has drained.
    pub fn start(committers: usize, executor: Arc<dyn BatchExecutor>) -> GroupCommit {
        let (sender, receiver) = mpsc::channel(QUEUE_CAPACITY);
        let receiver = Arc::new(Mutex::new(receiver));
        for _ in 0..committers.max(1) {
            tokio::spawn(committer(receiver.clone(), executor.clone()));
        }
        GroupCommit::Batched { sender }
    }

    /// No batching: for backends where a flush is not the bottleneck.
    pub fn direct(executor: Arc<dyn BatchExecutor>) -> GroupCommit {
        GroupCommit::Direct { executor }
    }

    pub async fn submit(&self, op: Op) -> Result<Outcome, StoreError> {
        match self {
            GroupCommit::Batched { sender } => {
                let (reply, answer) = oneshot::channel();
                sender
                    .send(Pending { op, reply })
                    .await
                    .map_err(|_| StoreError::Closed)?;
                answer.await.map_err(|_| StoreError::Closed)?
            }
            GroupCommit::Direct { executor } => executor
                .execute(&[&op])
                .await
                .and_then(|mut outcomes| outcomes.pop().ok_or(StoreError::Closed)),
        }
    }
}

async fn committer(
    receiver: Arc<Mutex<mpsc::Receiver<Pending>>>,
    executor: Arc<dyn BatchExecutor>,
) {
    loop {
        let mut batch = {
            let mut receiver = receiver.lock().await;
            let Some(first) = receiver.recv().await else {
                return;
            };
            let mut batch = vec![first];
            while batch.len() < MAX_BATCH {
                match receiver.try_recv() {
                    Ok(next) => batch.push(next),
                    Err(_) => break,
                }
            }
            batch
        };
        batch.sort_by_key(|pending| pending.op.order_key());
        let ops: Vec<&Op> = batch.iter().map(|pending| &pending.op).collect();
        match executor.execute(&ops).await {
            Ok(outcomes) => {
                for (pending, outcome) in batch.into_iter().zip(outcomes) {
                    let _ = pending.reply.send(Ok(outcome));
                }
            }
            Err(error) if batch.len() == 1 => {
                if let Some(pending) = batch.pop() {
                    let _ = pending.reply.send(Err(error));
                }
            }
            Err(error) => {
                tracing::debug!(%error, writes = batch.len(), "shared commit failed; retrying each write alone");
                for pending in batch {
                    let result = executor
                        .execute(&[&pending.op])
                        .await
                        .and_then(|mut outcomes| outcomes.pop().ok_or(StoreError::Closed));
                    let _ = pending.reply.send(result);
                }
            }
        }
    }
}
