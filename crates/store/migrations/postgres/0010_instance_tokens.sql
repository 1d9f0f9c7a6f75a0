-- GARM's instance API: a machine a GARM provider booted calls runway's
-- metadata and callback endpoints with a bearer token bound to its runner.
-- Only the token's hash is kept. `jit_files` holds what the machine may
-- fetch of its GitHub just-in-time configuration (a JSON object of file
-- name to base64 contents), `token_fetched_at` when it took its one
-- registration token.
CREATE TABLE instance_tokens (
    token_hash        TEXT    PRIMARY KEY,
    runner_id         BIGINT  NOT NULL,
    expires_at        BIGINT  NOT NULL,
    jit_files         TEXT,
    token_fetched_at  BIGINT
);
CREATE INDEX instance_tokens_by_runner ON instance_tokens (runner_id);
