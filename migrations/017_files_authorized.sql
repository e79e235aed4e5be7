-- v17: the code-trust flag on files.
ALTER TABLE adf_files ADD COLUMN authorized INTEGER NOT NULL DEFAULT 0;
