-- v27: why an approval was requested.
ALTER TABLE adf_tasks ADD COLUMN approval_meta TEXT;
