//! Spreadsheets (xlsx, xlsb, xls, ods through calamine) and CSV as rows of
//! JSON values, and spreadsheets as CSV text. Date cells come out as ISO
//! 8601 strings, never Excel serial numbers: an agent reading "45366"
//! where the sheet shows 2024-03-15 would be misled.

use std::io::Cursor;

use calamine::{Data, Reader, Sheets};
use serde_json::Value;

use super::{DocError, Sheet, archive, guard};

/// What a spreadsheet may expand to (bytes of XML inside its zip).
const MAX_EXPANDED: u64 = 512 << 20;
/// The largest sheet area (rows × columns of its used range). calamine
/// allocates the whole rectangle, so two cells at A1 and XFD1048576 would
/// ask for billions of cells and abort the process.
const MAX_CELLS: u64 = 10_000_000;

fn malformed(path: &str, detail: impl ToString) -> DocError {
    DocError::Malformed { path: path.into(), what: "spreadsheet", detail: detail.to_string() }
}

/// A date/time cell as ISO 8601: `2024-03-15`, `2024-03-15T10:30:00`, or
/// `10:30:00` for a time of day.
fn iso(dt: &calamine::ExcelDateTime) -> Value {
    if dt.is_duration() {
        if let Some(d) = dt.as_duration() {
            let s = d.num_seconds();
            return Value::from(format!("PT{}H{}M{}S", s / 3600, (s % 3600) / 60, s % 60));
        }
    } else if let Some(t) = dt.as_datetime() {
        let midnight = t.time() == chrono::NaiveTime::MIN;
        return Value::from(if (0.0..1.0).contains(&dt.as_f64()) {
            t.format("%H:%M:%S").to_string()
        } else if midnight {
            t.format("%Y-%m-%d").to_string()
        } else {
            t.format("%Y-%m-%dT%H:%M:%S").to_string()
        });
    }
    number(dt.as_f64())
}

/// Whole numbers as integers (42, not 42.0); NaN and infinities as null.
fn number(f: f64) -> Value {
    if f.fract() == 0.0 && f.abs() < 9.0e15 {
        Value::from(f as i64)
    } else {
        serde_json::Number::from_f64(f).map(Value::Number).unwrap_or(Value::Null)
    }
}

fn cell(d: &Data) -> Value {
    match d {
        Data::Empty => Value::Null,
        Data::Int(i) => Value::from(*i),
        Data::Float(f) => number(*f),
        Data::String(s) => Value::from(s.as_str()),
        Data::Bool(b) => Value::Bool(*b),
        Data::DateTime(dt) => iso(dt),
        Data::DateTimeIso(s) | Data::DurationIso(s) => Value::from(s.as_str()),
        Data::Error(e) => Value::from(e.to_string()),
    }
}

fn open<'a>(path: &str, bytes: &'a [u8]) -> Result<Sheets<Cursor<&'a [u8]>>, DocError> {
    if bytes.starts_with(b"PK") {
        archive::check_expansion(path, bytes, MAX_EXPANDED)?;
    }
    calamine::open_workbook_auto_from_rs(Cursor::new(bytes)).map_err(|e| malformed(path, e))
}

/// Refuse an xlsx sheet whose used range is too large to hold, measured
/// by streaming its cells before calamine allocates the range.
fn check_area(path: &str, book: &mut Sheets<Cursor<&[u8]>>, name: &str) -> Result<(), DocError> {
    let Sheets::Xlsx(x) = book else { return Ok(()) };
    let Ok(mut cells) = x.worksheet_cells_reader(name) else { return Ok(()) };
    let (mut r0, mut r1, mut c0, mut c1) = (u32::MAX, 0u32, u32::MAX, 0u32);
    while let Ok(Some(cell)) = cells.next_cell() {
        let (r, c) = cell.get_position();
        (r0, r1, c0, c1) = (r0.min(r), r1.max(r), c0.min(c), c1.max(c));
    }
    if r0 > r1 {
        return Ok(());
    }
    let area = u64::from(r1 - r0 + 1) * u64::from(c1 - c0 + 1);
    if area > MAX_CELLS {
        return Err(DocError::Limit {
            path: path.into(),
            what: format!("sheet \"{name}\" spans {area} cells, more than the {MAX_CELLS} this reads"),
        });
    }
    Ok(())
}

fn read_all(path: &str, bytes: &[u8], only: Option<&str>) -> Result<Vec<Sheet>, DocError> {
    let mut book = open(path, bytes)?;
    let names = book.sheet_names();
    let wanted: Vec<String> = match only {
        Some(want) if names.iter().any(|n| n == want) => vec![want.to_string()],
        Some(want) => {
            return Err(DocError::SheetNotFound { path: path.into(), sheet: want.into(), sheets: names.join(", ") });
        }
        None => names,
    };
    let mut out = Vec::with_capacity(wanted.len());
    for name in wanted {
        check_area(path, &mut book, &name)?;
        let range = book.worksheet_range(&name).map_err(|e| malformed(path, format!("sheet \"{name}\": {e}")))?;
        let rows = range.rows().map(|r| r.iter().map(cell).collect()).collect();
        out.push(Sheet { name, rows });
    }
    Ok(out)
}

/// The sheets of a workbook (all, or the one named `only`).
pub(super) fn sheets(path: &str, bytes: &[u8], only: Option<&str>) -> Result<Vec<Sheet>, DocError> {
    guard::contained(|| read_all(path, bytes, only))
        .unwrap_or_else(|why| Err(DocError::ParserFailed { path: path.into(), what: "spreadsheet", detail: why }))
}

