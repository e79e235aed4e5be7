//! Turning an agent's lambda file into something boa can run: TypeScript
//! types stripped by oxc (cached by content hash), the module normalised by
//! oxc's code generator, then `import` rewritten to `await __require(…)` and
//! `export` keywords dropped, so the file becomes the body of an async
//! function that returns its exported functions by name.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Mutex, OnceLock};

use sha2::{Digest, Sha256};

/// A lambda file ready for the worker.
#[derive(Debug, Clone)]
pub struct Prepared {
    pub hash: String,
    pub source: String,
}

const CACHE_MAX: usize = 512;

fn cache() -> &'static Mutex<HashMap<String, Prepared>> {
    static C: OnceLock<Mutex<HashMap<String, Prepared>>> = OnceLock::new();
    C.get_or_init(Default::default)
}

/// Prepare a file's text; the result is cached by (kind, content) hash.
pub fn module(path: &str, text: &str) -> Result<Prepared, String> {
    let ts = is_typescript(path);
    let hash = {
        let mut h = Sha256::new();
        h.update(if ts { b"ts\0" } else { b"js\0" });
        h.update(text.as_bytes());
        crate::identity::hex(&h.finalize()[..16])
    };
    if let Some(p) = cache().lock().ok().and_then(|c| c.get(&hash).cloned()) {
        return Ok(p);
    }
    let js = normalise(path, text, ts)?;
    let prepared = Prepared { hash: hash.clone(), source: rewrite(&js) };
    if let Ok(mut c) = cache().lock() {
        if c.len() >= CACHE_MAX {
            c.clear();
        }
        c.insert(hash, prepared.clone());
    }
    Ok(prepared)
}

pub fn is_typescript(path: &str) -> bool {
    [".ts", ".mts", ".cts", ".tsx"].iter().any(|e| path.ends_with(e))
}

/// Parse with oxc (as TypeScript when it is), strip types, print JS.
fn normalise(path: &str, text: &str, ts: bool) -> Result<String, String> {
    use oxc::allocator::Allocator;
    use oxc::codegen::Codegen;
    use oxc::parser::Parser;
    use oxc::semantic::SemanticBuilder;
    use oxc::span::SourceType;
    use oxc::transformer::{TransformOptions, Transformer};

    let alloc = Allocator::default();
    let source_type = if ts { SourceType::ts() } else { SourceType::mjs() };
    let parsed = Parser::new(&alloc, text, source_type).parse();
    if let Some(e) = parsed.diagnostics.first() {
        return Err(format!("{path}: syntax error: {e}"));
    }
    let mut program = parsed.program;
    if ts {
        let scoping = SemanticBuilder::new().with_enum_eval(true).build(&program).semantic.into_scoping();
        let out = Transformer::new(&alloc, Path::new(path), &TransformOptions::default())
            .build_with_scoping(scoping, &mut program);
        if let Some(e) = out.diagnostics.first() {
            return Err(format!("{path}: {e}"));
        }
    }
    Ok(Codegen::new().build(&program).code)
}

/// `import`/`export` to plain statements, plus a trailing `return` of the
/// exported (and top-level) functions.
fn rewrite(js: &str) -> String {
    let mut out = String::with_capacity(js.len() + 256);
    let mut names: Vec<(String, String)> = Vec::new();
    let mut add = |exported: &str, local: &str| {
        if !names.iter().any(|(e, _)| e == exported) {
            names.push((exported.to_string(), local.to_string()));
        }
    };
    for line in js.lines() {
        let t = line.trim_start();
        if let Some(rest) = t.strip_prefix("import ") {
            out.push_str(&import(rest));
        } else if let Some(rest) = t.strip_prefix("export default ") {
            match decl_name(rest) {
                Some(n) => {
                    add("default", &n);
                    out.push_str(rest);
                }
                None => {
                    add("default", "__default");
                    out.push_str("const __default = ");
                    out.push_str(rest);
                }
            }
        } else if let Some(rest) = t.strip_prefix("export {") {
            for part in rest.split('}').next().unwrap_or("").split(',') {
                let mut it = part.split(" as ").map(str::trim);
                if let Some(local) = it.next().filter(|s| !s.is_empty()) {
                    add(it.next().unwrap_or(local), local);
                }
            }
        } else if let Some(rest) = t.strip_prefix("export ") {
            if let Some(n) = decl_name(rest) {
                add(&n, &n);
            }
            out.push_str(rest);
        } else {
            if line.len() == t.len()
                && let Some(n) = decl_name(t).filter(|_| t.contains("function"))
            {
                add(&n, &n);
            }
            out.push_str(line);
        }
        out.push('\n');
    }
    out.push_str("return {");
    for (exported, local) in &names {
        out.push_str(&format!("{exported:?}: (typeof {local} !== \"undefined\" ? {local} : undefined), "));
    }
    out.push_str("};");
    out
}

