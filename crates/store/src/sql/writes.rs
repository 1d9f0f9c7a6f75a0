//! The writes the group committer runs: one transaction per batch of
//! enqueues, claims and guarded moves (`crate::group_commit`).

use super::*;

// The writes the group committer runs, in one transaction per batch.
shared_methods!(
    /// Records a delivery; false if its id was already recorded.
    pub(super) async fn insert_delivery(
        &self,
        connection: &mut <D::Db as Database>::Connection,
        delivery: &Delivery,
    ) -> Result<bool, StoreError> {
        let columns = Columns::from(delivery);
        let result = bind_columns(sqlx::query(&self.statements.insert_delivery), &columns)
            .execute(&mut *connection)
            .await?;
        Ok(result.rows_affected() == 1)
    }

    /// [`Dialect::enqueue_delivery_statement`]'s one statement, and the read
    /// of the stored job when there was one already (a redelivery, or the
    /// same job from another source of events).
    pub(super) async fn enqueue_delivery(
        &self,
        connection: &mut <D::Db as Database>::Connection,
        sql: &str,
        job: &NewJob,
        delivery: &Delivery,
        now: Timestamp,
    ) -> Result<(Enqueued, bool), StoreError> {
        let columns = Columns::from(&job.initial(JobId(0), now));
        let delivery = Columns::from(delivery);
        // Run to its end, as every write (see `insert_job`).
        let rows = bind_columns(bind_columns(sqlx::query(sql), &columns), &delivery)
            .fetch_all(&mut *connection)
            .await?;
        let row = rows
            .first()
            .ok_or_else(|| StoreError::Corrupt("an enqueue answered no row".into()))?;
        let new_delivery = row.try_get::<i64, _>("new_delivery")? == 1;
        if row.try_get::<Option<i64>, _>("id")?.is_some() {
            let job = Job::try_from(JobRow::from_row(row)?)?;
            return Ok((Enqueued { job, created: true }, new_delivery));
        }
        let existing: JobRow = sqlx::query_as(&self.statements.job_by_external_id)
            .bind(job.source.as_str())
            .bind(job.external_id.as_str())
            .fetch_one(&mut *connection)
            .await?;
        let job = Job::try_from(existing)?;
        Ok((
            Enqueued {
                job,
                created: false,
            },
            new_delivery,
        ))
    }

    /// Inserts a job, or reads the one already stored under its key.
    pub(crate) async fn insert_job(
        &self,
        connection: &mut <D::Db as Database>::Connection,
        job: &NewJob,
        now: Timestamp,
    ) -> Result<Enqueued, StoreError> {
        let columns = Columns::from(&job.initial(JobId(0), now));
        // Every write runs to its end (fetch_all), never stopped at its
        // first row: on SQLite an autocommit statement commits when it
        // finishes, and a commit that fails (a full disk) is only reported
        // there; stopped early, the row would be answered and then lost.
        let inserted = bind_columns(sqlx::query(&self.statements.insert_job), &columns)
            .fetch_all(&mut *connection)
            .await?
            .first()
            .map(JobRow::from_row)
            .transpose()?;
        if let Some(row) = inserted {
            return Ok(Enqueued {
                job: Job::try_from(row)?,
                created: true,
            });
        }
        let existing: JobRow = sqlx::query_as(&self.statements.job_by_external_id)
            .bind(job.source.as_str())
            .bind(job.external_id.as_str())
            .fetch_one(&mut *connection)
            .await?;
        Ok(Enqueued {
            job: Job::try_from(existing)?,
            created: false,
        })
    }

    /// Runs `ops` in one transaction (a lone write in autocommit).
    pub(crate) async fn execute_batch(&self, ops: &[&Op]) -> Result<Vec<Outcome>, StoreError> {
        let mut connection = self.held.acquire().await?;
        let result = async {
            // A lone one-statement write needs no transaction: autocommit
            // saves the BEGIN and COMMIT round trips. (An enqueue with its
            // delivery is two writes, which commit together or not at all.)
            if let [op] = ops {
                if op.is_one_statement() {
                    return Ok(vec![self.execute_one(&mut connection, op).await?]);
                }
            }
            let mut transaction = sqlx::Connection::begin(&mut *connection).await?;
            let mut outcomes = Vec::with_capacity(ops.len());
            for op in ops {
                outcomes.push(self.execute_one(&mut transaction, op).await?);
            }
            transaction.commit().await?;
            Ok(outcomes)
        }
        .await;
        connection.settle(result)
    }

    /// [`Op::ClaimStart`]: the dialect's one statement or script, all or
    /// nothing.
    pub(super) async fn claim_start(
        &self,
        connection: &mut <D::Db as Database>::Connection,
        claim: &Claim,
        (runner_version, runner_next): (i64, &Runner),
        steps: &str,
        now: Timestamp,
    ) -> Result<Outcome, StoreError> {
        let labels = claim_labels(claim);
        let lease_deadline = now.plus(claim.lease).as_millis();
        let started = |sql| {
            bind_claim(
                sqlx::query(sql),
                claim,
                (1, lease_deadline),
                labels.as_deref(),
                steps,
            )
            .bind(now.as_millis())
        };
        let (ClaimStartSql::OneStatement(sql) | ClaimStartSql::Script { script: sql, .. }) =
            self.statements.claim_start.of(claim);
        let columns = Columns::from(runner_next);
        // Run to its end, as every write (see `insert_job`).
        let rows = bind_columns(started(sql).bind(runner_version), &columns)
            .fetch_all(&mut *connection)
            .await?;
        // One row (the script's one row): the started job's columns (NULL
        // when none started) and the runner's stored version.
        let Some(row) = rows.first() else {
            return Err(StoreError::Corrupt(
                "a claim that starts answered no row".into(),
            ));
        };
        let started: Option<i64> = row.try_get("id")?;
        if started.is_none() {
            return Ok(Outcome::ClaimedStart(Err(row.try_get("runner_version")?)));
        }
        let job = Job::try_from(JobRow::from_row(row)?)?;
        Ok(Outcome::ClaimedStart(Ok(Box::new(job))))
    }

    /// [`Op::GuardedWithRunner`]: the job after the change, or `None` and
    /// nothing written when the job's guard or the runner's version does
    /// not hold, in the dialect's one statement or script.
    pub(super) async fn guarded_with_runner(
        &self,
        connection: &mut <D::Db as Database>::Connection,
        id: JobId,
        (change, step): (&runway_core::GuardedChange, &String),
        (runner, runner_version, runner_next): (RunnerId, i64, &Columns),
        log: Option<&(Option<i64>, String)>,
    ) -> Result<Option<Job>, StoreError> {
        let query = bind_guarded(
            sqlx::query_as(&self.statements.guarded_pair),
            id,
            change,
            step,
        )
        .bind(runner.0)
        .bind(runner_version);
        let row: Option<JobRow> = bind_columns(query, runner_next)
            .bind(i64::from(log.is_some()))
            .bind(log.and_then(|(exit, _)| *exit))
            .bind(log.map(|(_, text)| text.as_str()))
            .fetch_all(&mut *connection)
            .await?
            .pop();
        row.map(Job::try_from).transpose()
    }

    /// [`Op::CompleteNext`]: queued only by a dialect without the one
    /// statement (`Dialect::complete_next_statement`), which has the script
    /// (`sqlite::complete_next_script`).
    pub(super) async fn complete_next(
        &self,
        connection: &mut <D::Db as Database>::Connection,
        next: &CompleteNext,
    ) -> Result<Outcome, StoreError> {
        let Some(script) = self
            .statements
            .claim_start
            .of(&next.claim)
            .complete_next_script(next.log.is_some())
        else {
            return Err(StoreError::Corrupt(
                "a completion with its next job was queued for a dialect that writes it in one statement".into(),
            ));
        };
        self.complete_next_script(connection, next, script).await
    }

    /// [`Op::CompleteNext`] as the dialect's one script
    /// (`sqlite::complete_next_script`).
    async fn complete_next_script(
        &self,
        connection: &mut <D::Db as Database>::Connection,
        next: &CompleteNext,
        script: &str,
    ) -> Result<Outcome, StoreError> {
        let (finished, busy) = (Columns::from(&next.finished), Columns::from(&next.busy));
        let labels = claim_labels(&next.claim);
        let lease_deadline = next.now.plus(next.claim.lease).as_millis();
        let query = bind_guarded(sqlx::query(script), next.id, &next.change, &next.step)
            .bind(next.runner.0)
            .bind(next.runner_version);
        let query = bind_columns(bind_columns(query, &finished), &busy);
        let query = bind_claim(
            query,
            &next.claim,
            (1, lease_deadline),
            labels.as_deref(),
            &next.steps,
        )
        .bind(next.now.as_millis());
        let query = match &next.log {
            Some((exit, text)) => query.bind(*exit).bind(text.as_str()),
            None => query,
        };
        let (mut ended, mut started) = (None, None);
        for row in &query.fetch_all(&mut *connection).await? {
            let part: i64 = row.try_get("part")?;
            let job = Box::new(Job::try_from(JobRow::from_row(row)?)?);
            match part {
                0 => ended = Some(job),
                _ => started = Some(job),
            }
        }
        Ok(Outcome::CompletedNext(ended, started))
    }

    pub(super) async fn execute_one(
        &self,
        connection: &mut <D::Db as Database>::Connection,
        op: &Op,
    ) -> Result<Outcome, StoreError> {
        let transaction = connection;
        Ok(match op {
            Op::Enqueue { job, delivery, now } => {
                let new_delivery = match delivery {
                    Some(delivery) => self.insert_delivery(&mut *transaction, delivery).await?,
                    None => false,
                };
                let enqueued = self.insert_job(&mut *transaction, job, *now).await?;
                Outcome::Enqueued(Box::new(enqueued), new_delivery)
            }
            Op::RecordDelivery { delivery } => {
                Outcome::Recorded(self.insert_delivery(&mut *transaction, delivery).await?)
            }
            Op::Replace {
                id,
                version,
                next,
                step,
            } => {
                let result = bind_columns(sqlx::query(&self.statements.replace_job), next)
                    .bind(id.0)
                    .bind(*version)
                    .bind(step.as_str())
                    .execute(&mut *transaction)
                    .await?;
                Outcome::Replaced(result.rows_affected() == 1)
            }
            Op::ReplaceWithRunner {
                id,
                version,
                next,
                runner,
                runner_version,
                runner_next,
                step,
            } => {
                // A savepoint inside a shared transaction, a
                // transaction of its own otherwise: either way both
                // rows change or neither does.
                let mut both = sqlx::Connection::begin(&mut *transaction).await?;
                let job = bind_columns(sqlx::query(&self.statements.replace_job), next)
                    .bind(id.0)
                    .bind(*version)
                    .bind(step.as_str())
                    .execute(&mut *both)
                    .await?;
                let replaced = job.rows_affected() == 1 && {
                    let runner =
                        bind_columns(sqlx::query(&self.statements.replace_runner), runner_next)
                            .bind(runner.0)
                            .bind(*runner_version)
                            .execute(&mut *both)
                            .await?;
                    runner.rows_affected() == 1
                };
                if replaced {
                    both.commit().await?;
                } else {
                    both.rollback().await?;
                }
                Outcome::Replaced(replaced)
            }
            Op::Guarded { id, change, step } => {
                // Run to its end, as every write (see `insert_job`).
                let row: Option<JobRow> = bind_guarded(
                    sqlx::query_as(&self.statements.guarded_job),
                    *id,
                    change,
                    step,
                )
                .fetch_all(&mut *transaction)
                .await?
                .pop();
                Outcome::Changed(row.map(Job::try_from).transpose()?.map(Box::new))
            }
            Op::ClaimStart {
                claim,
                runner_version,
                runner_next,
                steps,
                now,
            } => {
                self.claim_start(
                    transaction,
                    claim,
                    (*runner_version, runner_next),
                    steps,
                    *now,
                )
                .await?
            }
            Op::GuardedWithRunner {
                id,
                change,
                step,
                runner,
                runner_version,
                runner_next,
                log,
            } => {
                let runner_next = Columns::from(runner_next.as_ref());
                let job = self
                    .guarded_with_runner(
                        transaction,
                        *id,
                        (change, step),
                        (*runner, *runner_version, &runner_next),
                        log.as_ref(),
                    )
                    .await?;
                Outcome::Changed(job.map(Box::new))
            }
            Op::CompleteNext(next) => self.complete_next(transaction, next).await?,
            Op::Claim { claim, now } => {
                let labels = claim_labels(claim);
                let step = holder_step(JobState::Provisioning, claim.runner, *now);
                let lease_deadline = now.plus(claim.lease).as_millis();
                let rows: Vec<JobRow> = bind_claim(
                    sqlx::query_as(self.statements.claim.of(claim)),
                    claim,
                    (i64::from(claim.limit), lease_deadline),
                    labels.as_deref(),
                    &step,
                )
                .fetch_all(&mut *transaction)
                .await?;
                Outcome::Claimed(
                    rows.into_iter()
                        .map(Job::try_from)
                        .collect::<Result<_, _>>()?,
                )
            }
        })
    }
);
