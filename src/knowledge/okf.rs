//! Open Knowledge Format v0.1 bundles in an agent's files: markdown
//! concepts with YAML frontmatter (`type` required; `title`, `description`
//! and any other field optional) that link to each other into a graph. The
//! consumption is permissive, as the format asks: unknown fields are kept
//! out of the way, broken links are reported, not refused, and a file
//! without frontmatter or `type` is simply not a concept. A folder with an
//! `index.md` over concepts is a bundle; its index page is offered to the
//! model like a skill, and the model walks the links with fs_read.

use serde::Serialize;
use serde_json::Value;

use super::skills::frontmatter;
use crate::store::Store;

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Concept {
    /// Its path in the bundle without `.md` (`tables/orders`).
    pub id: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub title: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Concepts it links to, by id.
    pub links: Vec<String>,
    /// Links to nothing in the bundle (tolerated, shown).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub broken_links: Vec<String>,
}

/// The largest concept file read (bigger ones are listed by name only).
const MAX_CONCEPT: u64 = 4 << 20;

/// Parse one concept file. `None`: not a concept (no frontmatter, no
/// `type`, or frontmatter that is not a YAML mapping).
pub fn parse(id: &str, text: &str) -> Option<(String, String, Option<String>, Vec<String>)> {
    let (yaml, body) = frontmatter(text)?;
    let meta: Value = serde_yaml_ng::from_str(yaml).ok()?;
    let kind = match &meta["type"] {
        Value::String(s) if !s.trim().is_empty() => s.trim().to_string(),
        _ => return None,
    };
    let title = meta["title"]
        .as_str()
        .map(str::to_string)
        .or_else(|| body.lines().find_map(|l| l.strip_prefix("# ")).map(|t| t.trim().to_string()))
        .unwrap_or_else(|| id.rsplit('/').next().unwrap_or(id).to_string());
    let description = meta["description"].as_str().map(str::to_string);
    Some((kind, title, description, link_targets(body)))
}

/// Markdown link targets `[text](target)` that point at `.md` files in
/// the bundle (not URLs, not anchors), as written.
pub fn link_targets(body: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = body;
    while let Some(i) = rest.find("](") {
        rest = &rest[i + 2..];
        let Some(end) = rest.find(')') else { break };
        let target = rest[..end].split_whitespace().next().unwrap_or("");
        let target = target.split('#').next().unwrap_or("");
        if target.ends_with(".md") && !target.contains("://") && !target.starts_with("mailto:") {
            out.push(target.to_string());
        }
        rest = &rest[end..];
    }
    out
}

/// A link from concept `from` (an id) to a concept id: bundle-absolute
/// (`/tables/orders.md`) or relative to `from`'s folder (`../x.md`).
pub fn resolve(from: &str, target: &str) -> Option<String> {
    let mut segs: Vec<&str> = if target.starts_with('/') {
        Vec::new()
    } else {
        let mut s: Vec<&str> = from.split('/').collect();
        s.pop();
        s
    };
    for seg in target.trim_start_matches('/').split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                segs.pop()?;
            }
            s => segs.push(s),
        }
    }
    Some(segs.join("/").trim_end_matches(".md").to_string())
}

/// Every concept under `prefix` (a folder of the agent's files; empty for
/// all), ids relative to it.
pub fn concepts(store: &Store, prefix: &str) -> crate::store::Result<Vec<Concept>> {
    let prefix = if prefix.is_empty() || prefix.ends_with('/') { prefix.to_string() } else { format!("{prefix}/") };
    let files = store.file_list(&prefix)?;
    let ids: Vec<String> = files
        .iter()
        .filter(|f| f.path.ends_with(".md"))
        .map(|f| f.path[prefix.len()..].trim_end_matches(".md").to_string())
        .collect();
    let mut out = Vec::new();
    for f in files.iter().filter(|f| f.path.ends_with(".md") && f.size <= MAX_CONCEPT) {
        let id = f.path[prefix.len()..].trim_end_matches(".md").to_string();
        let Ok(text) = store.file_read_text(&f.path) else { continue };
        let Some((kind, title, description, targets)) = parse(&id, &text) else { continue };
        let (mut links, mut broken) = (Vec::new(), Vec::new());
        for t in targets {
            match resolve(&id, &t) {
                Some(to) if ids.contains(&to) => {
                    if !links.contains(&to) {
                        links.push(to);
                    }
                }
                _ => {
                    if !broken.contains(&t) {
                        broken.push(t);
                    }
                }
            }
        }
        out.push(Concept { id, kind, title, description, links, broken_links: broken });
    }
    Ok(out)
}

