-- Live runners, for what runs every round or request (the reconciler, the
-- gauges, wait explanations, GET /api/v1/pools): its cost follows live
-- runners, not every runner ever recorded. One index for all live runners
-- in id order, one per pool. The predicate must stay identical to
-- `LIVE_RUNNER` in src/common.rs (tests/live_rows.rs checks the plan).
CREATE INDEX runners_live ON runners (id) WHERE state NOT IN ('terminated', 'failed', 'crashed');
CREATE INDEX runners_live_by_pool ON runners (pool, id) WHERE state NOT IN ('terminated', 'failed', 'crashed');
