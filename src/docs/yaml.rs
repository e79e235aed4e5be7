//! YAML to and from JSON values. serde_yaml is deprecated (archived in
//! March 2024); of its maintained forks we use serde_yaml_ng: the most
//! used, kept current, same model (YAML 1.1 via unsafe-libyaml), and its
//! errors carry a line and column. serde_norway is a good fork too, but
//! sees less use. Anchors and aliases are expanded; a document that
//! expands past the crate's alias budget (billion laughs) is an error.

use serde_json::Value;

use super::DocError;

/// The most YAML text parsed at once.
const MAX_TEXT: usize = super::MAX_INPUT;

fn yaml_error(e: serde_yaml_ng::Error) -> DocError {
    let message = e.to_string();
    match e.location() {
        Some(at) => {
            // The crate says " at line L column C" mid-message; the location leads instead.
            let message = message.replacen(&format!(" at line {} column {}", at.line(), at.column()), "", 1);
            DocError::YamlAt { line: at.line(), column: at.column(), message }
        }
        None => DocError::Yaml(message),
    }
}

/// Parse one YAML document into JSON. Keys that are not strings (numbers,
/// booleans) become their string form; an empty document is null.
pub fn yaml_to_json(text: &str) -> Result<Value, DocError> {
    if text.len() > MAX_TEXT {
        return Err(DocError::Yaml(format!("{} bytes is more than the {} MiB allowed", text.len(), MAX_TEXT >> 20)));
    }
    let parsed: Result<Result<serde_yaml_ng::Value, _>, _> = super::guard::contained(|| serde_yaml_ng::from_str(text));
    let y = parsed.map_err(DocError::Yaml)?.map_err(yaml_error)?;
    Ok(to_json(y))
}

fn key(k: serde_yaml_ng::Value) -> String {
    match to_json(k) {
        Value::String(s) => s,
        other => other.to_string(),
    }
}

fn to_json(y: serde_yaml_ng::Value) -> Value {
    use serde_yaml_ng::Value as Y;
    match y {
        Y::Null => Value::Null,
        Y::Bool(b) => Value::Bool(b),
        Y::Number(n) => {
            if let Some(i) = n.as_i64() {
                Value::from(i)
            } else if let Some(u) = n.as_u64() {
                Value::from(u)
            } else {
                n.as_f64().and_then(serde_json::Number::from_f64).map(Value::Number).unwrap_or(Value::Null)
            }
        }
        Y::String(s) => Value::String(s),
        Y::Sequence(items) => Value::Array(items.into_iter().map(to_json).collect()),
        Y::Mapping(m) => Value::Object(m.into_iter().map(|(k, v)| (key(k), to_json(v))).collect()),
        Y::Tagged(t) => to_json(t.value),
    }
}

/// A JSON value as YAML text.
pub fn json_to_yaml(v: &Value) -> Result<String, DocError> {
    serde_yaml_ng::to_string(v).map_err(|e| DocError::Yaml(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn round_trip_keeps_types_and_order() {
        let v = json!({"name": "adf", "n": 3, "pi": 1.5, "ok": true, "none": null,
            "list": [1, "two", {"three": 3}], "nested": {"b": 1, "a": 2}});
        let text = json_to_yaml(&v).unwrap();
        assert_eq!(yaml_to_json(&text).unwrap(), v);
        assert!(text.starts_with("name: adf\n"), "{text}");
    }

    #[test]
    fn anchors_expand_and_odd_keys_become_strings() {
        let v = yaml_to_json("base: &b {x: 1}\nuse: *b\n1: one\ntrue: yes\n").unwrap();
        assert_eq!(v, json!({"base": {"x": 1}, "use": {"x": 1}, "1": "one", "true": "yes"}));
        assert_eq!(yaml_to_json("").unwrap(), Value::Null);
    }

    #[test]
    fn errors_say_line_and_column() {
        let e = yaml_to_json("a: 1\nb: 2\nc: [1, 2\n").unwrap_err();
        let s = e.to_string();
        assert!(s.starts_with("YAML line "), "{s}");
        assert!(s.contains(" column "), "{s}");
        assert!(matches!(e, DocError::YamlAt { .. }));
    }

    #[test]
    fn billion_laughs_is_refused() {
        let mut doc = String::from("a: &a [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 0..9 {
            let prev = (b'a' + i) as char;
            let next = (b'a' + i + 1) as char;
            let refs = vec![format!("*{prev}"); 10].join(", ");
            doc.push_str(&format!("{next}: &{next} [{refs}]\n"));
        }
        assert!(yaml_to_json(&doc).is_err());
    }
}
