//! What Hourglass knows about the APIs it fronts: which wire format a request speaks (OpenAI
//! Chat Completions, the OpenAI Responses API, Anthropic Messages), the one request rewrite that
//! makes OpenAI report usage on streams, and the low-cardinality names of the providers'
//! mid-stream error types. Reading the streams themselves is `inspect`'s job.

pub mod assemble;
pub mod background;
pub mod batches;
pub mod inspect;
pub mod request;
pub mod rewrite;
pub mod tools;

use std::fmt;

/// The `api` an upstream speaks, as configured.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Api {
    /// OpenAI: Chat Completions, or the Responses API on paths ending in `/responses`.
    OpenAi,
    /// Anthropic Messages.
    Anthropic,
    /// Decided per request from its path; other paths are not inspected.
    #[default]
    Auto,
}

impl fmt::Display for Api {
    /// Formats as the spelling used in the config file.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Api::OpenAi => "openai",
            Api::Anthropic => "anthropic",
            Api::Auto => "auto",
        })
    }
}

/// The wire format of one request and its response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// OpenAI Chat Completions (`choices[].delta`), also legacy completions (`choices[].text`).
    Chat,
    /// The OpenAI Responses API (`response.*` events).
    Responses,
    /// Anthropic Messages (`message_start`, `content_block_delta`, ...).
    Messages,
}

impl Format {
    /// The format of a request to `path` (query allowed) on an upstream that speaks `api`;
    /// `None` when it is not known, and then nothing is inspected (every data event counts as
    /// a token, as for any SSE stream). A named `api` reads any path in its format (a
    /// provider may serve its API under paths of its own) but those below one of the APIs'
    /// calls: a stored response read again (`/responses/{id}`), a count of tokens
    /// (`/messages/count_tokens`), a batch; their usage is no use of tokens now, and a run
    /// polling one would spend its token budget on every poll.
    pub fn detect(api: Api, path: &str) -> Option<Format> {
        let path = path.split('?').next().unwrap_or_default();
        let path = path.trim_end_matches('/');
        if api != Api::Auto && below_call(path) && !Format::compaction(api, path) {
            return None;
        }
        match api {
            Api::Anthropic => Some(Format::Messages),
            Api::OpenAi if path.ends_with("/responses") || compacts(path) => {
                Some(Format::Responses)
            }
            Api::OpenAi => Some(Format::Chat),
            Api::Auto if path.ends_with("/v1/messages") => Some(Format::Messages),
            Api::Auto if path.ends_with("/chat/completions") => Some(Format::Chat),
            Api::Auto if path.ends_with("/v1/responses") => Some(Format::Responses),
            Api::Auto if Format::compaction(api, path) => Some(Format::Responses),
            Api::Auto => None,
        }
    }

    /// Whether `path` (query allowed) is OpenAI's `POST …/responses/compact` on an upstream
    /// that speaks `api` (`auto`: under `/v1/`): a model pass over a conversation that
    /// shrinks it, answered as one document with a Responses `usage`. Below `…/responses`
    /// by its path, it is a call of the model all the same: its usage counts, and a run
    /// reserves tokens for it and is charged them (audit ZD 1: three compactions reporting
    /// 43,000 tokens each left a run of 1,500 with 1,500). It is no call `stream_upstream`
    /// may ask to stream: it takes no `stream`.
    pub fn compaction(api: Api, path: &str) -> bool {
        let path = path.split('?').next().unwrap_or_default();
        let path = path.trim_end_matches('/');
        match api {
            Api::OpenAi => compacts(path),
            Api::Auto => path.ends_with("/v1/responses/compact"),
            Api::Anthropic => false,
        }
    }

