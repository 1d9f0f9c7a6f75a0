-- Fewer index entries for every version of a job (issue 15). On PostgreSQL
-- a job's state change is never a HOT update (its state, lease and times
-- are indexed), so each version of a job writes an entry in every index
-- whose predicate it meets, and every statement that modifies `jobs` opens
-- all of them.
--
-- The queue (`jobs_queue`, queued jobs by pool, oldest first) and the live
-- counts (`jobs_live`, live jobs by pool and state) become one index of
-- live jobs by pool, state and age: the claim's `pool = $1 AND state =
-- 'queued' ORDER BY enqueued_at, id` reads it in order, and the counts read
-- its leading columns. An enqueued job writes one entry here, not two. The
-- predicate must stay identical to `LIVE_JOB` in src/common.rs.
DROP INDEX IF EXISTS jobs_live;
DROP INDEX IF EXISTS jobs_queue;
CREATE INDEX jobs_live ON jobs (pool, state, enqueued_at, id) WHERE state IN ('queued', 'provisioning', 'running');
-- The console's queue times (jobs started in the last hour) no longer need
-- an index of every job's start (migration 0015), written by each start and
-- each completion: a job started since the cutoff is live, or finished
-- since the cutoff (it finished after it started), so `QUEUE_TIMES` reads
-- the live index and a range of `jobs_finished`.
DROP INDEX IF EXISTS jobs_started_at;
