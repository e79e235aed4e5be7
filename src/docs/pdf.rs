//! PDF text through pdf-extract (lopdf underneath, plus the font encodings
//! and ToUnicode maps that lopdf's own `extract_text` lacks, so more real
//! files come back as readable text). Malformed PDFs make it panic or
//! grind, so it runs on its own thread behind `guard::with_deadline`.

use std::time::Duration;

use super::DocError;
use super::guard::{self, Stopped};

/// How long one PDF may take.
const DEADLINE: Duration = Duration::from_secs(30);

/// The text of a PDF, pages in order.
pub(super) fn text(path: &str, bytes: &[u8]) -> Result<String, DocError> {
    text_within(path, bytes, DEADLINE)
}

fn text_within(path: &str, bytes: &[u8], limit: Duration) -> Result<String, DocError> {
    let owned = bytes.to_vec();
    match guard::with_deadline(limit, move || pdf_extract::extract_text_from_mem(&owned)) {
        Ok(Ok(text)) => Ok(text),
        Ok(Err(e)) => Err(DocError::Malformed { path: path.into(), what: "PDF", detail: e.to_string() }),
        Err(Stopped::Panicked(why)) => Err(DocError::ParserFailed { path: path.into(), what: "PDF", detail: why }),
        Err(Stopped::TimedOut) => Err(DocError::TimedOut { path: path.into(), secs: limit.as_secs().max(1) }),
    }
}

#[cfg(test)]
mod tests {
    use super::super::samples;
    use super::*;

    #[test]
    fn hello_pdf_comes_back() {
        let t = text("hello.pdf", &samples::pdf()).unwrap();
        assert!(t.contains("Hello PDF"), "{t:?}");
    }

    #[test]
    fn a_damaged_pdf_is_an_error_not_a_panic() {
        let mut pdf = samples::pdf();
        pdf.truncate(pdf.len() / 2);
        let e = text("half.pdf", &pdf).unwrap_err();
        assert!(e.to_string().starts_with("half.pdf: "), "{e}");
    }
}
