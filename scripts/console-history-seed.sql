-- A fleet's week for scripts/bench-console-history.sh, on top of
-- handout-history-seed.sql's million finished jobs: 8 days of one sample a
-- minute for pool `default` (what `[retention] pool_history` keeps), with
-- wait reasons, ending at the current minute.
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
ANALYZE pool_samples; ANALYZE pool_waits;
