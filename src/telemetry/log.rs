//! The one log line per request (target `hourglass::request`), and its access-log form when
//! that format is on. Plain data in, so that the log knows nothing of the request path.

use std::cell::RefCell;
use std::fmt;
use std::io::Write;
use std::sync::OnceLock;
use std::time::Duration;

use http::Method;
use tracing::level_filters::LevelFilter;

use crate::telemetry::access::{ClientInfo, Line};
use crate::telemetry::json::{escaped, f64_value, timestamp};
use crate::telemetry::writer::LogWriter;

/// Where `--log-format json` sends request lines written without `tracing` (see `emit`).
static JSON_LINES: OnceLock<LogWriter> = OnceLock::new();

/// Request lines are written in the JSON format straight to `writer`, the one `tracing`'s
/// JSON formatter writes to, rather than as `tracing` events.
pub fn write_json_lines_to(writer: LogWriter) {
    let _ = JSON_LINES.set(writer);
}

/// Everything the line says about one request.
pub struct RequestLog<'a> {
    pub request_id: &'a str,
    /// The run the request is a call of.
    pub run_id: Option<&'a str>,
    /// `unenforced` when the call was served without its run's limits (the run store could
    /// not answer and `on_store_error = "allow"`).
    pub run_limits: Option<&'static str>,
    pub method: &'a Method,
    /// The path alone: a query string may carry a key (`?key=` is how Gemini takes one).
    pub path: &'a str,
    /// The client key the route accepted, as the start of its digest (never the key).
    pub client_key: Option<[u8; 8]>,
    /// That key's name in the route's key file, if it has one (the line's `client`).
    pub client_name: Option<&'a str>,
    /// The subject of the certificate the client presented to a listener with `client_ca`,
    /// at most `CERT_MAX` bytes of it.
    pub client_cert: Option<&'a str>,
    pub route: Option<&'a str>,
    pub upstream: Option<&'a str>,
    /// The model the upstream was asked for (the client's, unless the upstream sets its own),
    /// at most `MODEL_MAX` bytes of it.
    pub model: Option<&'a str>,
    pub budget: Option<Duration>,
    pub budget_source: Option<&'static str>,
    pub budget_clamped: Option<bool>,
    pub elapsed: Duration,
    pub margin: Option<Duration>,
    pub ttfb: Option<Duration>,
    pub ttft: Option<Duration>,
    pub prompt_tokens: Option<u64>,
    /// With where the count came from (`reported` or `estimated`).
    pub completion_tokens: Option<(u64, &'static str)>,
    pub stream_error: Option<&'static str>,
    pub bytes: u64,
    /// The bytes of the client's body: the access line's size.
    pub body_bytes: u64,
    pub status: Option<u16>,
    pub outcome: &'static str,
    pub origin: Option<&'static str>,
    pub code: Option<&'static str>,
    /// The message the client was sent with `code`, at most `ERROR_MAX` bytes of it.
    pub error: Option<&'a str>,
    /// Every attempt, in order, when there was more than one.
    pub attempts: Option<&'a str>,
    /// The upstreams of the route's chain passed over as out of rotation.
    pub passed_over: Option<&'a str>,
    /// The extra attempts not made to spare an upstream (`retry_budget`, ...).
    pub throttled: Option<&'a str>,
    /// Who asked: only kept when the access log is on.
    pub client: Option<&'a ClientInfo>,
}

/// The most of a model's name the line carries: the name comes from the client's body, and
/// no real one is near this long.
pub const MODEL_MAX: usize = 200;

/// The most of a request's path the line carries: the path is the client's, and a real one
/// is far shorter (its query string is never logged).
pub const PATH_MAX: usize = 1000;

/// The most of the client's `User-Agent` and `Referer` an access line carries.
pub const HEADER_MAX: usize = 500;

/// The most of a certificate's subject the line carries.
pub const CERT_MAX: usize = 300;

/// A key's digest prefix in lowercase hex, as `sha256sum` prints it.
pub fn key_hex(id: &[u8; 8]) -> [u8; 16] {
    let mut out = [0u8; 16];
    crate::http::headers::hex_into(id, &mut out);
    out
}

/// The most of an error's message the line carries: a message may quote what the client
/// sent.
pub const ERROR_MAX: usize = 500;

