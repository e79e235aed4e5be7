-- v18: the one-way authorization latch on tasks.
ALTER TABLE adf_tasks ADD COLUMN requires_authorization INTEGER NOT NULL DEFAULT 0;
