//! What the gateway does to headers as a request crosses it, one way and back: the
//! hop-by-hop fields it removes (RFC 9110 7.6.1), the content codings it cannot read through,
//! the framing two parsers could read differently, and the request id that ties the logs of
//! each hop. The `Via` it adds and the loop limit are in `hops`.

use std::sync::Arc;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::uri::{Scheme, Uri};
use http::Version;

use crate::error::GatewayError;

pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Anthropic's credential header (OpenAI's is `Authorization`).
pub const X_API_KEY: HeaderName = HeaderName::from_static("x-api-key");
/// Azure OpenAI's credential header (its `/openai/deployments/...` paths take no other).
pub const API_KEY: HeaderName = HeaderName::from_static("api-key");
/// Google's credential header (native Gemini, `generativelanguage.googleapis.com`).
pub const X_GOOG_API_KEY: HeaderName = HeaderName::from_static("x-goog-api-key");

/// A character that text shows as nothing, or as something it is not: a control character,
/// one of Unicode's default ignorable code points (zero-width spaces and joiners, bidi
/// controls, the BOM, the soft hyphen, fillers, variation selectors, tags; break audit AH 5
/// found U+061C, U+180E, U+3164 and tags passed), the interlinear annotation controls, or a
/// line or paragraph separator (U+2028, U+2029), which `splitlines()` and many log viewers
/// break a line at. A name the operator gives is refused with one; the access log escapes a
/// client's (audit AG 1: a User-Agent with U+2028 forged an access line).
pub fn invisible(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{00AD}'
                | '\u{034F}'
                | '\u{061C}'
                | '\u{115F}'..='\u{1160}'
                | '\u{17B4}'..='\u{17B5}'
                | '\u{180B}'..='\u{180F}'
                | '\u{200B}'..='\u{200F}'
                | '\u{2028}'..='\u{202E}'
                | '\u{2060}'..='\u{206F}'
                | '\u{3164}'
                | '\u{FE00}'..='\u{FE0F}'
                | '\u{FEFF}'
                | '\u{FFA0}'
                | '\u{FFF0}'..='\u{FFFB}'
                | '\u{1BCA0}'..='\u{1BCA3}'
                | '\u{1D173}'..='\u{1D17A}'
                | '\u{E0000}'..='\u{E0FFF}'
        )
}

/// Gives a status without a standard reason phrase one, where nothing upstream gave it one:
/// hyper writes `<none>` on an HTTP/1.1 status line otherwise (an HTTP/2 upstream sends no
/// phrase). Anthropic's 529 is its overload; any other such status gets an empty phrase,
/// which RFC 9112 4 allows.
pub fn keep_reason_phrase(status: http::StatusCode, extensions: &mut http::Extensions) {
    // `<none>` is what hyper itself writes for such a status: an upstream served by hyper
    // gives that, which is no phrase.
    let given = extensions
        .get::<hyper::ext::ReasonPhrase>()
        .is_some_and(|p| p.as_bytes() != b"<none>");
    if status.canonical_reason().is_some() || given {
        return;
    }
    let phrase: &'static [u8] = if status.as_u16() == 529 {
        b"Overloaded"
    } else {
        b""
    };
    extensions.insert(hyper::ext::ReasonPhrase::from_static(phrase));
}

/// Connection-level headers (RFC 9110 section 7.6.1) that never cross a proxy.
const HOPS: usize = 9;
const HOP_BY_HOP: [HeaderName; HOPS] = [
    header::CONNECTION,
    header::UPGRADE,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
];
/// Where `Transfer-Encoding` is in `HOP_BY_HOP`.
const TRANSFER_ENCODING_AT: usize = HOPS - 1;

/// Where `name` is in `HOP_BY_HOP`: one match on the name's text, where comparing it with
/// each of the nine names cost about 50 instructions a header.
fn hop_at(name: &HeaderName) -> Option<usize> {
    Some(match name.as_str() {
        "connection" => 0,
        "upgrade" => 1,
        "keep-alive" => 2,
        "proxy-connection" => 3,
        "proxy-authenticate" => 4,
        "proxy-authorization" => 5,
        "te" => 6,
        "trailer" => 7,
        "transfer-encoding" => TRANSFER_ENCODING_AT,
        _ => return None,
    })
}

/// Whether a header is about one connection, not the message (`HOP_BY_HOP`).
pub(crate) fn is_hop_by_hop(name: &HeaderName) -> bool {
    hop_at(name).is_some()
}

/// Refuses heads whose target two parsers could read differently (RFC 9112 3.2). hyper's
/// HTTP/1 parser already refuses obs-fold, bare CR, conflicting or malformed lengths and
/// codings that do not end in chunked, and merges equal lengths; what it leaves is checked
/// here, transfer codings other than one chunked among them. It lets
/// Transfer-Encoding override (and remove) Content-Length, which RFC 9112 6.3 allows, but
/// nginx (since 1.21.1) and Envoy refuse such a request, and so does Hourglass:
/// `content_length_with_coding` says the connection's framing tracker saw both.
pub(crate) fn check_framing(
    version: Version,
    headers: &HeaderMap,
    content_length_with_coding: bool,
) -> Result<(), GatewayError> {
    // One lookup per name: each hashes the name and probes the map.
    let mut lengths = headers.get_all(header::CONTENT_LENGTH).iter();
    let mut hosts = headers.get_all(header::HOST).iter();
    let host = hosts.next();
    let reason = if content_length_with_coding {
        "both Content-Length and Transfer-Encoding are present"
    } else if lengths.nth(1).is_some() {
        "more than one Content-Length"
    } else if hosts.next().is_some() {
        "more than one Host"
    } else if version == Version::HTTP_11 && host.is_none() {
        "an HTTP/1.1 request without Host"
    } else if host.is_some_and(|h| !valid_host(h)) {
        "a Host that is not host[:port]"
    } else {
        return check_transfer_coding(headers);
    };
    Err(GatewayError::AmbiguousRequest { reason })
}

