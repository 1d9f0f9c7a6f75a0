-- Held jobs (issue 58): stored, but not routed until GitHub says what the
-- pools serving their labels need to know of the workflow run. The leader
-- reads them every few seconds, and only them, never the jobs' history.
-- (SQLite needs no migration for it: its index of every job's state,
-- `jobs_state`, already serves `state = 'held'`; PostgreSQL keeps none,
-- so that the hot path's generic plans find a job by id.)
CREATE INDEX jobs_held ON jobs (id) WHERE state = 'held';
