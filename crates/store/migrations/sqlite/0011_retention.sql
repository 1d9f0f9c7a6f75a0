-- Retention: the pruner finds what it deletes through indexes that hold
-- only finished rows, oldest first, so a prune batch never scans live work
-- or the whole history. The predicates must stay identical to
-- `FINISHED_JOB` and `LIVE_RUNNER` in src/common.rs.
CREATE INDEX jobs_finished ON jobs (finished_at, id) WHERE state IN ('completed', 'failed', 'cancelled', 'unroutable');
CREATE INDEX runners_ended ON runners (ended_at, id) WHERE state IN ('terminated', 'failed', 'crashed');
CREATE INDEX runner_reports_reported ON runner_reports (reported_at, id);
CREATE INDEX once_keys_done ON once_keys (done_at);
CREATE INDEX instance_tokens_expiry ON instance_tokens (expires_at);
