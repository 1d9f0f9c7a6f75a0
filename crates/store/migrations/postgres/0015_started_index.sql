-- Queue times over the last hour (the console's overview): jobs by the
-- time they started, without reading the finished history.
CREATE INDEX jobs_started_at ON jobs (started_at) WHERE started_at IS NOT NULL;
