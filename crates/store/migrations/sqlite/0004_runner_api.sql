-- One-time registration tokens, stored only as SHA-256 hashes.
CREATE TABLE registration_tokens (
    token_hash  TEXT   PRIMARY KEY,
    pool        TEXT   NOT NULL,
    created_at  INTEGER NOT NULL,
    expires_at  INTEGER NOT NULL,
    used_at     INTEGER
);
-- A registered runner's bearer token, also only as a hash.
ALTER TABLE runners ADD COLUMN token_hash TEXT;
CREATE UNIQUE INDEX runners_token ON runners (token_hash);
-- The bounded tail of a job's output, as its runner reported it.
CREATE TABLE job_logs (
    job_id     INTEGER PRIMARY KEY,
    exit_code  INTEGER,
    log        TEXT   NOT NULL
);