/// A request's transfer codings, over all its `Transfer-Encoding` lines, must be one
/// `chunked` (any case, whitespace around it). hyper refuses a coding list that does not end
/// in chunked, but reads `gzip, chunked` or `chunked, chunked` as chunked and hands the
/// header on; the header is hop-by-hop, so the coding before chunked would vanish and the
/// upstream take the coded bytes for the content.
fn check_transfer_coding(headers: &HeaderMap) -> Result<(), GatewayError> {
    Err(match coding_fault(headers) {
        None => return Ok(()),
        Some((Coding::Other, value)) => GatewayError::UnsupportedTransferCoding { value },
        Some((Coding::ChunkedTwice, value)) => GatewayError::ChunkedTwice { value },
    })
}

/// What is wrong with a message's transfer codings, over all its `Transfer-Encoding` lines.
enum Coding {
    /// A coding other than chunked.
    Other,
    /// `chunked` more than once (RFC 9112 6.1 forbids it).
    ChunkedTwice,
}

/// The fault of a message's transfer codings, if they are not one `chunked` (any case,
/// whitespace around it) or none, with the header's lines joined to name it.
fn coding_fault(headers: &HeaderMap) -> Option<(Coding, String)> {
    let (mut chunked, mut other) = (0, false);
    for (_, coding) in list_items(headers, header::TRANSFER_ENCODING) {
        if coding.eq_ignore_ascii_case(b"chunked") {
            chunked += 1;
        } else {
            other = true;
        }
    }
    if !other && chunked <= 1 {
        return None;
    }
    let lines: Vec<&[u8]> = headers
        .get_all(header::TRANSFER_ENCODING)
        .iter()
        .map(HeaderValue::as_bytes)
        .collect();
    let value = String::from_utf8_lossy(&lines.join(&b", "[..])).into_owned();
    Some((
        if other {
            Coding::Other
        } else {
            Coding::ChunkedTwice
        },
        value,
    ))
}

/// Whether an answer of `status` has no content, whatever its head says: a 1xx, a 204 (RFC
/// 9110 15.3.5), a 205 (15.3.6: "MUST NOT generate content") or a 304 (15.4.5). Such an
/// answer is no stream or document to read, nor one that could end short; its body, if the
/// upstream sent one anyway, is dropped. The one definition both the held attempt and the
/// answer use (audit NA 4: a 205 was read as an event stream and given an error event).
pub fn answers_without_content(status: http::StatusCode) -> bool {
    matches!(status.as_u16(), 100..=199 | 204 | 205 | 304)
}

/// What an upstream answer's head says that hyper's client accepts but the gateway must not
/// pass on, in words for the 502; `None` when the head can go out. A transfer coding other
/// than one `chunked` (RFC 9112 6.1: never sent unless the request's `TE` asked, and the
/// gateway's asks for none): hyper removes only the chunked framing, and the coding before
/// it would vanish with the hop-by-hop header, its bytes passed off as the content. A `101`
/// (RFC 9110 15.2.2: a switch the request never asked for). A `Content-Length` that is a
/// list of one repeated number, which hyper accepts, goes on as that number (RFC 9110 8.6:
/// a sender forwards only the single-number grammar).
/// The most fields an upstream's answer head may have: hyper's HTTP/1 client's own bound,
/// applied to HTTP/2 answers alike. Providers send about 30.
pub const MAX_ANSWER_FIELDS: usize = 100;

pub(crate) fn answer_framing_fault(
    status: http::StatusCode,
    headers: &mut HeaderMap,
) -> Option<String> {
    if status == http::StatusCode::SWITCHING_PROTOCOLS {
        return Some(
            "answered 101 Switching Protocols, to a request that asked for no upgrade".into(),
        );
    }
    // RFC 9110 15: status codes are 100 to 599 (hyper takes any three digits). A client
    // reads another as a 5xx, metrics have no class for it, and the log called it ok.
    if status.as_u16() > 599 {
        return Some(format!(
            "answered status {}, outside the 100 to 599 that HTTP defines",
            status.as_u16()
        ));
    }
    if let Some((_, value)) = coding_fault(headers) {
        return Some(format!(
            "transfer-encoding: {value:?}: a transfer coding other than one chunked, which the \
             gateway does not decode"
        ));
    }
    // hyper's HTTP/1 client refuses more itself; h2 bounds only the head's bytes.
    if headers.len() > MAX_ANSWER_FIELDS {
        return Some(format!(
            "sent a head of {} fields, more than the {MAX_ANSWER_FIELDS} the gateway passes on",
            headers.len()
        ));
    }
    let length = headers.get(header::CONTENT_LENGTH)?;
    if length.as_bytes().contains(&b',') {
        // hyper refuses a list of different numbers: this one repeats its first.
        let first = length.as_bytes().split(|&b| b == b',').next()?.trim_ascii();
        if let Ok(one) = HeaderValue::from_bytes(first) {
            headers.insert(header::CONTENT_LENGTH, one);
        }
    }
    None
}

