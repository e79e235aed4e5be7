//! MIME types: the spec's extension map for documents, a wider guess for
//! everything else, and the text-versus-binary rule (format.md §5.5).

/// The MIME type for a VFS path: the spec's document map first, then a
/// general guess, else `application/octet-stream`.
pub fn for_path(path: &str) -> String {
    let ext = path.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase()).unwrap_or_default();
    let spec = match ext.as_str() {
        "md" => Some("text/markdown"),
        "txt" => Some("text/plain"),
        "json" => Some("application/json"),
        "js" => Some("text/javascript"),
        "ts" => Some("text/typescript"),
        "py" => Some("text/x-python"),
        "html" => Some("text/html"),
        "css" => Some("text/css"),
        _ => None,
    };
    match spec {
        Some(m) => m.to_string(),
        None => mime_guess::from_path(path).first_raw().unwrap_or("application/octet-stream").to_string(),
    }
}

/// Whether content of this MIME type is text (`isTextMime`). Missing ⇒ binary.
pub fn is_text(mime: Option<&str>) -> bool {
    let Some(m) = mime else { return false };
    let m = m.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    m.starts_with("text/")
        || m.ends_with("+json")
        || m.ends_with("+xml")
        || m.ends_with("+yaml")
        || matches!(
            m.as_str(),
            "application/json"
                | "application/xml"
                | "application/yaml"
                | "application/x-yaml"
                | "application/javascript"
                | "application/typescript"
                | "application/x-sh"
                | "application/sql"
                | "application/graphql"
                | "application/xhtml+xml"
                | "application/x-httpd-php"
                | "application/x-ndjson"
                | "application/ndjson"
                | "application/csv"
                | "application/toml"
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_map_wins_over_guess() {
        assert_eq!(for_path("lib/x.ts"), "text/typescript");
        assert_eq!(for_path("a.MD"), "text/markdown");
        assert_eq!(for_path("img.png"), "image/png");
        assert_eq!(for_path("noext"), "application/octet-stream");
    }

    #[test]
    fn text_rule() {
        assert!(is_text(Some("text/markdown")));
        assert!(is_text(Some("application/ld+json")));
        assert!(is_text(Some("application/toml")));
        assert!(!is_text(Some("image/png")));
        assert!(!is_text(None));
    }
}
