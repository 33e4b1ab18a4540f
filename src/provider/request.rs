//! What the gateway reads from a request body in a provider's format: the `model` that picks
//! a route, and the most output tokens the call may take (what a run reserves for it); and
//! [`Members`], the body's top-level members as the provider will read them, which these
//! reads and the rewrites share.

use std::borrow::Cow;

use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde_json::value::RawValue;

/// The top-level members of a request body's JSON object, names decoded as the provider
/// decodes them (`"m\u006fdel"` is `model`), values raw and borrowed from the body. Most
/// bodies have a handful of members: a vector searched in order costs less than a map.
pub struct Members<'a>(Vec<(Cow<'a, [u8]>, &'a RawValue)>);

/// A member the gateway reads, named more than once. RFC 8259 4 leaves such an object's
/// meaning to each parser: most take the last, some the first, so the gateway could route,
/// rewrite or reserve by one value while the provider reads the other.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the request body names {0:?} more than once; send it once")]
pub struct Repeated(pub String);

impl From<Repeated> for crate::error::GatewayError {
    fn from(r: Repeated) -> Self {
        Self::RepeatedMember { name: r.0 }
    }
}

impl<'a> Members<'a> {
    /// `None` when the body is not a JSON object.
    pub fn parse(body: &'a [u8]) -> Option<Self> {
        serde_json::from_slice(body).ok()
    }

    /// The raw value of the member `name`, if the body has it.
    pub fn get(&self, name: &str) -> Result<Option<&'a RawValue>, Repeated> {
        let mut found = self
            .0
            .iter()
            .filter(|(n, _)| **n == *name.as_bytes())
            .map(|(_, v)| *v);
        match (found.next(), found.next()) {
            (Some(_), Some(_)) => Err(Repeated(name.to_owned())),
            (first, _) => Ok(first),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Members<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Object;
        impl<'de> Visitor<'de> for Object {
            type Value = Members<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<Self::Value, M::Error> {
                let mut members = Vec::with_capacity(map.size_hint().unwrap_or(8));
                while let Some((Name(name), value)) = map.next_entry::<Name<'de>, &RawValue>()? {
                    members.push((name, value));
                }
                Ok(Members(members))
            }
        }
        d.deserialize_map(Object)
    }
}

/// A member's name, as the bytes its escapes decode to: borrowed from the body unless it had
/// escapes. Bytes, not `str`: a lone surrogate escape (`"\ud800"`) is no `str`, and read as
/// one it made the whole body unreadable ("unexpected end of hex escape"), although Python's
/// `json` reads it and the same escape in a value passes (audit WA 4). Such a name decodes
/// to its WTF-8 bytes, which equal no name the gateway reads.
struct Name<'a>(Cow<'a, [u8]>);

impl<'de: 'a, 'a> Deserialize<'de> for Name<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // Taken raw, the string is checked as a value's is (a control character or a bad
        // escape is still an error) but not made `str`.
        let raw = <&'de RawValue>::deserialize(d)?.get().as_bytes();
        let inner = &raw[1..raw.len() - 1];
        // The common case: no escape, the name is its bytes in the body.
        if !inner.contains(&b'\\') {
            return Ok(Name(Cow::Borrowed(inner)));
        }
        struct Decoded;
        impl Visitor<'_> for Decoded {
            type Value = Vec<u8>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a member name")
            }
            fn visit_bytes<E>(self, v: &[u8]) -> Result<Self::Value, E> {
                Ok(v.to_vec())
            }
        }
        // serde_json's bytes decode the escapes as its `str` does, a lone surrogate too.
        let mut json = serde_json::Deserializer::from_slice(raw);
        serde::Deserializer::deserialize_bytes(&mut json, Decoded)
            .map(|name| Name(Cow::Owned(name)))
            .map_err(serde::de::Error::custom)
    }
}

/// A raw value as a string, borrowed unless it had escapes; `None` when it is no string.
fn text(raw: &RawValue) -> Option<Cow<'_, str>> {
    match serde_json::from_str::<&str>(raw.get()) {
        Ok(s) => Some(Cow::Borrowed(s)),
        Err(_) => serde_json::from_str::<String>(raw.get())
            .ok()
            .map(Cow::Owned),
    }
}

