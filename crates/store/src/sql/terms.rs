//! Replicas, leader terms and fencing, once-only claims, settings and paused
//! pools: what replicas agree on.

use super::*;

sql_store_methods!(
    pub(super) async fn init_setting(
        &self,
        key: &str,
        candidate: &str,
    ) -> Result<String, StoreError> {
        let sql = &self.inner.statements.runner_api;
        sqlx::query(&sql.insert_setting)
            .bind(key)
            .bind(candidate)
            .execute(self.writer())
            .await?;
        let value: String = sqlx::query_scalar(&sql.get_setting)
            .bind(key)
            .fetch_one(self.writer())
            .await?;
        Ok(value)
    }

    pub(super) async fn set_pool_paused(
        &self,
        pool: &str,
        by: Option<&str>,
        now: Timestamp,
    ) -> Result<bool, StoreError> {
        let done = match by {
            Some(by) => {
                sqlx::query(
                    "INSERT INTO pool_pauses (pool, paused_by, paused_at) VALUES ($1, $2, $3) \
                     ON CONFLICT (pool) DO NOTHING",
                )
                .bind(pool)
                .bind(by)
                .bind(now.as_millis())
                .execute(self.writer())
                .await?
            }
            None => {
                sqlx::query("DELETE FROM pool_pauses WHERE pool = $1")
                    .bind(pool)
                    .execute(self.writer())
                    .await?
            }
        };
        Ok(done.rows_affected() == 1)
    }

    pub(super) async fn paused_pools(&self) -> Result<Vec<crate::PausedPool>, StoreError> {
        let rows: Vec<(String, String, i64)> =
            sqlx::query_as("SELECT pool, paused_by, paused_at FROM pool_pauses ORDER BY pool")
                .fetch_all(self.reader())
                .await?;
        Ok(rows
            .into_iter()
            .map(|(pool, by, at)| crate::PausedPool {
                pool,
                by,
                at: Timestamp::from_millis(at),
            })
            .collect())
    }

    pub(super) async fn get_setting(&self, key: &str) -> Result<Option<String>, StoreError> {
        let value: Option<String> =
            sqlx::query_scalar(&self.inner.statements.runner_api.get_setting)
                .bind(key)
                .fetch_optional(self.reader())
                .await?;
        Ok(value)
    }

    pub(super) async fn put_setting(&self, key: &str, value: &str) -> Result<(), StoreError> {
        sqlx::query(&self.inner.statements.runner_api.put_setting)
            .bind(key)
            .bind(value)
            .execute(self.writer())
            .await?;
        Ok(())
    }

    pub(super) async fn claim_once(
        &self,
        key: &str,
        now: Timestamp,
        forget_before: Timestamp,
    ) -> Result<bool, StoreError> {
        let sql = &self.inner.statements.runner_api;
        sqlx::query(&sql.prune_once)
            .bind(forget_before.as_millis())
            .execute(self.writer())
            .await?;
        let done = sqlx::query(&sql.claim_once)
            .bind(key)
            .bind(now.as_millis())
            .execute(self.writer())
            .await?;
        Ok(done.rows_affected() == 1)
    }

    pub(super) async fn once_claimed(&self, key: &str) -> Result<bool, StoreError> {
        let found: Option<(i64,)> = sqlx::query_as("SELECT done_at FROM once_keys WHERE key = $1")
            .bind(key)
            .fetch_optional(self.reader())
            .await?;
        Ok(found.is_some())
    }

    pub(super) async fn forget_once(&self, key: &str) -> Result<(), StoreError> {
        sqlx::query(&self.inner.statements.runner_api.forget_once)
            .bind(key)
            .execute(self.writer())
            .await?;
        Ok(())
    }

    pub(super) async fn heartbeat_replica(
        &self,
        replica: &crate::Replica,
        forget_before: Timestamp,
    ) -> Result<(), StoreError> {
        let sql = &self.inner.statements.runner_api;
        sqlx::query(&sql.heartbeat_replica)
            .bind(replica.id.as_str())
            .bind(replica.address.as_str())
            .bind(replica.version.as_str())
            .bind(replica.started_at.as_millis())
            .bind(replica.heartbeat_at.as_millis())
            .execute(self.writer())
            .await?;
        sqlx::query(&sql.forget_replicas)
            .bind(forget_before.as_millis())
            .execute(self.writer())
            .await?;
        Ok(())
    }

    pub(super) async fn replicas(
        &self,
        seen_since: Timestamp,
    ) -> Result<Vec<crate::Replica>, StoreError> {
        let rows: Vec<(String, String, String, i64, i64)> =
            sqlx::query_as(&self.inner.statements.runner_api.replicas)
                .bind(seen_since.as_millis())
                .fetch_all(self.reader())
                .await?;
        Ok(rows
            .into_iter()
            .map(
                |(id, address, version, started_at, heartbeat_at)| crate::Replica {
                    id,
                    address,
                    version,
                    started_at: Timestamp::from_millis(started_at),
                    heartbeat_at: Timestamp::from_millis(heartbeat_at),
                },
            )
            .collect())
    }

    pub(super) async fn begin_term(
        &self,
        name: &str,
        replica: &str,
        now: Timestamp,
    ) -> Result<i64, StoreError> {
        // Run to its end, as every write (see `insert_job`).
        let terms: Vec<i64> = sqlx::query_scalar(&self.inner.statements.runner_api.begin_term)
            .bind(name)
            .bind(replica)
            .bind(now.as_millis())
            .fetch_all(self.writer())
            .await?;
        terms
            .first()
            .copied()
            .ok_or_else(|| StoreError::Corrupt(format!("no term for {name}")))
    }

    pub(super) async fn end_term(&self, name: &str, term: i64) -> Result<(), StoreError> {
        sqlx::query(&self.inner.statements.runner_api.end_term)
            .bind(name)
            .bind(term)
            .execute(self.writer())
            .await?;
        Ok(())
    }

    pub(super) async fn leader(&self, name: &str) -> Result<Option<crate::LeaderTerm>, StoreError> {
        let row: Option<(String, i64, i64)> =
            sqlx::query_as(&self.inner.statements.runner_api.leader)
                .bind(name)
                .fetch_optional(self.reader())
                .await?;
        Ok(row.map(|(replica, term, since)| crate::LeaderTerm {
            replica,
            term,
            since: Timestamp::from_millis(since),
        }))
    }
);
