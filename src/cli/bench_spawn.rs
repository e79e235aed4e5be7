//! The cost of an agent making a child from a template (`sys_create_adf`
//! with `template`, `adf new --template`): read the template, then build
//! the child in its work file and link it into place. Measured in a
//! scratch folder that is removed afterwards; the target is a p50 under
//! 30 ms in a release build.

use std::path::PathBuf;
use std::time::Instant;

use serde_json::{Value, json};

use crate::store::create::{NewAgent, create_file, nanoid};
use crate::store::derive::{self, ChildSpec, Template};

/// A scratch folder removed when dropped.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Spawn `iterations` children from one template; p50/p99 in milliseconds.
pub fn run(iterations: usize) -> anyhow::Result<Value> {
    let dir = Scratch(std::env::temp_dir().join(format!("adf-bench-spawn-{}-{}", std::process::id(), nanoid(8))));
    std::fs::create_dir_all(&dir.0)?;
    let src = dir.0.join("source.adf");
    create_file(&src, &NewAgent { name: Some("Bench source"), ..Default::default() })?;
    let template = dir.0.join("template.adf");
    derive::save_template(&src, &template, &["model.model_id".to_string()])?;
    let children = dir.0.join("children");
    std::fs::create_dir_all(&children)?;
    let mut ms = Vec::with_capacity(iterations);
    for i in 0..iterations.max(1) {
        let dst = children.join(format!("child-{i}.adf"));
        let name = format!("child {i}");
        let started = Instant::now();
        let tpl = Template::load(&template)?;
        let spec = ChildSpec {
            new: NewAgent { name: Some(&name), ..Default::default() },
            template: Some(&tpl),
            parent_did: Some("did:key:bench".into()),
            ..Default::default()
        };
        derive::create_child(&dst, &spec)?;
        ms.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    ms.sort_by(f64::total_cmp);
    let p50 = percentile(&ms, 0.50);
    Ok(json!({
        "suite": "spawn",
        "what": "child agent file from a template (load template, create child)",
        "iterations": ms.len(),
        "p50_ms": p50,
        "p99_ms": percentile(&ms, 0.99),
        "max_ms": ms.last().copied().unwrap_or(0.0),
        "target_p50_ms": 30,
        "within_target": p50 < 30.0,
        "release": !cfg!(debug_assertions),
    }))
}

#[cfg(test)]
mod tests {
    #[test]
    fn spawning_from_a_template_is_measured_and_cleaned_up() {
        let v = super::run(3).unwrap();
        assert_eq!(v["iterations"], 3);
        assert!(v["p50_ms"].as_f64().unwrap() > 0.0);
        assert!(v["p99_ms"].as_f64().unwrap() >= v["p50_ms"].as_f64().unwrap());
        eprintln!("spawn bench (debug build): {v}");
    }
}
