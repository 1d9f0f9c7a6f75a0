-- Worker configurations (DESIGN §7): the whole configuration as JSON, with
-- a version bumped by every change (the If-Match token of the API).
CREATE TABLE worker_configs (
    id          TEXT   PRIMARY KEY,
    version     INTEGER NOT NULL,
    body        TEXT   NOT NULL,
    updated_at  INTEGER NOT NULL
);
-- A pool belongs to at most one configuration; the primary key enforces it
-- even between concurrent writers.
CREATE TABLE worker_config_pools (
    pool       TEXT PRIMARY KEY,
    config_id  TEXT NOT NULL REFERENCES worker_configs (id) ON DELETE CASCADE
);
