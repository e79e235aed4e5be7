//! Holding benchmark figures to their targets. A report carries its
//! targets (`{"figure": {"max": x}}` or `{"min": x}`); `--check` fails the
//! command when a figure is more than twice its maximum (or under half its
//! minimum), so the noise of a shared machine passes and a regression
//! does not.

use serde_json::Value;

/// The figures past twice their target, each said as `figure = value
/// (target)`.
pub fn misses(report: &Value) -> Vec<String> {
    let Some(targets) = report.get("targets").and_then(Value::as_object) else { return Vec::new() };
    let mut out = Vec::new();
    for (name, t) in targets {
        let Some(v) = report.get(name).and_then(Value::as_f64) else {
            out.push(format!("{name}: missing from the report"));
            continue;
        };
        if let Some(max) = t.get("max").and_then(Value::as_f64) {
            // A zero target (nothing dropped) allows nothing.
            if v > max * 2.0 || (max == 0.0 && v > 0.0) {
                out.push(format!("{name} = {v:.4} (target at most {max})"));
            }
        }
        if let Some(min) = t.get("min").and_then(Value::as_f64)
            && v < min / 2.0
        {
            out.push(format!("{name} = {v:.4} (target at least {min})"));
        }
    }
    out
}

/// With `check`, an error naming every figure past twice its target.
pub fn enforce(report: &Value, check: bool) -> anyhow::Result<()> {
    if !check {
        return Ok(());
    }
    let m = misses(report);
    anyhow::ensure!(m.is_empty(), "figures past twice their target: {}", m.join("; "));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn twice_the_target_fails_and_noise_passes() {
        let r = json!({"a": 0.09, "b": 0.11, "c": 6000.0, "d": 4000.0, "z": 0,
            "targets": {"a": {"max": 0.05}, "b": {"max": 0.05}, "c": {"min": 10000}, "d": {"min": 10000},
                        "z": {"max": 0}, "gone": {"max": 1}}});
        let m = misses(&r);
        assert_eq!(m.len(), 3, "{m:?}");
        assert!(m.iter().any(|s| s.starts_with("b = ")));
        assert!(m.iter().any(|s| s.starts_with("d = ")));
        assert!(m.iter().any(|s| s.starts_with("gone")));
        assert!(enforce(&r, false).is_ok());
        assert!(enforce(&r, true).is_err());
        assert!(misses(&json!({"z": 1, "targets": {"z": {"max": 0}}})).len() == 1);
    }
}
