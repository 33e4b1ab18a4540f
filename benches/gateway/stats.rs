//! Percentiles and CDFs of latency samples (nanoseconds).

use serde_json::{json, Value};

/// Nearest-rank percentile of sorted samples; 0 when there are none.
pub fn pct(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

pub fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

/// A summary of samples in ms: count, p50, p90, p99, p99.9, max, mean.
pub fn summary(sorted: &[u64]) -> Value {
    let mean = if sorted.is_empty() {
        0.0
    } else {
        sorted.iter().map(|&v| v as f64).sum::<f64>() / sorted.len() as f64 / 1e6
    };
    json!({
        "count": sorted.len(),
        "p50_ms": ms(pct(sorted, 50.0)),
        "p90_ms": ms(pct(sorted, 90.0)),
        "p99_ms": ms(pct(sorted, 99.0)),
        "p999_ms": ms(pct(sorted, 99.9)),
        "max_ms": ms(sorted.last().copied().unwrap_or(0)),
        "mean_ms": mean,
    })
}

/// A compact CDF for plotting: `[value_ms, quantile]` at evenly spaced quantiles plus a
/// denser tail, so the committed JSON stays small whatever the sample count.
pub fn cdf(sorted: &[u64]) -> Value {
    if sorted.is_empty() {
        return json!([]);
    }
    let mut qs: Vec<f64> = (0..=100).map(|i| i as f64 / 100.0).collect();
    qs.extend((1..10).map(|i| 0.99 + i as f64 / 1000.0));
    qs.extend([0.9995, 0.9999]);
    qs.sort_by(f64::total_cmp);
    qs.dedup();
    let points: Vec<Value> = qs
        .into_iter()
        .map(|q| {
            let v = if q <= 0.0 {
                sorted[0]
            } else {
                pct(sorted, q * 100.0)
            };
            // 0.1 µs and 4 digits of quantile are plenty for a plot, and keep the JSON small.
            json!([(ms(v) * 1e4).round() / 1e4, (q * 1e4).round() / 1e4])
        })
        .collect();
    Value::Array(points)
}

/// Pretty JSON whose arrays of numbers (CDF points) stay on one line each.
pub fn to_json_text(v: &Value) -> String {
    let mut out = String::new();
    write_value(v, 0, &mut out);
    out.push('\n');
    out
}

fn write_value(v: &Value, indent: usize, out: &mut String) {
    let flat = |v: &Value| !matches!(v, Value::Array(_) | Value::Object(_));
    let pad = |n: usize| "  ".repeat(n);
    match v {
        Value::Object(map) if !map.is_empty() => {
            out.push_str("{\n");
            for (i, (k, val)) in map.iter().enumerate() {
                out.push_str(&pad(indent + 1));
                out.push_str(&Value::String(k.clone()).to_string());
                out.push_str(": ");
                write_value(val, indent + 1, out);
                if i + 1 < map.len() {
                    out.push(',');
                }
                out.push('\n');
            }
            out.push_str(&pad(indent));
            out.push('}');
        }
        Value::Array(items)
            if items.iter().all(|i| match i {
                Value::Array(inner) => inner.iter().all(flat),
                other => flat(other),
            }) =>
        {
            out.push_str(&v.to_string());
        }
        Value::Array(items) => {
            out.push_str("[\n");
            for (i, item) in items.iter().enumerate() {
                out.push_str(&pad(indent + 1));
                write_value(item, indent + 1, out);
                if i + 1 < items.len() {
                    out.push(',');
                }
                out.push('\n');
            }
            out.push_str(&pad(indent));
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}
