//! Percentiles, the printed table and the JSON file.

use serde_json::{Value, json};

/// p50/p90/p99/max/mean of samples in milliseconds (nearest-rank percentiles).
#[derive(Clone, Copy, Debug, Default)]
pub struct Summary {
    pub n: usize,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
    pub mean: f64,
}

impl Summary {
    pub fn of_seconds(samples: &[f64]) -> Self {
        let mut ms: Vec<f64> = samples.iter().map(|s| s * 1000.0).collect();
        ms.sort_by(f64::total_cmp);
        if ms.is_empty() {
            return Self::default();
        }
        let rank = |p: f64| ms[((p * ms.len() as f64).ceil() as usize).clamp(1, ms.len()) - 1];
        Summary {
            n: ms.len(),
            p50: rank(0.50),
            p90: rank(0.90),
            p99: rank(0.99),
            max: ms[ms.len() - 1],
            mean: ms.iter().sum::<f64>() / ms.len() as f64,
        }
    }

    pub fn to_json(self) -> Value {
        json!({"n": self.n, "p50_ms": round(self.p50), "p90_ms": round(self.p90),
               "p99_ms": round(self.p99), "max_ms": round(self.max), "mean_ms": round(self.mean)})
    }

    pub fn line(&self) -> String {
        if self.n == 0 {
            return "no samples".into();
        }
        format!(
            "p50 {:>7.1} ms  p90 {:>7.1} ms  p99 {:>7.1} ms  max {:>7.1} ms  (n={})",
            self.p50, self.p90, self.p99, self.max, self.n
        )
    }
}

pub fn round(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

/// Rows printed at the end, grouped under section titles.
#[derive(Default)]
pub struct Table {
    rows: Vec<(String, String)>,
}

impl Table {
    pub fn section(&mut self, title: &str) {
        println!("== {title}");
        self.rows.push((format!("== {title}"), String::new()));
    }

    pub fn row(&mut self, what: impl Into<String>, value: impl Into<String>) {
        let (what, value) = (what.into(), value.into());
        println!("  {what:<58} {value}");
        self.rows.push((what, value));
    }

    pub fn print(&self) {
        println!("\n================ tekton-mutex benchmark ================");
        for (what, value) in &self.rows {
            if what.starts_with("==") {
                println!("{what}");
            } else {
                println!("  {what:<58} {value}");
            }
        }
    }
}
