//! Office documents from agent code: `adf.doc_text`, `adf.doc_table`,
//! `adf.zip_extract` and the YAML methods, on files the test puts in the
//! agent's own filesystem, through real sandbox workers.

mod common;

use std::io::{Cursor, Write};
use std::sync::Arc;

use adf::providers::scripted::{Reply, Scripted};
use adf::runtime::bus::Bus;
use adf::runtime::executor::{Absent, Executor};
use adf::store::files::{Protection, WriteOptions};
use adf::store::{Caller, NewAgent, Store};
use serde_json::{Value, json};

fn agent(dir: &std::path::Path) -> Store {
    let new = NewAgent { provider: Some("scripted"), model: Some("m"), ..Default::default() };
    Store::create(dir.join("a.adf"), &new).unwrap().0
}

fn put(s: &mut Store, path: &str, bytes: &[u8]) {
    s.file_write(Caller::Owner, path, bytes, &WriteOptions::default()).unwrap();
}

/// Sheet Q1: a header, a number and a date; sheet Q2.
fn xlsx() -> Vec<u8> {
    use rust_xlsxwriter::{ExcelDateTime, Format, Workbook};
    let mut book = Workbook::new();
    let q1 = book.add_worksheet().set_name("Q1").unwrap();
    q1.write_string(0, 0, "item").unwrap();
    q1.write_string(0, 1, "amount").unwrap();
    q1.write_string(0, 2, "when").unwrap();
    q1.write_string(1, 0, "Widget").unwrap();
    q1.write_number(1, 1, 42.0).unwrap();
    let date = Format::new().set_num_format("yyyy-mm-dd");
    q1.write_datetime_with_format(1, 2, ExcelDateTime::from_ymd(2024, 3, 15).unwrap(), &date).unwrap();
    book.add_worksheet().set_name("Q2").unwrap().write_string(0, 0, "x").unwrap();
    book.save_to_buffer().unwrap()
}

/// A one-page PDF saying "Hello PDF".
fn pdf() -> Vec<u8> {
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
    out.extend_from_slice(b"xref\n0 6\n0000000000 65535 f \n");
    for o in offsets {
        out.extend_from_slice(format!("{o:010} 00000 n \n").as_bytes());
    }
    out.extend_from_slice(format!("trailer\n<< /Size 6 /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n").as_bytes());
    out
}

fn zip_of(files: &[(&str, &[u8])]) -> Vec<u8> {
    let mut z = zip::ZipWriter::new(Cursor::new(Vec::new()));
    for (name, content) in files {
        z.start_file(*name, zip::write::SimpleFileOptions::default()).unwrap();
        z.write_all(content).unwrap();
    }
    z.finish().unwrap().into_inner()
}

/// Run one tool call in a turn; its result text and error flag.
async fn call(store: Store, name: &str, input: Value) -> (String, bool, Executor) {
    let provider = Arc::new(Scripted::new(vec![Reply::Tools(vec![(name.into(), input)]), Reply::Text("done".into())]));
    let mut ex = Executor::new(store, provider, Bus::new(), Arc::new(Absent)).unwrap();
    ex.chat("go").await.unwrap();
    let results: Vec<(String, bool)> = ex
        .store
        .loop_rows(None)
        .unwrap()
        .iter()
        .flat_map(|r| r.content.as_array().cloned().unwrap_or_default())
        .filter(|b| b["type"] == "tool_result")
        .map(|b| (b["content"].as_str().unwrap_or("").to_string(), b["is_error"] == json!(true)))
        .collect();
    let (text, err) = results.last().cloned().expect("a tool result");
    (text, err, ex)
}

fn result(text: &str) -> Value {
    serde_json::from_str(text.strip_prefix("Result: ").unwrap_or(text)).unwrap_or_else(|_| Value::String(text.into()))
}

#[tokio::test]
async fn sys_code_reads_a_spreadsheet_and_a_pdf_from_the_agents_files() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = agent(dir.path());
    put(&mut s, "data/book.xlsx", &xlsx());
    put(&mut s, "data/hello.pdf", &pdf());
    put(&mut s, "data/list.csv", b"[1, 2]");
    let src = "const t = await adf.doc_table({path: 'data/book.xlsx', sheet: 'Q1'});\n\
               const p = await adf.doc_text({path: 'data/hello.pdf'});\n\
               const x = await adf.doc_text({path: 'data/book.xlsx'});\n\
               const c = await adf.doc_text({path: 'data/list.csv'});\n\
               let e; try { await adf.doc_table({path: 'data/book.xlsx', sheet: 'Q3'}); } catch (err) { e = err.code + ' ' + err.message; }\n\
               let m; try { await adf.doc_text({path: 'nope.pdf'}); } catch (err) { m = err.code; }\n\
               return {name: t[0].name, rows: t[0].rows, pdf: p.includes('Hello PDF'), csv: x.split('\\n').slice(0, 3), \
                       c: typeof c, e, m};";
    let (text, err, _) = call(s, "sys_code", json!({"code": src})).await;
    assert!(!err, "{text}");
    assert_eq!(
        result(&text),
        json!({"name": "Q1", "rows": [["item", "amount", "when"], ["Widget", 42, "2024-03-15"]], "pdf": true,
               "csv": ["# sheet: Q1", "item,amount,when", "Widget,42,2024-03-15"], "c": "string",
               "e": "NOT_FOUND data/book.xlsx: sheet \"Q3\" not found; sheets: Q1, Q2", "m": "NOT_FOUND"})
    );
}

