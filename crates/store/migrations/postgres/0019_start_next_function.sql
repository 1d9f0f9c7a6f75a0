-- The claim of a runner's next job in the chained completion, as a
-- function of its own (issue 15). In one statement with the completion,
-- the claim's `FOR UPDATE SKIP LOCKED` meets, most times under load, a
-- queued row another claimer took and committed after the statement's
-- snapshot; PostgreSQL then re-checks it (EvalPlanQual), and setting that
-- re-check up initialises every subplan of the statement, each CTE that
-- writes included (6 % of the server's time in the chained hand-out). In a
-- PL/pgSQL function the claim is a statement of its own, with a cached plan
-- and a re-check that sets up only that statement.
--
-- Starts the oldest queued job of `pool` that runner `runner` did not
-- decline and whose labels the runner's (`labels`, a JSON list in
-- lowercase, or NULL for any) all cover, on that runner: running, its
-- lease ending at `lease`, started at `started`, `steps` appended to its
-- history, its version two on (the claim and the accept). Rows another
-- claimer holds are skipped, never waited for. Returns the started job,
-- or no row.
CREATE FUNCTION runway_start_next(pool text, runner bigint, labels text, lease bigint,
                                  started bigint, steps text)
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
            ORDER BY q.enqueued_at, q.id
            LIMIT 1
              FOR UPDATE SKIP LOCKED)
    RETURNING jobs.* INTO job;
    IF FOUND THEN
        RETURN NEXT job;
    END IF;
END
$fn$;
