-- Jobs: the durable queue. Times are milliseconds since the Unix epoch and are
-- always passed in by the caller; no statement reads the database clock.
CREATE TABLE jobs (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    source           TEXT    NOT NULL,
    external_id      TEXT    NOT NULL,
    pool             TEXT,
    labels           TEXT    NOT NULL,             -- JSON array of strings
    state            TEXT    NOT NULL,
    attempts         INTEGER  NOT NULL DEFAULT 0,
    max_attempts     INTEGER  NOT NULL,
    runner_id        INTEGER,
    lease_deadline   INTEGER,
    excluded_runners TEXT    NOT NULL DEFAULT '[]', -- JSON array of runner ids
    payload          TEXT    NOT NULL DEFAULT '{}',
    created_at       INTEGER  NOT NULL,
    enqueued_at      INTEGER  NOT NULL,
    started_at       INTEGER,
    finished_at      INTEGER,
    conclusion       TEXT,
    reason           TEXT,
    version          INTEGER  NOT NULL DEFAULT 0,
    UNIQUE (source, external_id)
);
-- The claim path: oldest queued job of a pool.
CREATE INDEX jobs_queue ON jobs (pool, enqueued_at, id) WHERE state = 'queued';
-- The lease sweeper.
CREATE INDEX jobs_lease ON jobs (lease_deadline) WHERE lease_deadline IS NOT NULL;
CREATE INDEX jobs_state ON jobs (state, pool);

CREATE TABLE runners (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    name           TEXT   NOT NULL UNIQUE,
    pool           TEXT   NOT NULL,
    provider       TEXT   NOT NULL,
    labels         TEXT   NOT NULL DEFAULT '[]',
    instance_id    TEXT,
    state          TEXT   NOT NULL,
    job_id         INTEGER,
    requested_at   INTEGER NOT NULL,
    provisioning_at INTEGER,
    idle_at        INTEGER,
    busy_at        INTEGER,
    terminating_at INTEGER,
    ended_at       INTEGER,
    reason         TEXT,
    version        INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX runners_pool_state ON runners (pool, state);
