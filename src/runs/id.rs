//! Which run a request belongs to: its run id, read from the header its route names (or the
//! trace-id of a W3C `traceparent`), and the scope that keeps one client's runs apart from
//! another's where the route asks clients for keys.

use std::fmt;
use std::sync::Arc;

use http::HeaderMap;

pub use crate::config::RunIdSource;
use crate::error::GatewayError;
use crate::telemetry::log::key_hex;

/// Ids are at most this long: a key in memory and in the store, and a label in no metric.
pub const MAX_RUN_ID: usize = 128;

/// A run as the store knows it: its id, and the client key it is scoped to (a digest prefix,
/// never the key), when the route that carries it asks clients for keys.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RunKey {
    pub scope: Option<[u8; 8]>,
    pub id: Arc<str>,
}

impl fmt::Display for RunKey {
    /// `abc`, or `k:0123456789abcdef/abc` for a run scoped by a client key.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(scope) = &self.scope {
            let hex = key_hex(scope);
            f.write_str("k:")?;
            f.write_str(std::str::from_utf8(&hex).expect("hex digits"))?;
            f.write_str("/")?;
        }
        f.write_str(&self.id)
    }
}

fn invalid(header: &str, value: &[u8], reason: &'static str) -> GatewayError {
    // Bounded so that a hostile header cannot make the error body large.
    let value: String = String::from_utf8_lossy(value).chars().take(64).collect();
    GatewayError::InvalidRunId {
        header: header.to_owned(),
        value,
        reason,
    }
}

/// Whether `bytes` can be a run id: 1 to 128 visible ASCII bytes. `Err`: what they are not.
pub fn check_id(bytes: &[u8]) -> Result<(), &'static str> {
    if bytes.is_empty() || bytes.len() > MAX_RUN_ID {
        return Err("must be 1 to 128 bytes long");
    }
    if !bytes.iter().all(u8::is_ascii_graphic) {
        return Err("must be visible ASCII characters, without spaces");
    }
    Ok(())
}

/// The run id the request carries, if any. A malformed one is refused: a client that meant
/// its calls to be bounded as one run must not have them served unbounded.
pub fn run_id(headers: &HeaderMap, source: &RunIdSource) -> Result<Option<Arc<str>>, GatewayError> {
    let name = source.header_name();
    let mut values = match source {
        RunIdSource::Header(h) => headers.get_all(h).iter(),
        RunIdSource::TraceParent => headers.get_all("traceparent").iter(),
    };
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(invalid(name, value.as_bytes(), "is given more than once"));
    }
    let bytes = value.as_bytes();
    let id = match source {
        RunIdSource::Header(_) => {
            check_id(bytes).map_err(|why| invalid(name, bytes, why))?;
            bytes
        }
        RunIdSource::TraceParent => trace_id(bytes).ok_or_else(|| {
            invalid(
                name,
                bytes,
                "is not a W3C traceparent (00-<32 hex trace-id>-<16 hex parent-id>-<2 hex flags>)",
            )
        })?,
    };
    // Visible ASCII, so valid UTF-8.
    Ok(Some(Arc::from(std::str::from_utf8(id).unwrap_or_default())))
}

/// The trace-id of a `traceparent` (W3C Trace Context, version 00 and the rules for later
/// versions: at least the four fields, lowercase hex, neither id all zeros).
fn trace_id(v: &[u8]) -> Option<&[u8]> {
    let hex = |s: &[u8]| s.iter().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    let nonzero = |s: &[u8]| s.iter().any(|&b| b != b'0');
    if v.len() < 55 || v[2] != b'-' || v[35] != b'-' || v[52] != b'-' {
        return None;
    }
    let (version, trace, parent, flags) = (&v[..2], &v[3..35], &v[36..52], &v[53..55]);
    let ok = hex(version)
        && version != b"ff"
        && hex(trace)
        && nonzero(trace)
        && hex(parent)
        && nonzero(parent)
        && hex(flags)
        // Version 00 is exactly 55 bytes; a later version may append fields after a dash.
        && (v.len() == 55 || (version != b"00" && v[55] == b'-'));
    ok.then_some(trace)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderName, HeaderValue};

    fn headers(pairs: &[(&'static str, &[u8])]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_bytes(v).unwrap());
        }
        h
    }

    fn read(pairs: &[(&'static str, &[u8])]) -> Result<Option<Arc<str>>, GatewayError> {
        run_id(&headers(pairs), &RunIdSource::default())
    }

    #[test]
    fn an_id_is_one_to_128_visible_ascii_bytes() {
        assert_eq!(read(&[]).unwrap(), None);
        assert_eq!(
            read(&[("x-run-id", b"run-42")]).unwrap().as_deref(),
            Some("run-42")
        );
        let long = vec![b'a'; 128];
        assert_eq!(read(&[("x-run-id", &long)]).unwrap().unwrap().len(), 128);
        for (bad, why) in [
            (&b""[..], "1 to 128"),
            (&[b'a'; 129][..], "1 to 128"),
            (b"a b", "visible ASCII"),
            (b"caf\xc3\xa9", "visible ASCII"),
            (b"a\tb", "visible ASCII"),
        ] {
            let e = read(&[("x-run-id", bad)]).unwrap_err();
            assert_eq!(e.code(), "invalid_run_id");
            assert_eq!(e.status(), http::StatusCode::BAD_REQUEST);
            let msg = e.to_string();
            assert!(msg.contains("x-run-id") && msg.contains(why), "{msg}");
        }
        let twice = read(&[("x-run-id", b"a"), ("x-run-id", b"b")]).unwrap_err();
        assert!(twice.to_string().contains("more than once"), "{twice}");
    }

    #[test]
    fn a_route_may_name_its_own_header() {
        let source = RunIdSource::Header(HeaderName::from_static("x-session-id"));
        let h = headers(&[("x-session-id", b"s1"), ("x-run-id", b"ignored")]);
        assert_eq!(run_id(&h, &source).unwrap().as_deref(), Some("s1"));
        let e = run_id(&headers(&[("x-session-id", b"a b")]), &source).unwrap_err();
        assert!(
            e.to_string().starts_with("invalid run id: x-session-id"),
            "{e}"
        );
    }

    #[test]
    fn traceparent_gives_its_trace_id() {
        let source = RunIdSource::TraceParent;
        let tp = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let got = run_id(&headers(&[("traceparent", tp)]), &source).unwrap();
        assert_eq!(got.as_deref(), Some("4bf92f3577b34da6a3ce929d0e0e4736"));
        // A later version may carry more fields.
        let v1 = b"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra";
        assert!(run_id(&headers(&[("traceparent", v1)]), &source)
            .unwrap()
            .is_some());
        for bad in [
            &b"00-00000000000000000000000000000000-00f067aa0ba902b7-01"[..],
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            b"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            b"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
            b"00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            b"garbage",
        ] {
            let e = run_id(&headers(&[("traceparent", bad)]), &source).unwrap_err();
            assert_eq!(e.code(), "invalid_run_id", "{:?}", std::str::from_utf8(bad));
            assert!(e.to_string().contains("traceparent"), "{e}");
        }
    }

    #[test]
    fn keys_print_their_scope_and_never_a_key() {
        let unscoped = RunKey {
            scope: None,
            id: "abc".into(),
        };
        assert_eq!(unscoped.to_string(), "abc");
        let scoped = RunKey {
            scope: Some([0xde, 0xad, 0xbe, 0xef, 0, 1, 2, 3]),
            id: "abc".into(),
        };
        assert_eq!(scoped.to_string(), "k:deadbeef00010203/abc");
    }
}
