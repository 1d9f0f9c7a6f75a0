-- The fence (0013) checked once per written row, in a BEFORE ROW trigger
-- that every session paid for: for each row the executor fetched and
-- locked the old version for the trigger, then called the PL/pgSQL
-- function, which in an unfenced session found no setting and returned.
-- On the runner API's hot path (a runner's row changes with each job it
-- takes and ends) that was about 3 % of the server's time (perf,
-- BENCHMARKS.md). The check never needed a row: it is about the session
-- and its term. So it is now one BEFORE STATEMENT trigger per table, and
-- its WHEN condition (evaluated in the executor, no function call) skips
-- it in sessions without `runway.fence`. A fenced session's writes are
-- checked as before, and also when they change no row.
DROP TRIGGER runners_fence ON runners;
DROP TRIGGER once_keys_fence ON once_keys;
DROP FUNCTION runway_check_fence();

CREATE FUNCTION runway_check_fence() RETURNS trigger AS $$
DECLARE
    fence text := current_setting('runway.fence', true);
BEGIN
    PERFORM 1 FROM leader_terms
        WHERE name = split_part(fence, ':', 1)
          AND term = split_part(fence, ':', 2)::bigint
        FOR SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'leadership term % is over: another replica leads', fence
            USING ERRCODE = 'RW001';
    END IF;
    RETURN NULL;
END
$$ LANGUAGE plpgsql;

CREATE TRIGGER runners_fence BEFORE INSERT OR UPDATE OR DELETE ON runners
    FOR EACH STATEMENT WHEN (COALESCE(current_setting('runway.fence', true), '') <> '')
    EXECUTE FUNCTION runway_check_fence();
CREATE TRIGGER once_keys_fence BEFORE INSERT OR UPDATE OR DELETE ON once_keys
    FOR EACH STATEMENT WHEN (COALESCE(current_setting('runway.fence', true), '') <> '')
    EXECUTE FUNCTION runway_check_fence();
