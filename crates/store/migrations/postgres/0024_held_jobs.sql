-- Held jobs (issue 58): stored, but not routed until GitHub says what the
-- pools serving their labels need to know of the workflow run. The leader
-- reads them every few seconds, and only them, never the jobs' history.
CREATE INDEX jobs_held ON jobs (id) WHERE state = 'held';
