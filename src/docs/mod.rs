//! Office documents for agents, with nothing to install: PDF and DOCX as
//! text, spreadsheets (xlsx, xls, ods) and CSV as rows, zip archives listed
//! and safely extracted, YAML to and from JSON. A leaf module: it knows
//! bytes and paths for messages, never the store or the runtime; the
//! sandbox's `adf.doc_*` methods (src/runtime/docs_code.rs) feed it files
//! from the agent's own filesystem. Every parser treats its input as
//! hostile: sizes are capped, panics are contained (`guard`), and errors
//! say which file and what is wrong with it.

mod archive;
mod guard;
mod office;
mod pdf;
mod sheet;
mod yaml;

#[cfg(test)]
mod hostile_tests;
#[cfg(test)]
mod samples;

use serde::Serialize;
use serde_json::Value;

pub use archive::{ZipEntry, ZipLimits, zip_extract, zip_list};
pub use guard::{contained, panic_is_contained};
pub use yaml::{json_to_yaml, yaml_to_json};

/// The largest document any function here reads.
pub const MAX_INPUT: usize = 64 << 20;

/// What a document is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DocKind {
    Pdf,
    Docx,
    /// xlsx, xlsm, xlsb, xls or ods.
    Spreadsheet,
    Csv,
    Zip,
    Yaml,
}

impl DocKind {
    fn label(self) -> &'static str {
        match self {
            DocKind::Pdf => "PDF",
            DocKind::Docx => "DOCX document",
            DocKind::Spreadsheet => "spreadsheet",
            DocKind::Csv => "CSV file",
            DocKind::Zip => "zip archive",
            DocKind::Yaml => "YAML file",
        }
    }
}

/// A document that could not be read, naming the file and the trouble.
#[derive(Debug, thiserror::Error)]
pub enum DocError {
    #[error("{path}: {size} bytes is more than the {} MiB a document may be", MAX_INPUT >> 20)]
    TooLarge { path: String, size: usize },
    #[error("{path}: not a {what} ({why})")]
    NotKind { path: String, what: &'static str, why: &'static str },
    #[error("{path}: not a document this can read (pdf, docx, xlsx, xls, ods, csv, zip, yaml)")]
    Unsupported { path: String },
    #[error("{path}: has no rows to read (only xlsx, xls, ods and csv are tables)")]
    NotTable { path: String },
    #[error("{path}: cannot read the {what}: {detail}")]
    Malformed { path: String, what: &'static str, detail: String },
    #[error("{path}: the {what} reader gave up on this file (it is damaged or unusual): {detail}")]
    ParserFailed { path: String, what: &'static str, detail: String },
    #[error("{path}: reading took more than {secs} s; the file is too complex or damaged")]
    TimedOut { path: String, secs: u64 },
    #[error("{path}: sheet \"{sheet}\" not found; sheets: {sheets}")]
    SheetNotFound { path: String, sheet: String, sheets: String },
    #[error("{path}: entry \"{entry}\" escapes the folder")]
    UnsafeEntry { path: String, entry: String },
    #[error("{path}: {what}")]
    Limit { path: String, what: String },
    #[error("YAML line {line} column {column}: {message}")]
    YamlAt { line: usize, column: usize, message: String },
    #[error("YAML: {0}")]
    Yaml(String),
}

impl DocError {
    /// A short machine-readable code (for errors thrown into agent code).
    pub fn code(&self) -> &'static str {
        match self {
            DocError::TooLarge { .. } | DocError::Limit { .. } => "TOO_LARGE",
            DocError::NotKind { .. } | DocError::Unsupported { .. } | DocError::NotTable { .. } => "UNSUPPORTED",
            DocError::SheetNotFound { .. } => "NOT_FOUND",
            DocError::UnsafeEntry { .. } => "UNSAFE_PATH",
            DocError::TimedOut { .. } => "TIMEOUT",
            _ => "INVALID_DOCUMENT",
        }
    }
}

/// One sheet of a table: `rows` of the used area, numbers as numbers,
/// dates as ISO 8601 strings, booleans as booleans, empty cells as null.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Sheet {
    pub name: String,
    pub rows: Vec<Vec<Value>>,
}

fn extension(path: &str) -> String {
    let file = path.rsplit(['/', '\\']).next().unwrap_or(path);
    match file.rsplit_once('.') {
        Some((stem, ext)) if !stem.is_empty() => ext.to_ascii_lowercase(),
        _ => String::new(),
    }
}

