//! OpenAI's background responses, which outlive their connection: a Responses call created
//! with `"background": true` (streamed or not), and the stream of one resumed
//! (`GET …/responses/{id}?stream=true[&starting_after=N]`). OpenAI goes on generating (and
//! billing) when the connection closes; only `POST …/responses/{id}/cancel` stops it. So the
//! gateway sends such a creation once (a second would be a second response, run and billed),
//! and never counts a closed connection of either as work cancelled.

use http::Method;

use crate::provider::request::{Members, Repeated};

/// A call whose work goes on at the provider when its connection closes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Detached {
    /// `POST …/responses` with `"background": true`: it creates the response, and must not
    /// be sent twice.
    Background,
    /// `GET …/responses/{id}?stream=true`: it reads a background response as it runs, and
    /// may be read again.
    Resume,
    /// `POST …/responses` whose body the gateway does not read (in a content coding, or not
    /// a JSON object: a UTF-8 BOM before it, which Python's and .NET's parsers accept): the
    /// provider may read `"background": true` in it, so it is sent as [`Self::Background`]
    /// is (audit VB 1). Not known to run on, its close is still counted as a cancellation.
    Unread,
}

impl Detached {
    /// A creation that must not be sent twice: known, or possibly, a background response.
    pub fn creates(self) -> bool {
        matches!(self, Self::Background | Self::Unread)
    }

    /// Known to run on at the provider when its connection closes.
    pub fn runs_on(self) -> bool {
        matches!(self, Self::Background | Self::Resume)
    }
}

/// Whether a request to `path` (without its query; `query` apart) with `body` (`None`: in a
/// content coding, which the gateway does not decode) is a detached call. A body that names
/// `background` twice is refused, as any member the gateway reads.
pub fn detached(
    method: &Method,
    path: &str,
    query: Option<&str>,
    body: Option<&[u8]>,
) -> Result<Option<Detached>, Repeated> {
    let path = path.trim_end_matches('/');
    if *method == Method::POST && path.ends_with("/responses") {
        let Some(members) = body.and_then(Members::parse) else {
            return Ok(Some(Detached::Unread));
        };
        let background = members
            .get("background")?
            .is_some_and(|b| b.get() == "true");
        return Ok(background.then_some(Detached::Background));
    }
    // The id is the last segment, right after `responses` (not `/input_items`, `/cancel`).
    let resumed = *method == Method::GET
        && path
            .rsplit_once('/')
            .is_some_and(|(before, id)| !id.is_empty() && before.ends_with("/responses"))
        && query.is_some_and(|q| q.split('&').any(|pair| pair == "stream=true"));
    Ok(resumed.then_some(Detached::Resume))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_detached() {
        let post = |path, body: &str| detached(&Method::POST, path, None, Some(body.as_bytes()));
        let get = |path, query| detached(&Method::GET, path, query, Some(b""));
        let background = Some(Detached::Background);
        assert_eq!(
            post("/v1/responses", r#"{"background":true}"#),
            Ok(background)
        );
        assert_eq!(
            post(
                "/v1/responses/",
                r#"{"model":"m","stream":true,"background":true}"#
            ),
            Ok(background)
        );
        assert_eq!(post("/v1/responses", r#"{"background":false}"#), Ok(None));
        assert_eq!(post("/v1/responses", r#"{"model":"m"}"#), Ok(None));
        // A body the gateway cannot read may be background to the provider (VB 1).
        let unread = Some(Detached::Unread);
        assert_eq!(post("/v1/responses", "not json"), Ok(unread));
        assert_eq!(
            post("/openai/responses", "\u{feff}{\"background\":true}"),
            Ok(unread)
        );
        assert_eq!(
            detached(&Method::POST, "/v1/responses", None, None),
            Ok(unread),
            "in a content coding"
        );
        assert_eq!(post("/v1/chat/completions", "not json"), Ok(None));
        assert_eq!(post("/v1/responses/resp_1/cancel", "not json"), Ok(None));
        assert_eq!(
            post("/v1/chat/completions", r#"{"background":true}"#),
            Ok(None)
        );
        assert_eq!(
            post("/v1/responses", r#"{"background":true,"background":false}"#),
            Err(Repeated("background".into()))
        );
        // A cancel is a POST under the response: it is what stops the work.
        assert_eq!(
            post("/v1/responses/resp_1/cancel", r#"{"background":true}"#),
            Ok(None)
        );
        let resume = Some(Detached::Resume);
        assert_eq!(get("/v1/responses/resp_1", Some("stream=true")), Ok(resume));
        assert_eq!(
            get("/v1/responses/resp_1", Some("starting_after=3&stream=true")),
            Ok(resume)
        );
        assert_eq!(get("/v1/responses/resp_1", None), Ok(None), "a poll");
        assert_eq!(get("/v1/responses/resp_1", Some("stream=false")), Ok(None));
        assert_eq!(
            get("/v1/responses/resp_1/input_items", Some("stream=true")),
            Ok(None)
        );
        assert_eq!(get("/v1/responses", Some("stream=true")), Ok(None));
    }
}
