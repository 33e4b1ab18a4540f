//! The arithmetic of spending one budget on several attempts: what an attempt on an upstream
//! is expected to cost (a learned time-to-first-token estimate), how long to back off before
//! a retry, what a `Retry-After` asks for, and the rewrite of the body's `model`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::HeaderMap;

/// A per-upstream estimate of time to first token: a decaying high quantile of recent
/// observations. It rises quickly towards a slow observation and sinks slowly after fast
/// ones (an asymmetric moving average whose equilibrium sits near the 90th percentile), so
/// one lucky answer does not make a slow upstream look cheap. Seeded from the upstream's
/// `expected_first_token`; zero (unknown) until then, which lets every attempt through.
#[derive(Debug, Default)]
pub struct TtftEstimate {
    /// Seconds as `f64` bits. Updates race benignly: an estimate, not an account.
    bits: AtomicU64,
}

const RISE: f64 = 0.3;
const SINK: f64 = 0.03;

impl TtftEstimate {
    pub fn new(seed: Option<Duration>) -> Self {
        let s = Self::default();
        if let Some(d) = seed {
            s.set(d.as_secs_f64());
        }
        s
    }

    fn set(&self, secs: f64) {
        self.bits.store(secs.to_bits(), Ordering::Relaxed);
    }

    fn secs(&self) -> f64 {
        f64::from_bits(self.bits.load(Ordering::Relaxed))
    }

    pub fn get(&self) -> Duration {
        Duration::from_secs_f64(self.secs().max(0.0))
    }

    /// One observed time to first token (or a lower bound of it, when the limit fired first).
    pub fn observe(&self, d: Duration) {
        let x = d.as_secs_f64();
        let q = self.secs();
        let next = if q <= 0.0 {
            x
        } else if x > q {
            q + RISE * (x - q)
        } else {
            q + SINK * (x - q)
        };
        self.set(next);
    }
}

/// Exponential backoff with jitter before retry `n` (1-based) on the same upstream: 100 ms,
/// 200 ms, 400 ms ... capped at 2 s, each scaled by a random factor in [0.5, 1) so that
/// clients failing together do not retry together.
pub fn backoff(n: u32) -> Duration {
    let base = Duration::from_millis(100) * 2u32.saturating_pow(n.saturating_sub(1).min(5));
    base.min(Duration::from_secs(2))
        .mul_f64(0.5 + fastrand::f64() * 0.5)
}

/// What the upstream asked us to wait before trying again: OpenAI's `retry-after-ms`, or
/// `retry-after` in seconds. (The HTTP-date form is ignored: providers send seconds.)
pub fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let get = |name: &str| headers.get(name)?.to_str().ok()?.trim().parse::<f64>().ok();
    let d = get("retry-after-ms")
        .map(|ms| ms / 1000.0)
        .or_else(|| get("retry-after"))?;
    (d.is_finite() && (0.0..86_400.0).contains(&d)).then(|| Duration::from_secs_f64(d))
}

/// The body with its top-level `model` replaced by `model`, every other byte untouched.
/// `None` when the body is not a JSON object with a string `model` (then nothing is
/// rewritten and the body is forwarded as the client sent it).
pub fn rewrite_model(body: &Bytes, model: &str) -> Option<Bytes> {
    use serde_json::value::RawValue;
    use std::collections::HashMap;
    let fields: HashMap<&str, &RawValue> = serde_json::from_slice(body).ok()?;
    let raw = fields.get("model")?;
    if !raw.get().starts_with('"') {
        return None;
    }
    // The raw value borrows from `body`, so its position is its offset in the buffer.
    let start = raw.get().as_ptr() as usize - body.as_ptr() as usize;
    let end = start + raw.get().len();
    let quoted = serde_json::to_string(model).ok()?;
    let mut out = Vec::with_capacity(body.len() + quoted.len());
    out.extend_from_slice(&body[..start]);
    out.extend_from_slice(quoted.as_bytes());
    out.extend_from_slice(&body[end..]);
    Some(Bytes::from(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn estimate_is_seeded_then_tracks_a_high_quantile() {
        let e = TtftEstimate::new(None);
        assert_eq!(e.get(), Duration::ZERO);
        e.observe(ms(200));
        assert_eq!(e.get(), ms(200));
        // Mostly 100 ms with one in ten at 1 s: the estimate settles well above the median.
        for i in 0..2000 {
            e.observe(if i % 10 == 0 { ms(1000) } else { ms(100) });
        }
        let q = e.get();
        assert!(q > ms(300) && q < ms(1000), "{q:?}");
        let seeded = TtftEstimate::new(Some(ms(1500)));
        assert_eq!(seeded.get(), ms(1500));
        seeded.observe(ms(100));
        assert!(
            seeded.get() < ms(1500) && seeded.get() > ms(1400),
            "sinks slowly"
        );
        seeded.observe(ms(5000));
        assert!(seeded.get() > ms(2500), "rises fast");
    }

    #[test]
    fn backoff_grows_with_jitter_and_a_cap() {
        for _ in 0..100 {
            let b1 = backoff(1);
            assert!(b1 >= ms(50) && b1 < ms(100), "{b1:?}");
            let b3 = backoff(3);
            assert!(b3 >= ms(200) && b3 < ms(400), "{b3:?}");
            assert!(backoff(30) <= Duration::from_secs(2));
        }
    }

    #[test]
    fn retry_after_forms() {
        let mut h = HeaderMap::new();
        assert_eq!(retry_after(&h), None);
        h.insert("retry-after", "2".parse().unwrap());
        assert_eq!(retry_after(&h), Some(Duration::from_secs(2)));
        h.insert("retry-after-ms", "350".parse().unwrap());
        assert_eq!(retry_after(&h), Some(ms(350)));
        let mut h = HeaderMap::new();
        h.insert(
            "retry-after",
            "Wed, 21 Oct 2026 07:28:00 GMT".parse().unwrap(),
        );
        assert_eq!(retry_after(&h), None);
    }

    #[test]
    fn model_rewrite_touches_nothing_else() {
        let body = Bytes::from_static(
            br#"{ "messages":[{"role":"user","content":"model: keep \"me\""}],  "model" : "gpt-big", "stream":true }"#,
        );
        let out = rewrite_model(&body, "gpt-small").unwrap();
        assert_eq!(
            &out[..],
            br#"{ "messages":[{"role":"user","content":"model: keep \"me\""}],  "model" : "gpt-small", "stream":true }"#
        );
        // Escaping is done for the new name.
        let out = rewrite_model(&body, "a\"b").unwrap();
        assert!(std::str::from_utf8(&out)
            .unwrap()
            .contains(r#""model" : "a\"b""#));
        assert!(rewrite_model(&Bytes::from_static(b"not json"), "m").is_none());
        assert!(rewrite_model(&Bytes::from_static(br#"{"model":7}"#), "m").is_none());
        assert!(rewrite_model(&Bytes::from_static(br#"{"x":1}"#), "m").is_none());
    }
}
