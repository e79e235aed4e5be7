//! Zip archives: list them, and extract them without trusting them. A zip
//! names its own paths and declares its own sizes; both lie in hostile
//! files. Paths go through the zip crate's `enclosed_name` (no `..`, no
//! absolute or drive paths), and sizes are counted as bytes are actually
//! inflated, so a bomb stops at the cap whatever its headers say.

use std::io::{Cursor, Read};

use serde::Serialize;
use zip::ZipArchive;

use super::{DocError, MAX_INPUT};

/// One entry of an archive, as its central directory declares it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ZipEntry {
    pub name: String,
    /// Declared uncompressed size (not trusted by `zip_extract`).
    pub size: u64,
    pub compressed_size: u64,
    pub is_dir: bool,
}

/// Caps on what `zip_extract` produces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZipLimits {
    pub max_entries: usize,
    /// Total bytes written out, counted as they are inflated.
    pub max_total_bytes: u64,
    /// Largest inflated/compressed ratio of one entry, checked once the
    /// entry passes `ratio_floor` bytes (tiny files compress absurdly well).
    pub max_ratio: u64,
    pub ratio_floor: u64,
}

impl Default for ZipLimits {
    fn default() -> Self {
        ZipLimits { max_entries: 10_000, max_total_bytes: 256 << 20, max_ratio: 200, ratio_floor: 1 << 20 }
    }
}

fn malformed(path: &str, detail: impl ToString) -> DocError {
    DocError::Malformed { path: path.into(), what: "zip archive", detail: detail.to_string() }
}

fn limit(path: &str, what: String) -> DocError {
    DocError::Limit { path: path.into(), what }
}

fn open<'a>(path: &str, bytes: &'a [u8]) -> Result<ZipArchive<Cursor<&'a [u8]>>, DocError> {
    if bytes.len() > MAX_INPUT {
        return Err(DocError::TooLarge { path: path.into(), size: bytes.len() });
    }
    ZipArchive::new(Cursor::new(bytes)).map_err(|e| malformed(path, e))
}

/// Whether the archive has an entry named exactly `name`.
pub(super) fn has_entry(bytes: &[u8], name: &str) -> bool {
    ZipArchive::new(Cursor::new(bytes)).is_ok_and(|z| z.index_for_name(name).is_some())
}

/// Read from `r` into `out`, failing past `cap` bytes. Returns the count.
fn read_capped(r: &mut dyn Read, out: &mut dyn std::io::Write, cap: u64) -> std::io::Result<Option<u64>> {
    let mut buf = [0u8; 64 * 1024];
    let mut total = 0u64;
    loop {
        let n = r.read(&mut buf)?;
        if n == 0 {
            return Ok(Some(total));
        }
        total += n as u64;
        if total > cap {
            return Ok(None);
        }
        out.write_all(&buf[..n])?;
    }
}

/// The entries, in archive order.
pub fn zip_list(path: &str, bytes: &[u8]) -> Result<Vec<ZipEntry>, DocError> {
    let mut z = open(path, bytes)?;
    let mut out = Vec::with_capacity(z.len().min(100_000));
    for i in 0..z.len() {
        let f = z.by_index_raw(i).map_err(|e| malformed(path, e))?;
        out.push(ZipEntry {
            name: f.name().map(|n| n.to_string()).unwrap_or_else(|_| "<unreadable name>".into()),
            size: f.size(),
            compressed_size: f.compressed_size(),
            is_dir: f.is_dir(),
        });
    }
    Ok(out)
}

/// The files of the archive as `(relative path, bytes)`, directories and
/// symbolic links skipped. Refuses the whole archive when an entry's path
/// would leave the folder or a limit is passed.
pub fn zip_extract(path: &str, bytes: &[u8], limits: &ZipLimits) -> Result<Vec<(String, Vec<u8>)>, DocError> {
    let mut z = open(path, bytes)?;
    if z.len() > limits.max_entries {
        return Err(limit(path, format!("{} entries, more than the {} allowed", z.len(), limits.max_entries)));
    }
    let mut out = Vec::new();
    let mut total = 0u64;
    for i in 0..z.len() {
        let mut f = z.by_index(i).map_err(|e| malformed(path, e))?;
        let raw = f.name().map(|n| n.to_string()).unwrap_or_else(|_| "<unreadable name>".into());
        // enclosed_name drops `..` that stay inside and strips a leading
        // root; an absolute name is refused outright all the same.
        let absolute = raw.starts_with(['/', '\\']) || raw.as_bytes().get(1) == Some(&b':');
        let rel: Option<Vec<String>> = f.enclosed_name().filter(|_| !absolute).and_then(|p| {
            p.components()
                .map(|c| match c {
                    std::path::Component::Normal(s) => s.to_str().map(str::to_string),
                    _ => None,
                })
                .collect()
        });
        let Some(rel) = rel else {
            return Err(DocError::UnsafeEntry { path: path.into(), entry: raw });
        };
        if f.is_dir() || f.is_symlink() || rel.is_empty() {
            continue;
        }
        let compressed = f.compressed_size().max(1);
        let left = limits.max_total_bytes - total;
        let mut data = Vec::new();
        let mut entry_bytes = 0u64;
        let mut buf = [0u8; 64 * 1024];
        loop {
            let n = f.read(&mut buf).map_err(|e| malformed(path, format!("entry \"{raw}\": {e}")))?;
            if n == 0 {
                break;
            }
            entry_bytes += n as u64;
            if entry_bytes > left {
                return Err(limit(
                    path,
                    format!("expands to more than {} MiB (the limit)", limits.max_total_bytes >> 20),
                ));
            }
            if entry_bytes > limits.ratio_floor && entry_bytes / compressed > limits.max_ratio {
                return Err(limit(
                    path,
                    format!(
                        "entry \"{raw}\" expands more than {} times its compressed size (a zip bomb?)",
                        limits.max_ratio
                    ),
                ));
            }
            data.extend_from_slice(&buf[..n]);
        }
        total += entry_bytes;
        out.push((rel.join("/"), data));
    }
    Ok(out)
}