/// `text`, cut to at most `max` bytes at a character's boundary.
pub fn clipped(text: &str, max: usize) -> &str {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// What marks a path the line carries cut.
pub const CLIPPED: &str = "…";

/// A request's path as the line carries it when it is longer than `PATH_MAX` (none when it
/// fits): cut, never inside a `%XX` triplet (a dangling `%E2%82%` read as whole), and marked
/// `CLIPPED`, so that a reader knows it is not all the client sent (audit EB F7).
pub fn clipped_path(path: &str) -> Option<String> {
    if path.len() <= PATH_MAX {
        return None;
    }
    let cut = clipped(path, PATH_MAX - CLIPPED.len());
    let bytes = cut.as_bytes();
    let back = bytes
        .iter()
        .rev()
        .take(2)
        .position(|&b| b == b'%')
        .map_or(0, |i| i + 1);
    let mut out = String::with_capacity(PATH_MAX);
    out.push_str(&cut[..cut.len() - back]);
    out.push_str(CLIPPED);
    Some(out)
}

/// Whole microseconds: the nearest double to a three-decimal number prints as just that in
/// the text format ("6826.474", not "6826.4743069999995"); JSON rounds it the same. (Through
/// u64: a u128 to f64 conversion is a software routine.)
fn ms(d: Duration) -> f64 {
    micros(d) as f64 / 1000.0
}

fn micros(d: Duration) -> u64 {
    d.as_secs()
        .saturating_mul(1_000_000)
        .saturating_add(u64::from(d.subsec_micros()))
}

impl RequestLog<'_> {
    pub fn emit(&self) {
        if !self.write_json() {
            self.event();
        }
        if let Some(client) = self.client {
            let key = self.client_key.as_ref().map(key_hex);
            let line = Line {
                client,
                method: self.method,
                path: self.path,
                status: self.status,
                bytes: self.body_bytes,
                request_id: self.request_id,
                route: self.route,
                elapsed: self.elapsed,
                outcome: self.outcome,
                origin: self.origin,
                user: self
                    .client_name
                    .or_else(|| key.as_ref().and_then(|k| std::str::from_utf8(k).ok())),
                client_cert: self.client_cert,
            }
            .render();
            tracing::info!(target: "hourglass::access", "{line}");
        }
    }

    /// Writes the line in the JSON format itself, the bytes `telemetry::json` writes for the
    /// event: through `tracing` the line's two dozen fields were visited one by one through
    /// `dyn` calls, about 7,000 instructions of a request's 96,000. False where the line is
    /// `tracing`'s to write: another format, or a filter more verbose than `info`, under which
    /// a dependency's span may be open around the line and the formatter names it.
    fn write_json(&self) -> bool {
        let Some(out) = JSON_LINES.get() else {
            return false;
        };
        if LevelFilter::current() > LevelFilter::INFO {
            return false;
        }
        if !tracing::enabled!(target: "hourglass::request", tracing::Level::INFO) {
            return true;
        }
        thread_local! {
            static LINE: RefCell<String> = const { RefCell::new(String::new()) };
        }
        LINE.with(|line| {
            let Ok(mut w) = line.try_borrow_mut() else {
                return;
            };
            w.clear();
            if self.json(&mut w).is_ok() {
                let _ = (&*out).write_all(w.as_bytes());
            }
        });
        true
    }

    /// The line as `telemetry::json` formats `event`'s: fields in the macro's order, message
    /// first, absent ones left out.
    fn json(&self, w: &mut String) -> fmt::Result {
        fn str_field(w: &mut String, key: &str, value: Option<&str>) -> fmt::Result {
            if let Some(v) = value {
                w.push_str(key);
                escaped(w, v)?;
                w.push('"');
            }
            Ok(())
        }
        fn u64_field(w: &mut String, key: &str, value: Option<u64>) {
            if let Some(v) = value {
                w.push_str(key);
                w.push_str(itoa::Buffer::new().format(v));
            }
        }
        /// What `f64_value` makes of `ms(d)`, from the whole microseconds themselves.
        fn ms_field(w: &mut String, key: &str, value: Option<Duration>) -> fmt::Result {
            let Some(d) = value else { return Ok(()) };
            w.push_str(key);
            let micros = micros(d);
            if micros >= 9_000_000_000_000_000 {
                return f64_value(w, ms(d));
            }
            w.push_str(itoa::Buffer::new().format(micros / 1000));
            let frac = micros % 1000;
            let digit = |n: u64| char::from(b'0' + (n % 10) as u8);
            w.push('.');
            w.push(digit(frac / 100));
            w.push(digit(frac / 10));
            w.push(digit(frac));
            Ok(())
        }
        /// One of the gateway's own names (codes, outcomes, sources), which never need escaping.
        fn code_field(w: &mut String, key: &str, value: Option<&'static str>) {
            if let Some(v) = value {
                debug_assert!(!v.bytes().any(|b| b < 0x20 || b == b'"' || b == b'\\'));
                w.push_str(key);
                w.push_str(v);
                w.push('"');
            }
        }
        w.push_str("{\"timestamp\":\"");
        timestamp(w)?;
        w.push_str("\",\"level\":\"INFO\",\"message\":\"request\"");
        str_field(w, ",\"request_id\":\"", Some(self.request_id))?;
        str_field(w, ",\"run_id\":\"", self.run_id)?;
        code_field(w, ",\"run_limits\":\"", self.run_limits);
        str_field(w, ",\"method\":\"", Some(self.method.as_str()))?;
        str_field(w, ",\"path\":\"", Some(self.path))?;
        str_field(w, ",\"client\":\"", self.client_name)?;
        if let Some(id) = &self.client_key {
            w.push_str(",\"client_key\":\"");
            w.extend(key_hex(id).map(char::from));
            w.push('"');
        }
        str_field(w, ",\"client_cert\":\"", self.client_cert)?;
        str_field(w, ",\"route\":\"", self.route)?;
        str_field(w, ",\"upstream\":\"", self.upstream)?;
        str_field(w, ",\"model\":\"", self.model)?;
        u64_field(
            w,
            ",\"budget_ms\":",
            self.budget.map(|b| b.as_millis() as u64),
        );
        code_field(w, ",\"budget_source\":\"", self.budget_source);
        if let Some(c) = self.budget_clamped {
            w.push_str(if c {
                ",\"budget_clamped\":true"
            } else {
                ",\"budget_clamped\":false"
            });
        }
        ms_field(w, ",\"elapsed_ms\":", Some(self.elapsed))?;
        ms_field(w, ",\"margin_ms\":", self.margin)?;
        ms_field(w, ",\"ttfb_ms\":", self.ttfb)?;
        ms_field(w, ",\"ttft_ms\":", self.ttft)?;
        u64_field(w, ",\"prompt_tokens\":", self.prompt_tokens);
        u64_field(
            w,
            ",\"completion_tokens\":",
            self.completion_tokens.map(|c| c.0),
        );
        code_field(
            w,
            ",\"tokens_source\":\"",
            self.completion_tokens.map(|c| c.1),
        );
        code_field(w, ",\"stream_error\":\"", self.stream_error);
        u64_field(w, ",\"bytes\":", Some(self.bytes));
        u64_field(w, ",\"status\":", self.status.map(u64::from));
        code_field(w, ",\"outcome\":\"", Some(self.outcome));
        code_field(w, ",\"origin\":\"", self.origin);
        code_field(w, ",\"code\":\"", self.code);
        str_field(w, ",\"error\":\"", self.error)?;
        str_field(w, ",\"attempts\":\"", self.attempts)?;
        str_field(w, ",\"passed_over\":\"", self.passed_over)?;
        str_field(w, ",\"throttled\":\"", self.throttled)?;
        w.push_str(",\"target\":\"hourglass::request\"}\n");
        Ok(())
    }

    /// The line as a `tracing` event, for whichever format the subscriber has.
    fn event(&self) {
        let key = self.client_key.as_ref().map(key_hex);
        tracing::info!(
            target: "hourglass::request",
            request_id = self.request_id,
            run_id = self.run_id,
            run_limits = self.run_limits,
            method = self.method.as_str(),
            path = self.path,
            client = self.client_name,
            client_key = key.as_ref().and_then(|k| std::str::from_utf8(k).ok()),
            client_cert = self.client_cert,
            route = self.route,
            upstream = self.upstream,
            model = self.model,
            budget_ms = self.budget.map(|b| b.as_millis() as u64),
            budget_source = self.budget_source,
            budget_clamped = self.budget_clamped,
            elapsed_ms = ms(self.elapsed),
            margin_ms = self.margin.map(ms),
            ttfb_ms = self.ttfb.map(ms),
            ttft_ms = self.ttft.map(ms),
            prompt_tokens = self.prompt_tokens,
            completion_tokens = self.completion_tokens.map(|c| c.0),
            tokens_source = self.completion_tokens.map(|c| c.1),
            stream_error = self.stream_error,
            bytes = self.bytes,
            status = self.status,
            outcome = self.outcome,
            origin = self.origin,
            code = self.code,
            error = self.error,
            attempts = self.attempts,
            passed_over = self.passed_over,
            throttled = self.throttled,
            "request"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Audit EB F7: a path cut inside a `%XX` triplet, with nothing to say it was cut.
    #[test]
    fn a_long_path_is_cut_between_triplets_and_marked() {
        let fits = "/v1/x".to_owned() + &"a".repeat(PATH_MAX - 5);
        assert_eq!(clipped_path(&fits), None);
        let room = PATH_MAX - CLIPPED.len();
        // The cut after 0, 1 and 2 bytes of a triplet: only the whole ones before it stay.
        for (pad, kept) in [(0, room), (1, room - 1), (2, room - 2)] {
            let path = "a".repeat(room - pad) + &"%E2".repeat(400);
            let logged = clipped_path(&path).unwrap();
            assert_eq!(logged, format!("{}{CLIPPED}", &path[..kept]), "{pad}");
            assert!(logged.len() <= PATH_MAX);
        }
    }

    /// The line with its timestamp's value taken out, which differs between two writes.
    fn untimed(line: &str) -> String {
        let start = line.find("\"timestamp\":\"").unwrap() + 13;
        let end = start + line[start..].find('"').unwrap();
        format!("{}{}", &line[..start], &line[end..])
    }

    fn both_ways(log: &RequestLog<'_>) -> (String, String) {
        let through_tracing = crate::telemetry::json::tests::captured(|| log.event());
        let mut direct = String::new();
        log.json(&mut direct).unwrap();
        (untimed(&through_tracing), untimed(&direct))
    }

    #[test]
    fn the_line_written_directly_is_the_one_tracing_writes() {
        let method = Method::POST;
        let full = RequestLog {
            request_id: "id \"with\" quotes\\ and \u{1} control",
            run_id: Some("run-1"),
            run_limits: None,
            method: &method,
            path: "/v1/chat/completions",
            client_key: Some([0xde, 0xad, 0xbe, 0xef, 0, 1, 2, 0xa3]),
            client_name: Some("team-a"),
            client_cert: Some("CN=agent \"7\",O=Acme"),
            route: Some("chat \"r\""),
            upstream: Some("openai"),
            model: Some("gpt-4o \"mini\""),
            budget: Some(Duration::from_millis(8_000)),
            budget_source: Some("header"),
            budget_clamped: Some(true),
            elapsed: Duration::from_micros(6_826_474),
            margin: Some(Duration::from_micros(1_173_005)),
            ttfb: Some(Duration::from_micros(9)),
            ttft: Some(Duration::from_micros(120)),
            prompt_tokens: Some(14),
            completion_tokens: Some((5, "estimated")),
            stream_error: Some("overloaded"),
            bytes: 376,
            body_bytes: 368,
            status: Some(200),
            outcome: "cancelled",
            origin: Some("idle"),
            code: Some("idle_timeout"),
            error: Some("no chunk for \"2000ms\""),
            attempts: Some("a:ok:1ms,b:ok:2ms"),
            passed_over: Some("c"),
            throttled: Some("retry_budget,hedge_budget"),
            client: None,
        };
        let (a, b) = both_ways(&full);
        assert_eq!(a, b);
        assert!(a.contains("\"elapsed_ms\":6826.474,"), "{a}");
        assert!(a.contains("\"client_key\":\"deadbeef000102a3\","), "{a}");
        let sparse = RequestLog {
            run_id: None,
            run_limits: None,
            client_key: None,
            client_name: None,
            client_cert: None,
            route: None,
            upstream: None,
            model: None,
            budget: None,
            budget_source: None,
            budget_clamped: Some(false),
            // Past what three decimals in integers can hold: the float's own form.
            elapsed: Duration::from_secs(20_000_000_000),
            margin: None,
            ttfb: None,
            ttft: None,
            prompt_tokens: None,
            completion_tokens: None,
            stream_error: None,
            status: None,
            origin: None,
            code: None,
            error: None,
            attempts: None,
            passed_over: None,
            throttled: None,
            ..full
        };
        let (a, b) = both_ways(&sparse);
        assert_eq!(a, b);
        assert!(!a.contains("route"), "{a}");
    }
}
