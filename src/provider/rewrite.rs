//! The request bodies Hourglass rewrites for an upstream, every other byte untouched: the
//! `model` for an upstream that names its own, and OpenAI's `stream_options.include_usage`
//! so that a stream reports what it cost.

use bytes::Bytes;
use serde_json::value::RawValue;

use crate::provider::request::{Members, Repeated};
use crate::provider::Format;

/// The body with its top-level `model` replaced by `model`, every other byte untouched.
/// Whatever the value (a string, a number, an object, an array, `null`), it is replaced
/// whole: the operator pinned the model, and a value of another type had gone to the
/// upstream as the client sent it, for a provider to read as it would (audit SA 4).
/// `Ok(None)` when the body is not a JSON object or names no `model` (then nothing is
/// rewritten and the body is forwarded as the client sent it); an error when it names
/// `model` twice, which the upstream would read one way and this rewrite another.
pub fn rewrite_model(body: &Bytes, model: &str) -> Result<Option<Bytes>, Repeated> {
    let Some(fields) = Members::parse(body) else {
        return Ok(None);
    };
    let Some(raw) = fields.get("model")? else {
        return Ok(None);
    };
    let start = offset(body, raw);
    let end = start + raw.get().len();
    let Ok(quoted) = serde_json::to_string(model) else {
        return Ok(None);
    };
    let mut out = Vec::with_capacity(body.len() + quoted.len());
    out.extend_from_slice(&body[..start]);
    out.extend_from_slice(quoted.as_bytes());
    out.extend_from_slice(&body[end..]);
    Ok(Some(Bytes::from(out)))
}

/// Where a raw value that borrows from `body` starts in it.
fn offset(body: &[u8], raw: &RawValue) -> usize {
    raw.get().as_ptr() as usize - body.as_ptr() as usize
}

