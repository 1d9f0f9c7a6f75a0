//! Worker configurations stored through the API, with their optimistic
//! concurrency (`Expect`).

use super::*;

sql_store_methods!(
    pub(super) async fn list_worker_configs(&self) -> Result<Vec<StoredWorkerConfig>, StoreError> {
        let sql = &self.inner.statements.worker_configs;
        let rows: Vec<(String, i64, String, i64)> =
            sqlx::query_as(&sql.list).fetch_all(self.reader()).await?;
        let pools: Vec<(String, String)> = sqlx::query_as(&sql.all_pools)
            .fetch_all(self.reader())
            .await?;
        Ok(rows
            .into_iter()
            .map(|(id, version, body, updated_at)| StoredWorkerConfig {
                pools: pools
                    .iter()
                    .filter(|(_, owner)| owner == &id)
                    .map(|(pool, _)| pool.clone())
                    .collect(),
                id,
                version,
                body,
                updated_at: Timestamp::from_millis(updated_at),
            })
            .collect())
    }

    pub(super) async fn get_worker_config(
        &self,
        id: &str,
    ) -> Result<Option<StoredWorkerConfig>, StoreError> {
        let sql = &self.inner.statements.worker_configs;
        let mut transaction = self.reader().begin().await?;
        let row: Option<(String, i64, String, i64)> = sqlx::query_as(&sql.get)
            .bind(id)
            .fetch_optional(&mut *transaction)
            .await?;
        let pools: Vec<String> = sqlx::query_scalar(&sql.pools_of)
            .bind(id)
            .fetch_all(&mut *transaction)
            .await?;
        transaction.commit().await?;
        Ok(
            row.map(|(id, version, body, updated_at)| StoredWorkerConfig {
                id,
                version,
                body,
                pools,
                updated_at: Timestamp::from_millis(updated_at),
            }),
        )
    }

    pub(super) async fn put_worker_config(
        &self,
        id: &str,
        body: &str,
        pools: &[String],
        expect: Expect,
        now: Timestamp,
    ) -> Result<i64, StoreError> {
        let sql = &self.inner.statements.worker_configs;
        let mut connection = self.writer().acquire().await?;
        let result: Result<i64, StoreError> = async {
            let mut transaction = sqlx::Connection::begin(&mut *connection).await?;
            let version: Option<i64> = match expect {
                Expect::Any => {
                    let inserted = sqlx::query(&sql.insert)
                        .bind(id)
                        .bind(body)
                        .bind(now.as_millis())
                        .execute(&mut *transaction)
                        .await?;
                    if inserted.rows_affected() == 1 {
                        Some(1)
                    } else {
                        sqlx::query_scalar(&sql.update_any)
                            .bind(id)
                            .bind(body)
                            .bind(now.as_millis())
                            .fetch_optional(&mut *transaction)
                            .await?
                    }
                }
                Expect::Version(expected) => {
                    let updated: Option<i64> = sqlx::query_scalar(&sql.update_if)
                        .bind(id)
                        .bind(body)
                        .bind(now.as_millis())
                        .bind(expected)
                        .fetch_optional(&mut *transaction)
                        .await?;
                    if updated.is_none() {
                        let current: Option<i64> = sqlx::query_scalar(&sql.version)
                            .bind(id)
                            .fetch_optional(&mut *transaction)
                            .await?;
                        return Err(StoreError::VersionConflict {
                            id: id.to_owned(),
                            expected,
                            current,
                        });
                    }
                    updated
                }
            };
            let version = version.ok_or_else(|| {
                StoreError::Corrupt(format!("worker configuration {id} vanished mid-write"))
            })?;
            for pool in pools {
                let owner: Option<String> = sqlx::query_scalar(&sql.pool_owner)
                    .bind(pool.as_str())
                    .fetch_optional(&mut *transaction)
                    .await?;
                if let Some(owner) = owner.filter(|owner| owner != id) {
                    return Err(StoreError::PoolTaken {
                        pool: pool.clone(),
                        owner,
                    });
                }
            }
            sqlx::query(&sql.delete_pools)
                .bind(id)
                .execute(&mut *transaction)
                .await?;
            for pool in pools {
                let inserted = sqlx::query(&sql.insert_pool)
                    .bind(pool.as_str())
                    .bind(id)
                    .execute(&mut *transaction)
                    .await;
                match inserted {
                    Ok(_) => {}
                    // Another configuration claimed it between our check and insert.
                    Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {
                        return Err(StoreError::PoolTaken {
                            pool: pool.clone(),
                            owner: "another configuration written at the same time".to_owned(),
                        })
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            transaction.commit().await?;
            Ok(version)
        }
        .await;
        crate::conn::settle(connection, result)
    }

    pub(super) async fn delete_worker_config(
        &self,
        id: &str,
        expect: Expect,
    ) -> Result<bool, StoreError> {
        let sql = &self.inner.statements.worker_configs;
        let mut connection = self.writer().acquire().await?;
        let result: Result<bool, StoreError> = async {
            let mut transaction = sqlx::Connection::begin(&mut *connection).await?;
            let deleted = match expect {
                Expect::Any => {
                    sqlx::query(&sql.delete_any)
                        .bind(id)
                        .execute(&mut *transaction)
                        .await?
                }
                Expect::Version(expected) => {
                    let deleted = sqlx::query(&sql.delete_if)
                        .bind(id)
                        .bind(expected)
                        .execute(&mut *transaction)
                        .await?;
                    if deleted.rows_affected() == 0 {
                        let current: Option<i64> = sqlx::query_scalar(&sql.version)
                            .bind(id)
                            .fetch_optional(&mut *transaction)
                            .await?;
                        if current.is_some() {
                            return Err(StoreError::VersionConflict {
                                id: id.to_owned(),
                                expected,
                                current,
                            });
                        }
                    }
                    deleted
                }
            };
            // Pools go with their configuration (ON DELETE CASCADE), stated
            // here too so the outcome does not hang on a pragma.
            sqlx::query(&sql.delete_pools)
                .bind(id)
                .execute(&mut *transaction)
                .await?;
            transaction.commit().await?;
            Ok(deleted.rows_affected() == 1)
        }
        .await;
        crate::conn::settle(connection, result)
    }
);
