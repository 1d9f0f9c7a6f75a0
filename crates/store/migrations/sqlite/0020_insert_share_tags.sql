-- A job's insert computes its fair-share tag itself (the store's
-- `insert_job` statement, from the same four lookups as below): the
-- trigger's UPDATE wrote every queued row twice, with its index entries.
-- The trigger now tags only the rows an insert leaves at the default tag
-- 0 (a bulk seed, or a job whose computed tag is 0: its pool was empty,
-- and the trigger computes the same 0).
DROP TRIGGER jobs_share_tag;
CREATE TRIGGER jobs_share_tag AFTER INSERT ON jobs
    WHEN NEW.state = 'queued' AND NEW.share_tag = 0
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

-- The tag's lookups of a pool's last provisioning and running tags read
-- the state index in tag order: before, they sorted every provisioning
-- (or running) job of the pool for each insert (572 µs an insert with
-- 5,000 running, against 1.6 µs read in order).
DROP INDEX jobs_state;
CREATE INDEX jobs_state ON jobs (state, pool, share_tag);
