-- The fence (0013) checked once per written row, in a BEFORE ROW trigger
-- that every session paid for: for each row the executor ran the trigger
-- machinery and called the PL/pgSQL function, which in an unfenced session
-- found no setting and returned. On the runner API's hot path (a runner's
-- row changes with each job it takes and ends) that was about 3 % of the
-- server's time (perf, BENCHMARKS.md). The check never needed a row: it is
-- about the session and its term. So 0013's function now runs from one
-- BEFORE STATEMENT trigger per table (where NEW and OLD are NULL and the
-- return value is ignored), and the WHEN condition, evaluated in the
-- executor without a function call, skips it in sessions without
-- `runway.fence`. A fenced session's writes are checked as before, and
-- also when they change no row.
DROP TRIGGER runners_fence ON runners;
DROP TRIGGER once_keys_fence ON once_keys;
CREATE TRIGGER runners_fence BEFORE INSERT OR UPDATE OR DELETE ON runners
    FOR EACH STATEMENT WHEN (COALESCE(current_setting('runway.fence', true), '') <> '')
    EXECUTE FUNCTION runway_check_fence();
CREATE TRIGGER once_keys_fence BEFORE INSERT OR UPDATE OR DELETE ON once_keys
    FOR EACH STATEMENT WHEN (COALESCE(current_setting('runway.fence', true), '') <> '')
    EXECUTE FUNCTION runway_check_fence();
