//! The request target's path, checked before it picks a route: a path with a dot-segment
//! names one path to the gateway's prefix match and another to an upstream that resolves it
//! (RFC 3986 5.2.4), so it is refused rather than forwarded. Spellings that mean the same
//! path are made one ([`normalized`]) before routes match it, and routes read an encoded
//! slash as the slash some upstreams take it for ([`for_routing`]): the route a request
//! takes is the one its path names to any reader.

use std::borrow::Cow;

use memchr::{memchr, memchr2, memmem};

/// Whether `path` has a `.` or `..` segment, also percent-encoded (`%2e`, `%2E`, `.%2e`, ...).
/// `/v1/chat/completions/../../files` matches the chat route, gets its key and budget, and
/// reaches the provider's `/v1/files`. Normalising instead would still leave the upstream
/// to decode `%2e` its own way; refusing leaves nothing to disagree on. Empty segments
/// (`//`) are no dot-segments: [`normalized`] merges them.
pub fn has_dot_segment(path: &str) -> bool {
    let path = path.as_bytes();
    // Most paths have neither byte, and cost this one scan.
    if memchr2(b'.', b'%', path).is_none() {
        return false;
    }
    // A separator is also `%2F` and a backslash, plain or `%5C`: nginx decodes `%2F` before
    // it removes dot-segments, and some servers take `\` for `/`, so `x%2F..%2F..` climbs as
    // `x/../..` does.
    let mut start = 0;
    let mut i = 0;
    while i < path.len() {
        let sep = match path[i] {
            b'/' | b'\\' => 1,
            b'%' if matches!(
                path.get(i + 1..i + 3),
                Some([b'2', b'f' | b'F'] | [b'5', b'c' | b'C'])
            ) =>
            {
                3
            }
            _ => 0,
        };
        if sep > 0 {
            if is_dot_segment(&path[start..i]) {
                return true;
            }
            start = i + sep;
            i += sep;
        } else {
            i += 1;
        }
    }
    is_dot_segment(&path[start..])
}

/// `.` or `..`, each dot plain or `%2e` in either case, also before `;` parameters (`..;x`,
/// which servlet containers resolve as `..`).
fn is_dot_segment(mut segment: &[u8]) -> bool {
    let mut dots = 0;
    while !segment.is_empty() {
        segment = match segment {
            [b'.', rest @ ..] | [b'%', b'2', b'e' | b'E', rest @ ..] => rest,
            [b';', ..] if dots > 0 => break,
            _ => return false,
        };
        dots += 1;
    }
    matches!(dots, 1 | 2)
}

/// The path as routes match it and the upstream receives it, each path RFC 3986 6.2.2
/// calls equivalent spelled one way: percent-encoded unreserved characters decoded
/// (`/v1/%63hat/completions` is `/v1/chat/completions`, as every server reads it), the
/// other escapes' hex digits in upper case, and runs of `/` merged
/// (`/v1//chat/completions`, as nginx merges them). Otherwise such a path
/// slips past the route for its plain spelling (and that route's client keys and limits)
/// to a wider one, while the provider serves it as the plain path. Borrowed, at the cost of
/// one scan, when there is nothing to change.
pub fn normalized(path: &str) -> Cow<'_, str> {
    let bytes = path.as_bytes();
    if memchr(b'%', bytes).is_none() && memmem::find(bytes, b"//").is_none() {
        return Cow::Borrowed(path);
    }
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => match decoded(bytes.get(i + 1..i + 3)) {
                Some(c) if unreserved(c) => {
                    out.push(c);
                    i += 3;
                    continue;
                }
                // Kept, in upper case (RFC 3986 6.2.2.1: the hex digits' case means
                // nothing): `caf%c3%a9` must take the route of `caf%C3%A9`.
                Some(_) => {
                    out.push(b'%');
                    out.extend(bytes[i + 1..i + 3].iter().map(u8::to_ascii_uppercase));
                    i += 3;
                    continue;
                }
                None => {}
            },
            b'/' if out.last() == Some(&b'/') => {
                i += 1;
                continue;
            }
            _ => {}
        }
        out.push(bytes[i]);
        i += 1;
    }
    // Only ASCII bytes were decoded, and only whole escapes were replaced.
    Cow::Owned(String::from_utf8(out).expect("ASCII replaced ASCII"))
}

