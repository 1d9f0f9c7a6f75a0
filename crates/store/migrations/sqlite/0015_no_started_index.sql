-- The console's queue times (jobs started in the last hour) no longer need
-- an index of every job's start (migration 0014), written by each start and
-- each completion: a job started since the cutoff is live, or finished
-- since the cutoff (it finished after it started), so `QUEUE_TIMES` reads
-- live jobs by state and a range of `jobs_finished`.
DROP INDEX IF EXISTS jobs_started_at;