    /// The format of a background response streamed again, `GET …/responses/{id}?stream=true`
    /// (`path` without its query, `query` the request's), on an upstream that speaks OpenAI
    /// (or `auto`, under `/v1/`): Responses. Its `response.completed` carries the only usage
    /// a background response reports (its `POST` answers a `queued` response without one), so
    /// the token metrics and the log line count it (audit UC 4). Its run is charged none of
    /// it, as of any call that asks the model nothing (`Upstream::asks_model`: no body). A
    /// polled response (no `stream=true`) is a document read again: not read.
    pub fn resumed(api: Api, path: &str, query: Option<&str>) -> Option<Format> {
        let path = path.trim_end_matches('/');
        let (parent, id) = path.rsplit_once('/')?;
        let responses = match api {
            Api::OpenAi => parent.ends_with("/responses"),
            Api::Auto => parent.ends_with("/v1/responses"),
            Api::Anthropic => false,
        };
        let streamed = query.is_some_and(|q| q.split('&').any(|pair| pair == "stream=true"));
        (responses && !id.is_empty() && streamed).then_some(Format::Responses)
    }

    /// The format of a request to `path` when it is a call of the API itself (create a chat
    /// completion, a response, a message): the one request `stream_upstream` may ask to
    /// stream and rebuild. `…/chat/completions`, `…/responses`, `…/messages`, and nothing
    /// under them, whatever the upstream's `api`: `/messages/count_tokens` and
    /// `/messages/batches` refuse a `stream` field (400 "Extra inputs are not permitted"),
    /// `/responses/{id}` is a stored response, embeddings and legacy completions have no
    /// document of these to rebuild. `auto` asks for the `/v1/` its detection asks for.
    pub fn call(api: Api, path: &str) -> Option<Format> {
        let path = path.split('?').next().unwrap_or_default();
        let path = path.trim_end_matches('/');
        match api {
            Api::Anthropic if path.ends_with("/messages") => Some(Format::Messages),
            Api::OpenAi if path.ends_with("/chat/completions") => Some(Format::Chat),
            Api::OpenAi if path.ends_with("/responses") => Some(Format::Responses),
            Api::Anthropic | Api::OpenAi => None,
            // A compaction takes no `stream` (`Format::compaction`).
            Api::Auto if Format::compaction(api, path) => None,
            Api::Auto => Format::detect(api, path),
        }
    }
}

/// A path below one of the APIs' calls (`…/chat/completions/{id}`, `…/responses/{id}`,
/// `/cancel`, `…/messages/count_tokens`, `…/messages/batches`): a stored object, its
/// cancellation, a count of tokens, a batch; never the model's generation itself.
/// One pass over the path's bytes, as this runs for every request: three substring searches
/// cost about 2,800 instructions a request, a `split('/')` 2,000 (callgrind); a segment ended
/// by a `/` is one with more path below it; the query is no part of it.
fn below_call(path: &str) -> bool {
    let path = path.as_bytes();
    let (mut start, mut previous): (usize, &[u8]) = (0, b"");
    for (at, &byte) in path.iter().enumerate() {
        if byte == b'?' {
            break;
        }
        if byte == b'/' {
            let segment = &path[start..at];
            match segment {
                b"responses" | b"messages" => return true,
                b"completions" if previous == b"chat" => return true,
                _ => {}
            }
            (start, previous) = (at + 1, segment);
        }
    }
    false
}

/// A path (without its query) that ends in `/responses/compact` (see `Format::compaction`).
fn compacts(path: &str) -> bool {
    path.trim_end_matches('/').ends_with("/responses/compact")
}

/// Whether a request may be a call in which the model generates, as far as its method, path
/// and body tell: a `POST` to no path below one of the APIs' calls (a stored response, its
/// `/cancel`, a count of tokens, a batch), other than a background response created without
/// a stream (`"background": true`), which is answered at once with a `queued` response. GET
/// polls and resumes, `DELETE` and the like read or remove what was generated before. The
/// time-to-first-token histogram takes only these (audit UC 4); a path the gateway does not
/// know stays in, as before.
pub fn may_generate(method: &http::Method, path: &str, background: bool) -> bool {
    method == http::Method::POST && !background && !below_call(path)
}

