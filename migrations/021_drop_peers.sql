-- v21: the peers table is gone.
DROP INDEX IF EXISTS idx_adf_peers_did;
DROP TABLE IF EXISTS adf_peers;
