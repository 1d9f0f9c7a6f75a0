-- Stopped runners (issue 60): a runner created for its pool's stock is
-- booted once, stopped, and started for one job. `stock` marks it until it
-- is started; `stopped_at` is when it last stopped. The new states
-- (`stopping`, `stopped`) are values of the text `state` column.
ALTER TABLE runners ADD COLUMN stock BIGINT NOT NULL DEFAULT 0;
ALTER TABLE runners ADD COLUMN stopped_at BIGINT;