/// The type of a provider's mid-stream error, as the `type` label of
/// `hourglass_upstream_stream_errors_total`: the provider's own name when it is one of these,
/// `other` for anything else, so a provider cannot grow the label set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorType {
    Overloaded,
    RateLimit,
    Api,
    Server,
    InvalidRequest,
    Authentication,
    Permission,
    NotFound,
    RequestTooLarge,
    Timeout,
    Billing,
    InsufficientQuota,
    Other,
}

/// An error's numeric `code` that is an HTTP error status (vLLM's, Gemini's, OpenRouter's).
pub fn error_status(code: u64) -> Option<u16> {
    u16::try_from(code).ok().filter(|c| (400..600).contains(c))
}

/// The HTTP status an error's numeric `code` gives it, when the code decides what the error
/// is rather than its named `type` (`typed`). A code that is an HTTP error status is the
/// status the provider answers the error with unstreamed (vLLM's `{"type":
/// "ServiceUnavailableError","code":503}` is a 503, `{"type":"invalid_request_error","code":
/// 429}` a 429), so it decides; except a generic 400 or 500, which servers give any error
/// they do not tell apart, with a type that names an overload or a rate limit: that type
/// decides (`{"code":400,"type":"overloaded_error"}` is an overload; audits HB5, HC3).
pub fn status_of_code(typed: Option<ErrorType>, code: Option<u64>) -> Option<u16> {
    let status = error_status(code?)?;
    let generic = matches!(status, 400 | 500);
    let specific = matches!(typed, Some(ErrorType::Overloaded | ErrorType::RateLimit));
    (!(generic && specific)).then_some(status)
}

/// The type a provider's error is counted by: its numeric `code` as the HTTP status it is
/// where that decides (`status_of_code`), else its named `type`, else any status its code is,
/// else a type its `code` names (`named_code`). One rule for every reader of provider
/// errors: the inspector's events and llama.cpp's `error` field.
#[inline]
pub fn error_type_of(
    typed: Option<ErrorType>,
    status: Option<u64>,
    named_code: Option<ErrorType>,
) -> Option<ErrorType> {
    status_of_code(typed, status)
        .and_then(|s| ErrorType::from_status(u64::from(s)))
        .or(typed)
        .or(status.and_then(ErrorType::from_status))
        .or(named_code)
}

impl ErrorType {
    /// The type named by a provider's `error.type` (or `code`), if it is a known one.
    /// Also the names compatible servers give their errors: vLLM's `type` (the OpenAI SDK's
    /// exception names, `BadRequestError`, ...), TGI's `error_type` (`overloaded`,
    /// `validation`, `generation`), and an HTTP status as a string (LiteLLM's `"code":"429"`).
    pub fn parse(name: &[u8]) -> Option<ErrorType> {
        Some(match name {
            b"overloaded_error" | b"overloaded" | b"ServiceUnavailableError" | b"503" | b"529" => {
                Self::Overloaded
            }
            b"rate_limit_error" | b"rate_limit_exceeded" | b"RateLimitError" | b"429" => {
                Self::RateLimit
            }
            b"api_error" => Self::Api,
            b"server_error"
            | b"internal_error"
            | b"internal_server_error"
            | b"InternalServerError"
            | b"generation"
            | b"incomplete_generation"
            | b"500"
            | b"502"
            // A gateway's own (Hourglass's code and type of an upstream that failed, answered
            // 502 before its head): a chain reads its cut as the 502 it would have been.
            | b"upstream_error" => Self::Server,
            b"invalid_request_error"
            | b"BadRequestError"
            | b"UnprocessableEntityError"
            | b"validation"
            | b"400"
            | b"422" => Self::InvalidRequest,
            // The Responses API's `error.code`s of a failed response that the request caused
            // (its `ResponseError`): answered 400 when not streamed (audit HB3).
            b"invalid_prompt"
            | b"invalid_image"
            | b"invalid_image_format"
            | b"invalid_base64_image"
            | b"invalid_image_url"
            | b"invalid_image_mode"
            | b"image_too_large"
            | b"image_too_small"
            | b"image_parse_error"
            | b"image_content_policy_violation"
            | b"image_file_too_large"
            | b"image_file_not_found"
            | b"unsupported_image_media_type"
            | b"empty_image_file"
            | b"failed_to_download_image" => Self::InvalidRequest,
            b"authentication_error" | b"AuthenticationError" | b"401" => Self::Authentication,
            b"permission_error" | b"PermissionDeniedError" | b"403" => Self::Permission,
            b"not_found_error" | b"NotFoundError" | b"404" => Self::NotFound,
            b"request_too_large" | b"413" => Self::RequestTooLarge,
            b"timeout_error" | b"vector_store_timeout" | b"408" | b"504" => Self::Timeout,
            b"billing_error" | b"402" => Self::Billing,
            b"insufficient_quota" => Self::InsufficientQuota,
            // Hourglass's name for a provider's error of no kind it knows: read back as such
            // by a gateway in front, never as the `upstream_error` of its `code`.
            b"other" => Self::Other,
            _ => return None,
        })
    }

