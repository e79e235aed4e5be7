-- v28: position override for compaction summaries. The Rust step rebuilds
-- adf_audit with start_seq/end_seq/ref and seeds mind/log.md.
ALTER TABLE adf_loop ADD COLUMN ord INTEGER;
