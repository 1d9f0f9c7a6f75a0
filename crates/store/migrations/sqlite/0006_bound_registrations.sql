-- A registration token the reconciler minted for a runner record it created
-- (process and exec providers): redeeming it adopts that record instead of
-- creating a new one, so the runner keeps its name, pool and instance.
ALTER TABLE registration_tokens ADD COLUMN runner_id INTEGER;
-- Installation-wide values, such as the controller id providers tag their
-- instances with (so two installations never touch each other's runners).
CREATE TABLE settings (
    key    TEXT PRIMARY KEY,
    value  TEXT NOT NULL
);