/// The kind a file's extension claims.
fn claimed(path: &str) -> Option<DocKind> {
    Some(match extension(path).as_str() {
        "pdf" => DocKind::Pdf,
        "docx" | "docm" => DocKind::Docx,
        "xlsx" | "xlsm" | "xlsb" | "xls" | "xla" | "xlam" | "ods" => DocKind::Spreadsheet,
        "csv" | "tsv" => DocKind::Csv,
        "zip" => DocKind::Zip,
        "yaml" | "yml" => DocKind::Yaml,
        _ => return None,
    })
}

const ZIP_MAGIC: &[u8] = b"PK\x03\x04";
const EMPTY_ZIP_MAGIC: &[u8] = b"PK\x05\x06";
const OLE_MAGIC: &[u8] = b"\xD0\xCF\x11\xE0\xA1\xB1\x1A\xE1";

fn is_pdf(bytes: &[u8]) -> bool {
    // The header may follow a little junk (the PDF spec allows 1 KiB).
    bytes[..bytes.len().min(1024)].windows(5).any(|w| w == b"%PDF-")
}

fn is_zip(bytes: &[u8]) -> bool {
    bytes.starts_with(ZIP_MAGIC) || bytes.starts_with(EMPTY_ZIP_MAGIC)
}

/// Text formats: no NUL byte in the first 8 KiB (binary files have them).
fn looks_textual(bytes: &[u8]) -> bool {
    !bytes[..bytes.len().min(8192)].contains(&0)
}

/// Why `bytes` are not the `kind` the name claims, if they are not.
fn mismatch(kind: DocKind, path: &str, bytes: &[u8]) -> Option<&'static str> {
    match kind {
        DocKind::Pdf => (!is_pdf(bytes)).then_some("no %PDF header"),
        DocKind::Docx if !bytes.starts_with(ZIP_MAGIC) => Some("no zip header"),
        DocKind::Docx => (!archive::has_entry(bytes, "word/document.xml")).then_some("no word/document.xml inside"),
        DocKind::Spreadsheet => match extension(path).as_str() {
            "xls" | "xla" => (!bytes.starts_with(OLE_MAGIC)).then_some("no Excel 97 header"),
            _ => (!bytes.starts_with(ZIP_MAGIC)).then_some("no zip header"),
        },
        DocKind::Zip => (!is_zip(bytes)).then_some("no zip header"),
        DocKind::Csv | DocKind::Yaml => (!looks_textual(bytes)).then_some("binary content"),
    }
}

/// What kind of document `bytes` are. A known extension must agree with
/// the content (a `.pdf` without `%PDF` is `None`); without one, the
/// content alone decides (PDF, or a zip holding a document).
pub fn kind_of(path: &str, bytes: &[u8]) -> Option<DocKind> {
    if let Some(kind) = claimed(path) {
        return mismatch(kind, path, bytes).is_none().then_some(kind);
    }
    if is_pdf(bytes) && bytes.starts_with(b"%PDF") {
        return Some(DocKind::Pdf);
    }
    if bytes.starts_with(OLE_MAGIC) {
        return None;
    }
    if is_zip(bytes) {
        if archive::has_entry(bytes, "word/document.xml") {
            return Some(DocKind::Docx);
        }
        if archive::has_entry(bytes, "xl/workbook.xml") || archive::has_entry(bytes, "content.xml") {
            return Some(DocKind::Spreadsheet);
        }
        return Some(DocKind::Zip);
    }
    None
}

/// The kind to read `bytes` as, or why not.
fn checked(path: &str, bytes: &[u8]) -> Result<DocKind, DocError> {
    if bytes.len() > MAX_INPUT {
        return Err(DocError::TooLarge { path: path.into(), size: bytes.len() });
    }
    if let Some(kind) = claimed(path) {
        return match mismatch(kind, path, bytes) {
            Some(why) => Err(DocError::NotKind { path: path.into(), what: kind.label(), why }),
            None => Ok(kind),
        };
    }
    kind_of(path, bytes).ok_or_else(|| DocError::Unsupported { path: path.into() })
}

/// A document as text: PDF and DOCX text, each sheet of a spreadsheet as
/// CSV under a `# sheet: NAME` line, CSV and YAML as they are, a zip as a
/// listing (`name  size` lines).
pub fn to_text(path: &str, bytes: &[u8]) -> Result<String, DocError> {
    match checked(path, bytes)? {
        DocKind::Pdf => pdf::text(path, bytes),
        DocKind::Docx => office::docx_text(path, bytes),
        DocKind::Spreadsheet => sheet::as_csv_text(path, bytes),
        DocKind::Csv | DocKind::Yaml => Ok(String::from_utf8_lossy(bytes).into_owned()),
        DocKind::Zip => {
            let mut out = String::new();
            for e in zip_list(path, bytes)? {
                out.push_str(&format!("{}  {}\n", e.name, e.size));
            }
            Ok(out)
        }
    }
}