fn csv_field(v: &Value) -> String {
    match v {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Each sheet as CSV under a `# sheet: NAME` line.
pub(super) fn as_csv_text(path: &str, bytes: &[u8]) -> Result<String, DocError> {
    let mut out = String::new();
    for sheet in sheets(path, bytes, None)? {
        let mut w = csv::WriterBuilder::new().flexible(true).from_writer(Vec::new());
        for row in &sheet.rows {
            w.write_record(row.iter().map(csv_field)).map_err(|e| malformed(path, e))?;
        }
        let body = w.into_inner().map_err(|e| malformed(path, e.error()))?;
        out.push_str(&format!("# sheet: {}\n", sheet.name));
        out.push_str(&String::from_utf8_lossy(&body));
    }
    Ok(out)
}

/// A CSV file as one sheet named after the file. Fields that read as
/// numbers become numbers; empty fields are null. Tab-separated when the
/// name ends in `.tsv`.
pub(super) fn csv_sheet(path: &str, bytes: &[u8]) -> Result<Sheet, DocError> {
    let file = path.rsplit('/').next().unwrap_or(path);
    let name = file.rsplit_once('.').map(|(s, _)| s).unwrap_or(file).to_string();
    let delimiter = if path.to_ascii_lowercase().ends_with(".tsv") { b'\t' } else { b',' };
    let mut r = csv::ReaderBuilder::new().has_headers(false).flexible(true).delimiter(delimiter).from_reader(bytes);
    let mut rows = Vec::new();
    for rec in r.byte_records() {
        let rec =
            rec.map_err(|e| DocError::Malformed { path: path.into(), what: "CSV file", detail: e.to_string() })?;
        rows.push(rec.iter().map(|f| csv_value(&String::from_utf8_lossy(f))).collect());
    }
    Ok(Sheet { name, rows })
}

fn csv_value(field: &str) -> Value {
    if field.is_empty() {
        return Value::Null;
    }
    let t = field.trim();
    // Leading zeros (ZIP codes, ids) and lone signs stay text.
    let leading_zero = t.len() > 1 && t.starts_with('0') && !t.starts_with("0.");
    let plain = !t.is_empty()
        && !leading_zero
        && t.bytes().all(|b| b.is_ascii_digit() || matches!(b, b'-' | b'+' | b'.' | b'e' | b'E'))
        && t.bytes().any(|b| b.is_ascii_digit());
    if plain {
        if let Ok(i) = t.parse::<i64>() {
            return Value::from(i);
        }
        if let Ok(f) = t.parse::<f64>()
            && let Some(n) = serde_json::Number::from_f64(f)
        {
            return Value::Number(n);
        }
    }
    Value::from(field)
}

#[cfg(test)]
mod tests {
    use super::super::samples;
    use super::*;
    use serde_json::json;

    #[test]
    fn xlsx_rows_keep_types_and_render_dates_as_iso() {
        let t = sheets("book.xlsx", &samples::xlsx(), None).unwrap();
        let names: Vec<_> = t.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["Q1", "Q2"]);
        assert_eq!(t[0].rows[0], vec![json!("item"), json!("amount"), json!("when")]);
        assert_eq!(t[0].rows[1], vec![json!("Widget"), json!(42), json!("2024-03-15")]);
        assert_eq!(t[0].rows[2], vec![json!("Gadget"), json!(2.5), json!("2024-03-15T10:30:00")]);
        assert_eq!(t[0].rows[3], vec![json!("Blank"), Value::Null, json!(true)]);
        assert_eq!(t[1].rows, vec![vec![json!("only")]]);
    }

    #[test]
    fn one_sheet_by_name_or_a_clear_error() {
        let t = sheets("book.xlsx", &samples::xlsx(), Some("Q2")).unwrap();
        assert_eq!(t.len(), 1);
        let e = sheets("data.xlsx", &samples::xlsx(), Some("Q3")).unwrap_err();
        assert_eq!(e.to_string(), "data.xlsx: sheet \"Q3\" not found; sheets: Q1, Q2");
    }

    #[test]
    fn xlsx_as_csv_text_under_sheet_lines() {
        let text = as_csv_text("book.xlsx", &samples::xlsx()).unwrap();
        assert!(text.starts_with("# sheet: Q1\nitem,amount,when\nWidget,42,2024-03-15\n"), "{text}");
        assert!(text.contains("Blank,,true\n# sheet: Q2\nonly\n"), "{text}");
    }

    #[test]
    fn a_sheet_spanning_the_whole_grid_is_refused_not_allocated() {
        let mut book = rust_xlsxwriter::Workbook::new();
        let ws = book.add_worksheet();
        ws.write_string(0, 0, "a").unwrap();
        ws.write_string(1_048_575, 16_383, "z").unwrap();
        let bytes = book.save_to_buffer().unwrap();
        let e = sheets("wide.xlsx", &bytes, None).unwrap_err();
        assert!(e.to_string().starts_with("wide.xlsx: sheet \"Sheet1\" spans 17179869184 cells"), "{e}");
    }

    #[test]
    fn csv_fields_become_numbers_only_when_they_are_numbers() {
        let s = csv_sheet("x.csv", b"a,007,1e3,-,\"x,y\",,3.25\n").unwrap();
        assert_eq!(
            s.rows[0],
            vec![json!("a"), json!("007"), json!(1000.0), json!("-"), json!("x,y"), Value::Null, json!(3.25)]
        );
        let s = csv_sheet("x.tsv", b"a\tb\n").unwrap();
        assert_eq!(s.rows[0].len(), 2);
    }
}
