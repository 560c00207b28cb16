//! The `[prices."<model prefix>"]` tables: what a million tokens of each
//! kind cost for the models whose name starts with the prefix (the longest
//! matching prefix wins), and the bounded model-family label of the
//! billing metrics.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::config::PriceConfig;

/// Model families every configuration labels, besides its price prefixes:
/// the common model lines of the APIs the proxy serves.
pub const BUILT_IN_FAMILIES: [&str; 17] = [
    "gpt-5",
    "gpt-4.1",
    "gpt-4o",
    "gpt-4",
    "gpt-3.5",
    "o1",
    "o3",
    "o4",
    "claude-opus",
    "claude-sonnet",
    "claude-haiku",
    "claude",
    "gemini",
    "llama",
    "mistral",
    "deepseek",
    "qwen",
];

/// The family label of a model no family prefix matches, or of a response
/// that named none.
pub const OTHER_FAMILY: &str = "other";

/// One model prefix's prices, per million tokens.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Price {
    pub uncached: f64,
    pub cache_read: f64,
    pub cache_write: f64,
    /// One-hour cache writes (Anthropic); five-minute ones cost `cache_write`.
    pub cache_write_1h: f64,
    pub output: f64,
}

impl Price {
    /// What `usage` costs at these prices.
    pub fn cost(&self, usage: &super::Usage) -> f64 {
        let write_5m = usage.cache_write - usage.cache_write_1h.min(usage.cache_write);
        (self.uncached * usage.uncached_input as f64
            + self.cache_read * usage.cache_read as f64
            + self.cache_write * write_5m as f64
            + self.cache_write_1h * usage.cache_write_1h.min(usage.cache_write) as f64
            + self.output * usage.output as f64)
            / 1e6
    }
}

/// The compiled price table and family labels of one configuration.
#[derive(Debug, Clone)]
pub struct Prices {
    /// By prefix, longest first.
    table: Vec<(String, Price)>,
    /// Family labels, longest first.
    families: Vec<Arc<str>>,
    other: Arc<str>,
    /// The currency the prices are in (one for the whole table).
    pub currency: String,
}

impl Default for Prices {
    fn default() -> Self {
        Prices::compile(&BTreeMap::new()).expect("an empty table is valid")
    }
}

impl Prices {
    /// Checks and compiles the `[prices]` tables; every problem at once,
    /// as (key path, message).
    pub fn compile(
        config: &BTreeMap<String, PriceConfig>,
    ) -> Result<Prices, Vec<(String, String)>> {
        let mut problems = Vec::new();
        let mut table = Vec::new();
        let mut currency: Option<(&str, &str)> = None;
        for (prefix, p) in config {
            let path = |key: &str| format!("prices.{prefix:?}.{key}");
            if prefix.is_empty() {
                problems.push((
                    "prices".into(),
                    "a model prefix must not be empty".to_owned(),
                ));
            }
            let mut amount =
                |key: &str, value: Option<f64>, default: Option<f64>| match value.or(default) {
                    Some(v) if v.is_finite() && v >= 0.0 => v,
                    Some(_) => {
                        problems.push((path(key), "must be a non-negative number".into()));
                        0.0
                    }
                    None => {
                        problems.push((
                            path(key),
                            "is required: the price per million tokens".into(),
                        ));
                        0.0
                    }
                };
            let uncached = amount("uncached", p.uncached, None);
            let output = amount("output", p.output, None);
            let cache_read = amount("cache_read", p.cache_read, Some(uncached));
            let cache_write = amount("cache_write", p.cache_write, Some(uncached));
            let cache_write_1h = amount("cache_write_1h", p.cache_write_1h, Some(cache_write));
            let unit = p.currency.as_deref().unwrap_or("USD");
            match currency {
                None => currency = Some((prefix, unit)),
                Some((first, theirs)) if theirs != unit => problems.push((
                    path("currency"),
                    format!(
                        "is {unit:?} but prices.{first:?} is in {theirs:?}: one cost counter adds them, so every table needs the same currency"
                    ),
                )),
                Some(_) => {}
            }
            table.push((
                prefix.clone(),
                Price {
                    uncached,
                    cache_read,
                    cache_write,
                    cache_write_1h,
                    output,
                },
            ));
        }
        if !problems.is_empty() {
            return Err(problems);
        }
        table.sort_by_key(|(prefix, _)| std::cmp::Reverse(prefix.len()));
        let mut families: Vec<Arc<str>> = BUILT_IN_FAMILIES
            .iter()
            .map(|f| Arc::from(*f))
            .chain(table.iter().map(|(p, _)| Arc::from(p.as_str())))
            .collect();
        families.sort_by(|a, b| b.len().cmp(&a.len()).then(a.cmp(b)));
        families.dedup();
        Ok(Prices {
            table,
            families,
            other: OTHER_FAMILY.into(),
            currency: currency.map_or("USD", |(_, c)| c).to_owned(),
        })
    }