/// What every request's body is read for, when it is a JSON object: its top-level `model`
/// (`None` when it names none, or not as a string), and `n`, the Chat choices it asks for
/// (`None` when it names none, or not as a count), whose answer has not ended until each
/// has.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Head<'a> {
    pub model: Option<Cow<'a, str>>,
    pub choices: Option<u64>,
    /// A background response created without a stream (`"background": true` without
    /// `"stream": true`): answered at once with a `queued` response, nothing generated yet.
    pub background: bool,
    /// Set when the body looks like JSON but is not one JSON object in UTF-8: why not.
    pub unreadable: Option<Unreadable>,
}

/// A body that other parsers may read as a JSON object though this gateway cannot: one in
/// UTF-8 with a byte order mark, or in UTF-16 or UTF-32 (Python's `json.loads` takes both),
/// or one object followed by more (Go's `json.Decoder` reads the first and stops), or JSON
/// with a syntax error some parser forgives. Where the gateway reads the body (to route by
/// its model, rewrite it, or read its answer's format), it would decide on "no model" while
/// the provider reads one: a request could pass a route's client keys to a wider route, or
/// keep the model an upstream's `model` was meant to replace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unreadable(pub String);

impl From<Unreadable> for crate::error::GatewayError {
    fn from(u: Unreadable) -> Self {
        Self::UnreadableBody { reason: u.0 }
    }
}

/// Whether `bytes` start, after whitespace, as a JSON object or array would.
fn opens_json<'a>(mut bytes: impl Iterator<Item = &'a u8>) -> bool {
    matches!(bytes.find(|b| !b.is_ascii_whitespace()), Some(b'{' | b'['))
}

/// Whether `body` opens like a JSON object or array in UTF-16 or UTF-32, with or without a
/// byte order mark. RFC 4627 3: a JSON text's first characters are ASCII, so NULs among its
/// first four bytes mark a wider encoding; its ASCII characters are then the bytes that are
/// not NUL, however much whitespace comes first. (A binary upload with a NUL there opens
/// with no `{` once they are dropped.)
fn wide_json(body: &[u8]) -> bool {
    const MARKS: [&[u8]; 4] = [
        &[0, 0, 0xFE, 0xFF],
        &[0xFF, 0xFE, 0, 0],
        &[0xFE, 0xFF],
        &[0xFF, 0xFE],
    ];
    let mark = MARKS.iter().find(|m| body.starts_with(m));
    if mark.is_none() && !body.iter().take(4).any(|&b| b == 0) {
        return false;
    }
    let text = &body[mark.map_or(0, |m| m.len())..];
    opens_json(text.iter().filter(|&&b| b != 0))
}

/// The members the gateway reads anywhere (routing, rewrites, a run's reservation). Go's
/// `encoding/json` (Ollama, many OpenAI-compatible servers) takes a member named in another
/// case (`"Model"`, `"MODEL"`, even `"\u212Aey"` for `key`) for the field, the last one
/// winning: read here only as spelled, such a member would route by one model and serve
/// another.
const READ_MEMBERS: [&str; 8] = [
    "model",
    "n",
    "stream",
    "stream_options",
    "background",
    "max_tokens",
    "max_completion_tokens",
    "max_output_tokens",
];

/// The member of [`READ_MEMBERS`] that `name` spells otherwise, folded as Go folds names
/// (each character lower-cased, then upper-cased).
fn spelled_otherwise(name: &str) -> Option<&'static str> {
    // The common case, every request: a name in lower-case ASCII folds to itself, and the
    // members are spelled so.
    if name
        .bytes()
        .all(|b| b.is_ascii() && !b.is_ascii_uppercase())
    {
        return None;
    }
    let folds_to = |member: &str| {
        if name.is_ascii() {
            return name.eq_ignore_ascii_case(member);
        }
        let folded = name
            .chars()
            .flat_map(char::to_lowercase)
            .flat_map(char::to_uppercase);
        member.chars().map(|c| c.to_ascii_uppercase()).eq(folded)
    };
    READ_MEMBERS
        .into_iter()
        .find(|&member| member != name && folds_to(member))
}

