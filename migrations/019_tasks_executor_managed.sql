-- v19: approvals the executor is blocked on.
ALTER TABLE adf_tasks ADD COLUMN executor_managed INTEGER NOT NULL DEFAULT 0;
