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
pub struct Members<'a>(Vec<(Cow<'a, str>, &'a RawValue)>);

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
        let mut found = self.0.iter().filter(|(n, _)| n == name).map(|(_, v)| *v);
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

/// A member's name: borrowed from the body unless it had escapes to decode.
struct Name<'a>(Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for Name<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Text;
        impl<'de> Visitor<'de> for Text {
            type Value = Name<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a member name")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Name(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Name(Cow::Owned(v.to_owned())))
            }
        }
        d.deserialize_str(Text)
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
}

/// The body's [`Head`]. Every request's body is read for it, so it keeps no table of members
/// as [`Members`] does: the other values are skipped as they are parsed.
pub fn head_of(body: &[u8]) -> Result<Head<'_>, Repeated> {
    /// The head, and the first member named twice.
    struct Read<'a>(Head<'a>, Option<&'static str>);
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
                    let mut repeated = None;
                    while let Some(Name(name)) = map.next_key::<Name<'de>>()? {
                        match &*name {
                            "model" => {
                                let raw: &RawValue = map.next_value()?;
                                if model.is_some() {
                                    repeated.get_or_insert("model");
                                }
                                model.get_or_insert(text(raw));
                            }
                            "n" => {
                                let raw: &RawValue = map.next_value()?;
                                if choices.is_some() {
                                    repeated.get_or_insert("n");
                                }
                                choices.get_or_insert(serde_json::from_str::<u64>(raw.get()).ok());
                            }
                            _ => {
                                map.next_value::<IgnoredAny>()?;
                            }
                        }
                    }
                    let head = Head {
                        model: model.flatten(),
                        choices: choices.flatten(),
                    };
                    Ok(Read(head, repeated))
                }
            }
            d.deserialize_map(Object)
        }
    }
    match serde_json::from_slice::<Read<'_>>(body) {
        Ok(Read(_, Some(name))) => Err(Repeated(name.to_owned())),
        Ok(Read(head, None)) => Ok(head),
        Err(_) => Ok(Head::default()),
    }
}

/// The body's top-level `model` (see [`head_of`]).
#[cfg(test)]
fn model_of(body: &[u8]) -> Result<Option<Cow<'_, str>>, Repeated> {
    head_of(body).map(|h| h.model)
}

/// The most output tokens the request asks for: `max_completion_tokens` or `max_tokens`
/// (OpenAI Chat Completions, times its `n` choices, each of which may take the limit),
/// `max_tokens` (Anthropic Messages), `max_output_tokens` (OpenAI Responses). `None` when it
/// names none (or the body is not JSON).
pub fn max_output_tokens(body: &[u8]) -> Result<Option<u64>, Repeated> {
    let Some(members) = Members::parse(body) else {
        return Ok(None);
    };
    let count = |name| -> Result<Option<u64>, Repeated> {
        Ok(members
            .get(name)?
            .and_then(|raw| serde_json::from_str::<u64>(raw.get()).ok()))
    };
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
        assert_eq!(
            model_of(br#"{"model":"gpt-x","max_tokens":3}"#)
                .unwrap()
                .as_deref(),
            Some("gpt-x")
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
}
