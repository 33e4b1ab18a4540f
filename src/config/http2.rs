//! The HTTP/2 keys of an upstream: which version to speak, how many streams go on one
//! connection before another is opened, and the flow-control windows.
//!
//! The windows are what keeps one slow client from holding back its neighbours on a shared
//! upstream connection: a stream whose client does not read stops releasing window, so the
//! upstream can send it at most `http2_stream_window` bytes, all of which also count against
//! the connection's window until the client reads them. With the connection window at least
//! `streams × stream window`, even every stream stalled at once cannot close the connection
//! window to the others.

use super::raw::{RawHttp2Mode, RawUpstream};

/// Which HTTP version Hourglass speaks to an upstream (`http2`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Http2Mode {
    /// HTTP/2 when TLS negotiates it (ALPN `h2`, then `http/1.1`); plain `http://` is HTTP/1.1.
    Auto,
    /// HTTP/2 only: ALPN `h2` alone over TLS, prior knowledge (h2c) over plain `http://`.
    Always,
    /// HTTP/1.1 only, also over TLS.
    Never,
}

impl std::fmt::Display for Http2Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::Always => "always",
            Self::Never => "never",
        })
    }
}

/// An upstream's HTTP/2 settings after defaults and checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Http2Config {
    pub mode: Http2Mode,
    /// Streams Hourglass puts on one upstream connection before it opens another
    /// (`http2_max_streams_per_connection`). Set it at or below the provider's own
    /// `SETTINGS_MAX_CONCURRENT_STREAMS`: streams beyond the provider's limit wait on their
    /// connection instead of getting one of their own.
    pub max_streams_per_connection: u32,
    /// Most connections opened to this upstream for HTTP/2 (`http2_max_connections`); once
    /// every one is full, new streams go to the least loaded. `None`: no limit.
    pub max_connections: Option<u32>,
    /// Bytes the upstream may send one stream before Hourglass has passed them on
    /// (`http2_stream_window`).
    pub stream_window: u32,
    /// Bytes the upstream may send all streams of one connection together before Hourglass
    /// has passed them on (`http2_connection_window`); never below `stream_window`.
    pub connection_window: u32,
}

/// 100 is what most providers' front ends allow (and RFC 9113 recommends as a floor).
pub const DEFAULT_MAX_STREAMS: u32 = 100;
/// 128 KiB: a token stream sends a few KiB a second, so this holds many seconds of a stalled
/// client's output and still lets one stream move about 1.3 MB/s over a 100 ms round trip.
pub const DEFAULT_STREAM_WINDOW: u32 = 128 * 1024;
/// 16 MiB: at least `DEFAULT_MAX_STREAMS × DEFAULT_STREAM_WINDOW` (12.5 MiB), so that no set of
/// stalled streams can use up the connection's window. It is a bound, not an allocation:
/// memory is only used for bytes actually waiting on a client that does not read.
pub const DEFAULT_CONNECTION_WINDOW: u32 = 16 * 1024 * 1024;

/// RFC 9113 6.9.2: no window may pass 2^31 - 1; 65 535 is the protocol's initial window,
/// below which a connection window cannot be set at all.
const MIN_WINDOW: u64 = 65_535;
const MAX_WINDOW: u64 = (1 << 31) - 1;
/// Stream ids are 31 bits and odd on the client side.
const MAX_STREAMS: u64 = 1 << 30;

impl Default for Http2Config {
    fn default() -> Self {
        Self {
            mode: Http2Mode::Auto,
            max_streams_per_connection: DEFAULT_MAX_STREAMS,
            max_connections: None,
            stream_window: DEFAULT_STREAM_WINDOW,
            connection_window: DEFAULT_CONNECTION_WINDOW,
        }
    }
}

impl Http2Config {
    /// Whether this upstream may speak HTTP/2 at all, given its URL's scheme.
    pub fn used(&self, https: bool) -> bool {
        match self.mode {
            Http2Mode::Always => true,
            Http2Mode::Auto => https,
            Http2Mode::Never => false,
        }
    }

    /// A stalled-streams warning: the connection window is smaller than every stream's window
    /// together, so enough stalled clients can hold back the others on their connection.
    pub(super) fn warning(&self) -> Option<String> {
        let all = u64::from(self.max_streams_per_connection) * u64::from(self.stream_window);
        (self.mode != Http2Mode::Never && u64::from(self.connection_window) < all).then(|| {
            // Each stalled stream holds at most one stream window of the connection's.
            let stalled = self.connection_window.div_ceil(self.stream_window);
            let clients = if stalled == 1 {
                "1 client that stops reading".to_owned()
            } else {
                format!("{stalled} clients that stop reading")
            };
            format!(
                "http2_connection_window ({}) is less than http2_max_streams_per_connection × \
                 http2_stream_window ({all}): {clients} can hold back the other streams on \
                 their upstream connection",
                self.connection_window,
            )
        })
    }
}

/// The `http2*` keys of `[upstreams.NAME]`; errors are prefixed with `label` by the caller.
pub(super) fn build_http2(raw: &RawUpstream) -> Result<Http2Config, String> {
    let d = Http2Config::default();
    let mode = match raw.http2 {
        None | Some(RawHttp2Mode::Auto) => Http2Mode::Auto,
        Some(RawHttp2Mode::Always) => Http2Mode::Always,
        Some(RawHttp2Mode::Never) => Http2Mode::Never,
    };
    let keys = [
        (
            "http2_max_streams_per_connection",
            raw.http2_max_streams_per_connection,
        ),
        ("http2_max_connections", raw.http2_max_connections),
        ("http2_stream_window", raw.http2_stream_window),
        ("http2_connection_window", raw.http2_connection_window),
    ];
    if mode == Http2Mode::Never {
        // A tuning key that cannot take effect is a misunderstanding worth stopping at.
        if let Some((key, _)) = keys.iter().find(|(_, v)| v.is_some()) {
            return Err(format!("{key} has no effect with http2 = \"never\""));
        }
    }
    let ranged = |key: &str, v: Option<u64>, lo: u64, hi: u64, default: u32| match v {
        None => Ok(default),
        Some(n) if (lo..=hi).contains(&n) => Ok(u32::try_from(n).expect("range fits u32")),
        Some(n) => Err(format!("{key} ({n}) must be between {lo} and {hi}")),
    };
    let max_streams = ranged(
        "http2_max_streams_per_connection",
        raw.http2_max_streams_per_connection,
        1,
        MAX_STREAMS,
        d.max_streams_per_connection,
    )?;
    let max_connections = match raw.http2_max_connections {
        None => None,
        Some(n) => Some(ranged(
            "http2_max_connections",
            Some(n),
            1,
            u64::from(u16::MAX),
            0,
        )?),
    };
    let stream_window = ranged(
        "http2_stream_window",
        raw.http2_stream_window,
        MIN_WINDOW,
        MAX_WINDOW,
        d.stream_window,
    )?;
    let connection_window = ranged(
        "http2_connection_window",
        raw.http2_connection_window,
        MIN_WINDOW,
        MAX_WINDOW,
        // One stream alone must fit the connection's window: raise the default to match.
        d.connection_window.max(stream_window),
    )?;
    if connection_window < stream_window {
        return Err(format!(
            "http2_connection_window ({connection_window}) must not be less than \
             http2_stream_window ({stream_window}): one stream would close the connection's \
             window to every other"
        ));
    }
    Ok(Http2Config {
        mode,
        max_streams_per_connection: max_streams,
        max_connections,
        stream_window,
        connection_window,
    })
}
