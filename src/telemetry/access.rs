//! The access-log mode (`--log-format access`): one line per request in the NCSA combined
//! format that log shippers parse out of the box (Fluent Bit's `apache2`, Vector's
//! `parse_apache_log`, Filebeat's nginx module), with Hourglass's own fields appended as
//! `key=value` pairs after it.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::{Method, Version};

use crate::http::headers::invisible;

static ENABLED: AtomicBool = AtomicBool::new(false);

pub fn enable() {
    ENABLED.store(true, Ordering::Relaxed);
}

pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// What only the access line needs, captured when the request arrives.
#[derive(Debug, Clone)]
pub struct ClientInfo {
    pub addr: Option<SocketAddr>,
    pub user_agent: Option<String>,
    pub referer: Option<String>,
    pub version: Version,
    pub at: SystemTime,
}

/// The fields of one access line.
pub struct Line<'a> {
    pub client: &'a ClientInfo,
    pub method: &'a Method,
    pub path: &'a str,
    pub status: Option<u16>,
    pub bytes: u64,
    pub request_id: &'a str,
    pub route: Option<&'a str>,
    pub elapsed: Duration,
    pub outcome: &'a str,
    pub origin: Option<&'a str>,
    /// The client the accepted key names (its name, else its digest prefix in hex): the
    /// line's user, where nginx puts a basic-auth user.
    pub user: Option<&'a str>,
    pub client_cert: Option<&'a str>,
}

impl Line<'_> {
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(256);
        // An IPv4 client of a dual-stack (`[::]`) listener arrives as `::ffff:a.b.c.d`; log
        // tools, GeoIP and ban rules expect the IPv4 address itself (audit RA 4).
        let ip = self
            .client
            .addr
            .map_or_else(|| "-".to_string(), |a| a.ip().to_canonical().to_string());
        let version = match self.client.version {
            Version::HTTP_2 => "HTTP/2.0",
            Version::HTTP_10 => "HTTP/1.0",
            _ => "HTTP/1.1",
        };
        // Status 0 would break parsers; a request that ended before any status (the client
        // left before the head) is logged as 499, as nginx does.
        let status = self.status.unwrap_or(499);
        let _ = write!(
            out,
            "{ip} - {} [{}] \"{} {} {version}\" {status} {} \"{}\" \"{}\"",
            self.user.unwrap_or("-"),
            clf_time(self.client.at),
            self.method,
            escape(self.path),
            self.bytes,
            escape(self.client.referer.as_deref().unwrap_or("-")),
            escape(self.client.user_agent.as_deref().unwrap_or("-")),
        );
        let _ = write!(
            out,
            " request_id={} route={} duration_ms={:.1} outcome={}",
            value(self.request_id),
            value(self.route.unwrap_or("-")),
            self.elapsed.as_secs_f64() * 1000.0,
            self.outcome
        );
        if let Some(o) = self.origin {
            let _ = write!(out, " origin={o}");
        }
        if let Some(c) = self.client_cert {
            let _ = write!(out, " client_cert={}", value(c));
        }
        out
    }
}

/// A `key=value` pair's value as logfmt reads it: bare when it can be, else quoted and
/// escaped. A request id is the client's (any visible ASCII: a `"` in it hid every field
/// after it from a logfmt parser), a route name the operator's (a space or newline in it
/// split the line).
fn value(s: &str) -> std::borrow::Cow<'_, str> {
    let bare = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_graphic() && !matches!(c, '"' | '\\' | '='));
    if bare {
        return s.into();
    }
    // Quoted as logfmt parsers unquote (go-logfmt: JSON's rules, `\n`, `\u0007`), not with
    // the combined format's `\xHH`, which they refuse: a JSON string is exactly that. JSON
    // leaves the invisible characters that are no controls as they are: escaped too.
    let quoted = serde_json::to_string(s).expect("a string serialises");
    if !quoted.chars().any(invisible) {
        return quoted.into();
    }
    let mut out = String::with_capacity(quoted.len() + 12);
    for c in quoted.chars() {
        if invisible(c) {
            let _ = write!(out, "\\u{:04x}", u32::from(c));
        } else {
            out.push(c);
        }
    }
    out.into()
}

