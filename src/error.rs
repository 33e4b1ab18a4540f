//! What a client is told when Hourglass ends a request: one typed error per failure, whose
//! `code()` is both the JSON `code` and the metric label (low cardinality by construction).

use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;

/// The error type of bodies and connectors, as tower and hyper name it.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What a client that found a route full, or the gateway draining, is told to wait before
/// trying again (a draining replica's next connection goes to another behind the balancer).
pub const RETRY_AFTER: Duration = Duration::from_secs(1);

/// The methods the gateway forwards, as `Allow` names them.
pub const FORWARDED_METHODS: &str = "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS";

/// What the gateway itself ran out of, as an I/O error says: descriptors (EMFILE, ENFILE),
/// memory (ENOMEM), or local ports for an outgoing connection (EADDRNOTAVAIL). Such a failure
/// says nothing of the file or the peer it was for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Starved {
    Descriptors,
    Memory,
    /// A connect found no free local (ephemeral) port: every port of the host's
    /// `ip_local_port_range` toward that address is in use, by this gateway or by others on
    /// the host. The gateway binds no local address of its own, so this is what
    /// EADDRNOTAVAIL from a connect means, and the upstream is not at fault: audit KF 4 saw
    /// a healthy upstream answered 502 and ejected for it.
    Ports,
}

impl Starved {
    pub fn of(e: &std::io::Error) -> Option<Starved> {
        match e.raw_os_error() {
            Some(23 | 24) => Some(Starved::Descriptors),
            Some(12) => Some(Starved::Memory),
            // 99 on Linux, 49 on the BSDs: libc names it.
            Some(libc::EADDRNOTAVAIL) => Some(Starved::Ports),
            _ if e.kind() == std::io::ErrorKind::OutOfMemory => Some(Starved::Memory),
            _ => None,
        }
    }

    /// The first I/O error among `e` and its sources that says so: connectors wrap theirs
    /// (hyper-util's "tcp open error", a TLS connector's box).
    pub fn in_chain(e: &(dyn std::error::Error + 'static)) -> Option<Starved> {
        let mut source = Some(e);
        while let Some(s) = source {
            if let Some(starved) = s.downcast_ref::<std::io::Error>().and_then(Starved::of) {
                return Some(starved);
            }
            source = s.source();
        }
        None
    }

    fn words(self) -> &'static str {
        match self {
            Starved::Descriptors => {
                "the gateway has no file descriptor left (its open-file limit, ulimit -n or \
                 LimitNOFILE, or the host's, is reached)"
            }
            Starved::Memory => "the gateway's host is out of memory",
            Starved::Ports => {
                "the gateway has no local port left (the host's ephemeral ports, \
                 net.ipv4.ip_local_port_range, are all in use)"
            }
        }
    }
}

/// Who cancelled a request. Each cancellation has exactly one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    Client = 0,
    Deadline,
    FirstToken,
    Idle,
    Connect,
    InsufficientBudget,
    Shutdown,
    /// The slower of two hedged attempts; an attempt cancelled, not a request.
    HedgeLoser,
    /// The route was at `max_in_flight` and the budget left no time to wait for a slot.
    Overloaded,
    /// The call's run ran out of time (its deadline, not the call's own).
    RunDeadline,
    /// The call's answer pushed its run past `run_max_tokens`.
    RunTokens,
    /// The gateway closed the client's connection: it read nothing for `send_timeout`.
    SendTimeout,
}

impl Origin {
    pub const ALL: [Origin; 12] = [
        Origin::Client,
        Origin::Deadline,
        Origin::FirstToken,
        Origin::Idle,
        Origin::Connect,
        Origin::InsufficientBudget,
        Origin::Shutdown,
        Origin::HedgeLoser,
        Origin::Overloaded,
        Origin::RunDeadline,
        Origin::RunTokens,
        Origin::SendTimeout,
    ];

    /// The origins that end a call by closing its upstream connection once the call was
    /// sent: for a detached call (an OpenAI background response) the close cancels nothing,
    /// and the request is counted `detached` by this origin instead. The others end a call
    /// before it is sent (`connect`, `insufficient_budget`, `overloaded`) or are an attempt's
    /// (`hedge_loser`), which a detached call never has.
    pub const CLOSES: [Origin; 8] = [
        Origin::Client,
        Origin::Deadline,
        Origin::FirstToken,
        Origin::Idle,
        Origin::Shutdown,
        Origin::RunDeadline,
        Origin::RunTokens,
        Origin::SendTimeout,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Client => "client",
            Self::Deadline => "deadline",
            Self::FirstToken => "first_token",
            Self::Idle => "idle",
            Self::Connect => "connect",
            Self::InsufficientBudget => "insufficient_budget",
            Self::Shutdown => "shutdown",
            Self::HedgeLoser => "hedge_loser",
            Self::Overloaded => "overloaded",
            Self::RunDeadline => "run_deadline",
            Self::RunTokens => "run_tokens",
            Self::SendTimeout => "send_timeout",
        }
    }
}

