//! History and retention: finished jobs, their logs, the audit trail, and
//! pruning what is past its retention.

use super::*;

sql_store_methods!(
    pub(super) async fn job_history(
        &self,
        id: JobId,
    ) -> Result<Option<Vec<runway_core::JobStep>>, StoreError> {
        let Some(job) = self.get_job(id).await? else {
            return Ok(None);
        };
        let history: Option<String> = sqlx::query_scalar("SELECT history FROM jobs WHERE id = $1")
            .bind(id.0)
            .fetch_optional(self.reader())
            .await?;
        let mut steps = vec![job.first_step()];
        steps.extend(crate::rows::parse_history(
            id,
            history.as_deref().unwrap_or(""),
        )?);
        Ok(Some(steps))
    }

    pub(super) async fn add_audit(&self, entry: &crate::AuditEntry) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO audit (at, actor, action, target, details) VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(entry.at.as_millis())
        .bind(entry.actor.as_str())
        .bind(entry.action.as_str())
        .bind(entry.target.as_str())
        .bind(entry.details.as_str())
        .execute(self.writer())
        .await?;
        Ok(())
    }

    pub(super) async fn list_audit(
        &self,
        limit: u32,
        before: Option<i64>,
    ) -> Result<Vec<crate::AuditEntry>, StoreError> {
        let rows: Vec<(i64, i64, String, String, String, String)> = sqlx::query_as(
            "SELECT id, at, actor, action, target, details FROM audit \
             WHERE $1 IS NULL OR id < $1 ORDER BY id DESC LIMIT $2",
        )
        .bind(before)
        .bind(i64::from(limit))
        .fetch_all(self.reader())
        .await?;
        Ok(rows
            .into_iter()
            .map(
                |(id, at, actor, action, target, details)| crate::AuditEntry {
                    id,
                    at: Timestamp::from_millis(at),
                    actor,
                    action,
                    target,
                    details,
                },
            )
            .collect())
    }

    pub(super) async fn put_job_log(
        &self,
        job: JobId,
        exit_code: Option<i64>,
        log: &str,
    ) -> Result<(), StoreError> {
        sqlx::query(&self.inner.statements.runner_api.put_log)
            .bind(job.0)
            .bind(exit_code)
            .bind(log)
            .execute(self.writer())
            .await?;
        Ok(())
    }

    pub(super) async fn get_job_log(
        &self,
        job: JobId,
    ) -> Result<Option<(Option<i64>, String)>, StoreError> {
        let row: Option<(Option<i64>, String)> =
            sqlx::query_as(&self.inner.statements.runner_api.get_log)
                .bind(job.0)
                .fetch_optional(self.reader())
                .await?;
        Ok(row)
    }

    pub(super) async fn prune(
        &self,
        what: crate::Prunable,
        before: Timestamp,
        limit: u32,
    ) -> Result<u64, StoreError> {
        let statements = &self.inner.statements.prune[what as usize];
        let mut connection = self.writer().acquire().await?;
        let result: Result<u64, StoreError> = async {
            let mut transaction = sqlx::Connection::begin(&mut *connection).await?;
            let mut pruned = 0;
            for statement in statements {
                pruned = sqlx::query(statement)
                    .bind(before.as_millis())
                    .bind(i64::from(limit))
                    .execute(&mut *transaction)
                    .await?
                    .rows_affected();
            }
            if what == crate::Prunable::PoolHistory {
                // The hour the cutoff falls in lost some of its minutes:
                // its rollups are recomputed from those left.
                let hour = reports::hour_of(before.as_millis());
                let pools: Vec<String> =
                    sqlx::query_scalar("SELECT pool FROM pool_hours WHERE at = $1")
                        .bind(hour)
                        .fetch_all(&mut *transaction)
                        .await?;
                for pool in &pools {
                    for statement in reports::ROLL_UP {
                        sqlx::query(statement)
                            .bind(pool.as_str())
                            .bind(hour)
                            .bind(hour + reports::HOUR_MS)
                            .execute(&mut *transaction)
                            .await?;
                    }
                }
            }
            transaction.commit().await?;
            Ok(pruned)
        }
        .await;
        crate::conn::settle(connection, result)
    }

    pub(super) async fn count_rows(&self, what: crate::Prunable) -> Result<u64, StoreError> {
        let count: i64 = sqlx::query_scalar(&format!("SELECT COUNT(*) FROM {}", what.table()))
            .fetch_one(self.reader())
            .await?;
        Ok(u64::try_from(count).unwrap_or(0))
    }
);
