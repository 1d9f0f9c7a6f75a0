-- The cluster view: each replica sharing the store records itself and a
-- heartbeat; the leader of each name has a term that grows by one with
-- every new leader (the fencing token of its actions).
CREATE TABLE replicas (
    id TEXT PRIMARY KEY,
    address TEXT NOT NULL,
    version TEXT NOT NULL,
    started_at BIGINT NOT NULL,
    heartbeat_at BIGINT NOT NULL
);
CREATE TABLE leader_terms (
    name TEXT PRIMARY KEY,
    term BIGINT NOT NULL,
    replica TEXT NOT NULL,
    since BIGINT NOT NULL
);
