-- Fair share within a pool (issue 43). Each job carries a share key (its
-- repository, or the runway-API submitter) and the key's weight in
-- thousandths; its place in the pool's queue is a start tag, as in
-- start-time fair queueing (runway_core::share::next_tag): the pool's
-- virtual time (the highest tag handed out among live jobs, or the lowest
-- still queued) or its key's last queued tag plus one step of 1/weight,
-- whichever is later. The queue is served in tag order, ties by id
-- (arrival): with one key that is
-- arrival order; with several, a key that queued 500 jobs does not keep a
-- key that queues one behind all of them.
ALTER TABLE jobs ADD COLUMN share_key TEXT NOT NULL DEFAULT '';
ALTER TABLE jobs ADD COLUMN share_weight BIGINT NOT NULL DEFAULT 1000;
ALTER TABLE jobs ADD COLUMN share_tag DOUBLE PRECISION NOT NULL DEFAULT 0;

-- Jobs queued before this migration keep their order.
UPDATE jobs SET share_tag = q.place
  FROM (SELECT id, row_number() OVER (PARTITION BY pool ORDER BY enqueued_at, id) AS place
          FROM jobs WHERE state = 'queued') AS q
 WHERE jobs.id = q.id;

-- The live index orders by tag: the claim reads `pool = $1 AND state =
-- 'queued' ORDER BY share_tag, id` in order, the virtual time reads its
-- ends, the counts its leading columns. The predicate must stay identical
-- to `LIVE_JOB` in src/common.rs.
DROP INDEX IF EXISTS jobs_live;
CREATE INDEX jobs_live ON jobs (pool, state, share_tag, id) WHERE state IN ('queued', 'provisioning', 'running');
-- A key's last queued tag (each insert). Queued rows only: a job's
-- provisioning and running versions write no entry here (with every
-- running job of a pool under one key, as the hand-out benchmark has
-- it, each start's entry would land on the same hot page). The cap on a
-- key's running jobs reads the pool's running jobs off `jobs_live`.
CREATE INDEX jobs_share ON jobs (pool, share_key, share_tag) WHERE state = 'queued';

-- The tag, set as each queued job is inserted, in its transaction. Rows
-- an earlier row of the same statement inserted are seen (a BEFORE ROW
-- trigger sees them), so a batch gets one step per job. Two transactions
-- inserting the same key at once may give two jobs one tag; the id then
-- orders them.
-- Each lookup is written `ORDER BY … LIMIT 1`, not `max()`/`min()`: with
-- a table the statistics still call empty (a new database, before its
-- first ANALYZE) the planner aggregates every queued row for `max()`,
-- and the function's cached plan kept doing so as the queue grew (2 ms
-- an insert at 12,000 queued); `LIMIT 1` over the index reads one entry
-- whatever the statistics say. `served` reads each started state apart
-- for the same reason (the live index gives its order per state).
CREATE FUNCTION runway_share_tag() RETURNS trigger
LANGUAGE plpgsql VOLATILE
AS $fn$
BEGIN
    IF NEW.state <> 'queued' THEN
        RETURN NEW;
    END IF;
    -- One expression, so one query of the trigger's (four cost a third
    -- more an insert).
    NEW.share_tag := greatest(
        (SELECT share_tag FROM jobs WHERE pool = NEW.pool AND state = 'provisioning'
          ORDER BY share_tag DESC LIMIT 1),
        (SELECT share_tag FROM jobs WHERE pool = NEW.pool AND state = 'running'
          ORDER BY share_tag DESC LIMIT 1),
        (SELECT share_tag FROM jobs WHERE pool = NEW.pool AND state = 'queued'
          ORDER BY share_tag LIMIT 1),
        (SELECT share_tag FROM jobs WHERE pool = NEW.pool AND share_key = NEW.share_key
            AND state = 'queued' ORDER BY share_tag DESC LIMIT 1)
          + 1000.0 / greatest(NEW.share_weight, 1),
        0);
    RETURN NEW;
END
$fn$;

CREATE TRIGGER jobs_share_tag BEFORE INSERT ON jobs
    FOR EACH ROW EXECUTE FUNCTION runway_share_tag();

-- The chained completion's claim (migration 0019) in tag order, and with
-- the cap on a key's running jobs (`cap`, NULL for none): a job whose key
-- has `cap` jobs provisioning or running is passed over.
DROP FUNCTION runway_start_next(text, bigint, text, bigint, bigint, text);
CREATE FUNCTION runway_start_next(pool text, runner bigint, labels text, lease bigint,
                                  started bigint, steps text, cap bigint)
RETURNS SETOF jobs
LANGUAGE plpgsql VOLATILE
AS $fn$
DECLARE
    job jobs%ROWTYPE;
BEGIN
    UPDATE jobs
       SET state = 'running', runner_id = runway_start_next.runner,
           lease_deadline = runway_start_next.lease, started_at = runway_start_next.started,
           history = jobs.history || runway_start_next.steps, version = jobs.version + 2
     WHERE jobs.id = (
           SELECT q.id FROM jobs AS q
            WHERE q.state = 'queued' AND q.pool = runway_start_next.pool
              AND (q.excluded_runners = '[]'
                   OR NOT (q.excluded_runners::jsonb @> to_jsonb(runway_start_next.runner)))
              AND (runway_start_next.labels IS NULL
                   OR lower(q.labels)::jsonb <@ runway_start_next.labels::jsonb)
              AND (runway_start_next.cap IS NULL
                   OR (SELECT count(*) FROM jobs AS r
                        WHERE r.pool = q.pool AND r.share_key = q.share_key
                          AND r.state IN ('provisioning', 'running')) < runway_start_next.cap)
            ORDER BY q.share_tag, q.id
            LIMIT 1
              FOR UPDATE SKIP LOCKED)
    RETURNING jobs.* INTO job;
    IF FOUND THEN
        RETURN NEXT job;
    END IF;
END
$fn$;