/// Every way Hourglass itself can end a request. Upstream non-2xx answers are not errors here:
/// they pass through unchanged.
#[derive(Debug, Clone, thiserror::Error)]
pub enum GatewayError {
    #[error("{header}: {value:?} {reason}")]
    InvalidBudget {
        header: &'static str,
        value: String,
        reason: &'static str,
    },
    /// `by_model`: the path's routes all serve only the models they name.
    #[error("no route matches path {path:?}{}", model_suffix(.model, *.by_model))]
    NoRoute {
        path: String,
        model: Option<String>,
        by_model: bool,
    },
    /// Named as the gateway's setting (`[server] max_request_body`, or `route`'s own), with
    /// the length the client declared when it did: a client's report then says which
    /// setting to raise, and by how much.
    #[error("request body{} exceeds the gateway's {} ({limit} bytes)", sent_suffix(.sent), body_limit_key(.route))]
    BodyTooLarge {
        limit: u64,
        sent: Option<u64>,
        route: Option<String>,
    },
    #[error("{message}")]
    BadRequest { message: String },
    /// The client went away (closed the connection, reset its HTTP/2 stream) while sending
    /// its request body: its cancel, not a malformed request. Nobody is left to answer.
    #[error("the client left before its request body was complete")]
    ClientClosed,
    /// A request body in a content coding on a route that reads the body (for the model that
    /// picks the route, or to rewrite it for an upstream).
    #[error("content-encoding: {value:?} is not supported on this route, which reads the body; send it unencoded")]
    UnsupportedEncoding { value: String },
    /// A head whose framing two HTTP/1 parsers could read differently (request smuggling):
    /// refused, and the connection closed after the answer.
    #[error("ambiguous request framing: {reason}")]
    AmbiguousRequest { reason: &'static str },
    /// `chunked` more than once among a request's transfer codings, which RFC 9112 6.1
    /// forbids: refused like an ambiguous head, the connection closed after the answer.
    #[error(
        "ambiguous request framing: transfer-encoding: {value:?} applies chunked more than once"
    )]
    ChunkedTwice { value: String },
    /// A request transfer coding other than chunked (`gzip, chunked`): the gateway decodes
    /// none (RFC 9112 6.1 has a server answer 501), and with the header dropped as hop-by-hop
    /// the upstream would take the still-coded bytes for the content. The connection is closed
    /// after the answer, since the body is never read.
    #[error("transfer-encoding: {value:?}: this gateway decodes no transfer coding but chunked; send the body chunked or with a Content-Length, and a compressed body with Content-Encoding")]
    UnsupportedTransferCoding { value: String },
    /// A request path with a `.` or `..` segment (also percent-encoded), which an upstream
    /// could resolve to a path other than the one the route matched.
    #[error("request path {path:?} has a dot-segment (\".\" or \"..\", also percent-encoded), which the upstream could resolve to a path outside the route it matched; send the path without it")]
    DotSegment { path: String },
    /// A member of the request body that the gateway reads (`model`, `stream`, `max_tokens`,
    /// ...) named twice, also once escaped: parsers disagree on which one counts (RFC 8259
    /// 4), so the gateway could route, rewrite or reserve by one value and the provider read
    /// the other.
    #[error("the request body names {name:?} more than once (also counting escaped spellings); parsers differ on which one counts, so send it once")]
    RepeatedMember { name: String },
    /// A body that looks like JSON but is not one JSON object in UTF-8, on a request whose
    /// body the gateway reads: another parser could read a model from it that the gateway
    /// did not (see `provider::request::Unreadable`).
    #[error("the request body may be read otherwise by the provider than by this gateway, which routes and rewrites by it: {reason}; send one JSON object in UTF-8, without a byte order mark, its members spelled as the API spells them")]
    UnreadableBody { reason: String },
    /// More header fields than `[server] max_headers`. hyper refuses these itself over
    /// HTTP/1 (with a bare 431); over HTTP/2 it bounds only the header list's bytes.
    #[error("request has {count} header fields, more than this gateway's max_headers ({limit})")]
    TooManyHeaders { count: usize, limit: usize },
    /// An HTTP/2 request head larger than `[server] max_header_bytes`, counted as HTTP/2
    /// counts a header list (RFC 9113 6.5.2: each field's name and value and 32). hyper
    /// refuses these itself over HTTP/1 (with a bare 431); over HTTP/2 the h2 crate's own
    /// bound is set above the limit so that they reach the handler, its log and its metrics.
    #[error("request head has {bytes} bytes of header fields, more than this gateway's max_header_bytes ({limit})")]
    HeadTooLarge { bytes: usize, limit: usize },
    #[error("insufficient budget: {}; at least {} is needed to call the upstream{}{}", left(*.remaining, *.reserve, *.patience), ms(*.min_useful), expected(.expected_by.as_ref(), *.min_useful), upload_spent(.uploading))]
    InsufficientBudget {
        /// What is left of the budget after the reserve, or of the client's patience.
        remaining: Duration,
        reserve: Duration,
        min_useful: Duration,
        /// The upstream whose expected time to its first token (configured or learned) is
        /// what the call needs, when that is more than the route's `min_useful`, and the
        /// model it was expected for.
        expected_by: Option<(String, Option<String>)>,
        /// The request's whole budget was too small from the start: the same request fails
        /// the same way however often it is sent.
        whole: bool,
        /// What bounds the call is the client's own patience (the timeout its SDK announced),
        /// which ends before its budget does.
        patience: bool,
        /// The call would have fit when the request's body began, and the client's upload
        /// spent what it needed: the same upload would leave as little again.
        uploading: Option<Uploading>,
    },
    #[error("connect timeout: upstream {upstream:?} {}", connect_wait(*.after, *.sent, .proxy.as_deref()))]
    ConnectTimeout {
        upstream: String,
        after: Duration,
        /// The egress proxy its connections go through (password masked), if any: a slow
        /// proxy or tunnel is then named, not taken for the upstream (audit QC 6).
        proxy: Option<String>,
        /// The request had gone out on the connection: HTTP/2 sends it before the server's
        /// SETTINGS come, and a server that never sent them may still have processed it.
        sent: bool,
    },
    #[error("first token timeout: upstream {upstream:?} sent no token within {}{}", ms(*.after), cut_to_patience(*.patience))]
    FirstTokenTimeout {
        upstream: String,
        after: Duration,
        /// The wait was cut to the client's read timeout (the one its SDK announced, less a
        /// margin), shorter than the route's limit: the message says so, or the client would
        /// read a limit it finds neither in its code nor in the gateway's config.
        patience: bool,
    },
    #[error("idle timeout: {}", silence(upstream, *.after, *.patience))]
    IdleTimeout {
        upstream: String,
        after: Duration,
        /// As for `FirstTokenTimeout`.
        patience: bool,
    },
    #[error("deadline exceeded: {}{}", spent(*.budget, *.reserve, *.patience), uploading_words(.uploading))]
    DeadlineExceeded {
        budget: Duration,
        /// What the route holds back for after the upstream's share: the cut came that much
        /// before the budget's end.
        reserve: Duration,
        /// The client set the budget (a budget header): its own deadline has passed, and
        /// the same request sent again would get a new one.
        client_budget: bool,
        /// The deadline was the client's patience (the timeout its SDK announced) for an
        /// answer held until whole, which ends before its budget: `budget` is that patience.
        patience: bool,
        /// The deadline passed while the client was still sending the request's body: its
        /// own upload spent the budget, and the same upload would spend it again.
        uploading: Option<Uploading>,
    },
    #[error("upstream {upstream:?} unavailable: {reason}")]
    UpstreamUnavailable {
        upstream: String,
        reason: String,
        /// Its certificate failed the checks (or its TLS handshake failed otherwise for
        /// good: an alert such as `handshake_failure`, ALPN without h2 under `always`): so
        /// will every attempt on it, until it or the upstream's config changes.
        certificate: bool,
    },
    #[error("upstream {upstream:?} failed: {reason}")]
    UpstreamError { upstream: String, reason: String },
    /// The upstream turned the request away before processing any of it (HTTP/2's
    /// REFUSED_STREAM, or a GOAWAY that left it out): safe to send again, which the gateway
    /// does once by itself. Or (`unanswered`) a pooled HTTP/1.1 connection closed before any
    /// of the answer to a bodiless request of a safe method came: sent again once too (RFC
    /// 9112 9.3.1.1), but nobody can say the upstream did not process it (audit NA 3).
    #[error("{}", refused_words(.upstream, .reason, *.unanswered))]
    UpstreamRefused {
        upstream: String,
        reason: &'static str,
        unanswered: bool,
    },
    /// The gateway could not open a connection to the upstream for want of its own
    /// descriptors or memory: nothing is known of the upstream, which neither is blamed (no
    /// 502, no count against its health) nor replaced by another, whose connect would need
    /// a descriptor too.
    #[error("{}, so no connection to upstream {upstream:?} could be opened: {reason}; try again", .starved.words())]
    Starved {
        upstream: String,
        starved: Starved,
        reason: String,
    },
    #[error("the gateway is shutting down")]
    Shutdown,
    /// The route wants a client key and the request carried none of its keys. The message
    /// never repeats what was sent.
    #[error("this route requires an API key of this gateway (Authorization: Bearer KEY or x-api-key: KEY)")]
    Unauthorized,
    /// The route is at `max_in_flight` and the request's budget leaves no time to wait
    /// (longer) for a slot.
    #[error("route {route:?} is at its limit of {limit} {} in flight; {}", if *.limit == 1 { "request" } else { "requests" }, overload_detail(*.waited))]
    Overloaded {
        route: String,
        limit: usize,
        waited: Duration,
    },
    /// The request bodies being received, waiting for a slot or kept for calls in flight
    /// fill `[server] request_body_memory`: this one is not read further.
    #[error("the request bodies this gateway is receiving or forwarding fill its request_body_memory ({limit} bytes); try again")]
    BodyMemoryFull { limit: u64 },
    /// An attempt's upstream rewrites the body (`model`, `stream_upstream`, `include_usage`):
    /// the body and that copy hold `[server] request_body_memory` together, and the two are
    /// more than all of it, so no retry could ever be admitted (audit QC 1: an idle gateway
    /// said 503 "try again" to every one).
    #[error("request body ({body} bytes) and the rewritten copy of it sent to upstream {upstream:?} ({copy} bytes) are together more than the gateway's request_body_memory ({limit} bytes), which both hold while the call is in flight; send a smaller body")]
    BodyCopyTooLarge {
        body: u64,
        copy: u64,
        limit: u64,
        upstream: String,
    },
    /// The answers held before their heads go out (documents rebuilt from streams, JSON
    /// documents read whole) fill `[server] response_body_memory`: this one is given up, its
    /// upstream call cancelled.
    #[error("the answers this gateway is holding fill its response_body_memory ({limit} bytes); try again")]
    ResponseMemoryFull { limit: u64 },
    /// The request body fell silent for `header_read_timeout`, as a head may not.
    #[error("the request body sent nothing for {}ms (the gateway's header_read_timeout); send it without pauses", .after.as_millis())]
    BodyTimeout { after: Duration },
    /// The request already passed through `hops` Hourglass gateways (each names itself in
    /// `Via` and counts itself in `x-hourglass-hops`): an upstream leads back into the chain.
    #[error("the request has already passed through {hops} Hourglass gateways (Via, x-hourglass-hops): an upstream leads back into the chain")]
    LoopDetected { hops: usize },
    /// The client asked to switch the connection to WebSocket (the OpenAI Realtime API, for
    /// one). Hourglass forwards HTTP requests and streams only; passed on without `Upgrade`
    /// (a hop-by-hop header), the request would reach the provider as a plain GET and fail
    /// there with an answer the client's WebSocket library cannot explain.
    #[error("Upgrade: {value:?}: this gateway forwards HTTP requests and their streams, it does not tunnel WebSocket connections")]
    UpgradeUnsupported { value: String },
    /// The run id header is malformed: the calls of the run it meant cannot be bounded.
    #[error("invalid run id: {header}: {value:?} {reason}")]
    InvalidRunId {
        header: String,
        value: String,
        reason: &'static str,
    },
    /// The run has made all the calls `run_max_calls` allows.
    #[error("run call limit: run {run:?} has made its {limit} calls")]
    RunCallLimit { run: String, limit: u32 },
    /// The call's token reservation does not fit what the run has left.
    #[error("run token limit: run {run:?} has used {used} of its {limit} tokens and calls in flight hold {reserved}; this call would reserve {asked}")]
    RunTokenLimit {
        run: String,
        limit: u64,
        used: u64,
        reserved: u64,
        asked: u64,
    },
    /// An answer's (estimated) tokens pushed its run past `run_max_tokens`: the stream is cut.
    #[error("run token limit: run {run:?} reached its {limit} tokens during this answer")]
    RunTokensSpent { run: String, limit: u64 },
    /// The model asked for the same tool call (or the client sent the same request)
    /// `run_max_repeats` times in a row.
    #[error("run loop detected: run {run:?}: {}", loop_detail(.tool, *.count))]
    RunLoopDetected {
        run: String,
        tool: Option<String>,
        count: u32,
    },
    /// The run's deadline passed (before the call, or during it), or what is left of it
    /// (`left`) cannot fit a call.
    #[error("run deadline exceeded: run {run:?} {}", run_left(*.budget, *.left, *.reserve, .need.as_deref()))]
    RunDeadlineExceeded {
        run: String,
        budget: Duration,
        left: Duration,
        /// What a call needs that `left` does not fit, when the gateway measured it (the
        /// store's own refusals say only that it does not fit). Boxed: rare, and large.
        need: Option<Box<RunNeed>>,
        /// What the call's route holds back: a call cut at the run's deadline was cut that
        /// much before it (as `DeadlineExceeded`'s).
        reserve: Duration,
    },
    /// The run store did not answer in time and the gateway is told to deny (`on_store_error`).
    #[error("run store unavailable: {reason}")]
    RunStoreUnavailable { reason: String },
    /// A method the gateway does not forward. `CONNECT` (a client that takes the gateway for
    /// a forward proxy, `HTTPS_PROXY` pointed at it): its authority-form target has no path
    /// to route, and the gateway opens no tunnels. `TRACE`: an upstream that answers it
    /// echoes the provider key the gateway adds.
    #[error("method {method} is not allowed: {}", method_refused_why(.method))]
    MethodNotAllowed { method: String },
    /// A plain HTTP request on a TLS listener (`http://` where `https://` was meant).
    #[error("this port speaks TLS: the request was sent in plain HTTP; use https://")]
    PlainHttpOnTls,
    /// A bug: the request handler panicked. Logged and counted; the process keeps serving.
    #[error("internal error in the gateway")]
    Internal,
}

