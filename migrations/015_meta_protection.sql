-- v15: adf_meta gains its protection column (added by the structure pass);
-- every spec-governed adf_* key becomes readonly.
UPDATE adf_meta SET protection = 'readonly' WHERE key LIKE 'adf\_%' ESCAPE '\';
