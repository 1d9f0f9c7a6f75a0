//! Runners: their records, registrations and tokens, and the instance tokens
//! GARM-style machines trade for a registration.

use super::*;

sql_store_methods!(
    pub(super) async fn create_runner(
        &self,
        runner: &NewRunner,
        now: Timestamp,
    ) -> Result<Runner, StoreError> {
        // The id is assigned by the database; the placeholder is ignored.
        let initial = runner.initial(RunnerId(0), now);
        let columns = Columns::from(&initial);
        // Run to its end, as every write (see `insert_job`).
        let row = bind_columns(sqlx::query(&self.inner.statements.insert_runner), &columns)
            .fetch_all(self.writer())
            .await
            .and_then(|rows| {
                rows.first()
                    .map(RunnerRow::from_row)
                    .unwrap_or(Err(sqlx::Error::RowNotFound))
            });
        match row {
            Ok(row) => Runner::try_from(row),
            Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {
                Err(StoreError::DuplicateRunnerName(runner.name.clone()))
            }
            Err(e) => Err(e.into()),
        }
    }

    pub(super) async fn get_runner(&self, id: RunnerId) -> Result<Option<Runner>, StoreError> {
        let mut connection = self.inner.held_reads().acquire().await?;
        let row = sqlx::query_as(&self.inner.statements.runner_by_id)
            .bind(id.0)
            .fetch_optional(&mut *connection)
            .await
            .map_err(StoreError::from);
        let row: Option<RunnerRow> = connection.settle(row)?;
        row.map(Runner::try_from).transpose()
    }

    pub(super) async fn find_runner(&self, name: &str) -> Result<Option<Runner>, StoreError> {
        let row: Option<RunnerRow> = sqlx::query_as(&self.inner.statements.runner_by_name)
            .bind(name)
            .fetch_optional(self.reader())
            .await?;
        row.map(Runner::try_from).transpose()
    }

    pub(super) async fn list_runners(
        &self,
        filter: &RunnerFilter,
    ) -> Result<Vec<Runner>, StoreError> {
        let mut sql = Filter::new(format!(
            "SELECT id, {RUNNER_COLUMNS} FROM runners WHERE 1 = 1"
        ));
        let state = filter.state.map(|state| state.as_str());
        sql.and_if(state.is_some(), "state =")
            .and_if(filter.pool.is_some(), "pool =")
            .then(" ORDER BY id");
        let mut query = sqlx::query_as::<_, RunnerRow>(&sql.text);
        if let Some(state) = state {
            query = query.bind(state);
        }
        if let Some(pool) = &filter.pool {
            query = query.bind(pool.as_str());
        }
        let rows = query.fetch_all(self.reader()).await?;
        rows.into_iter().map(Runner::try_from).collect()
    }

    pub(super) async fn list_live_runners(
        &self,
        pool: Option<&str>,
    ) -> Result<Vec<Runner>, StoreError> {
        // The predicate is the index's own, word for word, so both
        // planners use the partial index.
        let mut sql = Filter::new(format!(
            "SELECT id, {RUNNER_COLUMNS} FROM runners WHERE {LIVE_RUNNER}"
        ));
        sql.and_if(pool.is_some(), "pool =").then(" ORDER BY id");
        let mut query = sqlx::query_as::<_, RunnerRow>(&sql.text);
        if let Some(pool) = pool {
            query = query.bind(pool);
        }
        let rows = query.fetch_all(self.reader()).await?;
        rows.into_iter().map(Runner::try_from).collect()
    }

    pub(super) async fn live_runner_counts(&self) -> Result<Vec<crate::RunnerCount>, StoreError> {
        // Three columns of the live rows, through the live index, counted
        // here: a `GROUP BY` in SQL has SQLite scan the (pool, state) index
        // over every runner ever, history included.
        let rows: Vec<(String, String, String)> = sqlx::query_as(&format!(
            "SELECT pool, provider, state FROM runners WHERE {LIVE_RUNNER} ORDER BY id"
        ))
        .fetch_all(self.reader())
        .await?;
        let mut counts: std::collections::BTreeMap<((String, String), String), i64> =
            Default::default();
        for (pool, provider, state) in rows {
            *counts.entry(((pool, provider), state)).or_default() += 1;
        }
        let rows = counts
            .into_iter()
            .map(|(((pool, provider), state), n)| ((pool, provider), state, n))
            .collect();
        Ok(super::parse_counts(rows, "runner")?
            .into_iter()
            .map(|((pool, provider), state, count)| crate::RunnerCount {
                pool,
                provider,
                state,
                count,
            })
            .collect())
    }

    pub(super) async fn create_registration_token(
        &self,
        token_hash: &str,
        pool: &str,
        runner: Option<RunnerId>,
        expires_at: Timestamp,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        sqlx::query(&self.inner.statements.runner_api.insert_registration)
            .bind(token_hash)
            .bind(pool)
            .bind(now.as_millis())
            .bind(expires_at.as_millis())
            .bind(runner.map(|r| r.0))
            .execute(self.writer())
            .await?;
        Ok(())
    }

    pub(super) async fn register_runner(
        &self,
        registration_token_hash: &str,
        attempt_hash: Option<&str>,
        name: &str,
        labels: &[String],
        runner_token_hash: &str,
        now: Timestamp,
    ) -> Result<Registration, StoreError> {
        let sql = &self.inner.statements.runner_api;
        let mut connection = self.writer().acquire().await?;
        let result: Result<Registration, StoreError> = async {
            let mut transaction = sqlx::Connection::begin(&mut *connection).await?;
            let redeemed: Option<(String, Option<i64>)> = sqlx::query_as(&sql.redeem_registration)
                .bind(registration_token_hash)
                .bind(now.as_millis())
                .bind(attempt_hash)
                .fetch_optional(&mut *transaction)
                .await?;
            let Some((pool, bound)) = redeemed else {
                // Used (or unknown, or expired): the same attempt again?
                let Some(attempt_hash) = attempt_hash else {
                    return Err(StoreError::InvalidToken);
                };
                let used_by: Option<i64> = sqlx::query_scalar(&sql.repeat_registration)
                    .bind(registration_token_hash)
                    .bind(now.as_millis())
                    .bind(attempt_hash)
                    .fetch_optional(&mut *transaction)
                    .await?
                    .flatten();
                let id = used_by.ok_or(StoreError::InvalidToken)?;
                let row: Option<RunnerRow> = sqlx::query_as(&self.inner.statements.runner_by_id)
                    .bind(id)
                    .fetch_optional(&mut *transaction)
                    .await?;
                let runner = row
                    .map(Runner::try_from)
                    .transpose()?
                    .ok_or(StoreError::InvalidToken)?;
                let untouched = matches!(
                    runner.state,
                    runway_core::RunnerState::Requested
                        | runway_core::RunnerState::Provisioning
                        | runway_core::RunnerState::Idle
                ) && runner.job.is_none()
                    && runner.busy_at.is_none()
                    && runner.name == name
                    && (runner.origin() != runway_core::RunnerOrigin::Registered
                        || runner.labels == labels);
                if !untouched {
                    return Err(StoreError::InvalidToken);
                }
                sqlx::query(&sql.set_runner_token)
                    .bind(runner.id.0)
                    .bind(runner_token_hash)
                    .execute(&mut *transaction)
                    .await?;
                transaction.commit().await?;
                return Ok(Registration {
                    // As stored: the token's write moved its version.
                    runner: Runner {
                        version: runner.version + 1,
                        ..runner
                    },
                    repeated: true,
                });
            };
            let runner = match bound {
                // Minted for a record the reconciler created: adopt it. A
                // record that already failed (boot timeout) admits no one.
                Some(id) => {
                    let row: Option<RunnerRow> =
                        sqlx::query_as(&self.inner.statements.runner_by_id)
                            .bind(id)
                            .fetch_optional(&mut *transaction)
                            .await?;
                    let current = row
                        .map(Runner::try_from)
                        .transpose()?
                        .ok_or(StoreError::InvalidToken)?;
                    let next = if matches!(
                        current.state,
                        runway_core::RunnerState::Requested
                            | runway_core::RunnerState::Provisioning
                    ) {
                        current.apply(&runway_core::RunnerEvent::Ready, now)?
                    } else {
                        return Err(StoreError::InvalidToken);
                    };
                    let columns = Columns::from(&next);
                    let updated =
                        bind_columns(sqlx::query(&self.inner.statements.replace_runner), &columns)
                            .bind(current.id.0)
                            .bind(current.version)
                            .execute(&mut *transaction)
                            .await?;
                    if updated.rows_affected() != 1 {
                        return Err(StoreError::Contention {
                            what: format!("runner {}", current.id),
                        });
                    }
                    next
                }
                None => {
                    let new = NewRunner {
                        name: name.to_owned(),
                        pool,
                        provider: runway_core::RunnerOrigin::Registered.column().to_owned(),
                        labels: labels.to_vec(),
                        stock: false,
                    };
                    let columns = Columns::from(&new.initial(RunnerId(0), now));
                    let row =
                        bind_columns(sqlx::query(&self.inner.statements.insert_runner), &columns)
                            .fetch_one(&mut *transaction)
                            .await
                            .and_then(|row| RunnerRow::from_row(&row));
                    match row {
                        Ok(row) => Runner::try_from(row)?,
                        Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {
                            return Err(StoreError::DuplicateRunnerName(name.to_owned()))
                        }
                        Err(e) => return Err(e.into()),
                    }
                }
            };
            sqlx::query(&sql.set_runner_token)
                .bind(runner.id.0)
                .bind(runner_token_hash)
                .execute(&mut *transaction)
                .await?;
            sqlx::query(&sql.registered_by)
                .bind(registration_token_hash)
                .bind(runner.id.0)
                .execute(&mut *transaction)
                .await?;
            transaction.commit().await?;
            Ok(Registration {
                // As stored: the token's write moved its version.
                runner: Runner {
                    version: runner.version + 1,
                    ..runner
                },
                repeated: false,
            })
        }
        .await;
        crate::conn::settle(connection, result)
    }

    pub(super) async fn set_runner_external_id(
        &self,
        runner: RunnerId,
        external_id: &str,
    ) -> Result<(), StoreError> {
        let done = sqlx::query(&self.inner.statements.runner_api.set_external_id)
            .bind(runner.0)
            .bind(external_id)
            .execute(self.writer())
            .await?;
        if done.rows_affected() == 0 {
            return Err(StoreError::RunnerNotFound(runner));
        }
        Ok(())
    }

    pub(super) async fn runner_external_id(
        &self,
        runner: RunnerId,
    ) -> Result<Option<String>, StoreError> {
        let value: Option<Option<String>> =
            sqlx::query_scalar(&self.inner.statements.runner_api.get_external_id)
                .bind(runner.0)
                .fetch_optional(self.reader())
                .await?;
        Ok(value.flatten())
    }

    pub(super) async fn ended_runners_registered(
        &self,
        limit: u32,
    ) -> Result<Vec<Runner>, StoreError> {
        let sql = format!(
            "SELECT id, {RUNNER_COLUMNS} FROM runners WHERE {} ORDER BY id LIMIT $1",
            crate::common::REGISTERED_ENDED_RUNNER
        );
        let rows: Vec<RunnerRow> = sqlx::query_as(&sql)
            .bind(i64::from(limit))
            .fetch_all(self.reader())
            .await?;
        rows.into_iter().map(Runner::try_from).collect()
    }

    /// Every runner API call starts here: a held connection (one round trip).
    pub(super) async fn find_runner_by_token(
        &self,
        token_hash: &str,
    ) -> Result<Option<Runner>, StoreError> {
        let mut connection = self.inner.held_reads().acquire().await?;
        let row = sqlx::query_as(&self.inner.statements.runner_api.runner_by_token)
            .bind(token_hash)
            .fetch_optional(&mut *connection)
            .await
            .map_err(StoreError::from);
        let row: Option<RunnerRow> = connection.settle(row)?;
        row.map(Runner::try_from).transpose()
    }

    pub(super) async fn set_runner_token(
        &self,
        runner: RunnerId,
        token_hash: &str,
    ) -> Result<(), StoreError> {
        sqlx::query(&self.inner.statements.runner_api.set_runner_token)
            .bind(runner.0)
            .bind(token_hash)
            .execute(self.writer())
            .await?;
        Ok(())
    }

    pub(super) async fn create_instance_token(
        &self,
        token_hash: &str,
        runner: RunnerId,
        expires_at: Timestamp,
        jit_files: Option<&str>,
    ) -> Result<(), StoreError> {
        sqlx::query(&self.inner.statements.runner_api.insert_instance_token)
            .bind(token_hash)
            .bind(runner.0)
            .bind(expires_at.as_millis())
            .bind(jit_files)
            .execute(self.writer())
            .await?;
        Ok(())
    }

    pub(super) async fn find_instance_token(
        &self,
        token_hash: &str,
    ) -> Result<Option<crate::InstanceToken>, StoreError> {
        let row: Option<(i64, i64, Option<String>, Option<i64>)> =
            sqlx::query_as(&self.inner.statements.runner_api.instance_token)
                .bind(token_hash)
                .fetch_optional(self.writer())
                .await?;
        Ok(row.map(
            |(runner, expires_at, jit_files, fetched)| crate::InstanceToken {
                runner: RunnerId(runner),
                expires_at: Timestamp::from_millis(expires_at),
                jit_files,
                token_fetched: fetched.is_some(),
            },
        ))
    }

    pub(super) async fn take_instance_registration(
        &self,
        token_hash: &str,
        now: Timestamp,
    ) -> Result<bool, StoreError> {
        let done = sqlx::query(&self.inner.statements.runner_api.take_instance_registration)
            .bind(token_hash)
            .bind(now.as_millis())
            .execute(self.writer())
            .await?;
        Ok(done.rows_affected() == 1)
    }

    pub(super) async fn arm_instance_tokens(
        &self,
        runner: RunnerId,
        expires_at: Timestamp,
        jit_files: Option<&str>,
    ) -> Result<u64, StoreError> {
        let done = sqlx::query(&self.inner.statements.runner_api.arm_instance_tokens)
            .bind(runner.0)
            .bind(expires_at.as_millis())
            .bind(jit_files)
            .execute(self.writer())
            .await?;
        Ok(done.rows_affected())
    }

    pub(super) async fn replace_runner(
        &self,
        current: &Runner,
        next: &Runner,
    ) -> Result<bool, StoreError> {
        let columns = Columns::from(next);
        let result = bind_columns(sqlx::query(&self.inner.statements.replace_runner), &columns)
            .bind(current.id.0)
            .bind(current.version)
            .execute(self.writer())
            .await?;
        Ok(result.rows_affected() == 1)
    }
);
