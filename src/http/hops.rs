//! How far a request has come: the `Via` the gateway adds (RFC 9110 7.6.3), its own hop
//! count for peers that drop `Via`, the loop limit the two make possible, and an OPTIONS
//! request's `Max-Forwards` (7.6.2).

use http::{header, HeaderMap, HeaderName, HeaderValue, Version};

use super::headers::list_items;

/// Hourglass gateways a request may already have passed through. A deliberate chain is a few
/// deep; a loop reaches this within milliseconds.
pub(crate) const MAX_HOPS: usize = 10;

/// The Hourglass gateways a request has passed through, as each counts itself on every
/// request it forwards. `Via` alone is not enough: a peer that forwards only `x-` headers
/// (LiteLLM; Portkey's forward list) drops it, and a loop through it went on for 932 hops
/// (audit KB 2). Such a peer passes this one on.
pub(crate) static HOURGLASS_HOPS: HeaderName = HeaderName::from_static("x-hourglass-hops");

/// How many Hourglass gateways the request has passed through: the greater of the `Via`
/// entries that name one ("1.1 hourglass"; a comment may follow) and `x-hourglass-hops`.
/// A hop count that is no count (not digits) says nothing, and the `Via` count stands: a
/// 400 would refuse a request for a header some peer mangled, and the gateway forwards the
/// count well-formed again, so a loop is still counted from the next hop on. Digits too many
/// for a number are a count past any limit.
pub(crate) fn hops(headers: &HeaderMap) -> usize {
    let via = list_items(headers, header::VIA)
        .filter(|(_, entry)| {
            let mut words = entry
                .split(u8::is_ascii_whitespace)
                .filter(|w| !w.is_empty());
            words.nth(1) == Some(b"hourglass")
        })
        .count();
    let own = list_items(headers, HOURGLASS_HOPS.clone())
        .filter(|(_, n)| n.iter().all(u8::is_ascii_digit))
        .map(|(_, n)| {
            std::str::from_utf8(n)
                .ok()
                .and_then(|n| n.parse().ok())
                .unwrap_or(usize::MAX)
        })
        .max()
        .unwrap_or(0);
    via.max(own)
}

/// `Via` for a request received over `version`: the protocol as RFC 9110 7.6.3 spells it
/// ("1.1", "2"; HTTP is implied), and this gateway's pseudonym. Constants, so that the bytes
/// are checked once at compile time and not on every request.
pub(crate) fn via(version: Version) -> HeaderValue {
    const V09: HeaderValue = HeaderValue::from_static("0.9 hourglass");
    const V10: HeaderValue = HeaderValue::from_static("1.0 hourglass");
    const V11: HeaderValue = HeaderValue::from_static("1.1 hourglass");
    const V2: HeaderValue = HeaderValue::from_static("2 hourglass");
    const V3: HeaderValue = HeaderValue::from_static("3 hourglass");
    match version {
        Version::HTTP_09 => V09,
        Version::HTTP_10 => V10,
        Version::HTTP_2 => V2,
        Version::HTTP_3 => V3,
        _ => V11,
    }
}

/// An OPTIONS request's `Max-Forwards` (RFC 9110 7.6.2), when it is a count: at 0 the
/// gateway answers it as the final recipient, above it forwards one less.
pub fn max_forwards(headers: &HeaderMap) -> Option<u64> {
    let v = headers.get(header::MAX_FORWARDS)?.to_str().ok()?;
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    // Digits past u64 are more hops than any chain has.
    Some(v.parse().unwrap_or(u64::MAX))
}

/// Forwards one hop less of an OPTIONS request's `Max-Forwards`, as RFC 9110 7.6.2 has every
/// intermediary do.
pub fn decrement_max_forwards(headers: &mut HeaderMap) {
    if let Some(n) = max_forwards(headers).filter(|&n| n > 0) {
        headers.insert(header::MAX_FORWARDS, HeaderValue::from(n - 1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hops_count_the_via_entries_of_hourglass_gateways_only() {
        let mut h = HeaderMap::new();
        assert_eq!(hops(&h), 0);
        h.append(
            header::VIA,
            HeaderValue::from_static("1.1 edge, 1.1 hourglass"),
        );
        h.append(
            header::VIA,
            HeaderValue::from_static("2 hourglass (chat),1.0  hourglass ,1.1 hourglass-like"),
        );
        h.append(header::VIA, HeaderValue::from_static("hourglass"));
        assert_eq!(hops(&h), 3);
    }

    /// Audit KB 2: a peer that forwards only `x-` headers (LiteLLM) drops `Via`, and a loop
    /// through it went 932 hops. The gateway's own hop count is counted too, the greater
    /// of the two; a malformed one says nothing (the `Via` count stands).
    #[test]
    fn hops_count_the_hourglass_hop_header_where_via_was_dropped() {
        let mut h = HeaderMap::new();
        h.insert(HOURGLASS_HOPS.clone(), HeaderValue::from_static("10"));
        assert_eq!(hops(&h), 10);
        h.insert(
            header::VIA,
            HeaderValue::from_static("1.1 hourglass, 1.1 hourglass"),
        );
        assert_eq!(hops(&h), 10);
        for (value, want) in [
            ("1", 2),
            (" 4 ", 4),
            ("3, 7", 7),
            ("abc", 2),
            ("-5", 2),
            ("+5", 2),
            ("", 2),
            ("99999999999999999999999999", usize::MAX),
        ] {
            h.insert(HOURGLASS_HOPS.clone(), HeaderValue::from_static(value));
            assert_eq!(hops(&h), want, "{value:?}");
        }
    }

    #[test]
    fn via_names_the_protocol_the_request_came_over() {
        assert_eq!(via(Version::HTTP_10), "1.0 hourglass");
        assert_eq!(via(Version::HTTP_11), "1.1 hourglass");
        assert_eq!(via(Version::HTTP_2), "2 hourglass");
    }
}