/// RFC 9112 3.2: `uri-host [ ":" port ]` (RFC 3986 3.2.2: a bracketed IP literal or a
/// reg-name), or empty (a target without an authority). The gateway replaces Host with the
/// upstream's, but the same section has a server answer 400 to an invalid one rather than
/// guess what the client meant. Checked byte by byte: `http`'s authority parser accepts
/// userinfo and any port text, and cost 800 instructions a request here.
fn valid_host(value: &HeaderValue) -> bool {
    let (host, port) = split_port(value.as_bytes());
    let unreserved_or_sub_delim = |b: u8| {
        matches!(b, b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~'
            | b'!' | b'$' | b'&' | b'\'' | b'(' | b')' | b'*' | b'+' | b',' | b';' | b'=')
    };
    let host_ok = match host {
        [b'[', literal @ .., b']'] => {
            !literal.is_empty()
                && literal
                    .iter()
                    .all(|&b| b == b':' || unreserved_or_sub_delim(b))
        }
        _ => host
            .iter()
            .all(|&b| b == b'%' || unreserved_or_sub_delim(b)),
    };
    host_ok && port.iter().all(u8::is_ascii_digit)
}

/// `host[:port]` as its host and its port's digits (none without a colon; a colon inside an
/// IP literal's brackets is no port's).
pub(crate) fn split_port(v: &[u8]) -> (&[u8], &[u8]) {
    match v.iter().rposition(|&b| b == b':') {
        Some(i) if !v[i..].contains(&b']') => (&v[..i], &v[i + 1..]),
        _ => (v, &[][..]),
    }
}

/// RFC 9113 8.3.1: an HTTP/2 request whose Host names another server than its `:authority`
/// is malformed. Forwarded, a front proxy that routed on the one and the gateway that logs
/// the other would disagree on whom it was for. Compared as RFC 3986 6.2.3 has it: the host
/// in any case, a port left out as the scheme's. Both, as sent, when they differ.
pub(crate) fn host_not_authority(uri: &Uri, headers: &HeaderMap) -> Option<(String, String)> {
    let authority = uri.authority()?;
    let host = headers.get(header::HOST)?;
    let default = if uri.scheme() == Some(&Scheme::HTTPS) {
        443
    } else {
        80
    };
    let (name, digits) = split_port(host.as_bytes());
    let port = match digits {
        [] => Some(default),
        d => std::str::from_utf8(d)
            .ok()
            .and_then(|d| d.parse::<u16>().ok()),
    };
    let same = name.eq_ignore_ascii_case(authority.host().as_bytes())
        && port == Some(authority.port_u16().unwrap_or(default));
    (!same).then(|| {
        (
            String::from_utf8_lossy(host.as_bytes()).into_owned(),
            authority.as_str().to_owned(),
        )
    })
}

/// An HTTP/2 request head's size as RFC 9113 6.5.2 counts a header list (what
/// `SETTINGS_MAX_HEADER_LIST_SIZE` bounds): each field's name and value and 32, the
/// pseudo-header fields among them.
pub(crate) fn header_list_size(method: &http::Method, uri: &Uri, headers: &HeaderMap) -> usize {
    const FIELD: usize = 32;
    let pseudo = [
        Some((":method", method.as_str())),
        uri.scheme_str().map(|s| (":scheme", s)),
        uri.authority().map(|a| (":authority", a.as_str())),
        uri.path_and_query().map(|p| (":path", p.as_str())),
    ];
    let pseudo: usize = pseudo
        .iter()
        .flatten()
        .map(|(name, value)| name.len() + value.len() + FIELD)
        .sum();
    headers.iter().fold(pseudo, |size, (name, value)| {
        size + name.as_str().len() + value.len() + FIELD
    })
}

pub(crate) fn content_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
}

/// The media type of `Content-Type` (before its parameters, trimmed), when the value is
/// visible ASCII.
fn media_type(headers: &HeaderMap) -> Option<&str> {
    let v = headers.get(header::CONTENT_TYPE)?.to_str().ok()?;
    Some(v.split(';').next().unwrap_or_default().trim())
}

/// The elements of a list-valued header over all its lines (RFC 9110 5.6.1: comma-separated,
/// optional whitespace around each, empty elements ignored), each with the line it is on.
pub(super) fn list_items(
    headers: &HeaderMap,
    name: HeaderName,
) -> impl Iterator<Item = (&HeaderValue, &[u8])> {
    headers.get_all(name).into_iter().flat_map(|line| {
        line.as_bytes()
            .split(|&b| b == b',')
            .map(<[u8]>::trim_ascii)
            .filter(|item| !item.is_empty())
            .map(move |item| (line, item))
    })
}

pub(crate) const IDENTITY: HeaderValue = HeaderValue::from_static("identity");

/// The client's `Accept-Encoding` as one value (its field lines joined, as RFC 9110 5.3
/// allows), or none.
pub(crate) fn client_accept_encoding(headers: &HeaderMap) -> Option<HeaderValue> {
    let mut values = headers.get_all(header::ACCEPT_ENCODING).iter();
    let first = values.next()?;
    let rest: Vec<&[u8]> = values.map(HeaderValue::as_bytes).collect();
    if rest.is_empty() {
        return Some(first.clone());
    }
    let joined = std::iter::once(first.as_bytes())
        .chain(rest)
        .collect::<Vec<_>>()
        .join(&b", "[..]);
    HeaderValue::from_bytes(&joined).ok()
}

pub(crate) fn unsupported_encoding(headers: &HeaderMap) -> GatewayError {
    let value = content_coding(headers).map(HeaderValue::as_bytes);
    GatewayError::UnsupportedEncoding {
        value: String::from_utf8_lossy(value.unwrap_or_default()).into_owned(),
    }
}

