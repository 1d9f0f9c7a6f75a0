//! Reports: the pools' sampled history and waits, and runners' pre- and post-
//! job reports.

use super::*;

/// One bucket of `pool_samples` as `pool_history` reads it: pool, bucket,
/// samples, the sums of queued, running, booting, idle, busy, stopped and
/// started,
/// the started-weighted p50 sum and the largest p95 (both absent when no
/// sample had waits), runner-seconds and cost.
type HistoryBucketRow = (
    String,
    i64,
    i64,
    i64,
    i64,
    i64,
    i64,
    i64,
    i64,
    i64,
    Option<i64>,
    Option<i64>,
    i64,
    i64,
);

pub(super) const HOUR_MS: i64 = 3_600_000;

/// The start of the hour `at` (ms) falls in.
pub(super) fn hour_of(at: i64) -> i64 {
    at.div_euclid(HOUR_MS) * HOUR_MS
}

/// An hour's rollups recomputed from its minutes: `$1` the pool, `$2` the
/// hour's start, `$3` its end. PostgreSQL's sum of bigints is a numeric,
/// cast back.
pub(super) const ROLL_UP: [&str; 4] = [
    "DELETE FROM pool_hours WHERE pool = $1 AND at = $2",
    "INSERT INTO pool_hours (pool, at, samples, queued, running, booting, idle, busy, stopped, \
       started, wait_p50_weighted_ms, wait_p95_ms, runner_seconds, cost_micros) \
     SELECT pool, $2, COUNT(*), CAST(SUM(queued) AS BIGINT), CAST(SUM(running) AS BIGINT), \
       CAST(SUM(booting) AS BIGINT), CAST(SUM(idle) AS BIGINT), CAST(SUM(busy) AS BIGINT), \
       CAST(SUM(stopped) AS BIGINT), \
       CAST(SUM(started) AS BIGINT), CAST(SUM(wait_p50_ms * started) AS BIGINT), \
       MAX(wait_p95_ms), CAST(SUM(runner_seconds) AS BIGINT), CAST(SUM(cost_micros) AS BIGINT) \
     FROM pool_samples WHERE pool = $1 AND at >= $2 AND at < $3 GROUP BY pool",
    "DELETE FROM pool_wait_hours WHERE pool = $1 AND at = $2",
    "INSERT INTO pool_wait_hours (pool, at, reason, jobs) \
     SELECT pool, $2, reason, CAST(SUM(jobs) AS BIGINT) FROM pool_waits \
     WHERE pool = $1 AND at >= $2 AND at < $3 GROUP BY pool, reason",
];

/// The history in buckets of `$3` ms from `$2` on, of pool `$1` or of
/// every pool, from the minutes. Sums, not means: the means are taken
/// here.
const HISTORY_FROM_MINUTES: &str = "SELECT pool, (at / $3) * $3 AS bucket, COUNT(*), \
       CAST(SUM(queued) AS BIGINT), CAST(SUM(running) AS BIGINT), \
       CAST(SUM(booting) AS BIGINT), CAST(SUM(idle) AS BIGINT), \
       CAST(SUM(busy) AS BIGINT), CAST(SUM(stopped) AS BIGINT), CAST(SUM(started) AS BIGINT), \
       CAST(SUM(wait_p50_ms * started) AS BIGINT), MAX(wait_p95_ms), \
       CAST(SUM(runner_seconds) AS BIGINT), CAST(SUM(cost_micros) AS BIGINT) \
     FROM pool_samples WHERE at >= $2 AND ($1 IS NULL OR pool = $1) \
     GROUP BY pool, bucket ORDER BY pool, bucket";

