-- Things done at most once across restarts and replicas (a webhook
-- redelivery requested from GitHub), by key, with when; old keys are pruned.
CREATE TABLE once_keys (
    key     TEXT PRIMARY KEY,
    done_at BIGINT NOT NULL
);
