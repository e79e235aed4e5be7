-- v16: owner lock on timers.
ALTER TABLE adf_timers ADD COLUMN locked INTEGER NOT NULL DEFAULT 0;
