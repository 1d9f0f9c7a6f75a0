-- The hand-out's statement shapes, driven by pgbench itself rather than by
-- runway (issue 15): is the gap to `pgbench -N` in the schema or on runway's
-- side of the wire? `wide` is runway's jobs table (same columns and
-- indexes, history appended); `lean` keeps live jobs in a small table and
-- moves a finished one to a history table. In a scratch database:
--
--   psql "$DB" -f setup.sql
--   pgbench -n -M prepared -c 8 -j 2 -T 10 -f wide.sql "$DB"   # then lean.sql, alternating
--
-- Figures: BENCHMARKS.md, "A job and its runner in one statement".
-- wide: runway's jobs/runners shape and indexes (history, labels, payload)
CREATE TABLE wjobs (id bigserial primary key, source text not null, external_id text not null, pool text, labels text not null,
 state text not null, attempts bigint not null default 0, max_attempts bigint not null, runner_id bigint, lease_deadline bigint,
 excluded_runners text not null default '[]', payload text not null default '{}', created_at bigint not null, enqueued_at bigint not null,
 started_at bigint, finished_at bigint, conclusion text, reason text, version bigint not null default 0, history text not null default '',
 unique (source, external_id));
CREATE INDEX wjobs_queue ON wjobs (pool, enqueued_at, id) WHERE state = 'queued';
CREATE INDEX wjobs_lease ON wjobs (lease_deadline) WHERE lease_deadline IS NOT NULL;
CREATE INDEX wjobs_state ON wjobs (state, pool);
CREATE INDEX wjobs_finished ON wjobs (finished_at, id) WHERE state IN ('completed','failed','cancelled','unroutable');
CREATE INDEX wjobs_started ON wjobs (started_at) WHERE started_at IS NOT NULL;
INSERT INTO wjobs (source, external_id, pool, labels, state, max_attempts, payload, created_at, enqueued_at)
 SELECT 'api', 'j'||g, 'p', '["self-hosted","linux"]', 'queued', 3, '{"script":"make test"}', g, g FROM generate_series(1,200000) g;
-- lean: live jobs only, few indexes; finished jobs moved to a history table
CREATE TABLE ljobs (id bigint primary key, pool text, labels text not null, state text not null, runner_id bigint, lease_deadline bigint,
 payload text not null, enqueued_at bigint not null, started_at bigint, version bigint not null default 0);
CREATE INDEX ljobs_queue ON ljobs (pool, enqueued_at, id) WHERE state = 'queued';
CREATE INDEX ljobs_lease ON ljobs (lease_deadline) WHERE lease_deadline IS NOT NULL;
CREATE TABLE ldone (id bigint primary key, pool text, labels text, payload text, enqueued_at bigint, started_at bigint, finished_at bigint, conclusion text);
INSERT INTO ljobs (id, pool, labels, state, payload, enqueued_at) SELECT g, 'p', '["self-hosted","linux"]', 'queued', '{"script":"make test"}', g FROM generate_series(1,200000) g;
CREATE TABLE runners (id bigint primary key, state text not null, job_id bigint, version bigint not null default 0);
INSERT INTO runners SELECT g, 'idle', NULL, 0 FROM generate_series(1,64) g;
