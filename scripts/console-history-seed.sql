-- A fleet's week for scripts/bench-console-history.sh, on top of
-- handout-history-seed.sql's million finished jobs: 8 days of one sample a
-- minute for pool `default` (what `[retention] pool_history` keeps), with
-- wait reasons, ending at the current minute; and, where the schema has
-- them (issue 59), the hourly rollups runway writes beside each minute.
INSERT INTO pool_samples (pool, at, queued, running, booting, idle, busy, started,
  wait_p50_ms, wait_p95_ms, runner_seconds, cost_micros)
SELECT 'default', m * 60000, (m % 37), (m % 11), (m % 3), 1, (m % 11), (m % 5),
  1000 * (m % 17), 9000 * (m % 17), 60 * (1 + (m % 11) + (m % 3)), 1667 * (1 + (m % 11))
FROM generate_series((extract(epoch FROM now())::bigint / 60) - 8 * 1440,
                     (extract(epoch FROM now())::bigint / 60) - 1) AS m;
INSERT INTO pool_waits (pool, at, reason, jobs)
SELECT 'default', m * 60000, r, 1 + (m % 7)
FROM generate_series((extract(epoch FROM now())::bigint / 60) - 8 * 1440,
                     (extract(epoch FROM now())::bigint / 60) - 1) AS m,
     unnest(ARRAY['at_max_runners', 'runner_booting', 'pool_paused']) AS r;
DO $$
BEGIN
  IF to_regclass('pool_hours') IS NOT NULL THEN
    INSERT INTO pool_hours (pool, at, samples, queued, running, booting, idle, busy, stopped,
      started, wait_p50_weighted_ms, wait_p95_ms, runner_seconds, cost_micros)
    SELECT pool, (at / 3600000) * 3600000, COUNT(*), SUM(queued), SUM(running), SUM(booting),
      SUM(idle), SUM(busy), 0, SUM(started), SUM(wait_p50_ms * started), MAX(wait_p95_ms),
      SUM(runner_seconds), SUM(cost_micros)
    FROM pool_samples GROUP BY pool, (at / 3600000) * 3600000;
    INSERT INTO pool_wait_hours (pool, at, reason, jobs)
    SELECT pool, (at / 3600000) * 3600000, reason, SUM(jobs)
    FROM pool_waits GROUP BY pool, (at / 3600000) * 3600000, reason;
    ANALYZE pool_hours; ANALYZE pool_wait_hours;
  END IF;
END $$;
ANALYZE pool_samples; ANALYZE pool_waits;