/// `{"code":..,"message":..,"type":..}`: the OpenAI/Anthropic error object.
#[derive(serde::Serialize)]
struct ErrorObject {
    code: &'static str,
    message: String,
    #[serde(rename = "type")]
    kind: &'static str,
}

fn write_json(out: &mut Vec<u8>, value: &impl serde::Serialize) {
    // Strings and plain structs into a Vec: serde_json cannot fail on these.
    serde_json::to_writer(out, value).expect("an error body serialises");
}

/// How the error that ends a cut stream is written, after the head has gone: as the
/// clients of that stream read one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamErrorShape {
    /// `event: error` and the error object (OpenAI's and Anthropic's SDKs).
    Event,
    /// A data-only event in Gemini's error shape, `{"error":{"code":504,"message","status"}}`,
    /// for Gemini's native streams (`:streamGenerateContent?alt=sse`): google-genai reads
    /// any line but `data: ` as raw JSON, and raised "Failed to parse response as JSON" at
    /// `event: error` (audit WB 6); its own errors it raises with their message. A gateway
    /// in front of this one reads it as its upstream's error (break audit YB 1).
    Gemini,
    /// One NDJSON line, `{"error":TEXT,"code","type"}`: Ollama's in-band error, which
    /// ollama-python raises as `ResponseError` with the text (audit WB 7).
    Line,
}

