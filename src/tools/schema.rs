//! A small validator for the JSON schemas of the built-in tools: object
//! properties with types, `required`, `enum`, `minLength`, `minimum`,
//! `items`, and `oneOf` of required sets. Messages name the field.

use serde_json::Value;

/// Validate `input` against `schema`; the first problem, if any.
pub fn validate(schema: &Value, input: &Value) -> Result<(), String> {
    check(schema, input, "")
}

fn type_ok(ty: &str, v: &Value) -> bool {
    match ty {
        "string" => v.is_string(),
        "integer" => v.is_i64() || v.is_u64(),
        "number" => v.is_number(),
        "boolean" => v.is_boolean(),
        "array" => v.is_array(),
        "object" => v.is_object(),
        "null" => v.is_null(),
        _ => true,
    }
}

fn check(schema: &Value, v: &Value, at: &str) -> Result<(), String> {
    let name = if at.is_empty() { "input".to_string() } else { format!("\"{at}\"") };
    match schema.get("type") {
        Some(Value::String(t)) if !type_ok(t, v) => return Err(format!("{name} must be of type {t}")),
        Some(Value::Array(ts)) if !ts.iter().filter_map(Value::as_str).any(|t| type_ok(t, v)) => {
            let list: Vec<&str> = ts.iter().filter_map(Value::as_str).collect();
            return Err(format!("{name} must be one of the types {}", list.join(", ")));
        }
        _ => {}
    }
    if let Some(Value::Array(allowed)) = schema.get("enum")
        && !allowed.contains(v)
    {
        let list: Vec<String> = allowed.iter().map(Value::to_string).collect();
        return Err(format!("{name} must be one of {}", list.join(", ")));
    }
    if let (Some(min), Some(s)) = (schema.get("minLength").and_then(Value::as_u64), v.as_str())
        && (s.chars().count() as u64) < min
    {
        return Err(format!("{name} must be at least {min} character(s)"));
    }
    if let (Some(min), Some(n)) = (schema.get("minimum").and_then(Value::as_f64), v.as_f64())
        && n < min
    {
        return Err(format!("{name} must be >= {min}"));
    }
    if let (Some(min), Some(n)) = (schema.get("exclusiveMinimum").and_then(Value::as_f64), v.as_f64())
        && n <= min
    {
        return Err(format!("{name} must be > {min}"));
    }
    if let (Some(min), Some(a)) = (schema.get("minItems").and_then(Value::as_u64), v.as_array())
        && (a.len() as u64) < min
    {
        return Err(format!("{name} must have at least {min} item(s)"));
    }
    if let (Some(items), Some(a)) = (schema.get("items"), v.as_array()) {
        for (i, x) in a.iter().enumerate() {
            check(items, x, &format!("{at}[{i}]"))?;
        }
    }
    if let Some(obj) = v.as_object() {
        for req in schema.get("required").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str) {
            if !obj.contains_key(req) {
                let field = if at.is_empty() { req.to_string() } else { format!("{at}.{req}") };
                return Err(format!("\"{field}\" is required"));
            }
        }
        if let Some(Value::Object(props)) = schema.get("properties") {
            for (k, x) in obj {
                if let Some(ps) = props.get(k) {
                    let field = if at.is_empty() { k.clone() } else { format!("{at}.{k}") };
                    check(ps, x, &field)?;
                }
            }
        }
        if let Some(Value::Array(options)) = schema.get("oneOf") {
            let fits = options.iter().filter(|o| check(o, v, at).is_ok()).count();
            if fits != 1 {
                let sets: Vec<String> = options
                    .iter()
                    .filter_map(|o| o.get("required"))
                    .map(|r| {
                        r.as_array()
                            .map(|a| a.iter().filter_map(Value::as_str).collect::<Vec<_>>().join("+"))
                            .unwrap_or_default()
                    })
                    .collect();
                return Err(format!("{name} must have exactly one of: {}", sets.join(", ")));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn checks() {
        let s = json!({"type": "object", "properties": {
            "path": {"type": "string", "minLength": 1},
            "mode": {"type": "string", "enum": ["write", "edit"]},
            "n": {"type": "integer", "exclusiveMinimum": 0},
            "edits": {"type": "array", "items": {"type": "object", "required": ["old_text"]}}
        }, "required": ["path"]});
        assert!(validate(&s, &json!({"path": "a"})).is_ok());
        assert_eq!(validate(&s, &json!({})).unwrap_err(), "\"path\" is required");
        assert_eq!(validate(&s, &json!({"path": 3})).unwrap_err(), "\"path\" must be of type string");
        assert!(validate(&s, &json!({"path": ""})).is_err());
        assert!(validate(&s, &json!({"path": "a", "mode": "x"})).unwrap_err().contains("one of"));
        assert!(validate(&s, &json!({"path": "a", "n": 0})).is_err());
        assert_eq!(
            validate(&s, &json!({"path": "a", "edits": [{}]})).unwrap_err(),
            "\"edits[0].old_text\" is required"
        );
        let one = json!({"type": "object", "oneOf": [{"required": ["value"]}, {"required": ["delta"]}]});
        assert!(validate(&one, &json!({"value": "1"})).is_ok());
        assert!(validate(&one, &json!({"value": "1", "delta": 1})).is_err());
        assert!(validate(&one, &json!({})).is_err());
        assert!(validate(&s, &json!("nope")).is_err());
    }
}