    /// Whether any price is configured (without one no cost is computed).
    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    /// The price of `model`: the longest matching prefix's.
    pub fn price(&self, model: Option<&str>) -> Option<&Price> {
        let model = model?;
        self.table
            .iter()
            .find(|(prefix, _)| model.starts_with(prefix.as_str()))
            .map(|(_, p)| p)
    }

    /// The bounded family label of `model`.
    pub fn family(&self, model: Option<&str>) -> Arc<str> {
        model
            .and_then(|m| self.families.iter().find(|f| m.starts_with(&***f)))
            .unwrap_or(&self.other)
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(entries: &[(&str, PriceConfig)]) -> BTreeMap<String, PriceConfig> {
        entries
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect()
    }

    fn price(uncached: f64, output: f64) -> PriceConfig {
        PriceConfig {
            uncached: Some(uncached),
            output: Some(output),
            ..PriceConfig::default()
        }
    }

    #[test]
    fn the_longest_prefix_wins_and_defaults_fill_in() {
        let prices = Prices::compile(&config(&[
            ("gpt-4o", price(2.5, 10.0)),
            (
                "gpt-4o-mini",
                PriceConfig {
                    cache_read: Some(0.075),
                    ..price(0.15, 0.6)
                },
            ),
        ]))
        .unwrap();
        let mini = prices.price(Some("gpt-4o-mini-2024-07-18")).unwrap();
        assert_eq!(
            (mini.uncached, mini.cache_read, mini.cache_write),
            (0.15, 0.075, 0.15)
        );
        assert_eq!(
            prices.price(Some("gpt-4o-2024-08-06")).unwrap().uncached,
            2.5
        );
        assert_eq!(prices.price(Some("claude-sonnet-4-5")), None);
        assert_eq!(&*prices.family(Some("gpt-4o-mini-2024")), "gpt-4o-mini");
        assert_eq!(&*prices.family(Some("claude-sonnet-4-5")), "claude-sonnet");
        assert_eq!(&*prices.family(Some("my-finetune")), "other");
        assert_eq!(&*prices.family(None), "other");
    }

    #[test]
    fn every_problem_is_reported_with_its_path() {
        let problems = Prices::compile(&config(&[
            ("a", PriceConfig::default()),
            (
                "b",
                PriceConfig {
                    cache_read: Some(-1.0),
                    currency: Some("EUR".into()),
                    ..price(1.0, 1.0)
                },
            ),
        ]))
        .unwrap_err();
        let paths: Vec<&str> = problems.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(
            paths,
            [
                "prices.\"a\".uncached",
                "prices.\"a\".output",
                "prices.\"b\".cache_read",
                "prices.\"b\".currency"
            ]
        );
    }

    #[test]
    fn one_hour_writes_cost_their_own_price() {
        let p = Price {
            uncached: 3.0,
            cache_read: 0.3,
            cache_write: 3.75,
            cache_write_1h: 6.0,
            output: 15.0,
        };
        let usage = super::super::Usage {
            uncached_input: 1_000_000,
            cache_read: 1_000_000,
            cache_write: 2_000_000,
            cache_write_1h: 1_000_000,
            output: 100_000,
            ..Default::default()
        };
        let cost = p.cost(&usage);
        assert!(
            (cost - (3.0 + 0.3 + 3.75 + 6.0 + 1.5)).abs() < 1e-9,
            "{cost}"
        );
    }
}
