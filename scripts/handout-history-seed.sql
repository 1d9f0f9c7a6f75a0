-- A long history for scripts/bench-handout-history.sh: a million finished jobs
-- and 200,000 ended runners, written straight into a migrated runway schema.
INSERT INTO jobs (source, external_id, pool, labels, state, attempts, max_attempts, runner_id, excluded_runners, payload,
  created_at, enqueued_at, started_at, finished_at, conclusion, version, history)
SELECT 'api', 'hist-'||g, 'default', '["self-hosted","linux","x64"]', 'completed', 0, 3, g % 200000 + 1, '[]', '{"script":"true","timeout_seconds":60}',
  1700000000000 + g, 1700000000000 + g, 1700000000100 + g, 1700000000200 + g, 'success', 3, ''
FROM generate_series(1, 1000000) g;
INSERT INTO runners (name, pool, provider, labels, state, requested_at, ended_at, draining, version)
SELECT 'hist-r'||g, 'default', 'api', '["self-hosted","linux","x64"]', 'terminated', 1700000000000 + g, 1700000001000 + g, 0, 5
FROM generate_series(1, 200000) g;
ANALYZE jobs; ANALYZE runners;