/// How far the client's upload had come when the deadline passed (see
/// `GatewayError::DeadlineExceeded`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Uploading {
    /// The body's bytes received.
    pub received: u64,
    /// Its `Content-Length`, when it had one.
    pub length: Option<u64>,
}

/// What a call of a run needs that the run's time left does not fit.
#[derive(Debug, Clone)]
pub struct RunNeed {
    pub needed: Duration,
    /// The upstream (and model) whose expected time to its first token is `needed`.
    pub expected_by: Option<(String, Option<String>)>,
}

/// An error and what caused it, as one line: hyper's own messages ("error reading a body
/// from connection") say where it failed, their sources why (an HTTP/2 reset, with its
/// code; an I/O error).
pub fn with_causes(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        let broken_pipe = |io: &std::io::Error| io.kind() == std::io::ErrorKind::BrokenPipe;
        match s.downcast_ref::<h2::Error>() {
            // h2 words the peer's end of file "a broken pipe", which nothing here broke (hyper
            // passes its I/O error on alone); a write's EPIPE means the same.
            _ if s.downcast_ref::<std::io::Error>().is_some_and(broken_pipe) => {
                out.push_str("the upstream closed the connection");
            }
            Some(h2) if h2.get_io().is_some_and(broken_pipe) => {
                out.push_str("the upstream closed the connection");
            }
            Some(h2) => {
                out.push_str(&s.to_string());
                if let Some(reason) = h2.reason() {
                    out.push_str(&format!(" ({reason:?})"));
                    // h2's own reset of an answer it could not take says no more.
                    if reason == h2::Reason::PROTOCOL_ERROR && h2.is_reset() && !h2.is_remote() {
                        out.push_str(
                            ": the upstream's answer broke HTTP/2, as a malformed head or one \
                             over 64 KiB does",
                        );
                    }
                }
            }
            None => out.push_str(&s.to_string()),
        }
        source = s.source();
    }
    out
}

