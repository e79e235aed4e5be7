//! Canonical JSON as the reference signs it (messaging.md §2): JavaScript's
//! `JSON.stringify` with every object's keys sorted — array-index-like keys
//! first in numeric order, the rest by UTF-16 code units — numbers printed
//! as JavaScript prints doubles, and only `"`, `\` and control characters
//! escaped. Messages, payloads, cards and attestations are signed over it.

use serde_json::Value;

/// The canonical text of a value.
pub fn to_string(v: &Value) -> String {
    let mut out = String::with_capacity(256);
    write(v, &mut out, key_order);
    out
}

/// `JSON.stringify` with keys sorted by JavaScript's plain `.sort()` (UTF-16
/// code units, integer-like keys not first): the reference's
/// `stableStringify`, used for MCP tool hashes.
pub fn stable_string(v: &Value) -> String {
    let mut out = String::with_capacity(256);
    write(v, &mut out, |a, b| a.encode_utf16().cmp(b.encode_utf16()));
    out
}

fn write(v: &Value, out: &mut String, order: fn(&str, &str) -> std::cmp::Ordering) {
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => out.push_str(&js_number(n.as_f64().unwrap_or(f64::NAN))),
        Value::String(s) => string(s, out),
        Value::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write(x, out, order);
            }
            out.push(']');
        }
        Value::Object(o) => {
            let mut keys: Vec<&String> = o.keys().collect();
            keys.sort_by(|a, b| order(a, b));
            out.push('{');
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                string(k, out);
                out.push(':');
                write(&o[k.as_str()], out, order);
            }
            out.push('}');
        }
    }
}

/// A canonical array index (`0` … `4294967294`, no leading zeros).
fn array_index(k: &str) -> Option<u64> {
    if k.is_empty() || k.len() > 10 || (k.len() > 1 && k.starts_with('0')) || !k.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    k.parse::<u64>().ok().filter(|n| *n < 4_294_967_295)
}

fn key_order(a: &str, b: &str) -> std::cmp::Ordering {
    match (array_index(a), array_index(b)) {
        (Some(x), Some(y)) => x.cmp(&y),
        (Some(_), None) => std::cmp::Ordering::Less,
        (None, Some(_)) => std::cmp::Ordering::Greater,
        (None, None) => a.encode_utf16().cmp(b.encode_utf16()),
    }
}

fn string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{8}' => out.push_str("\\b"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\u{c}' => out.push_str("\\f"),
            '\r' => out.push_str("\\r"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// JavaScript's `Number.prototype.toString()` for a double.
pub fn js_number(x: f64) -> String {
    if !x.is_finite() {
        return "null".into();
    }
    if x == 0.0 {
        return "0".into();
    }
    // Rust's `{:e}` gives the shortest round-trip digits: `d.ddddde±k`.
    let sci = format!("{:e}", x.abs());
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let k: i64 = exp.parse().unwrap_or(0);
    let n = digits.len() as i64;
    let sign = if x < 0.0 { "-" } else { "" };
    // JS: with the decimal point after position e+1 (e = k).
    let body = if (-6..21).contains(&k) {
        if k >= n - 1 {
            format!("{digits}{}", "0".repeat((k - (n - 1)) as usize))
        } else if k >= 0 {
            let point = (k + 1) as usize;
            format!("{}.{}", &digits[..point], &digits[point..])
        } else {
            format!("0.{}{digits}", "0".repeat((-k - 1) as usize))
        }
    } else {
        let rest = if n > 1 { format!(".{}", &digits[1..]) } else { String::new() };
        format!("{}{rest}e{}{}", &digits[..1], if k < 0 { "-" } else { "+" }, k.abs())
    };
    format!("{sign}{body}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    #[test]
    fn numbers_print_as_javascript_prints_them() {
        for (x, s) in [
            (1.0, "1"),
            (-0.0, "0"),
            (0.1, "0.1"),
            (123.456, "123.456"),
            (1e21, "1e+21"),
            (1e20, "100000000000000000000"),
            (1.5e-7, "1.5e-7"),
            (0.000001, "0.000001"),
            (-2.5e-8, "-2.5e-8"),
            (9007199254740993.0, "9007199254740992"),
            (1.7976931348623157e308, "1.7976931348623157e+308"),
            (5e-324, "5e-324"),
            (0.1 + 0.2, "0.30000000000000004"),
        ] {
            assert_eq!(js_number(x), s, "{x}");
        }
    }

    #[test]
    fn keys_sort_with_array_indices_first() {
        let v = json!({"b": 1, "10": 2, "9": 3, "a": [{"z": null, "y": true}], "01": 4, "\u{e000}": 5, "😀": 6});
        assert_eq!(
            to_string(&v),
            "{\"9\":3,\"10\":2,\"01\":4,\"a\":[{\"y\":true,\"z\":null}],\"b\":1,\"😀\":6,\"\u{e000}\":5}"
        );
    }

    #[test]
    fn strings_escape_only_what_json_stringify_escapes() {
        let v = json!("a\"b\\c\n\t\u{1}\u{7f}/é\u{2028}");
        assert_eq!(to_string(&v), "\"a\\\"b\\\\c\\n\\t\\u0001\u{7f}/é\u{2028}\"");
    }

    fn arb_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            (-1e30f64..1e30).prop_map(|f| json!(f)),
            "[a-z0-9 é\"\\\\\n]{0,8}".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 40, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
                prop::collection::vec(("[a-z0-9]{0,4}", inner), 0..6)
                    .prop_map(|kv| Value::Object(kv.into_iter().collect())),
            ]
        })
    }

    proptest! {
        /// Canonical text is stable, parses back to the same value, and
        /// does not depend on the order keys were inserted in.
        #[test]
        fn stable_and_key_order_independent(v in arb_json()) {
            let a = to_string(&v);
            let back: Value = serde_json::from_str(&a).unwrap();
            prop_assert_eq!(to_string(&back), a.clone());
            fn reversed(v: &Value) -> Value {
                match v {
                    Value::Object(o) => Value::Object(o.iter().rev().map(|(k, v)| (k.clone(), reversed(v))).collect()),
                    Value::Array(a) => Value::Array(a.iter().map(reversed).collect()),
                    v => v.clone(),
                }
            }
            prop_assert_eq!(to_string(&reversed(&v)), a);
        }
    }
}
