//! `--log-format json`: one JSON object per event, with the keys tracing-subscriber's
//! `json().flatten_event(true)` writes (`timestamp`, `level`, the event's fields with `message`
//! first, `target`), written straight into the line buffer.
//!
//! Why not tracing-subscriber's own: it serialises through serde_json into an `io::Write`
//! adaptor that re-validates UTF-8 on every small write. Under callgrind that was 25% of the
//! instructions of a whole non-streaming request, for the one log line each request writes.
//! Milliseconds are rounded to the microsecond (`3567.591`, not `3567.5912040000003`).

use std::cell::RefCell;
use std::fmt::{self, Write};

use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

pub struct JsonLines;

impl<S, N> FormatEvent<S, N> for JsonLines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut out: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        // The line is put together in a `String` of this thread and handed over whole: `Writer`
        // is a `dyn fmt::Write`, and each of the line's 60-odd small writes through it cost
        // about as much as the bytes it copied.
        thread_local! {
            static LINE: RefCell<String> = const { RefCell::new(String::new()) };
        }
        LINE.with(|line| match line.try_borrow_mut() {
            Ok(mut w) => {
                w.clear();
                render(ctx, &mut w, event)?;
                out.write_str(&w)
            }
            // Never seen: tracing does not dispatch an event logged while another is being
            // formatted (a field's `Debug` that logs). Kept so that a change there cannot
            // panic here.
            Err(_) => {
                let mut w = String::new();
                render(ctx, &mut w, event)?;
                out.write_str(&w)
            }
        })
    }
}

fn render<S, N>(ctx: &FmtContext<'_, S, N>, w: &mut String, event: &Event<'_>) -> fmt::Result
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    w.write_str("{\"timestamp\":\"")?;
    timestamp(w)?;
    w.write_str("\",\"level\":\"")?;
    w.write_str(event.metadata().level().as_str())?;
    w.write_str("\"")?;
    let mut fields = Fields {
        w: &mut *w,
        result: Ok(()),
    };
    event.record(&mut fields);
    fields.result?;
    // Spans come only from dependencies at debug and trace levels; their names say where.
    if let Some(scope) = ctx.event_scope() {
        w.write_str(",\"spans\":[")?;
        for (i, span) in scope.from_root().enumerate() {
            if i > 0 {
                w.write_char(',')?;
            }
            string(w, span.name())?;
        }
        w.write_char(']')?;
    }
    w.write_str(",\"target\":")?;
    string(w, event.metadata().target())?;
    w.write_str("}\n")
}

struct Fields<'a> {
    w: &'a mut String,
    result: fmt::Result,
}

impl Fields<'_> {
    /// Writes `,"name":` and `open` (the opening quote of a string value, or nothing), then
    /// the value. Names from `tracing`'s macros never need escaping.
    fn entry(&mut self, field: &Field, open: &str, value: impl FnOnce(&mut String) -> fmt::Result) {
        if self.result.is_ok() {
            let w = &mut *self.w;
            let name = field.name();
            w.push_str(",\"");
            if needs_escape(name.as_bytes()) {
                self.result = Escaped(w).write_str(name);
            } else {
                w.push_str(name);
            }
            w.push_str("\":");
            w.push_str(open);
            if self.result.is_ok() {
                self.result = value(w);
            }
        }
    }
}

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.entry(field, "\"", |w| {
            Escaped(w).write_str(value)?;
            w.write_str("\"")
        });
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.entry(field, "", |w| {
            w.write_str(itoa::Buffer::new().format(value))
        });
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.entry(field, "", |w| {
            w.write_str(itoa::Buffer::new().format(value))
        });
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.entry(field, "", |w| {
            w.write_str(if value { "true" } else { "false" })
        });
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.entry(field, "", |w| f64_value(w, value));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.entry(field, "\"", |w| {
            write!(Escaped(w), "{value:?}")?;
            w.write_str("\"")
        });
    }
}

/// Three decimals in integer arithmetic: shortest-float printing was a fifth of the line's
/// cost, for the four millisecond fields.
pub(crate) fn f64_value(w: &mut String, value: f64) -> fmt::Result {
    let thousandths = (value * 1000.0).round();
    if thousandths.abs() < 9.0e15 {
        let t = thousandths as i64;
        let sign = if t < 0 { "-" } else { "" };
        let t = t.unsigned_abs();
        let frac = t % 1000;
        w.push_str(sign);
        w.push_str(itoa::Buffer::new().format(t / 1000));
        w.push_str(match frac {
            0..=9 => ".00",
            10..=99 => ".0",
            _ => ".",
        });
        w.push_str(itoa::Buffer::new().format(frac));
        Ok(())
    } else if value.is_finite() {
        // Debug is the short form for huge magnitudes ("1e300").
        write!(w, "{value:?}")
    } else {
        // JSON has no NaN or infinity.
        w.push_str("null");
        Ok(())
    }
}

