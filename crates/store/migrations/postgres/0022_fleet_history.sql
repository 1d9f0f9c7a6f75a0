-- The fleet's history for the console's charts (issue 44): one row a pool
-- a minute, written by the leader's sampler, pruned by `[retention]
-- pool_history`; charts read these, never the jobs' history. Queued jobs
-- by wait reason go to `pool_waits`, one row a pool, minute and reason.
CREATE TABLE pool_samples (
    pool TEXT NOT NULL,
    at BIGINT NOT NULL,
    queued BIGINT NOT NULL,
    running BIGINT NOT NULL,
    booting BIGINT NOT NULL,
    idle BIGINT NOT NULL,
    busy BIGINT NOT NULL,
    started BIGINT NOT NULL,
    wait_p50_ms BIGINT,
    wait_p95_ms BIGINT,
    runner_seconds BIGINT NOT NULL,
    cost_micros BIGINT NOT NULL,
    PRIMARY KEY (pool, at)
);
-- The pruner reads the oldest minutes of every pool.
CREATE INDEX pool_samples_at ON pool_samples (at);

CREATE TABLE pool_waits (
    pool TEXT NOT NULL,
    at BIGINT NOT NULL,
    reason TEXT NOT NULL,
    jobs BIGINT NOT NULL,
    PRIMARY KEY (pool, at, reason)
);
