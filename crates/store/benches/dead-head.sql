-- What the queue's claim pays for jobs claimed since the last VACUUM, on
-- PostgreSQL (BENCHMARKS.md, session 9). A claimed job's old version keeps
-- its entry at the head of the queue's index until VACUUM removes it; the
-- claim's index scan starts at the head, so it steps over every such entry
-- (the first scan marks them dead, later ones still read their pages).
--
--   psql postgres://postgres@127.0.0.1:5432/test -f crates/store/benches/dead-head.sql
--
-- Works in a schema of its own (dead_head), dropped at the end. The table
-- has the columns the claim reads and the index runway's claim uses
-- (migration 0018); 20,000 jobs queued, 10,000 of them then claimed and
-- finished, autovacuum off for the table so nothing cleans up mid-run.
\set ON_ERROR_STOP on
DROP SCHEMA IF EXISTS dead_head CASCADE;
CREATE SCHEMA dead_head;
SET search_path = dead_head;
CREATE TABLE jobs (id bigserial PRIMARY KEY, pool text, state text, enqueued_at bigint, payload text);
ALTER TABLE jobs SET (autovacuum_enabled = false);
CREATE INDEX jobs_live ON jobs (pool, state, enqueued_at, id)
    WHERE state IN ('queued', 'provisioning', 'running');
INSERT INTO jobs (pool, state, enqueued_at, payload)
    SELECT 'p', 'queued', g, repeat('x', 200) FROM generate_series(1, 20000) AS g;
UPDATE jobs SET state = 'running' WHERE id <= 10000;
UPDATE jobs SET state = 'completed' WHERE id <= 9990;
\echo '== the claim, first scan after the claims (marks the dead entries)'
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF)
    SELECT id FROM jobs WHERE state = 'queued' AND pool = 'p' ORDER BY enqueued_at, id LIMIT 1;
\echo '== the claim again (the steady state until VACUUM)'
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF)
    SELECT id FROM jobs WHERE state = 'queued' AND pool = 'p' ORDER BY enqueued_at, id LIMIT 1;
\echo '== the claim started at the live head (what it would cost with no dead entries before it)'
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF)
    SELECT id FROM jobs WHERE state = 'queued' AND pool = 'p' AND (enqueued_at, id) >= (10000, 0)
    ORDER BY enqueued_at, id LIMIT 1;
VACUUM jobs;
\echo '== the claim after VACUUM'
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF)
    SELECT id FROM jobs WHERE state = 'queued' AND pool = 'p' ORDER BY enqueued_at, id LIMIT 1;
DROP SCHEMA dead_head CASCADE;