/// A JSON string's contents, escaped where needed.
pub(crate) fn escaped(w: &mut String, s: &str) -> fmt::Result {
    Escaped(w).write_str(s)
}

/// RFC 3339 UTC with microseconds, like tracing-subscriber's `SystemTime`. The date and time
/// of day are formatted once per second per thread; formatting them on every line was a
/// tenth of the line's cost.
pub(crate) fn timestamp(w: &mut String) -> fmt::Result {
    use std::cell::RefCell;
    thread_local! {
        static SECOND: RefCell<(u64, String)> = const { RefCell::new((u64::MAX, String::new())) };
    }
    let Ok(now) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) else {
        // A clock before 1970: let tracing-subscriber say what it makes of it.
        return SystemTime.format_time(&mut Writer::new(w));
    };
    let secs = now.as_secs();
    SECOND.with(|cell| {
        let mut cached = cell.borrow_mut();
        if cached.0 != secs {
            cached.1.clear();
            civil_time(&mut cached.1, secs)?;
            cached.0 = secs;
        }
        w.write_str(&cached.1)?;
        // Six digits by hand: `{:06}` goes through the formatter's padding path.
        let mut frac = *b".000000Z";
        let mut micros = now.subsec_micros();
        for digit in frac[1..7].iter_mut().rev() {
            *digit = b'0' + (micros % 10) as u8;
            micros /= 10;
        }
        w.write_str(std::str::from_utf8(&frac).map_err(|_| fmt::Error)?)
    })
}

/// `YYYY-MM-DDTHH:MM:SS` for seconds since the Unix epoch.
fn civil_time(out: &mut String, secs: u64) -> fmt::Result {
    let days = i64::try_from(secs / 86_400).map_err(|_| fmt::Error)?;
    let rem = secs % 86_400;
    let (year, month, day) = crate::telemetry::access::civil_from_days(days);
    write!(
        out,
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

fn string(w: &mut String, s: &str) -> fmt::Result {
    w.write_str("\"")?;
    Escaped(w).write_str(s)?;
    w.write_str("\"")
}

/// Writes a JSON string's contents (RFC 8259 7): runs of plain characters at once.
struct Escaped<'a>(&'a mut String);

impl Write for Escaped<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        if !needs_escape(s.as_bytes()) {
            return self.0.write_str(s);
        }
        let mut plain = 0;
        let bytes = s.as_bytes();
        for (i, &b) in bytes.iter().enumerate() {
            let escape: &str = match b {
                b'"' => "\\\"",
                b'\\' => "\\\\",
                b'\n' => "\\n",
                b'\r' => "\\r",
                b'\t' => "\\t",
                0..=0x1f => "",
                // U+2028 and U+2029, which JSON allows raw and `splitlines()`, JavaScript
                // before ES2019 and many log viewers break a line at (audit AG 1): escaped,
                // as Go's encoding/json does; and U+0085 (NEL), at which `splitlines()`
                // breaks too (break audit AH 4).
                0xE2 if bytes.get(i + 1) == Some(&0x80)
                    && matches!(bytes.get(i + 2), Some(0xA8 | 0xA9)) =>
                {
                    if bytes[i + 2] == 0xA8 {
                        "\\u2028"
                    } else {
                        "\\u2029"
                    }
                }
                0xC2 if bytes.get(i + 1) == Some(&0x85) => "\\u0085",
                _ => continue,
            };
            self.0.write_str(&s[plain..i])?;
            if escape.is_empty() {
                write!(self.0, "\\u{b:04x}")?;
            } else {
                self.0.write_str(escape)?;
            }
            plain = i + match b {
                0xE2 => 3,
                0xC2 => 2,
                _ => 1,
            };
        }
        self.0.write_str(&s[plain..])
    }
}

