-- Fair share within a pool (issue 43; PostgreSQL's migration 0021 says
-- the rule): each job carries a share key and the key's weight in
-- thousandths, and its place in the pool's queue is a start tag, set as
-- the job is inserted. The queue is served in tag order.
ALTER TABLE jobs ADD COLUMN share_key TEXT NOT NULL DEFAULT '';
ALTER TABLE jobs ADD COLUMN share_weight INTEGER NOT NULL DEFAULT 1000;
ALTER TABLE jobs ADD COLUMN share_tag REAL NOT NULL DEFAULT 0;

-- Jobs queued before this migration keep their order.
UPDATE jobs SET share_tag = (
    SELECT count(*) FROM jobs AS earlier
     WHERE earlier.state = 'queued' AND earlier.pool = jobs.pool
       AND (earlier.enqueued_at < jobs.enqueued_at
            OR (earlier.enqueued_at = jobs.enqueued_at AND earlier.id <= jobs.id)))
 WHERE state = 'queued';

-- The claim path: queued jobs of a pool in tag order.
DROP INDEX IF EXISTS jobs_queue;
CREATE INDEX jobs_queue ON jobs (pool, share_tag, id) WHERE state = 'queued';
-- A key's last queued tag (each insert); queued rows only (PostgreSQL's
-- migration 0021 says why).
CREATE INDEX jobs_share ON jobs (pool, share_key, share_tag) WHERE state = 'queued';

-- The tag of each queued job, in the transaction that inserts it.
CREATE TRIGGER jobs_share_tag AFTER INSERT ON jobs WHEN NEW.state = 'queued'
BEGIN
    UPDATE jobs SET share_tag = max(
        coalesce((SELECT share_tag FROM jobs WHERE pool = NEW.pool AND state = 'provisioning'
                   ORDER BY share_tag DESC LIMIT 1), 0),
        coalesce((SELECT share_tag FROM jobs WHERE pool = NEW.pool AND state = 'running'
                   ORDER BY share_tag DESC LIMIT 1), 0),
        coalesce((SELECT share_tag FROM jobs WHERE pool = NEW.pool AND state = 'queued'
                   AND id <> NEW.id ORDER BY share_tag LIMIT 1), 0),
        coalesce((SELECT share_tag FROM jobs WHERE pool = NEW.pool AND share_key = NEW.share_key
                   AND state = 'queued' AND id <> NEW.id ORDER BY share_tag DESC LIMIT 1)
                 + 1000.0 / max(NEW.share_weight, 1), 0)
    )
    WHERE id = NEW.id;
END;
