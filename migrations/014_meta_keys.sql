-- v14: the adf_* meta key convention. Legacy keys move to their adf_* names
-- (a newer value under the new name wins); `format` is dropped. The Rust step
-- then fills adf_name/adf_handle/adf_created_at/... and moves the identity KDF
-- keys into adf_identity rows.
DELETE FROM adf_meta WHERE key = 'format';
INSERT OR IGNORE INTO adf_meta(key, value) SELECT 'adf_schema_version', value FROM adf_meta WHERE key = 'schema_version';
DELETE FROM adf_meta WHERE key = 'schema_version';
INSERT OR IGNORE INTO adf_meta(key, value) SELECT 'adf_did', value FROM adf_meta WHERE key = 'did';
DELETE FROM adf_meta WHERE key = 'did';
INSERT OR IGNORE INTO adf_meta(key, value) SELECT 'adf_owner_did', value FROM adf_meta WHERE key = 'owner_did';
DELETE FROM adf_meta WHERE key = 'owner_did';
INSERT OR IGNORE INTO adf_meta(key, value) SELECT 'adf_runtime_did', value FROM adf_meta WHERE key = 'runtime_did';
DELETE FROM adf_meta WHERE key = 'runtime_did';
INSERT OR IGNORE INTO adf_meta(key, value) VALUES ('status', '');
