-- v22: the primary document is README.md (document.md kept if README exists).
UPDATE adf_files SET path = 'README.md' WHERE path = 'document.md' AND NOT EXISTS (SELECT 1 FROM adf_files WHERE path = 'README.md');
