-- A registration whose answer was lost (the connection cut after runway
-- applied it) is asked again with the same one-time token: the runner
-- registered with it (used_by) and the hash of the agent's per-attempt key
-- (attempt_hash, a secret the agent never stores) let that same agent
-- have its registration again, with a new runner token, instead of a 401.
ALTER TABLE registration_tokens ADD COLUMN used_by INTEGER;
ALTER TABLE registration_tokens ADD COLUMN attempt_hash TEXT;
