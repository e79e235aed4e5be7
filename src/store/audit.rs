//! The audit archive: append-only, Brotli-compressed JSON snapshots in
//! `adf_audit` (format.md §3.8). Loop snapshots are addressed by
//! `start_seq`/`end_seq`, message and file snapshots by `ref`.

use std::io::{Read, Write};

use rusqlite::{Connection, params};
use serde_json::Value;

/// Compress a JSON value the way audit blobs are stored.
pub fn encode(value: &Value) -> Vec<u8> {
    compress(&serde_json::to_vec(value).unwrap_or_default())
}

/// Brotli-compress serialised JSON.
pub fn compress(raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(raw.len() / 3 + 16);
    {
        // Quality 5 with a 1 MiB window: a good ratio for JSON without the
        // tens of megabytes a 4 MiB window's tables take.
        let mut w = brotli::CompressorWriter::new(&mut out, 4096, 5, 20);
        let _ = w.write_all(raw);
    }
    out
}

/// Decompress and parse an audit blob.
pub fn decode(blob: &[u8]) -> Result<Value, String> {
    let mut raw = Vec::new();
    brotli::Decompressor::new(blob, 4096)
        .read_to_end(&mut raw)
        .map_err(|e| format!("audit blob is not Brotli: {e}"))?;
    serde_json::from_slice(&raw).map_err(|e| format!("audit blob is not JSON: {e}"))
}

/// What an audit row addresses.
pub enum Address<'a> {
    Seqs { start: i64, end: i64 },
    Ref(&'a str),
}

/// Append one snapshot; returns its id.
pub fn append(
    conn: &Connection,
    source: &str,
    addr: Address<'_>,
    entries: usize,
    value: &Value,
) -> rusqlite::Result<i64> {
    append_json(conn, source, addr, entries, &serde_json::to_vec(value).unwrap_or_default())
}

/// Append one snapshot from its serialised JSON.
pub fn append_json(
    conn: &Connection,
    source: &str,
    addr: Address<'_>,
    entries: usize,
    json: &[u8],
) -> rusqlite::Result<i64> {
    let size = json.len() as i64;
    let (start, end, r) = match addr {
        Address::Seqs { start, end } => (Some(start), Some(end), None),
        Address::Ref(r) => (None, None, Some(r)),
    };
    conn.execute(
        "INSERT INTO adf_audit(source, start_seq, end_seq, ref, entry_count, size_bytes, data, created_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        params![source, start, end, r, entries as i64, size, compress(json), super::now_ms()],
    )?;
    Ok(conn.last_insert_rowid())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let v = serde_json::json!([{"seq": 1, "role": "user"}, {"seq": 2, "role": "assistant"}]);
        let blob = encode(&v);
        assert_eq!(decode(&blob).unwrap(), v);
        assert!(decode(b"not brotli at all").is_err());
    }
}