/// The same from the hourly rollups, for whole hours from a whole hour on.
const HISTORY_FROM_HOURS: &str = "SELECT pool, (at / $3) * $3 AS bucket, \
       CAST(SUM(samples) AS BIGINT), \
       CAST(SUM(queued) AS BIGINT), CAST(SUM(running) AS BIGINT), \
       CAST(SUM(booting) AS BIGINT), CAST(SUM(idle) AS BIGINT), \
       CAST(SUM(busy) AS BIGINT), CAST(SUM(stopped) AS BIGINT), CAST(SUM(started) AS BIGINT), \
       CAST(SUM(wait_p50_weighted_ms) AS BIGINT), MAX(wait_p95_ms), \
       CAST(SUM(runner_seconds) AS BIGINT), CAST(SUM(cost_micros) AS BIGINT) \
     FROM pool_hours WHERE at >= $2 AND ($1 IS NULL OR pool = $1) \
     GROUP BY pool, bucket ORDER BY pool, bucket";

sql_store_methods!(
    pub(super) async fn record_pool_samples(
        &self,
        samples: &[crate::PoolSample],
    ) -> Result<(), StoreError> {
        if samples.is_empty() {
            return Ok(());
        }
        let mut connection = self.inner.held.acquire().await?;
        let result = async {
            let mut transaction = sqlx::Connection::begin(&mut *connection).await?;
            for sample in samples {
                sqlx::query(
                    "INSERT INTO pool_samples (pool, at, queued, running, booting, idle, busy, \
                       started, wait_p50_ms, wait_p95_ms, runner_seconds, cost_micros, stopped) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13) \
                     ON CONFLICT (pool, at) DO UPDATE SET queued = excluded.queued, \
                       running = excluded.running, booting = excluded.booting, \
                       idle = excluded.idle, busy = excluded.busy, stopped = excluded.stopped, \
                       started = excluded.started, \
                       wait_p50_ms = excluded.wait_p50_ms, wait_p95_ms = excluded.wait_p95_ms, \
                       runner_seconds = excluded.runner_seconds, cost_micros = excluded.cost_micros",
                )
                .bind(sample.pool.as_str())
                .bind(sample.at.as_millis())
                .bind(sample.queued)
                .bind(sample.running)
                .bind(sample.booting)
                .bind(sample.idle)
                .bind(sample.busy)
                .bind(sample.started)
                .bind(sample.wait_p50_ms)
                .bind(sample.wait_p95_ms)
                .bind(sample.runner_seconds)
                .bind(sample.cost_micros)
                .bind(sample.stopped)
                .execute(&mut *transaction)
                .await?;
                sqlx::query("DELETE FROM pool_waits WHERE pool = $1 AND at = $2")
                    .bind(sample.pool.as_str())
                    .bind(sample.at.as_millis())
                    .execute(&mut *transaction)
                    .await?;
                for (reason, jobs) in &sample.waits {
                    sqlx::query(
                        "INSERT INTO pool_waits (pool, at, reason, jobs) VALUES ($1, $2, $3, $4)",
                    )
                    .bind(sample.pool.as_str())
                    .bind(sample.at.as_millis())
                    .bind(reason.as_str())
                    .bind(*jobs)
                    .execute(&mut *transaction)
                    .await?;
                }
            }
            // Each hour written to, recomputed from its minutes: a
            // replaced minute is counted once.
            let hours: std::collections::BTreeSet<(&str, i64)> = samples
                .iter()
                .map(|sample| (sample.pool.as_str(), hour_of(sample.at.as_millis())))
                .collect();
            for (pool, hour) in hours {
                for statement in ROLL_UP {
                    sqlx::query(statement)
                        .bind(pool)
                        .bind(hour)
                        .bind(hour + HOUR_MS)
                        .execute(&mut *transaction)
                        .await?;
                }
            }
            transaction.commit().await?;
            Ok(())
        }
        .await;
        connection.settle(result)
    }

    pub(super) async fn pool_history(
        &self,
        pool: Option<&str>,
        since: Timestamp,
        bucket: Duration,
    ) -> Result<Vec<crate::PoolHistoryPoint>, StoreError> {
        let width = i64::try_from(bucket.as_millis()).unwrap_or(i64::MAX).max(1);
        // Whole hours from whole hours on read the hourly rollup: a week is
        // 168 rows a pool, not 10,080.
        let hourly = width % HOUR_MS == 0 && since.as_millis() % HOUR_MS == 0;
        let statement = if hourly {
            HISTORY_FROM_HOURS
        } else {
            HISTORY_FROM_MINUTES
        };
        let rows: Vec<HistoryBucketRow> = sqlx::query_as(statement)
            .bind(pool)
            .bind(since.as_millis())
            .bind(width)
            .fetch_all(self.reader())
            .await?;
        Ok(rows
            .into_iter()
            .map(
                |(
                    pool,
                    at,
                    samples,
                    queued,
                    running,
                    booting,
                    idle,
                    busy,
                    stopped,
                    started,
                    p50,
                    p95,
                    seconds,
                    cost,
                )| {
                    let mean = |sum: i64| sum as f64 / samples.max(1) as f64;
                    crate::PoolHistoryPoint {
                        pool,
                        at: Timestamp::from_millis(at),
                        samples,
                        queued: mean(queued),
                        running: mean(running),
                        booting: mean(booting),
                        idle: mean(idle),
                        busy: mean(busy),
                        stopped: mean(stopped),
                        started,
                        wait_p50_ms: p50
                            .filter(|_| started > 0)
                            .map(|weighted| weighted / started),
                        wait_p95_ms: p95,
                        runner_seconds: seconds,
                        cost_micros: cost,
                    }
                },
            )
            .collect())
    }

    pub(super) async fn pool_waits(
        &self,
        pool: &str,
        since: Timestamp,
    ) -> Result<Vec<(String, i64)>, StoreError> {
        // The minutes up to the first whole hour, then the hours.
        let since = since.as_millis();
        let first_hour = hour_of(since) + if since % HOUR_MS == 0 { 0 } else { HOUR_MS };
        Ok(sqlx::query_as(
            "SELECT reason, CAST(SUM(jobs) AS BIGINT) AS total FROM ( \
               SELECT reason, jobs FROM pool_waits WHERE pool = $1 AND at >= $2 AND at < $3 \
               UNION ALL \
               SELECT reason, jobs FROM pool_wait_hours WHERE pool = $1 AND at >= $3 \
             ) AS waits GROUP BY reason ORDER BY total DESC, reason",
        )
        .bind(pool)
        .bind(since)
        .bind(first_hour)
        .fetch_all(self.reader())
        .await?)
    }

    pub(super) async fn add_runner_report(
        &self,
        runner: RunnerId,
        phase: &str,
        body: &str,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        sqlx::query(&self.inner.statements.runner_api.add_report)
            .bind(runner.0)
            .bind(phase)
            .bind(body)
            .bind(now.as_millis())
            .execute(self.writer())
            .await?;
        Ok(())
    }

    pub(super) async fn runner_reports(
        &self,
        runner: RunnerId,
    ) -> Result<Vec<(String, String)>, StoreError> {
        let rows: Vec<(String, String)> = sqlx::query_as(&self.inner.statements.runner_api.reports)
            .bind(runner.0)
            .fetch_all(self.reader())
            .await?;
        Ok(rows)
    }

    pub(super) async fn unfinished_reports(
        &self,
        from: Timestamp,
        to: Timestamp,
        limit: u32,
    ) -> Result<Vec<(RunnerId, Timestamp, String)>, StoreError> {
        let rows: Vec<(i64, i64, String)> =
            sqlx::query_as(&self.inner.statements.runner_api.unfinished_reports)
                .bind(from.as_millis())
                .bind(to.as_millis())
                .bind(i64::from(limit))
                .fetch_all(self.reader())
                .await?;
        Ok(rows
            .into_iter()
            .map(|(runner, at, body)| (RunnerId(runner), Timestamp::from_millis(at), body))
            .collect())
    }
);