/// The rows of a spreadsheet's sheets (all, or the one named `sheet`) or
/// of a CSV file (one sheet named after the file).
pub fn table(path: &str, bytes: &[u8], sheet: Option<&str>) -> Result<Vec<Sheet>, DocError> {
    match checked(path, bytes)? {
        DocKind::Spreadsheet => sheet::sheets(path, bytes, sheet),
        DocKind::Csv => {
            let one = sheet::csv_sheet(path, bytes)?;
            match sheet {
                Some(want) if want != one.name => {
                    Err(DocError::SheetNotFound { path: path.into(), sheet: want.into(), sheets: one.name.clone() })
                }
                _ => Ok(vec![one]),
            }
        }
        _ => Err(DocError::NotTable { path: path.into() }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_need_the_extension_and_the_content_to_agree() {
        let pdf = samples::pdf();
        assert_eq!(kind_of("a/report.PDF", &pdf), Some(DocKind::Pdf));
        assert_eq!(kind_of("report.pdf", b"hello"), None);
        assert_eq!(kind_of("noext", &pdf), Some(DocKind::Pdf));
        let docx = samples::docx();
        assert_eq!(kind_of("a.docx", &docx), Some(DocKind::Docx));
        assert_eq!(kind_of("a.bin", &docx), Some(DocKind::Docx));
        assert_eq!(kind_of("a.zip", &docx), Some(DocKind::Zip));
        assert_eq!(kind_of("a.docx", &samples::plain_zip()), None);
        let xlsx = samples::xlsx();
        assert_eq!(kind_of("a.xlsx", &xlsx), Some(DocKind::Spreadsheet));
        assert_eq!(kind_of("book", &xlsx), Some(DocKind::Spreadsheet));
        assert_eq!(kind_of("a.xls", &xlsx), None);
        assert_eq!(kind_of("a.csv", b"a,b\n1,2\n"), Some(DocKind::Csv));
        assert_eq!(kind_of("a.csv", b"a\0b"), None);
        assert_eq!(kind_of("a.yml", b"a: 1\n"), Some(DocKind::Yaml));
        assert_eq!(kind_of("a.txt", b"a: 1\n"), None);
        assert_eq!(kind_of(".pdf", &pdf), Some(DocKind::Pdf), "a dotfile has no extension; content decides");
    }

    #[test]
    fn errors_name_the_file_and_the_trouble() {
        let e = to_text("report.pdf", b"<html>").unwrap_err();
        assert_eq!(e.to_string(), "report.pdf: not a PDF (no %PDF header)");
        let e = to_text("x.bin", b"\x00\x01").unwrap_err();
        assert!(e.to_string().starts_with("x.bin: not a document this can read"), "{e}");
        let e = table("report.pdf", &samples::pdf(), None).unwrap_err();
        assert!(e.to_string().starts_with("report.pdf: has no rows"), "{e}");
        let big = vec![b'a'; MAX_INPUT + 1];
        let e = to_text("big.csv", &big).unwrap_err();
        assert!(e.to_string().contains("more than the 64 MiB"), "{e}");
        assert_eq!(e.code(), "TOO_LARGE");
    }

    #[test]
    fn text_of_each_kind() {
        let pdf = to_text("r.pdf", &samples::pdf()).unwrap();
        assert!(pdf.contains("Hello PDF"), "{pdf:?}");
        let docx = to_text("d.docx", &samples::docx()).unwrap();
        assert!(docx.contains("First paragraph\n"), "{docx:?}");
        assert_eq!(to_text("a.csv", b"a,b\n1,2\n").unwrap(), "a,b\n1,2\n");
        assert_eq!(to_text("a.yaml", b"k: v\n").unwrap(), "k: v\n");
        let listing = to_text("a.zip", &samples::plain_zip()).unwrap();
        assert!(listing.contains("notes/a.txt  11\n"), "{listing:?}");
    }

    #[test]
    fn csv_is_a_one_sheet_table() {
        let t = table("data/people.csv", b"name,age\nAda,36\n", None).unwrap();
        assert_eq!(t.len(), 1);
        assert_eq!(t[0].name, "people");
        assert_eq!(t[0].rows[1], vec![Value::from("Ada"), Value::from(36)]);
        let e = table("people.csv", b"a\n", Some("Q3")).unwrap_err();
        assert_eq!(e.to_string(), "people.csv: sheet \"Q3\" not found; sheets: people");
    }
}
