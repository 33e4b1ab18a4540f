//! A request's `Content-Type`, read as the frameworks behind the gateway read it: a body the
//! gateway reads as UTF-8 JSON must not be read otherwise by the provider (audits IC 1,
//! JB 1), so a media type parsers could split differently is refused.

use http::header::{self, HeaderMap, HeaderValue};

/// Why a request's `Content-Type` lets its body be read otherwise than as UTF-8 JSON, in
/// words naming the field: the charset it declares is not UTF-8 (or its ASCII subset), it
/// declares one more than once, its parameters are not RFC 9110 5.6.6's, or the field comes
/// more than once. JSON is UTF-8 (RFC 8259 8.1), but a server may decode a body by the label
/// (Express's body-parser takes `utf-7`, and the *last* `charset`, quoted strings read as
/// such), and read in it what a reader of UTF-8 does not.
pub fn content_type_fault(headers: &HeaderMap) -> Option<String> {
    let mut lines = headers.get_all(header::CONTENT_TYPE).iter();
    let value = lines.next()?;
    let shown = |v: &HeaderValue| format!("{:?}", String::from_utf8_lossy(v.as_bytes()));
    if lines.next().is_some() {
        let all: Vec<String> = headers
            .get_all(header::CONTENT_TYPE)
            .iter()
            .map(shown)
            .collect();
        return Some(format!(
            "it has {} content-type field lines ({}), and the field is a singleton (RFC 9110 \
             8.3): parsers differ on which one counts",
            all.len(),
            all.join(", ")
        ));
    }
    let charset = match media_type_charset(value.as_bytes()) {
        Ok(charset) => charset?,
        Err(MediaTypeFault::Unparsable) => {
            return Some(format!(
                "its content-type {} is not a media type with RFC 9110 5.6.6 parameters, \
                 which parsers may split differently",
                shown(value)
            ))
        }
        Err(MediaTypeFault::Extended) => {
            return Some(format!(
                "its content-type {} has an RFC 2231 extended parameter (a name with `*`), \
                 which some parsers read as its charset",
                shown(value)
            ))
        }
        Err(MediaTypeFault::CharsetTwice) => {
            return Some(format!(
                "its content-type {} declares charset more than once (RFC 9110 8.3.1 allows \
                 one), and parsers differ on which one counts",
                shown(value)
            ))
        }
    };
    let utf8 = [&b"utf-8"[..], b"utf8", b"us-ascii"]
        .iter()
        .any(|c| charset.eq_ignore_ascii_case(c));
    (!utf8).then(|| {
        let charset = String::from_utf8_lossy(&charset);
        format!("its content-type declares charset={charset:?}, and JSON is UTF-8 (RFC 8259 8.1)")
    })
}

#[derive(Debug, PartialEq, Eq)]
enum MediaTypeFault {
    Unparsable,
    CharsetTwice,
    Extended,
}

