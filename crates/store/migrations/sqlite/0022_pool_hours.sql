-- A pool's stopped runners (issue 60) in its minutes.
ALTER TABLE pool_samples ADD COLUMN stopped INTEGER NOT NULL DEFAULT 0;

-- Hourly rollups of the fleet's history (issue 59): a week's chart read
-- 10,080 minute rows a pool on every request; it now reads 168 hours.
-- `pool_hours` holds, per pool and hour, the sums of that hour's minute
-- samples (`pool_samples`) and `pool_wait_hours` the queued jobs by
-- wait reason (`pool_waits`). Each minute's write recomputes its hour
-- from its minutes, so a replaced sample is counted once; retention prunes
-- an hour once every minute of it is past.
CREATE TABLE pool_hours (
    pool TEXT NOT NULL,
    at INTEGER NOT NULL,
    samples INTEGER NOT NULL,
    queued INTEGER NOT NULL,
    running INTEGER NOT NULL,
    booting INTEGER NOT NULL,
    idle INTEGER NOT NULL,
    busy INTEGER NOT NULL,
    stopped INTEGER NOT NULL,
    started INTEGER NOT NULL,
    -- The sum of each minute's p50 wait times its started jobs (NULL when
    -- no minute had waits), and the largest p95.
    wait_p50_weighted_ms INTEGER,
    wait_p95_ms INTEGER,
    runner_seconds INTEGER NOT NULL,
    cost_micros INTEGER NOT NULL,
    PRIMARY KEY (pool, at)
);
CREATE INDEX pool_hours_at ON pool_hours (at);

CREATE TABLE pool_wait_hours (
    pool TEXT NOT NULL,
    at INTEGER NOT NULL,
    reason TEXT NOT NULL,
    jobs INTEGER NOT NULL,
    PRIMARY KEY (pool, at, reason)
);

-- The hours of the history already kept.
INSERT INTO pool_hours (pool, at, samples, queued, running, booting, idle, busy, stopped,
    started, wait_p50_weighted_ms, wait_p95_ms, runner_seconds, cost_micros)
SELECT pool, (at / 3600000) * 3600000, COUNT(*), SUM(queued), SUM(running), SUM(booting),
    SUM(idle), SUM(busy), 0, SUM(started), SUM(wait_p50_ms * started), MAX(wait_p95_ms),
    SUM(runner_seconds), SUM(cost_micros)
FROM pool_samples GROUP BY pool, (at / 3600000) * 3600000;

INSERT INTO pool_wait_hours (pool, at, reason, jobs)
SELECT pool, (at / 3600000) * 3600000, reason, SUM(jobs)
FROM pool_waits GROUP BY pool, (at / 3600000) * 3600000, reason;
