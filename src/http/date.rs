//! The `Date` of the answers the gateway makes itself (errors, refusals, the admin
//! listener's), from the wall clock when the answer is made.
//!
//! hyper adds a `Date` to an answer without one, from a per-thread cache that it renews only
//! once the clock is past the second it last wrote: after the wall clock steps back, each
//! worker kept its old value for as long as the step (audit KD 2: an hour ahead for an hour,
//! and back and forth by an hour from one answer to the next). One set here is left alone by
//! hyper. It is made once per answer head, never per chunk: a second's text, ~30 bytes.

use std::time::SystemTime;

use http::{header, HeaderMap, HeaderValue};

/// The current second as an HTTP-date (RFC 9110 5.6.7).
pub fn now() -> HeaderValue {
    let text = httpdate::fmt_http_date(SystemTime::now());
    HeaderValue::from_str(&text).expect("an IMF-fixdate is visible ASCII")
}

/// Dates an answer that has no `Date`: one the gateway made, or an upstream's that came
/// without (which a recipient with a clock dates when it forwards it, RFC 9110 6.6.1). An
/// upstream's own `Date` stays.
pub fn insert_if_missing(headers: &mut HeaderMap) {
    if !headers.contains_key(header::DATE) {
        headers.insert(header::DATE, now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// The date is the wall clock's second when the answer is made, not a cached one.
    #[test]
    fn an_answer_is_dated_now_unless_it_has_a_date() {
        let before = SystemTime::now() - Duration::from_secs(1);
        let mut headers = HeaderMap::new();
        insert_if_missing(&mut headers);
        let after = SystemTime::now();
        let date = httpdate::parse_http_date(headers[header::DATE].to_str().unwrap()).unwrap();
        assert!(
            before <= date && date <= after,
            "{:?}",
            headers[header::DATE]
        );
        let upstream = HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT");
        let mut headers = HeaderMap::new();
        headers.insert(header::DATE, upstream.clone());
        insert_if_missing(&mut headers);
        assert_eq!(headers[header::DATE], upstream, "the upstream's stays");
    }
}