/// Whether any byte is a control character, `"`, `\\` or the lead byte of a line
/// separator's (0xE2 or 0xC2, also those of other punctuation and Latin-1 letters: those are
/// then looked at one by one):
/// eight bytes at a time, since nearly every string in a log line needs no escaping at all.
fn needs_escape(s: &[u8]) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    // A byte of `v` is zero (or, for `below`, less than n <= 0x80) where its high bit ends up
    // set; bytes of 0x80 and above never match.
    let zero = |v: u64| v.wrapping_sub(ONES) & !v & HIGH;
    let below = |v: u64, n: u64| v.wrapping_sub(ONES * n) & !v & HIGH;
    let mut chunks = s.chunks_exact(8);
    for c in &mut chunks {
        let v = u64::from_le_bytes(c.try_into().expect("chunks of eight"));
        if below(v, 0x20)
            | zero(v ^ (ONES * u64::from(b'"')))
            | zero(v ^ (ONES * u64::from(b'\\')))
            | zero(v ^ (ONES * 0xE2))
            | zero(v ^ (ONES * 0xC2))
            != 0
        {
            return true;
        }
    }
    chunks
        .remainder()
        .iter()
        .any(|&b| b < 0x20 || b == b'"' || b == b'\\' || b == 0xE2 || b == 0xC2)
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// A log writer whose lines a test reads back (the run store's tests use it too).
    #[derive(Clone, Default)]
    pub(crate) struct Captured(pub(crate) Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// What the formatter writes for the events `emit` makes (the log line's tests use it too).
    pub(in crate::telemetry) fn captured(emit: impl FnOnce()) -> String {
        let out = Captured::default();
        let writer = out.clone();
        let subscriber = tracing_subscriber::fmt()
            .event_format(JsonLines)
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, emit);
        let bytes = out.0.lock().unwrap().clone();
        String::from_utf8(bytes).unwrap()
    }

    fn lines(emit: impl FnOnce()) -> Vec<serde_json::Value> {
        captured(emit)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect()
    }

    #[test]
    fn an_event_logged_while_a_line_is_being_formatted_leaves_that_line_whole() {
        struct Chatty;
        impl fmt::Debug for Chatty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                tracing::info!(inner = "from Debug", "nested");
                f.write_str("chatty")
            }
        }
        // tracing itself does not dispatch the nested event.
        let got = lines(|| tracing::info!(outer = ?Chatty, "outer"));
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(got[0]["outer"], "chatty");
        assert_eq!(got[0]["message"], "outer");
    }

    #[test]
    fn every_field_type_comes_out_as_valid_json() {
        let tricky = "quote \" backslash \\ newline \n tab \t nul \u{0} bell \u{7} é ✓";
        let got = lines(|| {
            tracing::info!(
                target: "hourglass::request",
                text = tricky,
                shown = %"display \"value\"",
                debugged = ?vec!["a", "b"],
                count = 42u64,
                signed = -7i64,
                flag = true,
                ms = 3_567.591_204_000_000_3_f64,
                nan = f64::NAN,
                absent = None::<u64>,
                "request {}",
                "done"
            );
        });
        assert_eq!(got.len(), 1);
        let l = &got[0];
        assert_eq!(l["level"], "INFO");
        assert_eq!(l["target"], "hourglass::request");
        assert_eq!(l["message"], "request done");
        assert_eq!(l["text"], tricky);
        assert_eq!(l["shown"], "display \"value\"");
        assert_eq!(l["debugged"], "[\"a\", \"b\"]");
        assert_eq!(l["count"], 42);
        assert_eq!(l["signed"], -7);
        assert_eq!(l["flag"], true);
        assert_eq!(l["ms"], 3567.591);
        assert!(l["nan"].is_null());
        assert!(l.get("absent").is_none(), "a None field is left out");
        let ts = l["timestamp"].as_str().unwrap();
        assert!(ts.ends_with('Z') && ts.len() >= 20, "{ts}");
        assert!(l.get("spans").is_none());
    }

    /// Audit AG 1: a client's model name with U+2028 and U+2029 was valid JSON that
    /// `splitlines()` cut into three lines, none of them JSON. Other characters of the same
    /// lead byte (a curly quote, an ellipsis) stay as they are.
    #[test]
    fn line_separators_are_escaped_and_their_neighbours_are_not() {
        let forged = "m-1\u{2028}{\"forged\":true}\u{2029}\u{85}’…\u{2027}°";
        let out = captured(|| tracing::info!(target: "hourglass::request", model = forged));
        assert_eq!(out.lines().count(), 1);
        assert!(!out.contains(['\u{2028}', '\u{2029}', '\u{85}']), "{out}");
        let want = r#""model":"m-1\u2028{\"forged\":true}\u2029\u0085’…"#;
        assert!(out.contains(&format!("{want}\u{2027}°\"")), "{out}");
        let parsed: serde_json::Value = serde_json::from_str(out.trim_end()).unwrap();
        assert_eq!(parsed["model"], forged);
    }

    #[test]
    fn the_escape_check_agrees_with_the_plain_one_on_every_byte_at_every_position() {
        let plain = |s: &[u8]| {
            s.iter()
                .any(|&b| b < 0x20 || b == b'"' || b == b'\\' || b == 0xE2 || b == 0xC2)
        };
        for len in 0..20 {
            for pos in 0..len {
                for b in 0..=255u8 {
                    let mut s = vec![b'a'; len];
                    s[pos] = b;
                    // Neighbours at the top of the range must not hide or fake a match.
                    if pos + 1 < len {
                        s[pos + 1] = 0xff;
                    }
                    assert_eq!(needs_escape(&s), plain(&s), "{s:?}");
                }
            }
        }
    }

    #[test]
    fn civil_time_matches_the_calendar() {
        for (secs, want) in [
            (0, "1970-01-01T00:00:00"),
            (951782400, "2000-02-29T00:00:00"),
            (951868799, "2000-02-29T23:59:59"),
            (1796083199, "2026-11-30T23:59:59"),
            (4102444800, "2100-01-01T00:00:00"),
            (253402300799, "9999-12-31T23:59:59"),
        ] {
            let mut got = String::new();
            civil_time(&mut got, secs).unwrap();
            assert_eq!(got, want, "{secs}");
        }
    }

    #[test]
    fn milliseconds_have_three_decimals_and_keep_their_sign() {
        let text = captured(|| {
            tracing::info!(
                a = 2.5f64,
                b = -0.0004f64,
                c = -12.3456f64,
                d = 1e300f64,
                "m"
            );
        });
        assert!(
            text.contains("\"a\":2.500,\"b\":0.000,\"c\":-12.346,\"d\":1e300"),
            "{text}"
        );
        serde_json::from_str::<serde_json::Value>(text.trim()).unwrap();
    }

    #[test]
    fn the_first_key_order_matches_tracing_subscribers_json() {
        let text = captured(|| {
            let span = tracing::info_span!("outer");
            let _g = span.enter();
            tracing::warn!(a = 1u64, "hello");
        });
        assert!(text.starts_with("{\"timestamp\":\""), "{text}");
        assert!(
            text.contains(",\"level\":\"WARN\",\"message\":\"hello\",\"a\":1,\"spans\":[\"outer\"],\"target\":"),
            "{text}"
        );
        assert!(text.ends_with("}\n"));
    }

    #[test]
    fn the_timestamp_is_rfc3339_utc_with_microseconds_and_current() {
        let before = std::time::SystemTime::now();
        let text = captured(|| tracing::info!("x"));
        let v: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
        let ts = v["timestamp"].as_str().unwrap();
        let b = ts.as_bytes();
        assert_eq!(b.len(), "2026-11-30T18:37:00.123456Z".len(), "{ts}");
        for (i, &c) in b.iter().enumerate() {
            let want_digit = !matches!(i, 4 | 7 | 10 | 13 | 16 | 19 | 26);
            assert_eq!(c.is_ascii_digit(), want_digit, "{ts} at {i}");
        }
        assert_eq!(
            (b[4], b[7], b[10], b[13], b[16], b[19], b[26]),
            (b'-', b'-', b'T', b':', b':', b'.', b'Z'),
            "{ts}"
        );
        // The seconds and microseconds are this moment's, to within the test's own runtime.
        let since = before.duration_since(std::time::UNIX_EPOCH).unwrap();
        let secs_of_day = since.as_secs() % 86_400;
        let hms: u64 = ts[11..13].parse::<u64>().unwrap() * 3600
            + ts[14..16].parse::<u64>().unwrap() * 60
            + ts[17..19].parse::<u64>().unwrap();
        let micros: u64 = ts[20..26].parse().unwrap();
        let stamped = hms as f64 + micros as f64 / 1e6;
        let then = secs_of_day as f64 + f64::from(since.subsec_micros()) / 1e6;
        let diff = (stamped - then).rem_euclid(86_400.0);
        assert!(diff < 5.0, "{ts} is {diff} s after the test started");
    }
}
