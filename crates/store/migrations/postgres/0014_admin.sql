-- The admin write API (issue 20).
-- A job's history: one JSON line per change of state or attempt, appended
-- by the statement that makes the change (the step that created the job is
-- its created_at and first state, not stored twice).
ALTER TABLE jobs ADD COLUMN history TEXT NOT NULL DEFAULT '';
-- A drained runner takes no new job and stops after its current one.
ALTER TABLE runners ADD COLUMN draining BIGINT NOT NULL DEFAULT 0;
-- Pools an operator paused: their queue is kept, no runner is started.
CREATE TABLE pool_pauses (
    pool TEXT PRIMARY KEY,
    paused_by TEXT NOT NULL,
    paused_at BIGINT NOT NULL
);
-- Who changed what, when: every write of the admin API and every reload.
CREATE TABLE audit (
    id BIGSERIAL PRIMARY KEY,
    at BIGINT NOT NULL,
    actor TEXT NOT NULL,
    action TEXT NOT NULL,
    target TEXT NOT NULL,
    details TEXT NOT NULL
);
CREATE INDEX audit_at ON audit (at, id);