#[tokio::test]
async fn a_lambda_reads_documents_and_extracts_a_zip_into_its_files() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = agent(dir.path());
    put(&mut s, "data/book.xlsx", &xlsx());
    put(&mut s, "data/hello.pdf", &pdf());
    put(&mut s, "in/a.zip", &zip_of(&[("docs/readme.txt", b"hi"), ("b.yaml", b"k: [1, 2]\n")]));
    put(&mut s, "in/evil.zip", &zip_of(&[("../escape.txt", b"x")]));
    put(
        &mut s,
        "lib/read.js",
        b"export async function main() {\n\
            const sheets = await adf.doc_table({path: 'data/book.xlsx'});\n\
            const pdf = await adf.doc_text({path: 'data/hello.pdf'});\n\
            const written = await adf.zip_extract({path: 'in/a.zip', dest: 'out'});\n\
            const listed = await adf.zip_list({path: 'in/a.zip'});\n\
            const yaml = await adf.yaml_parse({text: (await adf.fs_read({path: 'out/b.yaml'})).content});\n\
            const back = await adf.yaml_stringify({value: {n: 1}});\n\
            const evil = await adf.zip_extract({path: 'in/evil.zip', dest: 'out'}).catch(e => e.code + ' ' + e.message);\n\
            return {sheets: sheets.map(s => s.name), date: sheets[0].rows[1][2], pdf: pdf.trim(), written,\n\
                    listed: listed.map(e => e.name + ':' + e.size), yaml, back, evil};\n\
          }\n",
    );
    let (text, err, ex) = call(s, "sys_lambda", json!({"source": "lib/read.js"})).await;
    assert!(!err, "{text}");
    assert_eq!(
        result(&text),
        json!({"sheets": ["Q1", "Q2"], "date": "2024-03-15", "pdf": "Hello PDF",
               "written": ["out/docs/readme.txt", "out/b.yaml"], "listed": ["docs/readme.txt:2", "b.yaml:10"],
               "yaml": {"k": [1, 2]}, "back": "n: 1\n",
               "evil": "UNSAFE_PATH in/evil.zip: entry \"../escape.txt\" escapes the folder"})
    );
    assert_eq!(ex.store.file_read_text("out/docs/readme.txt").unwrap(), "hi");
    assert!(ex.store.file_stat("escape.txt").unwrap().is_none());

    // Extraction writes as the code: a read-only file stays as it was.
    let mut s = ex.store_into();
    s.file_write(
        Caller::Owner,
        "out/docs/readme.txt",
        b"keep",
        &WriteOptions { protection: Some(Protection::ReadOnly), ..Default::default() },
    )
    .unwrap();
    s.file_set_protection(Caller::Owner, "out/docs/readme.txt", Protection::ReadOnly).unwrap();
    let src = "return await adf.zip_extract({path: 'in/a.zip', dest: 'out'}).catch(e => e.code);";
    let (text, _, ex) = call(s, "sys_code", json!({"code": src})).await;
    assert_eq!(text, "Result: PROTECTION_DENIED");
    assert_eq!(ex.store.file_read_text("out/docs/readme.txt").unwrap(), "keep");
}

/// The agent's shell reads documents as text with nothing installed:
/// `cat report.pdf`, a workbook as CSV, a Word file, a zip listing, YAML
/// through `yq`.
#[tokio::test]
async fn the_shell_cats_documents_as_text() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = agent(dir.path());
    s.config_set(Caller::Owner, "tools", common::tools_enabled(&["adf_shell"])).unwrap();
    put(&mut s, "report.pdf", &pdf());
    put(&mut s, "book.xlsx", &xlsx());
    let body = r#"<?xml version="1.0"?><w:document xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main"><w:body><w:p><w:r><w:t>Hello DOCX</w:t></w:r></w:p></w:body></w:document>"#;
    put(&mut s, "notes.docx", &zip_of(&[("word/document.xml", body.as_bytes())]));
    put(&mut s, "a.zip", &zip_of(&[("one.txt", b"1"), ("dir/two.txt", b"22")]));
    put(&mut s, "c.yaml", b"name: adf\nlist: [1, 2]\n");
    let script = "cat report.pdf | grep -c 'Hello PDF'; cat book.xlsx | head -2; cat notes.docx; \
                  unzip -l a.zip | grep -c txt; yq .list[1] c.yaml";
    let (text, err, _) = call(s, "adf_shell", json!({"command": script})).await;
    assert!(!err, "{text}");
    let v = result(&text);
    assert_eq!(v["exit_code"], 0, "{v}");
    let out = v["stdout"].as_str().unwrap();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "1", "{out}");
    assert!(lines[1].contains("Q1") || lines[1].contains("item"), "the workbook as CSV: {out}");
    assert!(out.contains("item,amount,when") && out.contains("Hello DOCX"), "{out}");
    assert!(out.contains("\n2\n2\n") || out.ends_with("2\n2\n"), "two zip entries and yq's answer: {out}");
}
