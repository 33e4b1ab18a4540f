//! The request target's path, checked before it picks a route: a path with a dot-segment
//! names one path to the gateway's prefix match and another to an upstream that resolves it
//! (RFC 3986 5.2.4), so it is refused rather than forwarded.

use memchr::memchr2;

/// Whether `path` has a `.` or `..` segment, also percent-encoded (`%2e`, `%2E`, `.%2e`, ...).
/// `/v1/chat/completions/../../files` matches the chat route, gets its key and budget, and
/// reaches the provider's `/v1/files`. Normalising instead would still leave the upstream
/// to decode `%2e` its own way; refusing leaves nothing to disagree on. Empty segments
/// (`//`) are left alone: RFC 3986 does not remove them, and neither do the providers.
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
}