    /// The type of an error whose `code` is a number: the HTTP status the provider answers
    /// it with (Gemini's `{"error":{"code":429,"status":"RESOURCE_EXHAUSTED"}}`), typed as
    /// that status given as a string is; another 5xx is a server error.
    pub fn from_status(code: u64) -> Option<ErrorType> {
        let status = error_status(code)?;
        Self::parse(status.to_string().as_bytes()).or((status >= 500).then_some(Self::Server))
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Overloaded => "overloaded_error",
            Self::RateLimit => "rate_limit_error",
            Self::Api => "api_error",
            Self::Server => "server_error",
            Self::InvalidRequest => "invalid_request_error",
            Self::Authentication => "authentication_error",
            Self::Permission => "permission_error",
            Self::NotFound => "not_found_error",
            Self::RequestTooLarge => "request_too_large",
            Self::Timeout => "timeout_error",
            Self::Billing => "billing_error",
            Self::InsufficientQuota => "insufficient_quota",
            Self::Other => "other",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resumed_background_stream_is_read_and_nothing_below_a_call_generates() {
        use http::Method;
        let resumed = |api, path, query| Format::resumed(api, path, query);
        let r = Some(Format::Responses);
        assert_eq!(
            resumed(Api::OpenAi, "/v1/responses/resp_1", Some("stream=true")),
            r
        );
        assert_eq!(
            resumed(Api::Auto, "/v1/responses/resp_1", Some("a=1&stream=true")),
            r
        );
        assert_eq!(resumed(Api::OpenAi, "/v1/responses/resp_1", None), None);
        assert_eq!(
            resumed(Api::OpenAi, "/v1/responses/resp_1", Some("stream=false")),
            None
        );
        assert_eq!(
            resumed(Api::Auto, "/x/responses/resp_1", Some("stream=true")),
            None
        );
        assert_eq!(
            resumed(
                Api::OpenAi,
                "/v1/responses/resp_1/input_items",
                Some("stream=true")
            ),
            None
        );
        assert_eq!(
            resumed(Api::Anthropic, "/v1/responses/resp_1", Some("stream=true")),
            None
        );
        assert!(may_generate(&Method::POST, "/v1/responses", false));
        assert!(may_generate(&Method::POST, "/custom/generate", false));
        assert!(may_generate(&Method::POST, "/v1/chat/completions", false));
        assert!(may_generate(&Method::POST, "/v1/messages?beta=true", false));
        assert!(may_generate(&Method::POST, "/v1/completions/x", false));
        assert!(!may_generate(
            &Method::POST,
            "/v1/chat/completions/c_1",
            false
        ));
        assert!(!may_generate(&Method::POST, "/v1/responses/", false));
        assert!(!may_generate(&Method::POST, "/v1/responses", true));
        assert!(!may_generate(
            &Method::POST,
            "/v1/responses/resp_1/cancel",
            false
        ));
        assert!(!may_generate(
            &Method::POST,
            "/v1/messages/count_tokens",
            false
        ));
        assert!(!may_generate(
            &Method::GET,
            "/v1/responses/resp_1?stream=true",
            false
        ));
        assert!(!may_generate(
            &Method::DELETE,
            "/v1/responses/resp_1",
            false
        ));
        // A compaction is a model pass (audit ZD 1), but its answer is one document whose
        // first byte comes at its end: no sample of a first token (break audit ZC 3).
        assert!(!may_generate(&Method::POST, "/v1/responses/compact", false));
        assert!(!may_generate(
            &Method::POST,
            "/v1/responses/input_tokens",
            false
        ));
    }

    #[test]
    fn a_compaction_is_read_as_a_responses_call_and_no_other_path_below_one_is() {
        use super::Format;
        for (api, path, read) in [
            (
                Api::OpenAi,
                "/v1/responses/compact",
                Some(Format::Responses),
            ),
            (
                Api::OpenAi,
                "/openai/responses/compact/?x=1",
                Some(Format::Responses),
            ),
            (Api::Auto, "/v1/responses/compact", Some(Format::Responses)),
            (Api::Auto, "/x/responses/compact", None),
            (Api::Anthropic, "/v1/responses/compact", None),
            (Api::OpenAi, "/v1/responses/input_tokens", None),
            (Api::OpenAi, "/v1/responses/resp_1/compact", None),
        ] {
            assert_eq!(Format::detect(api, path), read, "{api} {path}");
            assert_eq!(
                Format::compaction(api, path),
                read.is_some(),
                "{api} {path}"
            );
            // Never one `stream_upstream` asks to stream.
            assert_eq!(Format::call(api, path), None, "{api} {path}");
        }
    }

    #[test]
    fn formats_by_api_and_path() {
        use Format::*;
        let cases = [
            (Api::Auto, "/v1/chat/completions", Some(Chat)),
            (Api::Auto, "/v1/chat/completions?x=1", Some(Chat)),
            (
                Api::Auto,
                "/openai/deployments/d/chat/completions",
                Some(Chat),
            ),
            (Api::Auto, "/v1/messages", Some(Messages)),
            (Api::Auto, "/v1/messages/", Some(Messages)),
            (Api::Auto, "/v1/responses", Some(Responses)),
            (Api::Auto, "/v1/messages/count_tokens", None),
            (Api::Auto, "/v1/responses/resp_1", None),
            (Api::Auto, "/v1/completions", None),
            (Api::Auto, "/v1/embeddings", None),
            (Api::OpenAi, "/v1/completions", Some(Chat)),
            (Api::OpenAi, "/custom/responses", Some(Responses)),
            (Api::OpenAi, "/v1/messages", Some(Chat)),
            (Api::Anthropic, "/v1/chat/completions", Some(Messages)),
            (Api::Anthropic, "/anything", Some(Messages)),
        ];
        for (api, path, want) in cases {
            assert_eq!(Format::detect(api, path), want, "{api} {path}");
        }
    }

    /// Only an API's own calls are asked to stream for a client that did not; the rest of
    /// an upstream whose `api` is named is read in its format, never rewritten.
    #[test]
    fn what_lies_below_a_call_is_not_read_as_one() {
        use Format::*;
        for (api, path, want) in [
            (Api::OpenAi, "/v1/responses/resp_1", None),
            (Api::OpenAi, "/v1/responses/resp_1/cancel", None),
            (Api::OpenAi, "/v1/chat/completions/chatcmpl-1", None),
            (Api::Anthropic, "/v1/messages/count_tokens", None),
            (Api::Anthropic, "/v1/messages/batches/b1/results", None),
            (Api::OpenAi, "/v1/responses/", Some(Responses)),
            (Api::OpenAi, "/custom/stream", Some(Chat)),
            (Api::Anthropic, "/custom/stream", Some(Messages)),
            (Api::Anthropic, "/v1/messages?beta=true", Some(Messages)),
        ] {
            assert_eq!(Format::detect(api, path), want, "{api:?} {path}");
        }
    }

    #[test]
    fn only_an_apis_calls_are_calls() {
        use Format::*;
        let cases = [
            (Api::Auto, "/v1/messages", Some(Messages)),
            (Api::Auto, "/v1/messages/count_tokens", None),
            (Api::Auto, "/v1/chat/completions?x=1", Some(Chat)),
            (Api::Auto, "/v1/responses/", Some(Responses)),
            (Api::Anthropic, "/v1/messages", Some(Messages)),
            (
                Api::Anthropic,
                "/anthropic/v1/messages/?beta=true",
                Some(Messages),
            ),
            (Api::Anthropic, "/v1/messages/count_tokens", None),
            (Api::Anthropic, "/v1/messages/batches", None),
            (
                Api::Anthropic,
                "/v1/messages/batches/msgbatch_1/results",
                None,
            ),
            (Api::Anthropic, "/v1/chat/completions", None),
            (Api::Anthropic, "/anything", None),
            (Api::OpenAi, "/v1/chat/completions", Some(Chat)),
            (Api::OpenAi, "/custom/responses", Some(Responses)),
            (Api::OpenAi, "/v1/responses/resp_1", None),
            (Api::OpenAi, "/v1/chat/completions/chatcmpl-1", None),
            (Api::OpenAi, "/v1/completions", None),
            (Api::OpenAi, "/v1/embeddings", None),
            (Api::OpenAi, "/v1/moderations", None),
            (Api::OpenAi, "/v1/images/generations", None),
            (Api::OpenAi, "/v1/messages", None),
        ];
        for (api, path, want) in cases {
            assert_eq!(Format::call(api, path), want, "{api} {path}");
        }
    }

    #[test]
    fn error_types_are_a_closed_set() {
        assert_eq!(
            ErrorType::parse(b"overloaded_error"),
            Some(ErrorType::Overloaded)
        );
        assert_eq!(
            ErrorType::parse(b"rate_limit_exceeded").map(ErrorType::as_str),
            Some("rate_limit_error")
        );
        assert_eq!(ErrorType::parse(b"some_new_error_of_the_week"), None);
        // Break audit ZC 2: a gateway's cut for its failed upstream, read by one in front.
        assert_eq!(ErrorType::parse(b"upstream_error"), Some(ErrorType::Server));
        // Break audit AH 1: the kind of no rule's, which an inner gateway writes as its type.
        assert_eq!(ErrorType::parse(b"other"), Some(ErrorType::Other));
        // Audit HB3: the Responses API's codes of a failed response.
        for (code, ty) in [
            (&b"invalid_prompt"[..], ErrorType::InvalidRequest),
            (b"invalid_base64_image", ErrorType::InvalidRequest),
            (b"image_too_large", ErrorType::InvalidRequest),
            (b"unsupported_image_media_type", ErrorType::InvalidRequest),
            (b"empty_image_file", ErrorType::InvalidRequest),
            (b"failed_to_download_image", ErrorType::InvalidRequest),
            (b"vector_store_timeout", ErrorType::Timeout),
            (b"rate_limit_exceeded", ErrorType::RateLimit),
            (b"server_error", ErrorType::Server),
        ] {
            assert_eq!(ErrorType::parse(code), Some(ty), "{code:?}");
        }
        assert_eq!(ErrorType::Other.as_str(), "other");
    }
}
