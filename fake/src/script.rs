//! The per-request script: the `x-fake-*` headers, parsed and checked.

use std::time::Duration;

use http::{HeaderMap, HeaderValue, StatusCode};

/// The per-request script, parsed from `x-fake-*` headers; `default()` is "no script at all".
#[derive(Default)]
pub(crate) struct Script {
    pub(crate) ttft: Duration,
    pub(crate) headers_first: bool,
    pub(crate) chunks: usize,
    pub(crate) interval: Duration,
    pub(crate) freeze_after: Option<usize>,
    pub(crate) disconnect_after: Option<usize>,
    pub(crate) status: Option<StatusCode>,
    pub(crate) keepalive: Option<Duration>,
    pub(crate) keepalive_ping: bool,
    pub(crate) timestamps: bool,
    /// `x-fake-tool-call`: the turns, each the names called together in one answer.
    pub(crate) tool_calls: Vec<Vec<String>>,
    pub(crate) tool_args: Option<String>,
    /// `x-fake-tool-preamble`: text tokens before the calls.
    pub(crate) tool_preamble: usize,
    pub(crate) id: Option<String>,
    pub(crate) reasoning: usize,
    pub(crate) refusal: bool,
}

/// The most tokens (`x-fake-chunks`, `x-fake-reasoning`, `x-fake-tool-preamble`) a
/// non-streaming answer may have: it is built whole (a count of 10^8 stalled the fake for
/// 12 s and held 1 GB), and a million tokens' answer is about 8 MB. A stream is made as it
/// goes, and has only [`MAX_STREAM_TOKENS`].
pub(crate) const MAX_DOCUMENT_TOKENS: usize = 1_000_000;

/// The most bytes a non-streaming answer may have, about: built as JSON values first, a
/// document takes some 25 times its size while it is made.
pub(crate) const MAX_DOCUMENT_BYTES: usize = 16 << 20;

/// Most content events a stream may have in all (2^48: at no interval, days of streaming).
/// Past it the plan's counts, multiplied by `n` and the calls, would wrap in `usize` and
/// the stream end early as if complete (audit GF 2).
pub(crate) const MAX_STREAM_TOKENS: u128 = 1 << 48;

impl Script {
    /// Refuses a non-streaming answer too large to build.
    pub(crate) fn check_document(&self) -> Result<(), String> {
        for (name, n) in [
            ("x-fake-chunks", self.chunks),
            ("x-fake-reasoning", self.reasoning),
            ("x-fake-tool-preamble", self.tool_preamble),
        ] {
            if n > MAX_DOCUMENT_TOKENS {
                return Err(format!(
                    "{name}: {n} is more than the {MAX_DOCUMENT_TOKENS} tokens a \
                     non-streaming answer may have"
                ));
            }
        }
        Ok(())
    }
}

/// What the APIs accept as a function name, and what the fake takes as an id: short, and
/// nothing that needs escaping in JSON or a header.
fn is_name(n: &str) -> bool {
    (1..=64).contains(&n.len())
        && n.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

impl Script {
    pub(crate) fn from_headers(headers: &HeaderMap) -> Result<Script, String> {
        let number = |name: &str| -> Result<Option<u64>, String> {
            let Some(value) = headers.get(name) else {
                return Ok(None);
            };
            let parsed = value.to_str().ok().and_then(|s| s.trim().parse().ok());
            parsed.map(Some).ok_or_else(|| invalid(name, value))
        };
        let count = |name: &str| -> Result<Option<usize>, String> {
            number(name)?
                .map(|n| usize::try_from(n).map_err(|_| format!("{name} is too large")))
                .transpose()
        };
        let flag = |name: &str| match headers.get(name).map(HeaderValue::as_bytes) {
            None | Some(b"0" | b"false") => Ok(false),
            Some(b"1" | b"true") => Ok(true),
            Some(_) => Err(invalid(name, &headers[name])),
        };
        let status = match number("x-fake-status")? {
            None => None,
            Some(code) => Some(
                u16::try_from(code)
                    .ok()
                    .filter(|code| (400..=599).contains(code))
                    .and_then(|code| StatusCode::from_u16(code).ok())
                    .ok_or_else(|| invalid("x-fake-status", &headers["x-fake-status"]))?,
            ),
        };
        let keepalive_ping = match headers
            .get("x-fake-keepalive-kind")
            .map(HeaderValue::as_bytes)
        {
            None | Some(b"comment") => false,
            Some(b"ping") => true,
            Some(_) => {
                return Err(invalid(
                    "x-fake-keepalive-kind",
                    &headers["x-fake-keepalive-kind"],
                ))
            }
        };
        // `a+b,c`: turns split by commas, the names of one turn joined by plus signs.
        let turns = |name: &str| -> Result<Option<Vec<Vec<String>>>, String> {
            let Some(value) = headers.get(name) else {
                return Ok(None);
            };
            let one = |n: &str| Some(n.trim()).filter(|n| is_name(n)).map(str::to_owned);
            let list = value.to_str().ok().and_then(|v| {
                v.split(',')
                    .map(|turn| turn.split('+').map(one).collect::<Option<Vec<_>>>())
                    .collect::<Option<Vec<_>>>()
            });
            list.map(Some).ok_or_else(|| invalid(name, value))
        };
        let tool_args = match headers.get("x-fake-tool-args") {
            None => None,
            Some(v) => {
                // UTF-8, not only visible ASCII: arguments may hold any text.
                let text = std::str::from_utf8(v.as_bytes()).ok().filter(|t| {
                    matches!(serde_json::from_str(t), Ok(serde_json::Value::Object(_)))
                });
                Some(
                    text.ok_or_else(|| invalid("x-fake-tool-args", v))?
                        .to_owned(),
                )
            }
        };
        let id = match headers.get("x-fake-id") {
            None => None,
            Some(v) => Some(
                v.to_str()
                    .ok()
                    .map(str::trim)
                    .filter(|id| is_name(id))
                    .ok_or_else(|| invalid("x-fake-id", v))?
                    .to_owned(),
            ),
        };
        Ok(Script {
            tool_calls: turns("x-fake-tool-call")?.unwrap_or_default(),
            tool_args,
            tool_preamble: count("x-fake-tool-preamble")?.unwrap_or(0),
            id,
            reasoning: count("x-fake-reasoning")?.unwrap_or(0),
            refusal: flag("x-fake-refusal")?,
            ttft: Duration::from_millis(number("x-fake-ttft-ms")?.unwrap_or(0)),
            headers_first: flag("x-fake-headers-first")?,
            chunks: count("x-fake-chunks")?.unwrap_or(5),
            interval: Duration::from_millis(number("x-fake-interval-ms")?.unwrap_or(20)),
            freeze_after: count("x-fake-freeze-after")?,
            disconnect_after: count("x-fake-disconnect-after")?,
            status,
            // 0 would mean a keep-alive storm; treat it as "off".
            keepalive: number("x-fake-keepalive-ms")?
                .filter(|&ms| ms > 0)
                .map(Duration::from_millis),
            keepalive_ping,
            timestamps: flag("x-fake-timestamps")?,
        })
    }
}

pub(crate) fn invalid(name: &str, value: &HeaderValue) -> String {
    format!(
        "invalid value for {name}: {:?}",
        String::from_utf8_lossy(value.as_bytes())
    )
}