/// Why `body` is [`Unreadable`], given that serde_json refused it with `error` (`None`: it
/// is not UTF-8); `None` when it does not look like JSON at all (empty, a multipart upload,
/// a form, audio), which no parser reads as an object either.
fn unreadable(body: &[u8], error: Option<&serde_json::Error>) -> Option<Unreadable> {
    let reason = if body.starts_with(&crate::http::sse::BOM) {
        "it starts with a byte order mark".to_owned()
    } else if wide_json(body) {
        "it is in UTF-16 or UTF-32, not UTF-8".to_owned()
    } else if opens_json(body.iter()) {
        error.map_or_else(|| "it is not UTF-8".to_owned(), ToString::to_string)
    } else {
        return None;
    };
    Some(Unreadable(reason))
}

/// The body's [`Head`]. Every request's body is read for it, so it keeps no table of members
/// as [`Members`] does: the other values are skipped as they are parsed.
pub fn head_of(body: &[u8]) -> Result<Head<'_>, Repeated> {
    /// The head, the first member named twice, and the first named in another spelling.
    struct Read<'a>(
        Head<'a>,
        Option<&'static str>,
        Option<(String, &'static str)>,
    );
    impl<'de: 'a, 'a> Deserialize<'de> for Read<'a> {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct Object;
            impl<'de> Visitor<'de> for Object {
                type Value = Read<'de>;
                fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                    f.write_str("a JSON object")
                }
                fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<Read<'de>, M::Error> {
                    // Each member's value as first read: `Some(None)` when it was no string
                    // (no count), so that a second one is still seen.
                    let (mut model, mut choices) = (None, None);
                    let (mut background, mut stream) = (None, None);
                    let mut repeated = None;
                    let mut otherwise = None;
                    while let Some(Name(name)) = map.next_key::<Name<'de>>()? {
                        match &*name {
                            b"model" => {
                                let raw: &RawValue = map.next_value()?;
                                if model.is_some() {
                                    repeated.get_or_insert("model");
                                }
                                model.get_or_insert(text(raw));
                            }
                            b"n" => {
                                let raw: &RawValue = map.next_value()?;
                                if choices.is_some() {
                                    repeated.get_or_insert("n");
                                }
                                choices.get_or_insert(count_of(raw));
                            }
                            b"background" | b"stream" => {
                                let raw: &RawValue = map.next_value()?;
                                let slot = if *name == *b"background" {
                                    &mut background
                                } else {
                                    &mut stream
                                };
                                slot.get_or_insert(raw.get() == "true");
                            }
                            _ => {
                                if otherwise.is_none() {
                                    // A name that is no UTF-8 (a lone surrogate) folds to
                                    // none of the members: Go reads it as U+FFFD.
                                    otherwise = std::str::from_utf8(&name)
                                        .ok()
                                        .and_then(spelled_otherwise)
                                        .map(|member| {
                                            (String::from_utf8_lossy(&name).into_owned(), member)
                                        });
                                }
                                map.next_value::<IgnoredAny>()?;
                            }
                        }
                    }
                    let head = Head {
                        model: model.flatten(),
                        choices: choices.flatten(),
                        background: background == Some(true) && stream != Some(true),
                        unreadable: None,
                    };
                    Ok(Read(head, repeated, otherwise))
                }
            }
            d.deserialize_map(Object)
        }
    }
    // The whole body is checked to be UTF-8 first: serde_json skips the strings it does
    // not keep unchecked, so a body whose model was read here could still fail the rewrite
    // (which reads them all) and be forwarded with the model unchanged.
    let Ok(text) = std::str::from_utf8(body) else {
        return Ok(Head {
            unreadable: unreadable(body, None),
            ..Head::default()
        });
    };
    match serde_json::from_str::<Read<'_>>(text) {
        Ok(Read(_, Some(name), _)) => Err(Repeated(name.to_owned())),
        Ok(Read(head, None, None)) => Ok(head),
        Ok(Read(head, None, Some((name, member)))) => Ok(Head {
            unreadable: Some(Unreadable(format!(
                "it names {name:?}, which Go's encoding/json (Ollama, and many compatible \
                 servers) reads as {member:?}; spell it {member:?}"
            ))),
            ..head
        }),
        Err(e) => Ok(Head {
            unreadable: unreadable(body, Some(&e)),
            ..Head::default()
        }),
    }
}