/// What a response body is, read once from its head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyShape {
    /// `text/event-stream`.
    pub event_stream: bool,
    /// `application/json` or a `+json` type.
    pub json: bool,
    /// `application/x-ndjson` (Ollama's streams), or `application/jsonl`.
    pub ndjson: bool,
    /// In no content coding, so its bytes are what its type says. An encoded body (an
    /// upstream that ignored `identity`) is passed through opaque: nothing is read from it
    /// or added to it.
    pub readable: bool,
}

impl BodyShape {
    /// Every answer's: one lookup and one media type for its three questions (a lookup each
    /// cost about 400 instructions a request).
    pub fn of(headers: &HeaderMap) -> Self {
        let media = media_type(headers).unwrap_or_default();
        let is = |m: &str| media.eq_ignore_ascii_case(m);
        // `application/json` or a `+json` type.
        let json = is("application/json")
            || media.len() > 5
                && media.as_bytes()[media.len() - 5..].eq_ignore_ascii_case(b"+json");
        Self {
            event_stream: is("text/event-stream"),
            json,
            ndjson: is("application/x-ndjson") || is("application/jsonl"),
            readable: content_coding(headers).is_none(),
        }
    }

    /// SSE text the gateway can read as it passes.
    pub fn readable_sse(self) -> bool {
        self.event_stream && self.readable
    }
}

/// The request's `Upgrade` value when it asks for WebSocket (RFC 6455 4.1: the `websocket`
/// token, case-insensitive, possibly among others). Other upgrades, such as curl's `h2c` on a
/// cleartext HTTP/1.1 request, are ignored as RFC 9110 7.8 lets a server do, and the request
/// is served as HTTP/1.1.
pub fn websocket_upgrade(headers: &HeaderMap) -> Option<&HeaderValue> {
    list_items(headers, header::UPGRADE)
        .find(|(_, protocol)| {
            // `name[/version]`
            let name = protocol.split(|&b| b == b'/').next().unwrap_or_default();
            name.trim_ascii().eq_ignore_ascii_case(b"websocket")
        })
        .map(|(line, _)| line)
}

/// The first `Content-Encoding` value that names a coding other than `identity`.
pub fn content_coding(headers: &HeaderMap) -> Option<&HeaderValue> {
    list_items(headers, header::CONTENT_ENCODING)
        .find(|(_, coding)| !coding.eq_ignore_ascii_case(b"identity"))
        .map(|(line, _)| line)
}

/// Which of `names` are present, in one pass over the names a message carries (a handful),
/// where a lookup per name hashes it and probes the map even when it is absent.
pub(crate) fn present<const N: usize>(headers: &HeaderMap, names: [&HeaderName; N]) -> [bool; N] {
    let mut present = [false; N];
    for name in headers.keys() {
        if let Some(i) = names.iter().position(|n| *n == name) {
            present[i] = true;
        }
    }
    present
}

/// Fields a trailer section must not carry (RFC 9110 6.5.1): those that frame the message,
/// route it, authenticate, control the response or say how to process its content. Sent on,
/// a `content-length` trailer makes nghttp2 (curl) and Node reset the stream, after a
/// complete answer.
const NOT_IN_TRAILERS: [HeaderName; 24] = [
    header::CONTENT_LENGTH,
    header::TRANSFER_ENCODING,
    header::HOST,
    header::CACHE_CONTROL,
    header::MAX_FORWARDS,
    header::TE,
    header::EXPECT,
    header::RANGE,
    header::AUTHORIZATION,
    header::PROXY_AUTHORIZATION,
    header::WWW_AUTHENTICATE,
    header::PROXY_AUTHENTICATE,
    header::SET_COOKIE,
    header::COOKIE,
    header::AGE,
    header::EXPIRES,
    header::DATE,
    header::LOCATION,
    header::RETRY_AFTER,
    header::VARY,
    header::CONTENT_ENCODING,
    header::CONTENT_TYPE,
    header::CONTENT_RANGE,
    header::TRAILER,
];

/// An upstream's trailers as they may be sent on: without hop-by-hop fields, and without
/// those no trailer section may carry. (Rare: the cost of the lookups is no stream's.)
pub(crate) fn strip_from_trailers(trailers: &mut HeaderMap) {
    strip_hop_by_hop(trailers);
    for name in &NOT_IN_TRAILERS {
        trailers.remove(name);
    }
}

pub(crate) fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // A removal hashes the name and probes the map, so only the hop-by-hop names present are
    // removed: most messages carry none, and an HTTP/1.1 stream's answer one
    // (`transfer-encoding`), where nine blind removals cost 1,200 instructions a stream.
    if !headers.keys().any(|n| hop_at(n).is_some()) {
        return;
    }
    let mut present = [false; HOPS];
    for name in headers.keys() {
        if let Some(i) = hop_at(name) {
            present[i] = true;
        }
    }
    // Names the `Connection` header lists are hop-by-hop too (RFC 9110 7.6.1).
    let named: Vec<HeaderName> = list_items(headers, header::CONNECTION)
        .filter_map(|(_, n)| HeaderName::from_bytes(n).ok())
        .collect();
    for n in named.iter() {
        headers.remove(n);
    }
    for (n, _) in HOP_BY_HOP.iter().zip(present).filter(|(_, p)| *p) {
        headers.remove(n);
    }
    // A length that came with a transfer coding is not the message's: the coding framed it
    // (RFC 9112 6.1), and an intermediary must remove the length before forwarding (6.3).
    // Left on an answer, a chunked body was cut to it for HTTP/1.1 clients and broke the
    // stream (PROTOCOL_ERROR) for HTTP/2 ones.
    if present[TRANSFER_ENCODING_AT] {
        headers.remove(header::CONTENT_LENGTH);
    }
}

