//! What Hourglass knows about the APIs it fronts: which wire format a request speaks (OpenAI
//! Chat Completions, the OpenAI Responses API, Anthropic Messages), the one request rewrite that
//! makes OpenAI report usage on streams, and the low-cardinality names of the providers'
//! mid-stream error types. Reading the streams themselves is `inspect`'s job.

use std::fmt;

use bytes::Bytes;

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
    /// a token, as for any SSE stream).
    pub fn detect(api: Api, path: &str) -> Option<Format> {
        let path = path.split('?').next().unwrap_or_default();
        let path = path.trim_end_matches('/');
        match api {
            Api::Anthropic => Some(Format::Messages),
            Api::OpenAi if path.ends_with("/responses") => Some(Format::Responses),
            Api::OpenAi => Some(Format::Chat),
            Api::Auto if path.ends_with("/v1/messages") => Some(Format::Messages),
            Api::Auto if path.ends_with("/chat/completions") => Some(Format::Chat),
            Api::Auto if path.ends_with("/v1/responses") => Some(Format::Responses),
            Api::Auto => None,
        }
    }
}

/// The body of an OpenAI streaming chat request with `"stream_options":{"include_usage":true}`
/// added, so that the provider sends its usage in a last chunk; every other byte untouched.
/// `None` (forward the body as it is) when the body is not a JSON object with `"stream": true`,
/// or when the client already said what it wants (`include_usage` present, true or false).
pub fn include_usage(body: &Bytes) -> Option<Bytes> {
    use serde_json::value::RawValue;
    use std::collections::HashMap;
    let fields: HashMap<&str, &RawValue> = serde_json::from_slice(body).ok()?;
    if fields.get("stream")?.get() != "true" {
        return None;
    }
    let offset = |raw: &RawValue| raw.get().as_ptr() as usize - body.as_ptr() as usize;
    let (at, insert): (usize, &[u8]) = match fields.get("stream_options") {
        // The object's closing brace is its last non-space byte.
        None => {
            let end = body.iter().rposition(|b| !b.is_ascii_whitespace())?;
            (end, br#","stream_options":{"include_usage":true}"#)
        }
        Some(raw) if raw.get() == "null" => {
            let start = offset(raw);
            let mut out = Vec::with_capacity(body.len() + 24);
            out.extend_from_slice(&body[..start]);
            out.extend_from_slice(br#"{"include_usage":true}"#);
            out.extend_from_slice(&body[start + 4..]);
            return Some(Bytes::from(out));
        }
        Some(raw) => {
            let options: HashMap<&str, &RawValue> = serde_json::from_str(raw.get()).ok()?;
            if options.contains_key("include_usage") {
                return None;
            }
            // Right after the opening brace; a comma follows unless the object is empty.
            let start = offset(raw) + 1;
            if options.is_empty() {
                (start, br#""include_usage":true"#)
            } else {
                (start, br#""include_usage":true,"#)
            }
        }
    };
    let mut out = Vec::with_capacity(body.len() + insert.len());
    out.extend_from_slice(&body[..at]);
    out.extend_from_slice(insert);
    out.extend_from_slice(&body[at..]);
    Some(Bytes::from(out))
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

impl ErrorType {
    /// The type named by a provider's `error.type` (or `code`), if it is a known one.
    pub fn parse(name: &[u8]) -> Option<ErrorType> {
        Some(match name {
            b"overloaded_error" => Self::Overloaded,
            b"rate_limit_error" | b"rate_limit_exceeded" => Self::RateLimit,
            b"api_error" => Self::Api,
            b"server_error" | b"internal_error" | b"internal_server_error" => Self::Server,
            b"invalid_request_error" => Self::InvalidRequest,
            b"authentication_error" => Self::Authentication,
            b"permission_error" => Self::Permission,
            b"not_found_error" => Self::NotFound,
            b"request_too_large" => Self::RequestTooLarge,
            b"timeout_error" => Self::Timeout,
            b"billing_error" => Self::Billing,
            b"insufficient_quota" => Self::InsufficientQuota,
            _ => return None,
        })
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

    fn with_usage(body: &str) -> Option<String> {
        include_usage(&Bytes::from(body.to_owned())).map(|b| String::from_utf8(b.to_vec()).unwrap())
    }

    #[test]
    fn include_usage_is_added_without_touching_anything_else() {
        assert_eq!(
            with_usage("{ \"model\":\"m\", \"stream\" : true , \"messages\":[{\"content\":\"}\"}] }\n")
                .as_deref(),
            Some("{ \"model\":\"m\", \"stream\" : true , \"messages\":[{\"content\":\"}\"}] ,\"stream_options\":{\"include_usage\":true}}\n")
        );
        assert_eq!(
            with_usage(r#"{"stream":true,"stream_options":{}}"#).as_deref(),
            Some(r#"{"stream":true,"stream_options":{"include_usage":true}}"#)
        );
        assert_eq!(
            with_usage(r#"{"stream":true,"stream_options": {"x":1}}"#).as_deref(),
            Some(r#"{"stream":true,"stream_options": {"include_usage":true,"x":1}}"#)
        );
        assert_eq!(
            with_usage(r#"{"stream":true,"stream_options":null,"n":1}"#).as_deref(),
            Some(r#"{"stream":true,"stream_options":{"include_usage":true},"n":1}"#)
        );
        // The result is JSON that says what it should.
        let out = with_usage(r#"{"model":"m","stream":true}"#).unwrap();
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["stream_options"]["include_usage"], true);
    }

    #[test]
    fn include_usage_leaves_other_bodies_alone() {
        for body in [
            r#"{"model":"m"}"#,
            r#"{"model":"m","stream":false}"#,
            r#"{"stream":"true"}"#,
            r#"{"stream":true,"stream_options":{"include_usage":false}}"#,
            r#"{"stream":true,"stream_options":{"include_usage":true}}"#,
            r#"{"stream":true,"stream_options":7}"#,
            "not json",
            "[1,2]",
        ] {
            assert_eq!(with_usage(body), None, "{body}");
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
        assert_eq!(ErrorType::Other.as_str(), "other");
    }
}