/// The body of an OpenAI streaming chat request with `"stream_options":{"include_usage":true}`
/// added, so that the provider sends its usage in a last chunk; every other byte untouched.
/// `None` (forward the body as it is) when the body is not a JSON object with `"stream": true`,
/// or when the client already said what it wants (`include_usage` present, true or false),
/// unless `force`: the gateway itself needs the usage (it assembles the answer, whose
/// non-streamed form always carries it), and a `false` becomes `true`.
pub fn include_usage(body: &Bytes, force: bool) -> Result<Option<Bytes>, Repeated> {
    let Some(fields) = Members::parse(body) else {
        return Ok(None);
    };
    if fields.get("stream")?.is_none_or(|s| s.get() != "true") {
        return Ok(None);
    }
    // Where to write, how many bytes the insert replaces there, and what.
    let (at, replaced, insert): (usize, usize, &[u8]) = match fields.get("stream_options")? {
        // The object's closing brace is its last non-space byte.
        None => {
            let Some(end) = body.iter().rposition(|b| !b.is_ascii_whitespace()) else {
                return Ok(None);
            };
            (end, 0, br#","stream_options":{"include_usage":true}"#)
        }
        Some(raw) if raw.get() == "null" => (offset(body, raw), 4, br#"{"include_usage":true}"#),
        Some(raw) => {
            let Some(options) = Members::parse(raw.get().as_bytes()) else {
                return Ok(None);
            };
            if let Some(given) = options.get("include_usage")? {
                if !force || given.get() == "true" {
                    return Ok(None);
                }
                let start = offset(body, given);
                let mut out = Vec::with_capacity(body.len() + 4);
                out.extend_from_slice(&body[..start]);
                out.extend_from_slice(b"true");
                out.extend_from_slice(&body[start + given.get().len()..]);
                return Ok(Some(Bytes::from(out)));
            }
            // Right after the opening brace; a comma follows unless the object is empty.
            let start = offset(body, raw) + 1;
            if options.is_empty() {
                (start, 0, br#""include_usage":true"#)
            } else {
                (start, 0, br#""include_usage":true,"#)
            }
        }
    };
    let mut out = Vec::with_capacity(body.len() + insert.len());
    out.extend_from_slice(&body[..at]);
    out.extend_from_slice(insert);
    out.extend_from_slice(&body[at + replaced..]);
    Ok(Some(Bytes::from(out)))
}

/// The body of a request that did not ask to stream, asking to (`"stream": true`, and for
/// Chat Completions, when `usage`, `stream_options.include_usage` too, so the usage still
/// comes): what `stream_upstream` sends. `None` when the request streams already, is not a JSON object
/// (then it is forwarded as it is), or is a Responses request run in the background
/// (`"background": true`), which answers at once with a queued response: streamed, it would
/// hold the client until the whole generation is done.
pub fn stream_request(
    body: &Bytes,
    format: Format,
    usage: bool,
) -> Result<Option<Bytes>, Repeated> {
    let Some(fields) = Members::parse(body) else {
        return Ok(None);
    };
    if fields.get("background")?.is_some_and(|b| b.get() == "true") {
        return Ok(None);
    }
    let streamed = match fields.get("stream")? {
        Some(raw) if raw.get() == "true" => return Ok(None),
        // Anything but a boolean (`"false"`, `0`) is the provider's to refuse, as it would
        // without the gateway: not read as a wish to stream.
        Some(raw) if raw.get() != "false" && raw.get() != "null" => return Ok(None),
        Some(raw) => {
            let start = offset(body, raw);
            let end = start + raw.get().len();
            let mut out = Vec::with_capacity(body.len() + 4);
            out.extend_from_slice(&body[..start]);
            out.extend_from_slice(b"true");
            out.extend_from_slice(&body[end..]);
            out
        }
        None => {
            // Right after the opening brace; a comma follows unless the object is empty.
            let Some(open) = body.iter().position(|&b| b == b'{') else {
                return Ok(None);
            };
            let mut out = Vec::with_capacity(body.len() + 16);
            out.extend_from_slice(&body[..=open]);
            out.extend_from_slice(br#""stream":true"#);
            if !fields.is_empty() {
                out.push(b',');
            }
            out.extend_from_slice(&body[open + 1..]);
            out
        }
    };
    let streamed = Bytes::from(streamed);
    Ok(Some(match format {
        Format::Chat if usage => include_usage(&streamed, true)?.unwrap_or(streamed),
        Format::Chat | Format::Messages | Format::Responses => streamed,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_rewrite_touches_nothing_else() {
        let body = Bytes::from_static(
            br#"{ "messages":[{"role":"user","content":"model: keep \"me\""}],  "model" : "gpt-big", "stream":true }"#,
        );
        let out = rewrite_model(&body, "gpt-small").unwrap().unwrap();
        assert_eq!(
            &out[..],
            br#"{ "messages":[{"role":"user","content":"model: keep \"me\""}],  "model" : "gpt-small", "stream":true }"#
        );
        // Escaping is done for the new name.
        let out = rewrite_model(&body, "a\"b").unwrap().unwrap();
        assert!(std::str::from_utf8(&out)
            .unwrap()
            .contains(r#""model" : "a\"b""#));
        assert!(rewrite_model(&Bytes::from_static(b"not json"), "m")
            .unwrap()
            .is_none());
        assert!(rewrite_model(&Bytes::from_static(br#"{"x":1}"#), "m")
            .unwrap()
            .is_none());
    }

    /// Audit SA 4: a `model` that is no string went to the upstream as the client sent it.
    #[test]
    fn a_model_of_any_type_is_replaced_whole() {
        for value in [
            "7",
            "-1.5e3",
            "null",
            "false",
            r#"{"id":"gpt-4o","model":"x"}"#,
            r#"["a",{"b":[1]}]"#,
            r#""gpt-4o""#,
        ] {
            let body = Bytes::from(format!(r#"{{"n":1, "model" :{value} ,"x":[]}}"#));
            let out = rewrite_model(&body, "m").unwrap().unwrap();
            assert_eq!(&out[..], br#"{"n":1, "model" :"m" ,"x":[]}"#, "{value}");
        }
    }

    fn with_usage(body: &str) -> Option<String> {
        include_usage(&Bytes::from(body.to_owned()), false)
            .unwrap()
            .map(|b| String::from_utf8(b.to_vec()).unwrap())
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
    fn a_stream_that_is_no_boolean_is_left_to_the_provider() {
        for body in [
            r#"{"stream":"false"}"#,
            r#"{"stream":0}"#,
            r#"{"stream":{}}"#,
        ] {
            let body = Bytes::from(body);
            assert_eq!(
                stream_request(&body, Format::Chat, true).unwrap(),
                None,
                "{body:?}"
            );
        }
        for body in [r#"{"stream":false}"#, r#"{"stream":null}"#, r#"{}"#] {
            let body = Bytes::from(body);
            assert!(
                stream_request(&body, Format::Chat, true).unwrap().is_some(),
                "{body:?}"
            );
        }
    }

    /// Audit GB 2: Mistral refuses `stream_options` (422 `extra_forbidden`); an upstream with
    /// `include_usage = false` is asked to stream, and for nothing else.
    #[test]
    fn stream_upstream_asks_for_no_usage_where_it_may_not() {
        let body = Bytes::from_static(br#"{"model":"m","messages":[]}"#);
        let out = stream_request(&body, Format::Chat, false).unwrap().unwrap();
        assert_eq!(&out[..], br#"{"stream":true,"model":"m","messages":[]}"#);
    }

    #[test]
    fn a_background_response_is_not_asked_to_stream() {
        let body = Bytes::from_static(br#"{"model":"m","input":"hi","background":true}"#);
        assert_eq!(
            stream_request(&body, Format::Responses, true).unwrap(),
            None
        );
        let body = Bytes::from_static(br#"{"model":"m","input":"hi","background":false}"#);
        assert!(stream_request(&body, Format::Responses, true)
            .unwrap()
            .is_some());
    }

    #[test]
    fn stream_upstream_asks_to_stream_and_touches_nothing_else() {
        let run = |body: &str, format| {
            stream_request(&Bytes::from(body.to_owned()), format, true)
                .unwrap()
                .map(|b| String::from_utf8(b.to_vec()).unwrap())
        };
        assert_eq!(
            run(r#"{"model":"m","messages":[]}"#, Format::Chat).as_deref(),
            Some(
                r#"{"stream":true,"model":"m","messages":[],"stream_options":{"include_usage":true}}"#
            )
        );
        assert_eq!(
            run(r#"{ "model":"m", "stream": false }"#, Format::Messages).as_deref(),
            Some(r#"{ "model":"m", "stream": true }"#)
        );
        assert_eq!(
            run(r#"{"input":"hi","stream":null}"#, Format::Responses).as_deref(),
            Some(r#"{"input":"hi","stream":true}"#)
        );
        assert_eq!(
            run("{}", Format::Responses).as_deref(),
            Some(r#"{"stream":true}"#)
        );
        assert_eq!(
            run(r#"{"stream":true}"#, Format::Chat),
            None,
            "streams already"
        );
        assert_eq!(run("not json", Format::Chat), None);
        assert_eq!(run("[1]", Format::Chat), None);
        // The gateway needs the usage of the answer it assembles (which always has one).
        assert_eq!(
            run(
                r#"{"model":"m","stream_options":{"include_usage": false}}"#,
                Format::Chat
            )
            .as_deref(),
            Some(r#"{"stream":true,"model":"m","stream_options":{"include_usage": true}}"#)
        );
    }

    /// A member whose name has an escape is the member the provider reads: rewritten, not
    /// passed over (a `model` pinned by the upstream was otherwise the client's to choose).
    #[test]
    fn escaped_member_names_are_rewritten_and_repeated_ones_refused() {
        let body = Bytes::from_static(br#"{"m\u006fdel":"o1-pro","messages":[]}"#);
        let out = rewrite_model(&body, "small").unwrap().unwrap();
        assert_eq!(&out[..], br#"{"m\u006fdel":"small","messages":[]}"#);
        let body = Bytes::from_static(br#"{"model":"o1-pro","messag\u0065s":[]}"#);
        let out = rewrite_model(&body, "small").unwrap().unwrap();
        assert_eq!(&out[..], br#"{"model":"small","messag\u0065s":[]}"#);

        let out = with_usage(r#"{"model":"m","str\u0065am":true}"#).unwrap();
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["stream_options"]["include_usage"], true);
        let body = Bytes::from_static(br#"{"model":"m","messag\u0065s":[]}"#);
        let out = stream_request(&body, Format::Messages, true)
            .unwrap()
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["stream"], true);

        for (body, name) in [
            (r#"{"model":"a","model":"b"}"#, "model"),
            (r#"{"model":"a","m\u006fdel":"b"}"#, "model"),
        ] {
            let body = Bytes::from(body.to_owned());
            assert_eq!(
                rewrite_model(&body, "x").unwrap_err(),
                Repeated(name.into())
            );
        }
        let body = Bytes::from_static(br#"{"stream":false,"stream":true}"#);
        assert_eq!(
            stream_request(&body, Format::Chat, true).unwrap_err(),
            Repeated("stream".into())
        );
        let body = Bytes::from_static(
            br#"{"stream":true,"stream_options":{"include_usage":false,"include_usage":true}}"#,
        );
        assert_eq!(
            include_usage(&body, true).unwrap_err(),
            Repeated("include_usage".into())
        );
    }
}
