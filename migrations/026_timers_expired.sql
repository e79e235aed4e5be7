-- v26: completed timers are kept as history.
ALTER TABLE adf_timers ADD COLUMN expired INTEGER NOT NULL DEFAULT 0;
