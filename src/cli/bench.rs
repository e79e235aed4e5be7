//! `adf bench store`: medians of the store's hot paths on real files in a
//! temporary folder. A benchmark, not a test: machines here are shared, so
//! figures are reported, never asserted.

use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::json;

use super::output::Out;
use crate::store::create::{NewAgent, create_file};
use crate::store::files::WriteOptions;
use crate::store::loop_rows::NewLoopRow;
use crate::store::{Caller, Store};

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum Suite {
    Store,
}

#[derive(Debug, Serialize)]
struct Figure {
    name: &'static str,
    samples: usize,
    median_us: f64,
    p90_us: f64,
    target_us: f64,
    reference_us: Option<f64>,
}

fn measure(n: usize, mut f: impl FnMut(usize) -> anyhow::Result<()>) -> anyhow::Result<(f64, f64)> {
    let mut t: Vec<Duration> = Vec::with_capacity(n);
    for i in 0..n {
        let start = Instant::now();
        f(i)?;
        t.push(start.elapsed());
    }
    t.sort();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    Ok((us(t[n / 2]), us(t[(n * 9 / 10).min(n - 1)])))
}

pub fn run(out: &Out, suite: Suite, iterations: usize) -> anyhow::Result<()> {
    let Suite::Store = suite;
    let n = iterations.max(5);
    let dir = tempfile_dir()?;
    let mut figures = Vec::new();

    let (m, p) = measure(n, |i| {
        create_file(&dir.join(format!("c{i}.adf")), &NewAgent::default())?;
        Ok(())
    })?;
    figures.push(Figure {
        name: "create a new agent",
        samples: n,
        median_us: m,
        p90_us: p,
        target_us: 15_000.0,
        reference_us: Some(261_000.0),
    });

    let agent = dir.join("c0.adf");
    let (m, p) = measure(n, |_| {
        Store::open(&agent)?.close()?;
        Ok(())
    })?;
    figures.push(Figure {
        name: "open+close an agent file",
        samples: n,
        median_us: m,
        p90_us: p,
        target_us: 2_000.0,
        reference_us: Some(35_000.0),
    });

    let (m, p) = measure(n, |i| {
        let mut s = Store::open(&agent)?;
        s.meta_set(Caller::AGENT, "bench", &i.to_string(), None)?;
        s.close()?;
        Ok(())
    })?;
    figures.push(Figure {
        name: "open, write a meta key, close",
        samples: n,
        median_us: m,
        p90_us: p,
        target_us: 5_000.0,
        reference_us: None,
    });

    let mut store = Store::open(&agent)?;
    let content = vec![b'x'; 4096];
    let (m, p) = measure(n, |i| {
        store.file_write(Caller::AGENT, &format!("bench/{}.txt", i % 16), &content, &WriteOptions::default())?;
        Ok(())
    })?;
    figures.push(Figure {
        name: "write a 4 KiB file",
        samples: n,
        median_us: m,
        p90_us: p,
        target_us: 1_000.0,
        reference_us: None,
    });

    let row = json!([{"type": "text", "text": "The quick brown fox jumps over the lazy dog."}]);
    let (m, p) = measure(n * 5, |_| {
        store.loop_append(&NewLoopRow { role: "user", content: &row, model: None, tokens: None, ord: None })?;
        Ok(())
    })?;
    figures.push(Figure {
        name: "append a loop row (WAL)",
        samples: n * 5,
        median_us: m,
        p90_us: p,
        target_us: 100.0,
        reference_us: None,
    });
    store.close()?;
    let _ = std::fs::remove_dir_all(&dir);

    if out.json {
        return out.json(&figures);
    }
    let rows: Vec<Vec<String>> = figures
        .iter()
        .map(|f| {
            vec![
                f.name.to_string(),
                fmt(f.median_us),
                fmt(f.p90_us),
                format!("< {}", fmt(f.target_us)),
                f.reference_us.map(fmt).unwrap_or_else(|| "-".into()),
            ]
        })
        .collect();
    out.table(&["STORE", "MEDIAN", "P90", "TARGET", "REFERENCE"], &rows)
}

fn fmt(us: f64) -> String {
    if us >= 1000.0 { format!("{:.2} ms", us / 1000.0) } else { format!("{us:.1} µs") }
}

fn tempfile_dir() -> anyhow::Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("adf-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}