/// HTTP/2 carries a cookie as one field per crumb; before an HTTP/1.1 hop they must be one
/// field joined with "; " (RFC 9113 8.2.3), which serves an HTTP/2 upstream as well. An
/// HTTP/1.1 client's repeated `Cookie` lines are joined alike (RFC 6265 5.4 allows one).
pub(crate) fn join_cookies(headers: &mut HeaderMap) {
    let mut crumbs = headers.get_all(header::COOKIE).iter();
    let (Some(first), Some(_)) = (crumbs.next(), crumbs.next()) else {
        return;
    };
    let mut joined = first.as_bytes().to_vec();
    for crumb in headers.get_all(header::COOKIE).iter().skip(1) {
        joined.extend_from_slice(b"; ");
        joined.extend_from_slice(crumb.as_bytes());
    }
    // Each crumb was a valid value, and so is their join.
    if let Ok(value) = HeaderValue::from_bytes(&joined) {
        headers.insert(header::COOKIE, value);
    }
}

/// Keeps a client's request id when it is a sane token, so logs correlate across hops;
/// otherwise makes one.
pub(crate) fn request_id(headers: &HeaderMap) -> Arc<str> {
    headers
        .get(REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= 128 && v.bytes().all(|b| b.is_ascii_graphic()))
        .map(Arc::from)
        .unwrap_or_else(new_request_id)
}

/// 32 hex digits: a random 64-bit prefix drawn once per process, then a counter. Unique
/// within the process and, with overwhelming odds, across processes, without the kernel
/// call per request that a UUIDv4 costs (it showed in profiles).
fn new_request_id() -> Arc<str> {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;
    static PREFIX: OnceLock<u64> = OnceLock::new();
    static NEXT: AtomicU64 = AtomicU64::new(0);
    // fastrand seeds itself from the process's random state (std's `RandomState`).
    let prefix = *PREFIX.get_or_init(|| fastrand::u64(..));
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&prefix.to_be_bytes());
    bytes[8..].copy_from_slice(&n.to_be_bytes());
    let mut buf = [0u8; 32];
    hex_into(&bytes, &mut buf);
    Arc::from(std::str::from_utf8(&buf).expect("hex digits are ASCII"))
}