impl GatewayError {
    /// This error, when it is the request's deadline or a budget too short for a call, told
    /// that the client's own upload spent it: the budget runs from arrival (DESIGN 3), so the
    /// same upload would be cut again, and the answer says not to retry it (audit PC 3: the
    /// OpenAI SDK sent an upload cut by its route's budget three times; ZA 2: one that left
    /// too little for the call). A run's deadline says so already.
    pub fn spent_uploading(mut self, upload: Uploading) -> GatewayError {
        if let GatewayError::DeadlineExceeded { uploading, .. }
        | GatewayError::InsufficientBudget { uploading, .. } = &mut self
        {
            *uploading = Some(upload);
        }
        self
    }
}

impl GatewayError {
    /// The stable, low-cardinality name of this failure: JSON `code` and metric label.
    pub fn code(&self) -> &'static str {
        match self {
            Self::InvalidBudget { .. } => "invalid_budget",
            Self::NoRoute { .. } => "no_route",
            Self::BodyTooLarge { .. } | Self::BodyCopyTooLarge { .. } => "body_too_large",
            Self::UnsupportedEncoding { .. } => "unsupported_encoding",
            Self::BadRequest { .. }
            | Self::AmbiguousRequest { .. }
            | Self::ChunkedTwice { .. }
            | Self::DotSegment { .. }
            | Self::RepeatedMember { .. }
            | Self::UnreadableBody { .. } => "invalid_request",
            Self::TooManyHeaders { .. } => "too_many_headers",
            Self::HeadTooLarge { .. } => "head_too_large",
            Self::ClientClosed => "client_closed",
            Self::UnsupportedTransferCoding { .. } => "unsupported_transfer_coding",
            Self::InsufficientBudget { .. } => "insufficient_budget",
            Self::ConnectTimeout { .. } => "connect_timeout",
            Self::FirstTokenTimeout { .. } => "first_token_timeout",
            Self::IdleTimeout { .. } => "idle_timeout",
            Self::DeadlineExceeded { .. } => "deadline_exceeded",
            Self::UpstreamUnavailable { .. } => "upstream_unavailable",
            Self::UpstreamError { .. } | Self::UpstreamRefused { .. } => "upstream_error",
            Self::Shutdown => "shutdown",
            Self::Unauthorized => "unauthorized",
            Self::Overloaded { .. }
            | Self::BodyMemoryFull { .. }
            | Self::ResponseMemoryFull { .. }
            | Self::Starved { .. } => "overloaded",
            Self::BodyTimeout { .. } => "body_timeout",
            Self::LoopDetected { .. } => "loop_detected",
            Self::UpgradeUnsupported { .. } => "upgrade_unsupported",
            Self::InvalidRunId { .. } => "invalid_run_id",
            Self::RunCallLimit { .. } => "run_call_limit",
            Self::RunTokenLimit { .. } | Self::RunTokensSpent { .. } => "run_token_limit",
            Self::RunLoopDetected { .. } => "run_loop_detected",
            Self::RunDeadlineExceeded { .. } => "run_deadline_exceeded",
            Self::RunStoreUnavailable { .. } => "run_store_unavailable",
            Self::MethodNotAllowed { .. } => "method_not_allowed",
            Self::PlainHttpOnTls => "plain_http_on_tls",
            Self::Internal => "internal_error",
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            Self::InvalidBudget { .. }
            | Self::BadRequest { .. }
            | Self::ClientClosed
            | Self::AmbiguousRequest { .. }
            | Self::ChunkedTwice { .. }
            | Self::DotSegment { .. }
            | Self::RepeatedMember { .. }
            | Self::UnreadableBody { .. }
            | Self::InvalidRunId { .. } => StatusCode::BAD_REQUEST,
            Self::RunCallLimit { .. }
            | Self::RunTokenLimit { .. }
            | Self::RunTokensSpent { .. }
            | Self::RunLoopDetected { .. } => StatusCode::TOO_MANY_REQUESTS,
            Self::RunDeadlineExceeded { .. } => StatusCode::GATEWAY_TIMEOUT,
            Self::RunStoreUnavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
            Self::NoRoute { .. } => StatusCode::NOT_FOUND,
            Self::BodyTooLarge { .. } | Self::BodyCopyTooLarge { .. } => {
                StatusCode::PAYLOAD_TOO_LARGE
            }
            Self::TooManyHeaders { .. } | Self::HeadTooLarge { .. } => {
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE
            }
            Self::UnsupportedEncoding { .. } => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::InsufficientBudget { .. }
            | Self::ConnectTimeout { .. }
            | Self::FirstTokenTimeout { .. }
            | Self::IdleTimeout { .. }
            | Self::DeadlineExceeded { .. } => StatusCode::GATEWAY_TIMEOUT,
            Self::UpstreamUnavailable { .. }
            | Self::UpstreamError { .. }
            | Self::UpstreamRefused { .. } => StatusCode::BAD_GATEWAY,
            Self::Shutdown
            | Self::Overloaded { .. }
            | Self::BodyMemoryFull { .. }
            | Self::ResponseMemoryFull { .. }
            | Self::Starved { .. } => StatusCode::SERVICE_UNAVAILABLE,
            Self::BodyTimeout { .. } => StatusCode::REQUEST_TIMEOUT,
            Self::Unauthorized => StatusCode::UNAUTHORIZED,
            Self::LoopDetected { .. } => StatusCode::LOOP_DETECTED,
            Self::UpgradeUnsupported { .. } | Self::UnsupportedTransferCoding { .. } => {
                StatusCode::NOT_IMPLEMENTED
            }
            Self::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            Self::PlainHttpOnTls => StatusCode::BAD_REQUEST,
            Self::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The OpenAI/Anthropic error `type`, which the official SDKs map to exception classes.
    pub fn error_type(&self) -> &'static str {
        match self {
            Self::InvalidBudget { .. }
            | Self::NoRoute { .. }
            | Self::BodyTooLarge { .. }
            | Self::BodyCopyTooLarge { .. }
            | Self::UnsupportedEncoding { .. }
            | Self::BadRequest { .. }
            | Self::ClientClosed
            | Self::AmbiguousRequest { .. }
            | Self::ChunkedTwice { .. }
            | Self::DotSegment { .. }
            | Self::RepeatedMember { .. }
            | Self::UnreadableBody { .. }
            | Self::BodyTimeout { .. }
            | Self::TooManyHeaders { .. }
            | Self::HeadTooLarge { .. }
            | Self::UnsupportedTransferCoding { .. }
            | Self::UpgradeUnsupported { .. }
            | Self::InvalidRunId { .. } => "invalid_request_error",
            // OpenAI's and Anthropic's name for 429s: the SDKs map it to RateLimitError.
            Self::RunCallLimit { .. }
            | Self::RunTokenLimit { .. }
            | Self::RunTokensSpent { .. }
            | Self::RunLoopDetected { .. } => "rate_limit_error",
            Self::RunDeadlineExceeded { .. } => "timeout_error",
            Self::RunStoreUnavailable { .. } => "overloaded_error",
            Self::MethodNotAllowed { .. } | Self::PlainHttpOnTls => "invalid_request_error",
            // The names both OpenAI and Anthropic use for these.
            Self::Unauthorized => "authentication_error",
            Self::Overloaded { .. }
            | Self::BodyMemoryFull { .. }
            | Self::ResponseMemoryFull { .. }
            | Self::Starved { .. } => "overloaded_error",
            Self::InsufficientBudget { .. }
            | Self::ConnectTimeout { .. }
            | Self::FirstTokenTimeout { .. }
            | Self::IdleTimeout { .. }
            | Self::DeadlineExceeded { .. } => "timeout_error",
            Self::UpstreamUnavailable { .. }
            | Self::UpstreamError { .. }
            | Self::UpstreamRefused { .. }
            | Self::Shutdown
            | Self::LoopDetected { .. }
            | Self::Internal => "upstream_error",
        }
    }