/// Bundles: folders with an `index.md` and at least one concept beside or
/// below it, as (index path, its title, concept count). Bounded: at most
/// 20 bundles, each judged by its first 200 markdown files.
pub fn bundles(store: &Store) -> Vec<(String, String, usize)> {
    let Ok(indexes) = store.file_list("") else { return Vec::new() };
    let mut out = Vec::new();
    for idx in indexes.iter().filter(|f| f.path == "index.md" || f.path.ends_with("/index.md")) {
        let folder = idx.path.trim_end_matches("index.md");
        let Ok(files) = store.file_list(folder) else { continue };
        let mut n = 0;
        for f in
            files.iter().filter(|f| f.path.ends_with(".md") && f.path != idx.path && f.size <= MAX_CONCEPT).take(200)
        {
            let id = &f.path[folder.len()..];
            if store.file_read_text(&f.path).ok().is_some_and(|t| parse(id, &t).is_some()) {
                n += 1;
            }
        }
        if n == 0 {
            continue;
        }
        let title = store
            .file_read_text(&idx.path)
            .ok()
            .and_then(|t| t.lines().find_map(|l| l.strip_prefix("# ").map(|s| s.trim().to_string())))
            .unwrap_or_else(|| folder.trim_end_matches('/').to_string());
        out.push((idx.path.clone(), title, n));
        if out.len() == 20 {
            break;
        }
    }
    out
}

/// The system prompt's section for the bundles (none: no section).
pub fn prompt_section(bundles: &[(String, String, usize)]) -> Option<String> {
    if bundles.is_empty() {
        return None;
    }
    let lines: Vec<String> =
        bundles.iter().map(|(p, t, n)| format!("- {p}: {t} ({n} concept{})", if *n == 1 { "" } else { "s" })).collect();
    Some(format!(
        "## Knowledge Bundles\n\nOpen Knowledge Format bundles in your files: start at the index page with fs_read \
         and follow its links to the concepts you need.\n\n{}",
        lines.join("\n")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn concepts_need_a_type_and_tolerate_the_rest() {
        let (kind, title, desc, links) = parse(
            "tables/orders",
            "---\ntype: BigQuery Table\nowner: sales\n---\n# Orders\nSee [customers](/tables/customers.md), \
             [rev](../metrics/revenue.md#total \"t\") and [site](https://x.test/a.md).",
        )
        .unwrap();
        assert_eq!((kind.as_str(), title.as_str(), desc), ("BigQuery Table", "Orders", None));
        assert_eq!(links, ["/tables/customers.md", "../metrics/revenue.md"]);
        assert!(parse("x", "# just markdown").is_none());
        assert!(parse("x", "---\ntitle: no type\n---\n").is_none());
        assert!(parse("x", "---\n- a list\n---\n").is_none());
        assert_eq!(parse("dir/x", "---\ntype: T\n---\nbody").unwrap().1, "x", "title falls back to the name");
    }

    #[test]
    fn links_resolve_from_the_concept() {
        assert_eq!(resolve("tables/orders", "/tables/customers.md").as_deref(), Some("tables/customers"));
        assert_eq!(resolve("tables/orders", "../metrics/revenue.md").as_deref(), Some("metrics/revenue"));
        assert_eq!(resolve("tables/orders", "./x.md").as_deref(), Some("tables/x"));
        assert_eq!(resolve("a", "../../x.md"), None);
    }
}
