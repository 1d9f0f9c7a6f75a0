-- The fleet's history for the console's charts (issue 44; PostgreSQL's migration 0022 says more): one row a pool
-- a minute, written by the leader's sampler, pruned by `[retention]
-- pool_history`; charts read these, never the jobs' history. Queued jobs
-- by wait reason go to `pool_waits`, one row a pool, minute and reason.
CREATE TABLE pool_samples (
    pool TEXT NOT NULL,
    at INTEGER NOT NULL,
    queued INTEGER NOT NULL,
    running INTEGER NOT NULL,
    booting INTEGER NOT NULL,
    idle INTEGER NOT NULL,
    busy INTEGER NOT NULL,
    started INTEGER NOT NULL,
    wait_p50_ms INTEGER,
    wait_p95_ms INTEGER,
    runner_seconds INTEGER NOT NULL,
    cost_micros INTEGER NOT NULL,
    PRIMARY KEY (pool, at)
);
-- The pruner reads the oldest minutes of every pool.
CREATE INDEX pool_samples_at ON pool_samples (at);

CREATE TABLE pool_waits (
    pool TEXT NOT NULL,
    at INTEGER NOT NULL,
    reason TEXT NOT NULL,
    jobs INTEGER NOT NULL,
    PRIMARY KEY (pool, at, reason)
);