/// Quotes, control characters and line separators would let a client forge log fields or
/// lines, format characters hide or reorder what is shown: written as `\xHH` (a C1 control
/// as its code, as before; any other, its UTF-8 bytes, as nginx writes every byte past
/// ASCII).
fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if invisible(c) => {
                for b in c.encode_utf8(&mut [0; 4]).bytes() {
                    let _ = write!(out, "\\x{b:02x}");
                }
            }
            c => out.push(c),
        }
    }
    out
}

/// `10/Oct/2000:13:55:36 +0000` (UTC).
fn clf_time(t: SystemTime) -> String {
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    format!(
        "{d:02}/{}/{y:04}:{:02}:{:02}:{:02} +0000",
        MONTHS[(m - 1) as usize],
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// Days since 1970-01-01 to (year, month, day), Howard Hinnant's algorithm.
pub(crate) fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_are_right() {
        assert_eq!(clf_time(UNIX_EPOCH), "01/Jan/1970:00:00:00 +0000");
        let t = UNIX_EPOCH + Duration::from_secs(971_186_136);
        assert_eq!(clf_time(t), "10/Oct/2000:13:55:36 +0000");
        let t = UNIX_EPOCH + Duration::from_secs(1_796_030_125);
        assert_eq!(clf_time(t), "30/Nov/2026:09:15:25 +0000");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400); // 2000-02-29
        assert_eq!(clf_time(leap), "29/Feb/2000:00:00:00 +0000");
    }

    /// Audit AG 1: a User-Agent with U+2028 and U+2029 was one line by `\n` and four by
    /// `splitlines()`, one of them a forged access line; bidi and zero-width characters went
    /// in as they were. A route named with them (refused by the config now) is escaped too.
    #[test]
    fn line_separators_and_format_characters_are_escaped() {
        let client = ClientInfo {
            addr: Some("10.1.2.3:5555".parse().unwrap()),
            user_agent: Some(
                "curl/8 \u{2028}FORGED 200 0\u{2029}x\u{85}y \u{202e}gpj\u{200b}é".into(),
            ),
            referer: Some("http://r/\u{feff}".into()),
            version: Version::HTTP_11,
            at: UNIX_EPOCH,
        };
        let line = Line {
            client: &client,
            method: &Method::GET,
            path: "/v1/models",
            status: Some(200),
            bytes: 0,
            request_id: "a\u{2028}b",
            route: Some("r\u{2029}"),
            elapsed: Duration::ZERO,
            outcome: "ok",
            origin: None,
            user: None,
            client_cert: None,
        }
        .render();
        assert_eq!(line.lines().count(), 1, "{line}");
        assert!(!line.contains(|c: char| invisible(c)), "{line}");
        assert!(line.contains(
            "\"http://r/\\xef\\xbb\\xbf\" \"curl/8 \\xe2\\x80\\xa8FORGED 200 0\\xe2\\x80\\xa9x\\x85y \\xe2\\x80\\xaegpj\\xe2\\x80\\x8bé\""
        ), "{line}");
        assert!(
            line.contains(r#"request_id="a\u2028b" route="r\u2029""#),
            "{line}"
        );
        // Break audit AH 5: the rest of the default ignorables (an Arabic letter mark, a tag).
        assert_eq!(escape("a\u{61c}\u{e0041}b"), r"a\xd8\x9c\xf3\xa0\x81\x81b");
    }

    #[test]
    fn a_line_is_combined_format_and_cannot_be_forged() {
        let client = ClientInfo {
            addr: Some("10.1.2.3:5555".parse().unwrap()),
            user_agent: Some("OpenAI/Python 1.0\" injected=\"x".into()),
            referer: None,
            version: Version::HTTP_11,
            at: UNIX_EPOCH + Duration::from_secs(971_186_136),
        };
        let line = Line {
            client: &client,
            method: &Method::POST,
            path: "/v1/chat/completions",
            status: Some(200),
            bytes: 952,
            request_id: "abc",
            route: Some("chat"),
            elapsed: Duration::from_millis(87),
            outcome: "ok",
            origin: None,
            user: None,
            client_cert: None,
        };
        assert_eq!(
            line.render(),
            "10.1.2.3 - - [10/Oct/2000:13:55:36 +0000] \"POST /v1/chat/completions HTTP/1.1\" 200 952 \"-\" \"OpenAI/Python 1.0\\\" injected=\\\"x\" request_id=abc route=chat duration_ms=87.0 outcome=ok"
        );
        let named = Line {
            user: Some("deadbeef000102a3"),
            client_cert: Some("CN=agent \"7\",O=Acme"),
            ..line
        };
        assert_eq!(
            named.render(),
            "10.1.2.3 - deadbeef000102a3 [10/Oct/2000:13:55:36 +0000] \"POST /v1/chat/completions HTTP/1.1\" 200 952 \"-\" \"OpenAI/Python 1.0\\\" injected=\\\"x\" request_id=abc route=chat duration_ms=87.0 outcome=ok client_cert=\"CN=agent \\\"7\\\",O=Acme\""
        );
    }

    /// A dual-stack (`[::]`) listener sees an IPv4 client as `::ffff:a.b.c.d`; the line
    /// writes it as the IPv4 address log tools, GeoIP and ban rules expect (audit RA 4).
    #[test]
    fn an_ipv4_client_of_a_dual_stack_listener_is_written_as_ipv4() {
        let at = |addr: &str| ClientInfo {
            addr: Some(addr.parse().unwrap()),
            user_agent: None,
            referer: None,
            version: Version::HTTP_11,
            at: UNIX_EPOCH,
        };
        let line = |client: &ClientInfo| {
            Line {
                client,
                method: &Method::GET,
                path: "/",
                status: Some(200),
                bytes: 0,
                request_id: "r",
                route: None,
                elapsed: Duration::ZERO,
                outcome: "ok",
                origin: None,
                user: None,
                client_cert: None,
            }
            .render()
        };
        assert!(line(&at("[::ffff:127.0.0.1]:5555")).starts_with("127.0.0.1 - - ["));
        assert!(line(&at("[::1]:5555")).starts_with("::1 - - ["));
        assert!(line(&at("[2001:db8::1]:5555")).starts_with("2001:db8::1 - - ["));
    }

    /// The fields after the combined format are logfmt: a request id (the client's, any
    /// visible ASCII) or a route name (the operator's) that a parser would misread is quoted,
    /// so that neither hides the fields after it nor splits the line. The client's Referer
    /// is in its place.
    #[test]
    fn key_value_fields_are_quoted_when_they_must_be() {
        let client = ClientInfo {
            addr: None,
            user_agent: None,
            referer: Some("https://app.example/\"x".into()),
            version: Version::HTTP_2,
            at: UNIX_EPOCH,
        };
        let line = Line {
            client: &client,
            method: &Method::POST,
            path: "/v1/messages",
            status: None,
            bytes: 0,
            request_id: "\"a=b\\",
            route: Some("my route\nx\u{7}"),
            elapsed: Duration::ZERO,
            outcome: "cancelled",
            origin: Some("client"),
            user: None,
            client_cert: None,
        };
        assert_eq!(
            line.render(),
            "- - - [01/Jan/1970:00:00:00 +0000] \"POST /v1/messages HTTP/2.0\" 499 0 \"https://app.example/\\\"x\" \"-\" request_id=\"\\\"a=b\\\\\" route=\"my route\\nx\\u0007\" duration_ms=0.0 outcome=cancelled origin=client"
        );
    }
}
