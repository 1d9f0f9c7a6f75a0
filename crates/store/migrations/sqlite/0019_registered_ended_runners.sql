-- Ended runners whose registration at their job source (GitHub's runner
-- id) was not yet let go: the reconciler asks again until GitHub answers
-- 204/404, reading only these rows, never the runners' history. The
-- predicate must stay identical to `REGISTERED_ENDED_RUNNER` in
-- src/common.rs.
CREATE INDEX runners_registered_ended ON runners (id) WHERE external_id <> '' AND state IN ('terminated', 'failed', 'crashed');