    /// The cancellation origin this failure counts as, if it cancels work (as opposed to a
    /// request that was refused or an upstream that failed on its own).
    pub fn origin(&self) -> Option<Origin> {
        match self {
            Self::InsufficientBudget { .. } => Some(Origin::InsufficientBudget),
            Self::ConnectTimeout { .. } => Some(Origin::Connect),
            Self::FirstTokenTimeout { .. } => Some(Origin::FirstToken),
            Self::IdleTimeout { .. } => Some(Origin::Idle),
            Self::DeadlineExceeded { .. } => Some(Origin::Deadline),
            Self::Shutdown => Some(Origin::Shutdown),
            Self::ClientClosed => Some(Origin::Client),
            Self::Overloaded { .. }
            | Self::BodyMemoryFull { .. }
            | Self::ResponseMemoryFull { .. }
            | Self::Starved { .. } => Some(Origin::Overloaded),
            Self::RunDeadlineExceeded { .. } => Some(Origin::RunDeadline),
            Self::RunTokensSpent { .. } => Some(Origin::RunTokens),
            _ => None,
        }
    }

    /// The `error` object, written straight out: building a `serde_json::Value` tree first
    /// cost 14,000 instructions a stream end, more than the rest of the end together.
    fn error_object(&self) -> ErrorObject {
        ErrorObject {
            code: self.code(),
            message: self.to_string(),
            kind: self.error_type(),
        }
    }

