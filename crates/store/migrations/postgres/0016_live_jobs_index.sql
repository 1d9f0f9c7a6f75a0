-- Jobs by pool and state for live jobs only, in place of `jobs_state`, an
-- index of every job ever recorded (migration 0001). That one held an
-- entry for every version of every job, and PostgreSQL's generic plans of
-- the hot path's statements (`id = $1 AND state = $10 …`, a job's guarded
-- change) chose it over the primary key: each completion walked every
-- entry of its state, dead versions included. A partial index serves the
-- live counts (its predicate must stay identical to `LIVE_JOB` in
-- src/common.rs) and cannot serve a parameterised state, so the hot path
-- finds its job by id.
DROP INDEX IF EXISTS jobs_state;
CREATE INDEX jobs_live ON jobs (pool, state) WHERE state IN ('queued', 'provisioning', 'running');
