//! DOCX text: the paragraphs of `word/document.xml` as lines, a table's
//! rows as lines of tab-separated cells. Only the text runs (`w:t`) are
//! read, so field codes, deleted text and drawings stay out; the rest of
//! the package (styles, media) is never opened.

use quick_xml::Reader;
use quick_xml::events::Event;

use super::{DocError, archive};

/// The most `word/document.xml` may inflate to.
const MAX_XML: u64 = 256 << 20;

fn malformed(path: &str, detail: impl ToString) -> DocError {
    DocError::Malformed { path: path.into(), what: "DOCX document", detail: detail.to_string() }
}

/// Where text goes while walking the XML: open table rows and cells, for
/// tables inside tables too.
#[derive(Default)]
struct Walk {
    out: String,
    /// The paragraph being read.
    para: String,
    /// Per open `w:tr`, its finished cells.
    rows: Vec<Vec<String>>,
    /// Per open `w:tc`, its text so far.
    cells: Vec<String>,
    in_text: bool,
}

impl Walk {
    /// A finished piece of text: a line of the output, or part of a cell.
    fn emit(&mut self, text: String) {
        match self.cells.last_mut() {
            Some(cell) => {
                if !cell.is_empty() && !text.is_empty() {
                    cell.push(' ');
                }
                cell.push_str(&text.replace(['\t', '\n'], " "));
            }
            None => {
                self.out.push_str(&text);
                self.out.push('\n');
            }
        }
    }

    fn open(&mut self, name: &[u8]) {
        match name {
            b"t" => self.in_text = true,
            b"tr" => self.rows.push(Vec::new()),
            b"tc" => self.cells.push(String::new()),
            _ => {}
        }
    }

    fn empty(&mut self, name: &[u8]) {
        match name {
            b"tab" => self.para.push('\t'),
            b"br" | b"cr" => self.para.push('\n'),
            b"p" => {
                let p = std::mem::take(&mut self.para);
                self.emit(p);
            }
            _ => {}
        }
    }

    fn close(&mut self, name: &[u8]) {
        match name {
            b"t" => self.in_text = false,
            b"p" => {
                let p = std::mem::take(&mut self.para);
                self.emit(p);
            }
            b"tc" => {
                let cell = self.cells.pop().unwrap_or_default();
                if let Some(row) = self.rows.last_mut() {
                    row.push(cell);
                }
            }
            b"tr" => {
                let row = self.rows.pop().unwrap_or_default().join("\t");
                self.emit(row);
            }
            _ => {}
        }
    }
}

/// The `w:` local name of an element, or nothing for other namespaces
/// (DrawingML's `a:p` and `a:t` are not document paragraphs).
fn word_name(qname: &[u8]) -> Option<&[u8]> {
    qname.strip_prefix(b"w:")
}

fn walk_xml(path: &str, xml: &str) -> Result<String, DocError> {
    let mut reader = Reader::from_str(xml);
    let mut w = Walk::default();
    loop {
        let ev = reader
            .read_event()
            .map_err(|e| malformed(path, format!("word/document.xml at byte {}: {e}", reader.buffer_position())))?;
        match ev {
            Event::Start(e) => {
                if let Some(n) = word_name(e.name().as_ref().as_bytes()) {
                    w.open(n);
                }
            }
            Event::Empty(e) => {
                if let Some(n) = word_name(e.name().as_ref().as_bytes()) {
                    w.empty(n);
                }
            }
            Event::End(e) => {
                if let Some(n) = word_name(e.name().as_ref().as_bytes()) {
                    w.close(n);
                }
            }
            Event::Text(t) if w.in_text => w.para.push_str(&t.xml10_content()),
            Event::CData(t) if w.in_text => w.para.push_str(&t),
            Event::GeneralRef(r) if w.in_text => {
                let c = match r.resolve_char_ref() {
                    Ok(Some(c)) => Some(c),
                    _ => match &*r {
                        "amp" => Some('&'),
                        "lt" => Some('<'),
                        "gt" => Some('>'),
                        "quot" => Some('"'),
                        "apos" => Some('\''),
                        _ => None,
                    },
                };
                if let Some(c) = c {
                    w.para.push(c);
                }
            }
            Event::Eof => break,
            _ => {}
        }
    }
    if !w.para.is_empty() {
        let p = std::mem::take(&mut w.para);
        w.emit(p);
    }
    Ok(w.out)
}

/// The text of a DOCX document.
pub(super) fn docx_text(path: &str, bytes: &[u8]) -> Result<String, DocError> {
    let xml = archive::read_entry(path, bytes, "word/document.xml", MAX_XML)?;
    let xml = String::from_utf8_lossy(&xml);
    super::guard::contained(|| walk_xml(path, &xml))
        .unwrap_or_else(|why| Err(DocError::ParserFailed { path: path.into(), what: "DOCX", detail: why }))
}

#[cfg(test)]
mod tests {
    use super::super::samples;
    use super::*;

    #[test]
    fn paragraphs_are_lines_and_table_cells_are_tab_separated() {
        let text = docx_text("d.docx", &samples::docx()).unwrap();
        assert_eq!(text, "First paragraph\nTom & Jerry\tsaid \"hi\"\nName\tAge\nAda\t36\nLast\n");
    }

    #[test]
    fn broken_xml_is_an_error_naming_the_file() {
        let doc = samples::docx_with("<w:document><w:body><w:p><w:r><w:t>x</w:p></w:document>");
        let e = docx_text("bad.docx", &doc).unwrap_err();
        assert!(e.to_string().starts_with("bad.docx: cannot read the DOCX document: word/document.xml"), "{e}");
    }
}
