//! The queue: reading jobs, claims and hand-outs, and the guarded moves of a
//! job (with its runner) that keep the queue and the fleet in step.

use super::*;

sql_store_methods!(
    pub(super) async fn get_jobs(&self, ids: &[JobId]) -> Result<Vec<Job>, StoreError> {
        let mut jobs = Vec::with_capacity(ids.len());
        // A bounded statement a chunk (SQLite allows 32,766 parameters).
        for chunk in ids.chunks(500) {
            let places: Vec<String> = (1..=chunk.len()).map(|n| format!("${n}")).collect();
            let sql = format!(
                "SELECT id, {JOB_COLUMNS} FROM jobs WHERE id IN ({}) ORDER BY id",
                places.join(", ")
            );
            let mut query = sqlx::query_as::<_, JobRow>(&sql);
            for id in chunk {
                query = query.bind(id.0);
            }
            for row in query.fetch_all(self.reader()).await? {
                jobs.push(Job::try_from(row)?);
            }
        }
        jobs.sort_by_key(|job| job.id);
        Ok(jobs)
    }

    pub(super) async fn get_job(&self, id: JobId) -> Result<Option<Job>, StoreError> {
        let mut connection = self.inner.held_reads().acquire().await?;
        let row = sqlx::query_as(&self.inner.statements.job_by_id)
            .bind(id.0)
            .fetch_optional(&mut *connection)
            .await
            .map_err(StoreError::from);
        let row: Option<JobRow> = connection.settle(row)?;
        row.map(Job::try_from).transpose()
    }

    pub(super) async fn find_job(
        &self,
        source: JobSource,
        external_id: &str,
    ) -> Result<Option<Job>, StoreError> {
        let row: Option<JobRow> = sqlx::query_as(&self.inner.statements.job_by_external_id)
            .bind(source.as_str())
            .bind(external_id)
            .fetch_optional(self.reader())
            .await?;
        row.map(Job::try_from).transpose()
    }

    pub(super) async fn list_jobs(&self, filter: &JobFilter) -> Result<Vec<Job>, StoreError> {
        // The state is written into the statement, not bound: one of a
        // fixed set of words, and only as a literal can the planner read a
        // live state through the partial index made for it (PostgreSQL's
        // generic plans cannot), never the whole history.
        let state = match filter.state {
            Some(state) => format!(" AND state = '{}'", state.as_str()),
            None => String::new(),
        };
        let mut sql = Filter::new(format!(
            "SELECT id, {JOB_COLUMNS} FROM jobs WHERE 1 = 1{state}"
        ));
        sql.and_if(filter.pool.is_some(), "pool =")
            .and_if(filter.before.is_some(), "id <")
            .and_if(filter.after.is_some(), "id >")
            .then(if filter.newest_first {
                " ORDER BY id DESC"
            } else if filter.oldest_first {
                " ORDER BY id"
            } else {
                " ORDER BY share_tag, id"
            })
            .then_if(filter.limit.is_some(), " LIMIT");
        let mut query = sqlx::query_as::<_, JobRow>(&sql.text);
        if let Some(pool) = &filter.pool {
            query = query.bind(pool.as_str());
        }
        if let Some(before) = filter.before {
            query = query.bind(before.0);
        }
        if let Some(after) = filter.after {
            query = query.bind(after.0);
        }
        if let Some(limit) = filter.limit {
            query = query.bind(i64::from(limit));
        }
        let rows = query.fetch_all(self.reader()).await?;
        rows.into_iter().map(Job::try_from).collect()
    }

    pub(super) async fn queue_times(
        &self,
        since: Timestamp,
        limit: u32,
    ) -> Result<Vec<(String, std::time::Duration)>, StoreError> {
        let rows: Vec<(String, i64)> = sqlx::query_as(&self.inner.statements.queue_times)
            .bind(since.as_millis())
            .bind(i64::from(limit))
            .fetch_all(self.reader())
            .await?;
        Ok(rows
            .into_iter()
            .map(|(pool, waited)| {
                let millis = u64::try_from(waited).unwrap_or(0);
                (pool, std::time::Duration::from_millis(millis))
            })
            .collect())
    }

    pub(super) async fn live_job_counts(&self) -> Result<Vec<JobCount>, StoreError> {
        let rows: Vec<(Option<String>, String, i64)> =
            // Held jobs (no pool yet) through their own index, apart from
            // the routed ones (one `OR` would not use either partial index).
            sqlx::query_as(&format!("SELECT pool, state, COUNT(*) FROM jobs WHERE {} GROUP BY pool, state \
                 UNION ALL SELECT NULL, 'held', COUNT(*) FROM jobs WHERE state = 'held' HAVING COUNT(*) > 0 \
                 ORDER BY 1, 2", crate::LIVE_JOB))
                .fetch_all(self.reader())
                .await?;
        Ok(super::parse_counts(rows, "job")?
            .into_iter()
            .map(|(pool, state, count)| JobCount { pool, state, count })
            .collect())
    }

    pub(super) async fn queued_count(&self, pool: &str) -> Result<u64, StoreError> {
        let (count,): (i64,) =
            sqlx::query_as("SELECT COUNT(*) FROM jobs WHERE state = 'queued' AND pool = $1")
                .bind(pool)
                .fetch_one(self.reader())
                .await?;
        Ok(u64::try_from(count).unwrap_or(0))
    }

    pub(super) async fn share_counts(
        &self,
        pool: &str,
    ) -> Result<Vec<crate::ShareCount>, StoreError> {
        let rows: Vec<(String, i64, i64)> = sqlx::query_as(&format!(
            "SELECT share_key, \
                    SUM(CASE WHEN state = 'queued' THEN 1 ELSE 0 END), \
                    SUM(CASE WHEN state = 'queued' THEN 0 ELSE 1 END) \
             FROM jobs WHERE pool = $1 AND {} GROUP BY share_key",
            crate::LIVE_JOB
        ))
        .bind(pool)
        .fetch_all(self.reader())
        .await?;
        Ok(rows
            .into_iter()
            .map(|(key, queued, active)| crate::ShareCount {
                key,
                queued: u64::try_from(queued).unwrap_or(0),
                active: u64::try_from(active).unwrap_or(0),
            })
            .collect())
    }

    pub(super) async fn jobs_with_expired_leases(
        &self,
        now: Timestamp,
        limit: u32,
    ) -> Result<Vec<Job>, StoreError> {
        let rows: Vec<JobRow> = sqlx::query_as(&self.inner.statements.expired_leases)
            .bind(now.as_millis())
            .bind(i64::from(limit))
            .fetch_all(self.reader())
            .await?;
        rows.into_iter().map(Job::try_from).collect()
    }

    pub(super) async fn replace_job(&self, current: &Job, next: &Job) -> Result<bool, StoreError> {
        let op = Op::Replace {
            id: current.id,
            version: current.version,
            next: Box::new(Columns::from(next)),
            step: history_line(current.step_to(next, None).as_ref()),
        };
        match self.group.submit(op).await? {
            Outcome::Replaced(replaced) => Ok(replaced),
            _ => Err(StoreError::Corrupt(
                "group commit answered a replace with another outcome".into(),
            )),
        }
    }

    pub(super) async fn apply_guarded(
        &self,
        id: JobId,
        change: &runway_core::GuardedChange,
    ) -> Result<Option<Job>, StoreError> {
        let op = Op::Guarded {
            id,
            change: change.clone(),
            step: history_line(change.step().as_ref()),
        };
        match self.group.submit(op).await? {
            Outcome::Changed(job) => Ok(job.map(|job| *job)),
            _ => Err(StoreError::Corrupt(
                "group commit answered a guarded change with another outcome".into(),
            )),
        }
    }

    pub(super) async fn claim_and_start(
        &self,
        claim: &Claim,
        runner: &Runner,
        now: Timestamp,
    ) -> Result<ClaimStart, StoreError> {
        let runner_next = runway_core::moves::start_on_claim(runner, now)?;
        let op = Op::ClaimStart {
            claim: Claim {
                runner: runner.id,
                limit: 1,
                ..claim.clone()
            },
            runner_version: runner.version,
            runner_next: Box::new(runner_next.clone()),
            steps: start_steps(runner.id, now),
            now,
        };
        let stored_version = match self.group.submit(op).await? {
            Outcome::ClaimedStart(Ok(job)) => {
                let mut busy = runner_next;
                busy.job = Some(job.id);
                return Ok(ClaimStart::Started(Box::new(Moved {
                    job: *job,
                    runner: Some(busy),
                })));
            }
            Outcome::ClaimedStart(Err(version)) => version,
            _ => {
                return Err(StoreError::Corrupt(
                    "group commit answered a claim with another outcome".into(),
                ))
            }
        };
        // Nothing claimed: no job for this runner, or the runner is no
        // longer the row the decision was made on. Versions only grow, so
        // the same version means the former. Where the claim read the
        // runner's version itself (PostgreSQL's statement, SQLite's
        // script), a waiting runner woken for a job another took pays one
        // statement, not two.
        if stored_version == Some(runner.version) {
            return Ok(ClaimStart::NoJob);
        }
        match self.get_runner(runner.id).await? {
            Some(fresh) if fresh.version == runner.version => Ok(ClaimStart::NoJob),
            Some(fresh) => Ok(ClaimStart::RunnerChanged(Box::new(fresh))),
            None => Err(StoreError::RunnerNotFound(runner.id)),
        }
    }

    pub(super) async fn apply_guarded_with_runner(
        &self,
        id: JobId,
        change: &runway_core::GuardedChange,
        runner: (&Runner, &Runner),
        log: Option<(Option<i64>, &str)>,
    ) -> Result<Option<Moved>, StoreError> {
        let (current, next) = runner;
        let op = Op::GuardedWithRunner {
            id,
            change: change.clone(),
            step: history_line(change.step().as_ref()),
            runner: current.id,
            runner_version: current.version,
            runner_next: Box::new(next.clone()),
            log: log.map(|(exit, text)| (exit, text.to_owned())),
        };
        match self.group.submit(op).await? {
            Outcome::Changed(job) => Ok(job.map(|job| Moved {
                job: *job,
                runner: Some(next.clone()),
            })),
            _ => Err(StoreError::Corrupt(
                "group commit answered a guarded change with another outcome".into(),
            )),
        }
    }

    pub(super) async fn complete_and_start_next(
        &self,
        id: JobId,
        change: &runway_core::GuardedChange,
        runner: (&Runner, &Runner),
        log: Option<(Option<i64>, &str)>,
        claim: &Claim,
        now: Timestamp,
    ) -> Result<Option<(Moved, Option<Job>)>, StoreError> {
        let (current, finished) = runner;
        let Ok(busy) = runway_core::moves::start_on_claim(finished, now) else {
            // The runner stops or drains after this job: a completion only.
            return crate::complete_then_start(self, id, change, runner, log, claim, now).await;
        };
        let step = history_line(change.step().as_ref());
        let steps = start_steps(current.id, now);
        let Some(sql) = &self.inner.statements.complete_next else {
            // No one statement here: the dialect's script as one op of
            // the group commit, sharing a batch's transaction and flush.
            let op = Op::CompleteNext(Box::new(CompleteNext {
                id,
                change: change.clone(),
                step,
                runner: current.id,
                runner_version: current.version,
                finished: finished.clone(),
                log: log.map(|(exit, text)| (exit, text.to_owned())),
                claim: Claim {
                    runner: current.id,
                    limit: 1,
                    ..claim.clone()
                },
                busy: busy.clone(),
                steps,
                now,
            }));
            return match self.group.submit(op).await? {
                Outcome::CompletedNext(ended, started) => {
                    Ok(ended
                        .map(|job| completed_next(*job, started.map(|job| *job), finished, busy)))
                }
                _ => Err(StoreError::Corrupt(
                    "group commit answered a completion with another outcome".into(),
                )),
            };
        };
        let labels = claim_labels(claim);
        let (finished_columns, busy_columns) = (Columns::from(finished), Columns::from(&busy));
        let mut connection = self.inner.held.acquire().await?;
        let result = async {
            let query = bind_guarded(sqlx::query(sql), id, change, &step)
                .bind(current.id.0)
                .bind(current.version);
            let query = bind_columns(query, &finished_columns)
                .bind(i64::from(log.is_some()))
                .bind(log.and_then(|(exit, _)| exit))
                .bind(log.map(|(_, text)| text))
                .bind(claim.pool.as_str())
                .bind(now.plus(claim.lease).as_millis())
                .bind(labels.as_deref())
                .bind(steps.as_str())
                .bind(now.as_millis())
                .bind(claim.max_running_per_key.map(i64::from));
            // Run to its end, as every write (see `insert_job`).
            let rows = bind_columns(query, &busy_columns)
                .fetch_all(&mut *connection)
                .await?;
            let (mut ended, mut next) = (None, None);
            for row in &rows {
                let part: i64 = row.try_get("part")?;
                let job = Job::try_from(JobRow::from_row(row)?)?;
                if part == 0 {
                    ended = Some(job);
                } else {
                    next = Some(job);
                }
            }
            Ok::<_, StoreError>(ended.map(|job| completed_next(job, next, finished, busy)))
        }
        .await;
        connection.settle(result)
    }

    pub(super) async fn enqueue_with_delivery(
        &self,
        job: &NewJob,
        delivery: Option<&Delivery>,
        now: Timestamp,
    ) -> Result<(Enqueued, bool), StoreError> {
        if let (Some(delivery), Some(sql)) = (delivery, &self.inner.statements.enqueue_delivery) {
            let mut connection = self.inner.held.acquire().await?;
            let result = self
                .inner
                .enqueue_delivery(&mut connection, sql, job, delivery, now)
                .await;
            return connection.settle(result);
        }
        let op = Op::Enqueue {
            job: job.clone(),
            delivery: delivery.cloned(),
            now,
        };
        match self.group.submit(op).await? {
            Outcome::Enqueued(enqueued, new_delivery) => Ok((*enqueued, new_delivery)),
            _ => Err(StoreError::Corrupt(
                "group commit answered an enqueue with another outcome".into(),
            )),
        }
    }

    pub(super) async fn delivery_seen(&self, id: &str) -> Result<bool, StoreError> {
        let seen: Option<i64> = sqlx::query_scalar(&self.inner.statements.delivery_seen)
            .bind(id)
            .fetch_optional(self.reader())
            .await?;
        Ok(seen.is_some())
    }

    pub(super) async fn record_delivery(&self, delivery: &Delivery) -> Result<bool, StoreError> {
        let op = Op::RecordDelivery {
            delivery: delivery.clone(),
        };
        match self.group.submit(op).await? {
            Outcome::Recorded(new) => Ok(new),
            _ => Err(StoreError::Corrupt(
                "group commit answered a delivery with another outcome".into(),
            )),
        }
    }

    pub(super) async fn claim(
        &self,
        claim: &Claim,
        now: Timestamp,
    ) -> Result<Vec<Job>, StoreError> {
        let op = Op::Claim {
            claim: claim.clone(),
            now,
        };
        match self.group.submit(op).await? {
            Outcome::Claimed(mut jobs) => {
                jobs.sort_by_key(|job| (job.enqueued_at, job.id));
                Ok(jobs)
            }
            _ => Err(StoreError::Corrupt(
                "group commit answered a claim with another outcome".into(),
            )),
        }
    }

    pub(super) async fn replace_job_and_runner(
        &self,
        job: (&Job, &Job),
        runner: Option<(&Runner, &Runner)>,
    ) -> Result<bool, StoreError> {
        let (current, next) = job;
        let Some((runner_current, runner_next)) = runner else {
            return self.replace_job(current, next).await;
        };
        let op = Op::ReplaceWithRunner {
            id: current.id,
            version: current.version,
            next: Box::new(Columns::from(next)),
            runner: runner_current.id,
            runner_version: runner_current.version,
            runner_next: Box::new(Columns::from(runner_next)),
            step: history_line(current.step_to(next, None).as_ref()),
        };
        match self.group.submit(op).await? {
            Outcome::Replaced(replaced) => Ok(replaced),
            _ => Err(StoreError::Corrupt(
                "group commit answered a replace with another outcome".into(),
            )),
        }
    }
);