/// Inline code: `import` lines become `await __require(…)` (the rest is
/// left as written).
pub fn code_imports(code: &str) -> std::borrow::Cow<'_, str> {
    if !code.lines().any(|l| l.trim_start().starts_with("import ")) {
        return std::borrow::Cow::Borrowed(code);
    }
    let mut out = String::with_capacity(code.len() + 64);
    for line in code.lines() {
        match line.trim_start().strip_prefix("import ") {
            Some(rest) if !rest.trim_start().starts_with('(') => {
                let (stmt, tail) = split_import(rest);
                out.push_str(&import(stmt));
                out.push_str(tail);
            }
            _ => out.push_str(line),
        }
        out.push('\n');
    }
    std::borrow::Cow::Owned(out)
}

/// An import statement's text up to its module string, and what follows
/// on the line.
fn split_import(rest: &str) -> (&str, &str) {
    let from = rest.find(" from ").map(|i| i + 6).unwrap_or(0);
    let Some(q) = rest[from..].find(['"', '\'']).map(|i| i + from) else { return (rest, "") };
    let quote = &rest[q..q + 1];
    match rest[q + 1..].find(quote) {
        Some(end) => {
            let cut = q + 1 + end + 1;
            let tail = rest[cut..].trim_start();
            (&rest[..cut], tail.strip_prefix(';').unwrap_or(tail))
        }
        None => (rest, ""),
    }
}

/// The name a declaration binds: `function f`, `async function f`,
/// `function* f`, `class C`, `const x`.
fn decl_name(s: &str) -> Option<String> {
    let s = s.strip_prefix("async ").unwrap_or(s);
    let rest = ["function* ", "function *", "function ", "class ", "const ", "let ", "var "]
        .iter()
        .find_map(|k| s.strip_prefix(k))?;
    let name: String =
        rest.trim_start().chars().take_while(|c| c.is_alphanumeric() || *c == '_' || *c == '$').collect();
    (!name.is_empty()).then_some(name)
}

/// One `import` statement (after the keyword) as `await __require`.
fn import(rest: &str) -> String {
    let rest = rest.trim().trim_end_matches(';');
    let Some((clause, module)) = rest.rsplit_once(" from ") else {
        return format!("await __require({});", rest.trim());
    };
    let module = module.trim();
    let clause = clause.trim();
    if let Some(ns) = clause.strip_prefix("* as ") {
        return format!("const {} = await __require({module});", ns.trim());
    }
    if let Some(inner) = clause.strip_prefix('{') {
        let inner = inner.trim_end_matches('}').replace(" as ", ": ");
        return format!("const {{{inner}}} = await __require({module});");
    }
    match clause.split_once(',') {
        Some((def, more)) => {
            let more = more.trim().trim_start_matches('{').trim_end_matches('}').replace(" as ", ": ");
            format!("const {def} = await __require({module}); const {{{more}}} = await __require({module});")
        }
        None => format!("const {clause} = await __require({module});"),
    }
}

/// Split a `sys_lambda` source into (file, function): the text after the
/// last `:` names the function only when that colon is neither first nor
/// last and the rest is a JS identifier (tools.md `sys_lambda`).
pub fn split_target(source: &str) -> (&str, &str) {
    if let Some(i) = source.rfind(':')
        && i > 0
        && i + 1 < source.len()
    {
        let f = &source[i + 1..];
        let mut chars = f.chars();
        let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == '$');
        if first_ok && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$') {
            return (&source[..i], f);
        }
    }
    (source, "main")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_split_on_identifiers_only() {
        assert_eq!(split_target("lib/a.ts:run"), ("lib/a.ts", "run"));
        assert_eq!(split_target("lib/a.ts"), ("lib/a.ts", "main"));
        assert_eq!(split_target("a.ts:a-b"), ("a.ts:a-b", "main"));
        assert_eq!(split_target(":x"), (":x", "main"));
        assert_eq!(split_target("a.ts:"), ("a.ts:", "main"));
        assert_eq!(split_target("c:/x.js:$go"), ("c:/x.js", "$go"));
    }

    #[test]
    fn typescript_is_stripped_and_exports_returned() {
        let p = module(
            "lib/x.ts",
            "import { a as b } from 'util';\ninterface T { n: number }\nenum E { A = 1 }\nexport async function main(x: T): Promise<number> { return x.n + E.A; }\nfunction helper(): void { b(); }\nexport const k: number = 2;\nexport default function run() {}\n",
        )
        .unwrap();
        assert!(!p.source.contains("interface"), "{}", p.source);
        assert!(!p.source.contains(": number"), "{}", p.source);
        assert!(
            p.source.contains("const {b: a} = await __require")
                || p.source.contains("const { a: b } = await __require"),
            "{}",
            p.source
        );
        for n in ["\"main\"", "\"k\"", "\"helper\"", "\"default\": (typeof run"] {
            assert!(p.source.contains(n), "{n} missing in {}", p.source);
        }
        // Same content, same cached result.
        let q = module("lib/x.ts", "import { a as b } from 'util';\ninterface T { n: number }\nenum E { A = 1 }\nexport async function main(x: T): Promise<number> { return x.n + E.A; }\nfunction helper(): void { b(); }\nexport const k: number = 2;\nexport default function run() {}\n").unwrap();
        assert_eq!(p.hash, q.hash);
    }

    #[test]
    fn syntax_errors_name_the_file() {
        let e = module("bad.js", "export function (").unwrap_err();
        assert!(e.starts_with("bad.js: syntax error"), "{e}");
    }
}
