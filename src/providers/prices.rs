//! What model calls cost, where the price is known: the owner's price list
//! in `settings.json` (`prices: {"<model>": {"input": …, "output": …,
//! "cache_read": …, "cache_write": …}}`, US dollars per million tokens).
//! adf ships no price table of its own: prices change, and a guess would be
//! worse than no figure.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::Usage;

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Price {
    pub input: f64,
    pub output: f64,
    #[serde(default)]
    pub cache_read: Option<f64>,
    #[serde(default)]
    pub cache_write: Option<f64>,
}

pub type Prices = BTreeMap<String, Price>;

/// Where a cost came from.
pub const SOURCE: &str = "settings.json prices";

/// The owner's price list (empty when there is none).
pub fn from_settings(s: &super::accounts::Settings) -> Prices {
    s.extra.get("prices").and_then(|v| serde_json::from_value(v.clone()).ok()).unwrap_or_default()
}

/// The cost of one call, if the model has a price.
pub fn cost(prices: &Prices, model: &str, u: &Usage) -> Option<f64> {
    let p = prices.get(model)?;
    let m = 1_000_000.0;
    let cached = u.cache_read.unwrap_or(0) as f64;
    let written = u.cache_write.unwrap_or(0) as f64;
    Some(
        (u.input as f64) * p.input / m
            + (u.output as f64) * p.output / m
            + cached * p.cache_read.unwrap_or(p.input) / m
            + written * p.cache_write.unwrap_or(p.input) / m,
    )
}

/// Where a provider-reported cost came from.
pub const PROVIDER: &str = "provider";

/// What a call cost and where the figure came from: the provider's own
/// report first, then the owner's price list; `None` when neither knows.
pub fn priced(prices: &Prices, model: &str, u: &Usage) -> Option<(f64, &'static str)> {
    if let Some(c) = u.cost {
        return Some((c, PROVIDER));
    }
    cost(prices, model, u).map(|c| (c, SOURCE))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn costs() {
        let mut prices = Prices::new();
        prices.insert("m".into(), Price { input: 3.0, output: 15.0, cache_read: Some(0.3), cache_write: None });
        let u = Usage { input: 1_000_000, output: 100_000, cache_read: Some(1_000_000), ..Default::default() };
        let c = cost(&prices, "m", &u).unwrap();
        assert!((c - (3.0 + 1.5 + 0.3)).abs() < 1e-9);
        assert_eq!(cost(&prices, "other", &u), None);
    }
}