    /// The body sent when no response head has gone out yet. The top-level `type` is
    /// Anthropic's (`{"type":"error","error":{..}}`): clients that check it before reading
    /// the error (the Vercel AI SDK) showed only the status text without it; OpenAI's
    /// clients read `error` alone.
    pub fn json_body(&self) -> Bytes {
        #[derive(serde::Serialize)]
        struct Body {
            error: ErrorObject,
            #[serde(rename = "type")]
            kind: &'static str,
        }
        let mut out = Vec::with_capacity(176);
        write_json(
            &mut out,
            &Body {
                error: self.error_object(),
                kind: "error",
            },
        );
        Bytes::from(out)
    }

    /// The single event appended to an SSE stream that a limit or failure cut. Anthropic's
    /// SDKs read `event: error`; OpenAI's raise on any data object with an `error` key. On
    /// a Responses stream, whose every event is numbered, it takes the next number
    /// (`sequence_number`).
    pub fn sse_event(&self, sequence_number: Option<u64>) -> Bytes {
        self.sse_event_as(sequence_number, self.error_type())
    }

    fn sse_event_as(&self, sequence_number: Option<u64>, kind: &'static str) -> Bytes {
        #[derive(serde::Serialize)]
        struct Data {
            error: ErrorObject,
            #[serde(skip_serializing_if = "Option::is_none")]
            sequence_number: Option<u64>,
            #[serde(rename = "type")]
            kind: &'static str,
        }
        let mut out = Vec::with_capacity(224);
        out.extend_from_slice(b"event: error\ndata: ");
        write_json(
            &mut out,
            &Data {
                error: ErrorObject {
                    kind,
                    ..self.error_object()
                },
                sequence_number,
                kind: "error",
            },
        );
        out.extend_from_slice(b"\n\n");
        Bytes::from(out)
    }

    /// What ends a stream that a limit or failure cut, written as its clients read errors
    /// (see `StreamErrorShape`).
    pub fn stream_error(&self, shape: StreamErrorShape, sequence_number: Option<u64>) -> Bytes {
        self.stream_error_as(shape, sequence_number, self.error_type())
    }

    /// `stream_error` with the `type` of another's error: the provider's, whose error the
    /// gateway writes in its words (llama.cpp's `error` field), so that a gateway in front
    /// reads its kind (a 503's `overloaded_error` failed over, break audit ZC 2) as it reads
    /// the provider's own events.
    pub fn stream_error_as(
        &self,
        shape: StreamErrorShape,
        sequence_number: Option<u64>,
        kind: &'static str,
    ) -> Bytes {
        match shape {
            StreamErrorShape::Event => self.sse_event_as(sequence_number, kind),
            StreamErrorShape::Gemini => self.gemini_event(),
            StreamErrorShape::Line => self.ndjson_line(kind),
        }
    }

    /// Gemini's error event: its HTTP status as the numeric `code` (google-genai makes its
    /// `status_code` of it, and raises `ServerError` for a 5xx), the gRPC status name that
    /// Google pairs with it, and the gateway's code as the reason of an `ErrorInfo` detail.
    fn gemini_event(&self) -> Bytes {
        #[derive(serde::Serialize)]
        struct Detail {
            #[serde(rename = "@type")]
            kind: &'static str,
            reason: &'static str,
            domain: &'static str,
        }
        #[derive(serde::Serialize)]
        struct Error {
            code: u16,
            message: String,
            status: &'static str,
            details: [Detail; 1],
        }
        #[derive(serde::Serialize)]
        struct Data {
            error: Error,
        }
        let status = self.status();
        // google.rpc.Code's HTTP mapping.
        let name = match status.as_u16() {
            504 => "DEADLINE_EXCEEDED",
            429 => "RESOURCE_EXHAUSTED",
            502 | 503 => "UNAVAILABLE",
            _ => "INTERNAL",
        };
        let mut out = Vec::with_capacity(320);
        out.extend_from_slice(b"data: ");
        write_json(
            &mut out,
            &Data {
                error: Error {
                    code: status.as_u16(),
                    message: self.to_string(),
                    status: name,
                    details: [Detail {
                        kind: "type.googleapis.com/google.rpc.ErrorInfo",
                        reason: self.code(),
                        domain: "hourglass",
                    }],
                },
            },
        );
        out.extend_from_slice(b"\n\n");
        Bytes::from(out)
    }