/// The body's top-level `model` (see [`head_of`]).
#[cfg(test)]
fn model_of(body: &[u8]) -> Result<Option<Cow<'_, str>>, Repeated> {
    head_of(body).map(|h| h.model)
}

/// A count as a lenient provider reads it: a whole number in any JSON spelling (`1000`,
/// `1000.0` as Python writes a float, `1e3`; past `u64` as `u64::MAX`, which no run fits).
/// `None` for anything else (a fraction, a negative, a string): the provider refuses those.
fn count_of(raw: &RawValue) -> Option<u64> {
    if let Ok(n) = serde_json::from_str::<u64>(raw.get()) {
        return Some(n);
    }
    let text = raw.get();
    let f = match serde_json::from_str::<f64>(text) {
        Ok(f) => f,
        // Past f64 too (1e400): a positive number, so larger than any run allows.
        Err(_) if text.starts_with(|c: char| c.is_ascii_digit()) => return Some(u64::MAX),
        Err(_) => return None,
    };
    // `as` saturates: 1e20 is u64::MAX.
    (f >= 0.0 && f.fract() == 0.0).then_some(f as u64)
}

/// The most output tokens the request asks for: `max_completion_tokens` or `max_tokens`
/// (OpenAI Chat Completions, times its `n` choices, each of which may take the limit),
/// `max_tokens` (Anthropic Messages), `max_output_tokens` (OpenAI Responses). `None` when it
/// names none (or the body is not JSON).
pub fn max_output_tokens(body: &[u8]) -> Result<Option<u64>, Repeated> {
    let Some(members) = Members::parse(body) else {
        return Ok(None);
    };
    let count =
        |name| -> Result<Option<u64>, Repeated> { Ok(members.get(name)?.and_then(count_of)) };
    let n = count("n")?;
    let Some(each) = [
        count("max_completion_tokens")?,
        count("max_output_tokens")?,
        count("max_tokens")?,
    ]
    .into_iter()
    .flatten()
    .next() else {
        return Ok(None);
    };
    Ok(Some(each.saturating_mul(n.unwrap_or(1).max(1))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_output_limit_of_each_api() {
        let read = |b: &str| max_output_tokens(b.as_bytes()).unwrap();
        assert_eq!(read(r#"{"model":"m","max_tokens":300}"#), Some(300));
        assert_eq!(
            read(r#"{"max_tokens":300,"max_completion_tokens":50}"#),
            Some(50)
        );
        assert_eq!(read(r#"{"input":"hi","max_output_tokens":70}"#), Some(70));
        // Chat's n choices may each take the limit.
        assert_eq!(read(r#"{"n":2,"max_tokens":140}"#), Some(280));
        assert_eq!(read(r#"{"n":1,"max_completion_tokens":140}"#), Some(140));
        assert_eq!(read(r#"{"model":"m","messages":[{"max_tokens":9}]}"#), None);
        assert_eq!(read(r#"{"max_tokens":null}"#), None);
        assert_eq!(
            read(r#"{"max_tokens":-1}"#),
            None,
            "not a count: no reservation of its own"
        );
        assert_eq!(read("not json"), None);
        // A whole number however it is spelled, as vLLM's (pydantic's) lax reading takes it.
        assert_eq!(read(r#"{"max_tokens":1e3}"#), Some(1000));
        assert_eq!(read(r#"{"max_tokens":1000.0,"n":2.0}"#), Some(2000));
        assert_eq!(read(r#"{"max_output_tokens":1e20}"#), Some(u64::MAX));
        assert_eq!(read(r#"{"max_tokens":1e400}"#), Some(u64::MAX));
        assert_eq!(read(r#"{"max_tokens":-1e400}"#), None);
        assert_eq!(read(r#"{"max_tokens":10.5}"#), None);
        assert_eq!(read(r#"{"max_tokens":-1e3}"#), None);
        assert_eq!(read(r#"{"max_tokens":"100"}"#), None);
        assert_eq!(
            model_of(br#"{"model":"gpt-x","max_tokens":3}"#)
                .unwrap()
                .as_deref(),
            Some("gpt-x")
        );
    }

    #[test]
    fn what_other_parsers_could_read_as_an_object() {
        let why = |b: &[u8]| head_of(b).unwrap().unreadable.map(|u| u.0);
        assert_eq!(why(br#"{"model":"m"}"#), None);
        assert_eq!(
            why(br#" {"model":"m"} "#),
            None,
            "whitespace around is JSON"
        );
        assert_eq!(why(b""), None, "no body");
        assert_eq!(why(b"model=m&x=1"), None, "a form");
        assert_eq!(why(b"RIFF\0\0\0\0WAVE"), None, "audio");
        assert_eq!(why(b"\x1f\x8b\x08\0\0\0"), None, "gzip");
        assert_eq!(why(b"\"just a string\""), None);
        let reason =
            |b: &[u8]| why(b).unwrap_or_else(|| panic!("{:?}", String::from_utf8_lossy(b)));
        assert!(reason(b"\xEF\xBB\xBF{\"model\":\"m\"}").contains("byte order mark"));
        for wide in [
            b"{\0\"\0m\0\"\0:\0".as_slice(),
            b"\0{\0\"\0m\0\"",
            b"\xFF\xFE{\0\"\0",
            b"\xFE\xFF\0{\0\"",
            b"{\0\0\0\"\0\0\0",
            b" \0\n\0[\0",
        ] {
            assert!(reason(wide).contains("UTF-16"), "{wide:?}");
        }
        for wide in [b"\0\0\xFE\xFF\0\0\0{".as_slice(), b"\xFF\xFE\0\0{\0\0\0"] {
            assert!(reason(wide).contains("UTF-32"), "{wide:?}");
        }
        let mut padded = b" \0".repeat(40);
        padded.extend_from_slice(b"{\0\"\0");
        assert!(reason(&padded).contains("UTF-16"), "whitespace first");
        assert_eq!(why(b"\0\0\0\x20ftypM4A "), None, "an m4a file");
        assert!(reason(br#"{"model":"m"}{}"#).contains("trailing"));
        assert!(reason(br#"[{"model":"m"}]"#).contains("JSON object"));
        assert!(reason(br#"{"model":"m",}"#).contains("line 1"));
        assert!(reason(b"{\"model\":\"\xFF\"}").contains("not UTF-8"));
        // Past the model: serde_json skips what it does not keep unchecked.
        assert!(reason(b"{\"model\":\"m\",\"user\":\"\xE9\"}").contains("not UTF-8"));
        assert!(reason(br#"{"Model":"m"}"#).contains(r#"reads as "model""#));
        assert!(reason(br#"{"STREAM":true,"model":"m"}"#).contains(r#""stream""#));
        assert!(
            reason("{\"max_to\u{212A}ens\":1}".as_bytes()).contains("max_tokens"),
            "Kelvin sign"
        );
        assert!(
            reason("{\"\u{17F}tream\":true}".as_bytes()).contains("stream"),
            "long s"
        );
        assert_eq!(
            why(br#"{"model":"m","Messages":[],"modelx":1}"#),
            None,
            "not read here"
        );
    }

    #[test]
    fn the_choices_a_chat_request_asks_for() {
        let choices = |b: &str| head_of(b.as_bytes()).unwrap().choices;
        assert_eq!(choices(r#"{"model":"m","n":3}"#), Some(3));
        assert_eq!(choices(r#"{"model":"m"}"#), None);
        assert_eq!(choices(r#"{"n":"3"}"#), None, "no count");
        assert_eq!(choices(r#"{"n":-1}"#), None);
        assert_eq!(choices(r#"{"messages":[{"n":4}],"n":2}"#), Some(2));
        assert_eq!(choices(r#"{"n\u0020":2}"#), None, "another member");
        assert_eq!(
            choices(r#"{"\u006e":5}"#),
            Some(5),
            "decoded as the provider does"
        );
    }

    #[test]
    fn members_are_read_as_the_provider_decodes_them() {
        // An escaped name is the same member, as every JSON parser decodes it.
        let body = br#"{"m\u006fdel":"gpt-x","max_t\u006fkens":7,"messag\u0065s":[]}"#;
        assert_eq!(model_of(body).unwrap().as_deref(), Some("gpt-x"));
        assert_eq!(max_output_tokens(body).unwrap(), Some(7));
        // An escaped value is decoded too.
        assert_eq!(
            model_of(br#"{"model":"gpt\u002dx"}"#).unwrap().as_deref(),
            Some("gpt-x")
        );
        assert_eq!(model_of(br#"{"model":7}"#).unwrap(), None);
        assert_eq!(model_of(b"[1]").unwrap(), None);
    }

    #[test]
    fn a_member_named_twice_is_refused_only_where_it_is_read() {
        for body in [
            r#"{"model":"a","model":"b"}"#,
            r#"{"model":"a","m\u006fdel":"b"}"#,
        ] {
            assert_eq!(
                model_of(body.as_bytes()).unwrap_err(),
                Repeated("model".into()),
                "{body}"
            );
        }
        assert_eq!(
            max_output_tokens(br#"{"max_tokens":1,"max_tokens":100000}"#).unwrap_err(),
            Repeated("max_tokens".into())
        );
        assert_eq!(
            head_of(br#"{"model":"m","n":2,"n":3}"#).unwrap_err(),
            Repeated("n".into())
        );
        // A repeated member the gateway does not read is the provider's business.
        let body = br#"{"model":"m","metadata":1,"metadata":2,"max_tokens":5}"#;
        assert_eq!(model_of(body).unwrap().as_deref(), Some("m"));
        assert_eq!(max_output_tokens(body).unwrap(), Some(5));
        // Only top-level members: the same name inside messages is another object's.
        let body = br#"{"model":"m","messages":[{"model":"x"},{"model":"y"}]}"#;
        assert_eq!(model_of(body).unwrap().as_deref(), Some("m"));
    }

    /// Audit WA 4: a lone surrogate escape in a member name (`"\ud800"`), which Python's
    /// `json` reads, was refused with "unexpected end of hex escape", while the same escape in
    /// a value passed. Names are compared as the bytes they decode to, never made `str`.
    #[test]
    fn a_lone_surrogate_in_a_member_name_is_read_like_any_other_name() {
        for body in [
            r#"{"model":"pin-a","\ud800":1}"#,
            r#"{"\udc00x":[1],"model":"pin-a"}"#,
            r#"{"model":"pin-a","\ud800\ud800":1,"a\ud83d":2}"#,
        ] {
            let head = head_of(body.as_bytes()).unwrap();
            assert_eq!(head.unreadable, None, "{body}");
            assert_eq!(head.model.as_deref(), Some("pin-a"), "{body}");
            let members = Members::parse(body.as_bytes()).expect("an object");
            assert_eq!(members.get("model").unwrap().unwrap().get(), r#""pin-a""#);
        }
        // Not the member it would be without the surrogate.
        let body = br#"{"model\ud800":"x","mod\u0065l":"m"}"#;
        assert_eq!(model_of(body).unwrap().as_deref(), Some("m"));
        // Still refused: a raw control character in a name, a bad escape.
        let why = |b: &[u8]| head_of(b).unwrap().unreadable.map(|u| u.0);
        assert!(why(b"{\"a\x01b\":1}")
            .unwrap()
            .contains("control character"));
        assert!(why(b"{\"m\\u006fd\x01\":1}")
            .unwrap()
            .contains("control character"));
        assert!(why(br#"{"\ud8":1}"#).is_some());
        assert!(why(br#"{"\q":1}"#).unwrap().contains("escape"));
    }
}
