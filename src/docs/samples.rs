//! Small documents built by the tests themselves (nothing checked in):
//! an xlsx with two sheets, a docx, a one-page PDF, and zips.

use std::io::{Cursor, Write};

use zip::write::SimpleFileOptions;

/// Q1: header, a number and a date, a float and a date-time, a blank and
/// a boolean; Q2: one string.
pub fn xlsx() -> Vec<u8> {
    use rust_xlsxwriter::{ExcelDateTime, Format, Workbook};
    let mut book = Workbook::new();
    let date = Format::new().set_num_format("yyyy-mm-dd");
    let stamp = Format::new().set_num_format("yyyy-mm-dd hh:mm:ss");
    let q1 = book.add_worksheet();
    q1.set_name("Q1").unwrap();
    for (c, h) in ["item", "amount", "when"].iter().enumerate() {
        q1.write_string(0, c as u16, *h).unwrap();
    }
    q1.write_string(1, 0, "Widget").unwrap();
    q1.write_number(1, 1, 42.0).unwrap();
    q1.write_datetime_with_format(1, 2, ExcelDateTime::from_ymd(2024, 3, 15).unwrap(), &date).unwrap();
    q1.write_string(2, 0, "Gadget").unwrap();
    q1.write_number(2, 1, 2.5).unwrap();
    let t = ExcelDateTime::from_ymd(2024, 3, 15).unwrap().and_hms(10, 30, 0).unwrap();
    q1.write_datetime_with_format(2, 2, t, &stamp).unwrap();
    q1.write_string(3, 0, "Blank").unwrap();
    q1.write_boolean(3, 2, true).unwrap();
    let q2 = book.add_worksheet();
    q2.set_name("Q2").unwrap();
    q2.write_string(0, 0, "only").unwrap();
    book.save_to_buffer().unwrap()
}

/// A zip of `(name, content)` files, deflated.
pub fn zip_of(files: &[(&str, &[u8])]) -> Vec<u8> {
    let mut z = zip::ZipWriter::new(Cursor::new(Vec::new()));
    for (name, content) in files {
        z.start_file(*name, SimpleFileOptions::default()).unwrap();
        z.write_all(content).unwrap();
    }
    z.finish().unwrap().into_inner()
}

/// `notes/` (a directory), `notes/a.txt` ("hello world"), `b.bin`.
pub fn plain_zip() -> Vec<u8> {
    let mut z = zip::ZipWriter::new(Cursor::new(Vec::new()));
    z.add_directory("notes/", SimpleFileOptions::default()).unwrap();
    z.start_file("notes/a.txt", SimpleFileOptions::default()).unwrap();
    z.write_all(b"hello world").unwrap();
    z.start_file("b.bin", SimpleFileOptions::default()).unwrap();
    z.write_all(&[1, 2, 3]).unwrap();
    z.finish().unwrap().into_inner()
}

/// The zip with every declared uncompressed size set to `size`.
pub fn with_declared_size(zip: &[u8], size: u32) -> Vec<u8> {
    let mut out = zip.to_vec();
    let mut i = 0;
    while i + 4 <= out.len() {
        let at = match &out[i..i + 4] {
            b"PK\x03\x04" => Some(i + 22),
            b"PK\x01\x02" => Some(i + 24),
            _ => None,
        };
        if let Some(at) = at.filter(|a| a + 4 <= out.len()) {
            out[at..at + 4].copy_from_slice(&size.to_le_bytes());
        }
        i += 1;
    }
    out
}

const CONTENT_TYPES: &str = r#"<?xml version="1.0" encoding="UTF-8" standalone="yes"?>
<Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types"><Default Extension="xml" ContentType="application/xml"/><Override PartName="/word/document.xml" ContentType="application/vnd.openxmlformats-officedocument.wordprocessingml.document.main+xml"/></Types>"#;

/// A docx whose `word/document.xml` is `xml`.
pub fn docx_with(xml: &str) -> Vec<u8> {
    zip_of(&[("[Content_Types].xml", CONTENT_TYPES.as_bytes()), ("word/document.xml", xml.as_bytes())])
}

/// Two paragraphs (one with a tab and escaped characters), a 2×2 table,
/// a last paragraph, and DrawingML text that is not part of the body.
pub fn docx() -> Vec<u8> {
    docx_with(concat!(
        r#"<?xml version="1.0" encoding="UTF-8" standalone="yes"?>"#,
        r#"<w:document xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main" "#,
        r#"xmlns:a="http://schemas.openxmlformats.org/drawingml/2006/main"><w:body>"#,
        r#"<w:p><w:r><w:t>First </w:t></w:r><w:r><w:t xml:space="preserve">paragraph</w:t></w:r></w:p>"#,
        r#"<w:p><w:r><w:t>Tom &amp; Jerry</w:t><w:tab/><w:t>said &quot;hi&#34;</w:t></w:r>"#,
        r#"<w:r><w:instrText>PAGE</w:instrText></w:r></w:p>"#,
        r#"<w:tbl><w:tr><w:tc><w:p><w:r><w:t>Name</w:t></w:r></w:p></w:tc><w:tc><w:p><w:r><w:t>Age</w:t></w:r></w:p></w:tc></w:tr>"#,
        r#"<w:tr><w:tc><w:p><w:r><w:t>Ada</w:t></w:r></w:p></w:tc><w:tc><w:p><w:r><w:t>36</w:t></w:r></w:p></w:tc></w:tr></w:tbl>"#,
        r#"<w:p><a:p><a:t>chart label</a:t></a:p><w:r><w:t>Last</w:t></w:r></w:p>"#,
        r#"</w:body></w:document>"#,
    ))
}

/// A one-page PDF saying "Hello PDF" in Helvetica, with a correct xref.
pub fn pdf() -> Vec<u8> {
    let stream = "BT /F1 24 Tf 72 720 Td (Hello PDF) Tj ET";
    let objects = [
        "<< /Type /Catalog /Pages 2 0 R >>".to_string(),
        "<< /Type /Pages /Kids [3 0 R] /Count 1 >>".to_string(),
        "<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R /Resources << /Font << /F1 5 0 R >> >> >>".to_string(),
        format!("<< /Length {} >>\nstream\n{stream}\nendstream", stream.len()),
        "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>".to_string(),
    ];
    let mut out = b"%PDF-1.4\n".to_vec();
    let mut offsets = Vec::new();
    for (i, body) in objects.iter().enumerate() {
        offsets.push(out.len());
        out.extend_from_slice(format!("{} 0 obj\n{body}\nendobj\n", i + 1).as_bytes());
    }
    let xref = out.len();
    out.extend_from_slice(format!("xref\n0 {}\n0000000000 65535 f \n", objects.len() + 1).as_bytes());
    for o in offsets {
        out.extend_from_slice(format!("{o:010} 00000 n \n").as_bytes());
    }
    out.extend_from_slice(
        format!("trailer\n<< /Size {} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n", objects.len() + 1).as_bytes(),
    );
    out
}