    /// Ollama's in-band error line: `error` is the text (all that ollama-python reads), the
    /// gateway's `code` and `type` beside it.
    fn ndjson_line(&self, kind: &'static str) -> Bytes {
        #[derive(serde::Serialize)]
        struct Line {
            error: String,
            code: &'static str,
            #[serde(rename = "type")]
            kind: &'static str,
        }
        let mut out = Vec::with_capacity(176);
        write_json(
            &mut out,
            &Line {
                error: self.to_string(),
                code: self.code(),
                kind,
            },
        );
        out.push(b'\n');
        Bytes::from(out)
    }

    pub fn response(&self) -> http::Response<Bytes> {
        let mut resp = http::Response::new(self.json_body());
        *resp.status_mut() = self.status();
        resp.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        );
        match self {
            Self::Overloaded { .. }
            | Self::BodyMemoryFull { .. }
            | Self::ResponseMemoryFull { .. }
            | Self::Starved { .. }
            | Self::Shutdown => {
                let secs = RETRY_AFTER.as_secs().max(1);
                resp.headers_mut()
                    .insert(http::header::RETRY_AFTER, http::HeaderValue::from(secs));
            }
            // No byte after this head may be read as another request (RFC 9112 6.3).
            // hyper drops the header from HTTP/2 answers, where it has no meaning.
            Self::AmbiguousRequest { .. } | Self::ChunkedTwice { .. } => {
                resp.headers_mut().insert(
                    http::header::CONNECTION,
                    http::HeaderValue::from_static("close"),
                );
            }
            // The methods the gateway forwards (RFC 9110 15.5.6). A CONNECT client may send
            // its tunnel's first bytes (a TLS ClientHello) without waiting for the answer:
            // closing keeps them from being read as a request. Refused the same way again.
            Self::MethodNotAllowed { .. } => {
                let headers = resp.headers_mut();
                headers.insert(
                    http::header::ALLOW,
                    http::HeaderValue::from_static(FORWARDED_METHODS),
                );
                headers.insert(
                    http::header::CONNECTION,
                    http::HeaderValue::from_static("close"),
                );
            }
            // The codings this server takes (RFC 9110 12.5.3).
            Self::UnsupportedEncoding { .. } => {
                resp.headers_mut().insert(
                    http::header::ACCEPT_ENCODING,
                    http::HeaderValue::from_static("identity"),
                );
            }
            Self::Unauthorized => {
                resp.headers_mut().insert(
                    http::header::WWW_AUTHENTICATE,
                    http::HeaderValue::from_static("Bearer realm=\"hourglass\""),
                );
            }
            _ => {}
        }
        if self.tells_not_to_retry() {
            resp.headers_mut().insert(
                http::HeaderName::from_static("x-should-retry"),
                http::HeaderValue::from_static("false"),
            );
        }
        resp
    }

    /// The answer says `x-should-retry: false`: the same request would fail the same way.
    /// The OpenAI and Anthropic SDKs, which retry any 5xx by default, obey this header.
    pub fn tells_not_to_retry(&self) -> bool {
        matches!(
            self,
            // Refused the same way again.
            Self::MethodNotAllowed { .. }
            // The same request loops (or is refused, or cannot fit) the same way again.
            // A deadline the client set is its own: a retry would come with a new one, and
            // an answer after the time the client asked for (openai 3.63: a 2 s budget,
            // 504 after 7.3 s and three requests).
            // (An unsupported coding's body is never read: the answer also closes, as every
            // answer made before the body was read does, `gateway::body::error_answer`.)
            | Self::LoopDetected { .. }
            | Self::BodyCopyTooLarge { .. }
            | Self::UnsupportedTransferCoding { .. }
            | Self::UpgradeUnsupported { .. }
            | Self::InsufficientBudget { whole: true, .. }
            | Self::InsufficientBudget {
                uploading: Some(_),
                ..
            }
            | Self::UpstreamUnavailable {
                certificate: true,
                ..
            }
            | Self::RunCallLimit { .. }
            | Self::RunTokenLimit { .. }
            | Self::RunTokensSpent { .. }
            | Self::RunLoopDetected { .. }
            | Self::RunDeadlineExceeded { .. }
            | Self::DeadlineExceeded {
                client_budget: true,
                ..
            }
            // Spent by the client's own upload, which would spend it again (the budget runs
            // from arrival).
            | Self::DeadlineExceeded {
                uploading: Some(_),
                ..
            }
        )
    }
}

mod words;
use words::*;

#[cfg(test)]
mod tests;