/// `bytes` in lowercase hex, two digits each, into the start of `out`. By hand: `format!`
/// (1,450 instructions more per request id) or `write!` into a stack buffer (780 more)
/// spend more on padding and dispatch than the digits take.
pub fn hex_into(bytes: &[u8], out: &mut [u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for (b, pair) in bytes.iter().zip(out.chunks_exact_mut(2)) {
        pair[0] = HEX[usize::from(b >> 4)];
        pair[1] = HEX[usize::from(b & 0xf)];
    }
}

pub(crate) fn insert_request_id(headers: &mut HeaderMap, id: &str) {
    if let Ok(v) = HeaderValue::from_str(id) {
        headers.insert(REQUEST_ID, v);
    }
}

/// Where an upstream's own `x-request-id` goes on the answer: the gateway's id takes its
/// name, and the provider's (OpenAI's `req_...`, the id its support asks for) is kept.
pub const UPSTREAM_REQUEST_ID: HeaderName = HeaderName::from_static("x-upstream-request-id");

/// The request id on an upstream's answer: ours, with each of the upstream's own kept as an
/// `x-upstream-request-id` line, after any it sent under that name itself (the id of a
/// provider behind an upstream proxy, which that provider's support asks for). An id that is
/// ours (a provider that echoes it, or a gateway behind this one) or already kept is not
/// repeated, so a chain of gateways shows one id per hop.
pub(crate) fn answer_request_id(headers: &mut HeaderMap, id: &str) {
    use http::header::Entry;
    if let Entry::Occupied(entry) = headers.entry(REQUEST_ID) {
        let mut theirs = entry.remove_entry_mult().1;
        let first = theirs.next();
        // Empty, and so no allocation, for the one id an upstream sends.
        let rest: Vec<HeaderValue> = theirs.collect();
        for value in first.into_iter().chain(rest) {
            let kept = value.as_bytes() == id.as_bytes()
                || headers
                    .get_all(UPSTREAM_REQUEST_ID)
                    .iter()
                    .any(|v| v == value);
            if !kept {
                headers.append(UPSTREAM_REQUEST_ID, value);
            }
        }
    }
    insert_request_id(headers, id);
}

/// An event stream's `Cache-Control`: the upstream's own, with `no-cache` added unless it
/// already forbids reuse (`no-cache` unqualified, or `no-store`). Replaced, a provider's
/// `no-store, private` became `no-cache`, which lets a shared cache store a user's answer
/// (RFC 9111 5.2.2.4, 5.2.2.5, 5.2.2.7).
pub(crate) fn uncached_event_stream(headers: &mut HeaderMap) {
    const NO_CACHE: HeaderValue = HeaderValue::from_static("no-cache");
    let forbids = list_items(headers, header::CACHE_CONTROL).any(|(_, directive)| {
        directive.eq_ignore_ascii_case(b"no-cache") || directive.eq_ignore_ascii_case(b"no-store")
    });
    if forbids {
        return;
    }
    let mut lines = headers.get_all(header::CACHE_CONTROL).iter();
    if lines.next().is_none() {
        headers.insert(header::CACHE_CONTROL, NO_CACHE);
        return;
    }
    // One line, not two: a cache that reads only the first would miss the `no-cache`.
    let mut joined: Vec<&[u8]> = headers
        .get_all(header::CACHE_CONTROL)
        .iter()
        .map(HeaderValue::as_bytes)
        .collect();
    joined.push(b"no-cache");
    if let Ok(value) = HeaderValue::from_bytes(&joined.join(&b", "[..])) {
        headers.insert(header::CACHE_CONTROL, value);
    }
}

/// Whether an upstream's answer header tells of the provider, kept on an answer the gateway
/// makes in place of one whose head came (an error after it): its own request id
/// (Anthropic's `request-id`, or an `x-request-id` kept as `x-upstream-request-id`), which its
/// support asks for, and its rate limits (`anthropic-ratelimit-*`, `x-ratelimit-*`, the IETF
/// draft's `ratelimit` and `ratelimit-policy`), which a client paces itself by.
fn tells_of_the_provider(name: &HeaderName) -> bool {
    let name = name.as_str();
    matches!(name, "request-id" | "ratelimit" | "ratelimit-policy")
        || name == UPSTREAM_REQUEST_ID.as_str()
        || name.starts_with("anthropic-ratelimit-")
        || name.starts_with("x-ratelimit-")
}

/// Copies the headers of an upstream's head that tell of the provider (see
/// `tells_of_the_provider`) onto an answer made in its place.
pub(crate) fn carry_provider_headers(head: &HeaderMap, answer: &mut HeaderMap) {
    for (name, value) in head {
        if tells_of_the_provider(name) {
            answer.append(name.clone(), value.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Audit DA 5.
    #[test]
    fn a_host_is_the_authority_in_any_case_and_with_the_default_port() {
        let differs = |uri: &str, host: Option<&'static str>| {
            let mut h = HeaderMap::new();
            if let Some(v) = host {
                h.insert(header::HOST, HeaderValue::from_static(v));
            }
            host_not_authority(&uri.parse().unwrap(), &h)
        };
        for (uri, host) in [
            ("http://gateway/v1", None),
            ("/v1", Some("elsewhere")),
            ("http://gateway/v1", Some("gateway")),
            ("http://Gateway:80/v1", Some("gATEWAY")),
            ("https://gateway/v1", Some("gateway:443")),
            ("http://[::1]:8443/v1", Some("[::1]:8443")),
        ] {
            assert_eq!(differs(uri, host), None, "{uri} {host:?}");
        }
        for (uri, host) in [
            ("http://gateway/v1", "evil.example"),
            ("http://gateway/v1", "gateway:8443"),
            ("https://gateway/v1", "gateway:80"),
            ("http://gateway:8443/v1", "gateway"),
            ("http://[::1]:8443/v1", "[::2]:8443"),
        ] {
            let (h, a) = differs(uri, Some(host)).unwrap_or_else(|| panic!("{uri} {host}"));
            assert_eq!(h, host);
            assert_eq!(a, uri.parse::<Uri>().unwrap().authority().unwrap().as_str());
        }
    }

    #[test]
    fn a_header_list_is_sized_as_http2_counts_it() {
        let mut h = HeaderMap::new();
        h.append("x-long", HeaderValue::from_static("abc"));
        h.append("cookie", HeaderValue::from_static("a=1"));
        h.append("cookie", HeaderValue::from_static("b=2"));
        let uri: Uri = "http://gateway/v1/chat?x=1".parse().unwrap();
        let pseudo = (7 + 4) + (7 + 4) + (10 + 7) + (5 + 12) + 4 * 32;
        assert_eq!(
            header_list_size(&http::Method::POST, &uri, &h),
            pseudo + (6 + 3 + 32) + 2 * (6 + 3 + 32)
        );
        let path_only: Uri = "/v1".parse().unwrap();
        assert_eq!(
            header_list_size(&http::Method::GET, &path_only, &HeaderMap::new()),
            (7 + 3 + 32) + (5 + 3 + 32)
        );
    }

    /// Audit IC 6: a second `x-request-id` and the upstream's own `x-upstream-request-id` (its
    /// provider's, behind it) were lost.
    #[test]
    fn every_upstream_request_id_is_kept_once() {
        let answer = |fields: &[(&'static str, &'static str)]| {
            let mut h = HeaderMap::new();
            for (name, value) in fields {
                h.append(*name, HeaderValue::from_static(value));
            }
            answer_request_id(&mut h, "ours");
            let ids = |name| {
                h.get_all(name)
                    .iter()
                    .map(|v| v.to_str().unwrap().to_owned())
                    .collect::<Vec<_>>()
            };
            (ids("x-request-id"), ids("x-upstream-request-id"))
        };
        assert_eq!(
            answer(&[
                ("x-request-id", "up1"),
                ("x-request-id", "up2"),
                ("x-upstream-request-id", "deeper"),
            ]),
            (
                vec!["ours".into()],
                vec!["deeper".into(), "up1".into(), "up2".into()]
            )
        );
        // A gateway behind this one echoes our id and keeps its provider's: one id per hop.
        assert_eq!(
            answer(&[("x-request-id", "ours"), ("x-upstream-request-id", "req_1")]),
            (vec!["ours".into()], vec!["req_1".into()])
        );
        assert_eq!(
            answer(&[
                ("x-request-id", "up1"),
                ("x-request-id", "up1"),
                ("x-upstream-request-id", "up1"),
            ]),
            (vec!["ours".into()], vec!["up1".into()])
        );
        assert_eq!(answer(&[]), (vec!["ours".into()], vec![]));
    }

    /// Audit IC 5: an event stream's `no-store, private` was replaced by `no-cache`.
    #[test]
    fn an_event_stream_keeps_the_upstreams_cache_control() {
        let of = |lines: &[&'static str]| {
            let mut h = HeaderMap::new();
            for v in lines {
                h.append(header::CACHE_CONTROL, HeaderValue::from_static(v));
            }
            uncached_event_stream(&mut h);
            h.get_all(header::CACHE_CONTROL)
                .iter()
                .map(|v| v.to_str().unwrap().to_owned())
                .collect::<Vec<_>>()
        };
        assert_eq!(of(&[]), ["no-cache"]);
        assert_eq!(of(&["no-store, private"]), ["no-store, private"]);
        assert_eq!(of(&["private", "No-Store"]), ["private", "No-Store"]);
        assert_eq!(of(&["no-cache"]), ["no-cache"]);
        assert_eq!(
            of(&["private, max-age=0"]),
            ["private, max-age=0, no-cache"]
        );
        assert_eq!(
            of(&["private", "max-age=0"]),
            ["private, max-age=0, no-cache"]
        );
        // A qualified no-cache (RFC 9111 5.2.2.4) holds back only the fields it names.
        assert_eq!(
            of(&["no-cache=\"set-cookie\""]),
            ["no-cache=\"set-cookie\", no-cache"]
        );
    }

    fn framing(version: Version, fields: &[(&'static str, &'static str)]) -> Option<&'static str> {
        framing_seen(version, fields, false)
    }

    /// `both`: the connection's tracker saw Content-Length beside Transfer-Encoding.
    fn framing_seen(
        version: Version,
        fields: &[(&'static str, &'static str)],
        both: bool,
    ) -> Option<&'static str> {
        let mut h = HeaderMap::new();
        for (name, value) in fields {
            h.append(*name, HeaderValue::from_static(value));
        }
        match check_framing(version, &h, both) {
            Ok(()) => None,
            Err(GatewayError::AmbiguousRequest { reason }) => Some(reason),
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn check_framing_refuses_each_ambiguity_and_nothing_else() {
        use Version as V;
        let host = ("host", "gateway");
        let len = ("content-length", "5");
        // Clean heads: one length or none, one valid Host; HTTP/2 and 1.0 need no Host.
        for (v, fields) in [
            (V::HTTP_11, &[host][..]),
            (V::HTTP_11, &[host, len][..]),
            (V::HTTP_10, &[][..]),
            (V::HTTP_2, &[len][..]),
            (V::HTTP_2, &[("host", "gateway:8443")][..]),
        ] {
            assert_eq!(framing(v, fields), None, "{v:?} {fields:?}");
        }
        // Two lengths, equal or not, on any version (HTTP/1 merges equal ones before this;
        // HTTP/2 does not).
        for v in [V::HTTP_11, V::HTTP_2] {
            for second in ["5", "6"] {
                let fields = [host, len, ("content-length", second)];
                assert_eq!(framing(v, &fields), Some("more than one Content-Length"));
            }
        }
        assert_eq!(
            framing(V::HTTP_2, &[host, ("host", "other")]),
            Some("more than one Host")
        );
        assert_eq!(
            framing(V::HTTP_11, &[len]),
            Some("an HTTP/1.1 request without Host")
        );
        for v in [V::HTTP_11, V::HTTP_10, V::HTTP_2] {
            assert_eq!(
                framing(v, &[("host", "u@gateway")]),
                Some("a Host that is not host[:port]"),
                "{v:?}"
            );
        }
        // A length beside a coding, which hyper hides from the head, as the tracker saw it.
        let chunked = ("transfer-encoding", "chunked");
        let both = framing_seen(V::HTTP_11, &[host, chunked], true).unwrap();
        assert!(
            both.contains("Content-Length") && both.contains("Transfer-Encoding"),
            "{both}"
        );
        assert_eq!(framing_seen(V::HTTP_11, &[host, chunked], false), None);
        // The length is checked first: a head with two of everything names the lengths.
        let all = [host, ("host", "b"), len, ("content-length", "6")];
        assert_eq!(
            framing(V::HTTP_11, &all),
            Some("more than one Content-Length")
        );
    }

    #[test]
    fn transfer_codings_other_than_one_chunked_are_refused() {
        let coded = |lines: &[&'static str]| {
            let mut h = HeaderMap::new();
            h.insert(header::HOST, HeaderValue::from_static("gateway"));
            for line in lines {
                h.append(header::TRANSFER_ENCODING, HeaderValue::from_static(line));
            }
            match check_framing(Version::HTTP_11, &h, false) {
                Ok(()) => "ok".to_owned(),
                Err(e) => format!("{} {}", e.status().as_u16(), e),
            }
        };
        for ok in [
            &[][..],
            &["chunked"],
            &[" Chunked\t"],
            &["CHUNKED"],
            &[", chunked,"],
        ] {
            assert_eq!(coded(ok), "ok", "{ok:?}");
        }
        assert!(
            coded(&["gzip, chunked"]).starts_with("501 transfer-encoding: \"gzip, chunked\": "),
            "{}",
            coded(&["gzip, chunked"])
        );
        assert!(coded(&["gzip", "chunked"]).starts_with("501 transfer-encoding: \"gzip, chunked\""));
        assert!(coded(&["chunked;x=1"]).starts_with("501 "));
        assert!(coded(&["gzip, chunked, chunked"]).starts_with("501 "));
        assert_eq!(
            coded(&["chunked", "Chunked"]),
            "400 ambiguous request framing: transfer-encoding: \"chunked, Chunked\" applies chunked more than once"
        );
        assert!(coded(&["chunked , chunked"]).starts_with("400 "));
    }

    #[test]
    fn host_values() {
        for ok in [
            "",
            "gateway",
            "gateway:8080",
            "gateway:",
            "127.0.0.1:80",
            "[::1]",
            "[::1]:8080",
        ] {
            assert!(valid_host(&HeaderValue::from_static(ok)), "{ok:?}");
        }
        for bad in [
            "a b",
            "u@gateway",
            "gateway/x",
            "gateway:80x",
            "[::1",
            "[]",
            "gateway?q",
            "gate[way]",
        ] {
            assert!(!valid_host(&HeaderValue::from_static(bad)), "{bad:?}");
        }
    }

    #[test]
    fn a_websocket_upgrade_is_told_from_others() {
        let with = |values: &[&'static str]| {
            let mut h = HeaderMap::new();
            for v in values {
                h.append(header::UPGRADE, HeaderValue::from_static(v));
            }
            websocket_upgrade(&h).map(|v| v.to_str().unwrap().to_string())
        };
        assert_eq!(with(&["websocket"]).as_deref(), Some("websocket"));
        assert_eq!(with(&["WebSocket"]).as_deref(), Some("WebSocket"));
        assert_eq!(
            with(&["h2c", " websocket/13 "]).as_deref(),
            Some(" websocket/13 ")
        );
        assert_eq!(with(&["foo, websocket"]).as_deref(), Some("foo, websocket"));
        assert_eq!(with(&[]), None);
        assert_eq!(with(&["h2c"]), None);
        assert_eq!(with(&["TLS/1.2, websockets"]), None);
    }

    #[test]
    fn hop_by_hop_headers_and_those_connection_names_are_stripped() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        h.insert("x-keep", HeaderValue::from_static("1"));
        let untouched = h.clone();
        strip_hop_by_hop(&mut h);
        assert_eq!(h, untouched);

        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, X-Secret"),
        );
        h.insert("x-secret", HeaderValue::from_static("s"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        h.insert(header::TE, HeaderValue::from_static("trailers"));
        h.insert("proxy-connection", HeaderValue::from_static("close"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h, untouched);

        // An HTTP/1.1 stream's answer: one of them, alone.
        h.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        strip_hop_by_hop(&mut h);
        assert_eq!(h, untouched);

        // A length beside a coding goes with it; a length alone stays.
        for (i, name) in HOP_BY_HOP.iter().enumerate() {
            assert_eq!(hop_at(name), Some(i), "{name}");
        }
        assert_eq!(hop_at(&header::CONTENT_TYPE), None);
        h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("3"));
        let with_length = h.clone();
        h.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        strip_hop_by_hop(&mut h);
        assert_eq!(h, untouched);
        h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("3"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h, with_length);
    }

    #[test]
    fn the_clients_accept_encoding_is_kept_whole() {
        let mut h = HeaderMap::new();
        assert_eq!(client_accept_encoding(&h), None);
        h.append(header::ACCEPT_ENCODING, HeaderValue::from_static("gzip"));
        assert_eq!(client_accept_encoding(&h).unwrap(), "gzip");
        h.append(
            header::ACCEPT_ENCODING,
            HeaderValue::from_static("br;q=0.5"),
        );
        assert_eq!(client_accept_encoding(&h).unwrap(), "gzip, br;q=0.5");
    }

    #[test]
    fn only_codings_other_than_identity_count_as_encoded() {
        let coded = |values: &[&str]| {
            let mut h = HeaderMap::new();
            for v in values {
                h.append(header::CONTENT_ENCODING, HeaderValue::from_str(v).unwrap());
            }
            content_coding(&h).map(|v| v.to_str().unwrap().to_owned())
        };
        assert_eq!(coded(&[]), None);
        assert_eq!(coded(&["identity"]), None);
        assert_eq!(coded(&[" Identity , IDENTITY", ""]), None);
        assert_eq!(coded(&["gzip"]).as_deref(), Some("gzip"));
        assert_eq!(coded(&["identity", "br"]).as_deref(), Some("br"));
        assert_eq!(
            coded(&["identity, gzip"]).as_deref(),
            Some("identity, gzip")
        );
    }

    #[test]
    fn request_ids_are_kept_when_sane_and_made_unique_otherwise() {
        let mut h = HeaderMap::new();
        let a = request_id(&h);
        let b = request_id(&h);
        assert_ne!(a, b);
        assert_eq!(a.len(), 32);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(a[..16], b[..16], "one prefix per process");
        let (na, nb) = (
            u64::from_str_radix(&a[16..], 16).unwrap(),
            u64::from_str_radix(&b[16..], 16).unwrap(),
        );
        assert!(nb > na, "a counter after the prefix: {a} then {b}");
        h.insert(REQUEST_ID, HeaderValue::from_static("client-chosen-id"));
        assert_eq!(&*request_id(&h), "client-chosen-id");
        h.insert(REQUEST_ID, HeaderValue::from_static("has space"));
        assert_eq!(request_id(&h).len(), 32);
    }

    #[test]
    fn cookie_crumbs_are_joined_into_one_field() {
        let mut h = HeaderMap::new();
        h.append(header::COOKIE, HeaderValue::from_static("a=1"));
        join_cookies(&mut h);
        assert_eq!(h.get_all(header::COOKIE).iter().count(), 1);
        h.append(header::COOKIE, HeaderValue::from_static("b=2"));
        h.append(header::COOKIE, HeaderValue::from_static("c=3"));
        join_cookies(&mut h);
        let all: Vec<_> = h.get_all(header::COOKIE).iter().collect();
        assert_eq!(all, ["a=1; b=2; c=3"]);
    }
}
