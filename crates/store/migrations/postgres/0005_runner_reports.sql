-- Facts a runner reported about its jobs (pre-job, post-job), validated by
-- the server before they are stored.
CREATE TABLE runner_reports (
    id          BIGSERIAL PRIMARY KEY,
    runner_id   BIGINT NOT NULL,
    phase       TEXT   NOT NULL,
    body        TEXT   NOT NULL,
    reported_at BIGINT NOT NULL
);
CREATE INDEX runner_reports_runner ON runner_reports (runner_id, id);
