-- adf's own schema track, separate from the ADF schema (which stays at 28 so
-- that the reference reads our files). Everything adf adds lives in adfrs_*
-- tables; this one records the version of that track.
CREATE TABLE IF NOT EXISTS adfrs_schema (
  component TEXT PRIMARY KEY,
  version INTEGER NOT NULL
);