/// Refuse an archive whose entries inflate past `cap` bytes in total
/// (counted, not declared), before a parser that trusts it sees it.
pub(super) fn check_expansion(path: &str, bytes: &[u8], cap: u64) -> Result<(), DocError> {
    let Ok(mut z) = ZipArchive::new(Cursor::new(bytes)) else {
        return Ok(()); // the parser reports what is wrong with it
    };
    let mut total = 0u64;
    for i in 0..z.len() {
        let Ok(mut f) = z.by_index(i) else { continue };
        match read_capped(&mut f, &mut std::io::sink(), cap - total) {
            Ok(Some(n)) => total += n,
            Ok(None) => return Err(limit(path, format!("expands to more than {} MiB", cap >> 20))),
            Err(_) => {}
        }
    }
    Ok(())
}

/// One entry's content, at most `cap` bytes.
pub(super) fn read_entry(path: &str, bytes: &[u8], name: &str, cap: u64) -> Result<Vec<u8>, DocError> {
    let mut z = open(path, bytes)?;
    let mut f = z.by_name(name).map_err(|e| malformed(path, format!("{name}: {e}")))?;
    let mut out = Vec::new();
    match read_capped(&mut f, &mut out, cap) {
        Ok(Some(_)) => Ok(out),
        Ok(None) => Err(limit(path, format!("{name} expands to more than {} MiB", cap >> 20))),
        Err(e) => Err(malformed(path, format!("{name}: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::super::samples;
    use super::*;

    #[test]
    fn lists_entries_with_sizes() {
        let list = zip_list("a.zip", &samples::plain_zip()).unwrap();
        let names: Vec<_> = list.iter().map(|e| (e.name.as_str(), e.size, e.is_dir)).collect();
        assert_eq!(names, [("notes/", 0, true), ("notes/a.txt", 11, false), ("b.bin", 3, false)]);
        assert!(list[1].compressed_size > 0);
    }

    #[test]
    fn extracts_files_and_skips_directories() {
        let files = zip_extract("a.zip", &samples::plain_zip(), &ZipLimits::default()).unwrap();
        assert_eq!(files, vec![("notes/a.txt".to_string(), b"hello world".to_vec()), ("b.bin".into(), vec![1, 2, 3])]);
    }

    #[test]
    fn refuses_entries_that_escape() {
        for bad in ["../x", "/etc/passwd", "a/../../x", "..\\x"] {
            let z = samples::zip_of(&[(bad, b"x")]);
            let e = zip_extract("a.zip", &z, &ZipLimits::default()).unwrap_err();
            assert_eq!(e.to_string(), format!("a.zip: entry \"{bad}\" escapes the folder"), "{bad}");
            assert_eq!(e.code(), "UNSAFE_PATH");
        }
    }

    #[test]
    fn caps_count_real_bytes_not_headers() {
        let zeros = vec![0u8; 4 << 20];
        let z = samples::zip_of(&[("zeros.bin", &zeros)]);
        let small = ZipLimits { max_total_bytes: 1 << 20, ..ZipLimits::default() };
        let e = zip_extract("b.zip", &z, &small).unwrap_err();
        assert!(e.to_string().starts_with("b.zip: expands to more than 1 MiB"), "{e}");
        let ratio = ZipLimits { max_ratio: 50, ..ZipLimits::default() };
        let e = zip_extract("b.zip", &z, &ratio).unwrap_err();
        assert!(e.to_string().contains("expands more than 50 times"), "{e}");
        // A header claiming 10 bytes does not let 4 MiB through.
        let lying = samples::with_declared_size(&z, 10);
        let r = zip_extract("b.zip", &lying, &small);
        assert!(r.is_err(), "a lying header must not pass the cap");
        let few = ZipLimits { max_entries: 2, ..ZipLimits::default() };
        let e = zip_extract("c.zip", &samples::plain_zip(), &few).unwrap_err();
        assert_eq!(e.to_string(), "c.zip: 3 entries, more than the 2 allowed");
    }
}
