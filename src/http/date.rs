//! The `Date` of the answers the gateway makes itself (errors, refusals, the admin
//! listener's), from the wall clock when the answer is made.
//!
//! hyper adds a `Date` to an answer without one, from a per-thread cache that it renews only
//! once the clock is past the second it last wrote: after the wall clock steps back, each
//! worker kept its old value for as long as the step (audit KD 2: an hour ahead for an hour,
//! and back and forth by an hour from one answer to the next). One set here is left alone by
//! hyper. It is made once per answer head, never per chunk: a second's text, ~30 bytes.
//!
//! A clock before 1970 or past 9999 has no HTTP-date: then no `Date` is sent, rather than
//! the panic that formatting it is (audit WD 4; docs/deployment.md, "The wall clock").

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use http::{header, HeaderMap, HeaderValue};

/// The first second an IMF-fixdate cannot write: year 10000.
const YEAR_10000: Duration = Duration::from_secs(253_402_300_800);

/// The current second as an HTTP-date (RFC 9110 5.6.7); `None` when the wall clock is set
/// before 1970 or past 9999, where no HTTP-date exists (logged once: the clock is wrong).
pub fn now() -> Option<HeaderValue> {
    let date = at(SystemTime::now());
    if date.is_none() && !CLOCK_WARNED.swap(true, Ordering::Relaxed) {
        tracing::warn!(
            "the wall clock is before 1970 or past 9999: answers the gateway makes carry no \
             Date, and hyper's HTTP/1 connections fail (set the clock, NTP)"
        );
    }
    date
}

/// The wall clock was found without an HTTP-date, and said so.
static CLOCK_WARNED: AtomicBool = AtomicBool::new(false);

/// `t` as an HTTP-date, if it has one. `httpdate` panics outside 1970-9999, which took down
/// every answer the gateway made itself with a clock set before 1970 (audit WD 4). A
/// recipient without a reliable clock sends no Date (RFC 9110 6.6.1), so none is sent.
fn at(t: SystemTime) -> Option<HeaderValue> {
    let since = t.duration_since(SystemTime::UNIX_EPOCH).ok()?;
    if since >= YEAR_10000 {
        return None;
    }
    let text = httpdate::fmt_http_date(t);
    Some(HeaderValue::from_str(&text).expect("an IMF-fixdate is visible ASCII"))
}

/// Dates an answer that has no `Date`: one the gateway made, or an upstream's that came
/// without (which a recipient with a clock dates when it forwards it, RFC 9110 6.6.1). An
/// upstream's own `Date` stays.
pub fn insert_if_missing(headers: &mut HeaderMap) {
    if !headers.contains_key(header::DATE) {
        if let Some(date) = now() {
            headers.insert(header::DATE, date);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    /// Audit WD 4: a wall clock before 1970 (or past 9999) has no IMF-fixdate, and the
    /// formatting panicked: every answer the gateway made itself died with its handler.
    #[test]
    fn a_clock_with_no_http_date_dates_nothing() {
        let before = SystemTime::UNIX_EPOCH - Duration::from_secs(3600);
        assert_eq!(at(before), None);
        let after = SystemTime::UNIX_EPOCH + YEAR_10000;
        assert_eq!(at(after), None);
        assert_eq!(
            at(SystemTime::UNIX_EPOCH).unwrap(),
            "Thu, 01 Jan 1970 00:00:00 GMT"
        );
        let last = SystemTime::UNIX_EPOCH + YEAR_10000 - Duration::from_secs(1);
        assert_eq!(at(last).unwrap(), "Fri, 31 Dec 9999 23:59:59 GMT");
    }
}
