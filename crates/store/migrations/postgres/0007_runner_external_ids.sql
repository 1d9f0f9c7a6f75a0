-- The id a runner has at its job source (GitHub's runner id for a
-- just-in-time runner): what deregistration needs before the machine goes.
ALTER TABLE runners ADD COLUMN external_id TEXT;