/// The `charset` parameter of a media type (RFC 9110 8.3.1), its quoted-pairs undone:
/// `type "/" subtype *( OWS ";" OWS [ name "=" ( token / quoted-string ) ] )` (5.6.6).
fn media_type_charset(v: &[u8]) -> Result<Option<std::borrow::Cow<'_, [u8]>>, MediaTypeFault> {
    use std::borrow::Cow;
    fn tchar(b: u8) -> bool {
        b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
    }
    let token = |i: &mut usize| {
        let start = *i;
        while v.get(*i).is_some_and(|&b| tchar(b)) {
            *i += 1;
        }
        (*i > start).then_some(&v[start..*i])
    };
    let ows = |i: &mut usize| {
        while matches!(v.get(*i), Some(b' ' | b'\t')) {
            *i += 1;
        }
    };
    let mut i = 0;
    token(&mut i).ok_or(MediaTypeFault::Unparsable)?;
    if v.get(i) != Some(&b'/') {
        return Err(MediaTypeFault::Unparsable);
    }
    i += 1;
    token(&mut i).ok_or(MediaTypeFault::Unparsable)?;
    let mut charset = None;
    loop {
        ows(&mut i);
        match v.get(i) {
            None => return Ok(charset),
            Some(b';') => i += 1,
            Some(_) => return Err(MediaTypeFault::Unparsable),
        }
        ows(&mut i);
        if matches!(v.get(i), None | Some(b';')) {
            continue;
        }
        let name = token(&mut i).ok_or(MediaTypeFault::Unparsable)?;
        if v.get(i) != Some(&b'=') {
            return Err(MediaTypeFault::Unparsable);
        }
        i += 1;
        let value: Cow<'_, [u8]> = if v.get(i) == Some(&b'"') {
            i += 1;
            let start = i;
            let mut unescaped: Option<Vec<u8>> = None;
            loop {
                match v.get(i) {
                    None => return Err(MediaTypeFault::Unparsable),
                    Some(b'"') => break,
                    Some(b'\\') => {
                        let escaped = *v.get(i + 1).ok_or(MediaTypeFault::Unparsable)?;
                        if escaped != b'\t' && (escaped < 0x20 || escaped == 0x7f) {
                            return Err(MediaTypeFault::Unparsable);
                        }
                        unescaped
                            .get_or_insert_with(|| v[start..i].to_vec())
                            .push(escaped);
                        i += 2;
                    }
                    Some(&b) if b == b'\t' || (b >= 0x20 && b != 0x7f) => {
                        if let Some(u) = &mut unescaped {
                            u.push(b);
                        }
                        i += 1;
                    }
                    Some(_) => return Err(MediaTypeFault::Unparsable),
                }
            }
            let quoted = &v[start..i];
            i += 1;
            unescaped.map_or(Cow::Borrowed(quoted), Cow::Owned)
        } else {
            Cow::Borrowed(token(&mut i).ok_or(MediaTypeFault::Unparsable)?)
        };
        // RFC 2231 / 8187 extended parameters (`charset*=utf-7''utf-7`, `charset*0=utf;
        // charset*1=-7`): Python's `email` package, which aiohttp reads the charset with,
        // takes them for the charset; no API client sends one (audit JB 1).
        if name.contains(&b'*') {
            return Err(MediaTypeFault::Extended);
        }
        if name.eq_ignore_ascii_case(b"charset") {
            if charset.is_some() {
                return Err(MediaTypeFault::CharsetTwice);
            }
            charset = Some(value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charsets_other_than_utf8() {
        let of = |v: &'static str| {
            let mut h = HeaderMap::new();
            h.insert(header::CONTENT_TYPE, HeaderValue::from_static(v));
            content_type_fault(&h)
        };
        assert_eq!(of("application/json"), None);
        assert_eq!(of("application/json; charset=UTF-8"), None);
        assert_eq!(of("application/json;charset=\"utf8\""), None);
        assert_eq!(of("application/json; charset=us-ascii"), None);
        assert!(of("application/json; Charset=utf-7")
            .unwrap()
            .contains("charset=\"utf-7\""));
        assert!(of("text/plain; a=b; charset=\"latin1\"")
            .unwrap()
            .contains("charset=\"latin1\""));
    }

    /// Audit IC 1: a second `charset`, or one hidden from a split on `;` by a quoted string,
    /// got past the check, and Express decoded the body by the last one.
    #[test]
    fn a_content_type_parsers_could_read_otherwise_is_refused() {
        let of = |lines: &[&'static str]| {
            let mut h = HeaderMap::new();
            for v in lines {
                h.append(header::CONTENT_TYPE, HeaderValue::from_static(v));
            }
            content_type_fault(&h)
        };
        for twice in [
            "application/json; charset=utf-8; charset=utf-7",
            "application/json; charset=utf-8; CHARSET=utf-7",
            "application/json; charset=utf-8; charset=\"utf-7\"",
            "application/json; charset=utf-8;charset=utf-8",
        ] {
            let why = of(&[twice]).unwrap_or_else(|| panic!("{twice}"));
            assert!(why.contains("charset more than once"), "{why}");
            assert!(why.contains(&format!("{twice:?}")), "{why}");
        }
        // RFC 2231 forms, which Python's `email` (aiohttp) reads as the charset (audit JB 1).
        for extended in [
            "application/json; charset*=utf-7''utf-7",
            "application/json; charset*0=utf; charset*1=-7",
            "application/json; CHARSET*0*=utf-7''utf-7",
            "application/json; charset=utf-8; charset*=utf-7''utf-7",
        ] {
            let why = of(&[extended]).unwrap_or_else(|| panic!("{extended}"));
            assert!(why.contains("extended parameter"), "{why}");
        }
        // The `charset` inside the quoted string is no parameter: the one after it counts.
        let hidden = of(&["application/json; foo=\"a;charset=utf-8\"; charset=utf-7"]).unwrap();
        assert!(hidden.contains("charset=\"utf-7\""), "{hidden}");
        for unparsable in [
            "application/json; charset",
            "application/json; charset = utf-8",
            "application/json; foo=\"a; charset=utf-8",
            "application/json; a=b c",
            "application/json\"; charset=utf-8",
            "application; charset=utf-8",
            "application/json, text/plain",
            "/json",
        ] {
            let why = of(&[unparsable]).unwrap_or_else(|| panic!("{unparsable}"));
            assert!(why.contains("RFC 9110 5.6.6"), "{why}");
        }
        let two = of(&["application/json", "application/json; charset=utf-7"]).unwrap();
        assert!(
            two.contains("2 content-type field lines")
                && two.contains("singleton")
                && two.contains("\"application/json; charset=utf-7\""),
            "{two}"
        );
        // What RFC 9110 5.6.6 allows: whitespace around `;`, empty parameters, a quoted
        // string with escapes and a `;` in it.
        for fine in [
            "application/json ; charset=utf-8 ;",
            "application/json;;charset=utf-8",
            "application/json; foo=\"a;charset=utf-7\"; charset=utf-8",
            "application/json; foo=\"a\\\"b\"; charset=\"ut\\f-8\"",
            "multipart/form-data; boundary=\"--b\"",
        ] {
            assert_eq!(of(&[fine]), None, "{fine}");
        }
        assert_eq!(
            media_type_charset(b"a/b; x=\"q\\\"\"; charset=\"u\\tf-8\"")
                .unwrap()
                .as_deref(),
            Some(&b"utf-8"[..])
        );
    }
}