/// How routes read a [`normalized`] path: an encoded slash or a backslash (`%2F`, `\`,
/// `%5C`) as the `/` that some upstreams, and proxies in front of them, take it for. So
/// `/v1/chat%2Fcompletions` takes the chat route, whichever way its upstream reads it: as
/// the chat path, or as a path it does not serve. It is forwarded as it came.
pub fn for_routing(path: &str) -> Cow<'_, str> {
    let bytes = path.as_bytes();
    let slash_at = |i: usize| match bytes[i] {
        b'/' | b'\\' => Some(1),
        b'%' if matches!(
            bytes.get(i + 1..i + 3),
            Some([b'2', b'f' | b'F'] | [b'5', b'c' | b'C'])
        ) =>
        {
            Some(3)
        }
        _ => None,
    };
    if memchr2(b'%', b'\\', bytes).is_none() {
        return Cow::Borrowed(path);
    }
    let mut out = String::with_capacity(path.len());
    let mut i = 0;
    while i < bytes.len() {
        if let Some(len) = slash_at(i) {
            if !out.ends_with('/') {
                out.push('/');
            }
            i += len;
        } else {
            // Character by character: the path may hold (invalid, but passed) UTF-8.
            let c = path[i..]
                .chars()
                .next()
                .expect("i is at a character boundary");
            out.push(c);
            i += c.len_utf8();
        }
    }
    Cow::Owned(out)
}

/// The byte two hex digits spell.
fn decoded(hex: Option<&[u8]>) -> Option<u8> {
    let digit = |b: u8| (b as char).to_digit(16);
    match hex? {
        [h, l] => Some((digit(*h)? * 16 + digit(*l)?) as u8),
        _ => None,
    }
}

/// RFC 3986 2.3: what a URI never needs to encode.
fn unreserved(c: u8) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_' | b'~')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_segments_are_found_in_every_spelling_and_only_as_whole_segments() {
        for dotted in [
            "/.",
            "/..",
            "/raw/../v1/models",
            "/v1/chat/completions/../../files",
            "/v1/./x",
            "/v1/%2e/x",
            "/v1/%2E%2e/x",
            "/v1/.%2e/x",
            "/v1/%2E./x",
            "/v1/x/..",
            "/v1/%2f..%2f",
            "/n/v1/chat/completions/x%2F..%2F..%2Fv1%2Ffiles",
            "/v1/x%5c..%5Cfiles",
            "/v1/x\\..\\files",
            "/v1/%2F%2e%2E",
            "/v1/..;/files",
            "/v1/.;x/files",
            "/v1/x/..;",
            "./x",
            "..",
        ] {
            assert!(has_dot_segment(dotted), "{dotted}");
        }
        for clean in [
            "/",
            "",
            "/v1/chat/completions",
            "/v1/...",
            "/v1/a..b",
            "/v1/.well-known",
            "/v1/..x",
            "/v1/%2e%2e%2e",
            "/v1/%2ex",
            "/v1/%2",
            "/v1/%2f",
            "/v1/a%2fb..c",
            "/v1/%2F...%2F",
            "/v1/;..",
            "/v1/a;b/..x",
            "/v1//x",
            "/v1/model.json",
        ] {
            assert!(!has_dot_segment(clean), "{clean}");
        }
    }

    #[test]
    fn equivalent_spellings_are_made_one() {
        for (given, want) in [
            ("/v1/chat/completions", "/v1/chat/completions"),
            ("/v1/chat/%63ompletions", "/v1/chat/completions"),
            ("/v1/%63%68at/completions", "/v1/chat/completions"),
            ("/v1/%7euser%2D%5F", "/v1/~user-_"),
            ("/v1//chat///completions", "/v1/chat/completions"),
            ("//v1/chat/completions", "/v1/chat/completions"),
            // Reserved and other bytes stay encoded, and so does a broken escape.
            ("/v1/a%2Fb%3Fc%25d%20e", "/v1/a%2Fb%3Fc%25d%20e"),
            ("/v1/%2", "/v1/%2"),
            ("/v1/%zz%", "/v1/%zz%"),
            ("/v1/%C3%A9", "/v1/%C3%A9"),
            // The hex digits' case means nothing (RFC 3986 6.2.2.1): one spelling.
            ("/v1/caf%c3%a9", "/v1/caf%C3%A9"),
            ("/v1/a%2fb%3f", "/v1/a%2Fb%3F"),
        ] {
            assert_eq!(normalized(given), want, "{given}");
        }
        assert!(matches!(
            normalized("/v1/chat/completions"),
            Cow::Borrowed(_)
        ));
    }

    #[test]
    fn routes_read_encoded_slashes_and_backslashes_as_slashes() {
        for (given, want) in [
            ("/v1/chat/completions", "/v1/chat/completions"),
            ("/v1/chat%2Fcompletions", "/v1/chat/completions"),
            ("/v1/chat%2fcompletions", "/v1/chat/completions"),
            ("/v1/chat\\completions", "/v1/chat/completions"),
            ("/v1/chat%5Ccompletions", "/v1/chat/completions"),
            ("/v1%2F%2Fchat/completions", "/v1/chat/completions"),
            ("/v1/caf\u{e9}%2Fx", "/v1/caf\u{e9}/x"),
            ("/v1/%20", "/v1/%20"),
        ] {
            assert_eq!(for_routing(given), want, "{given}");
        }
        assert!(matches!(
            for_routing("/v1/chat/completions"),
            Cow::Borrowed(_)
        ));
    }
}
