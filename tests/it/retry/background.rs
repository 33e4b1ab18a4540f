//! A Responses call run in the background (`"background": true`) goes on at the provider, and
//! is billed, after its connection closes: only `POST /v1/responses/{id}/cancel` stops it. So
//! once it may have reached the upstream it is never sent again, neither retried, nor moved
//! on to a fallback, nor hedged; and with no attempt after it, its head and its first events
//! (`response.created` names the response the client resumes or cancels) are not held back
//! (audit UC 1: each request made two background responses, one of them nobody could see).

use super::*;

/// The chat route of [`CONFIG`], then a Responses route on the primary with `route`'s keys.
fn responses_route(route: &str) -> String {
    format!(
        "\n[[routes]]\nname = \"responses\"\npath_prefix = \"/v1/responses\"\n\
         upstream = \"primary\"\n{route}"
    )
}

fn background(stream: bool) -> http::Request<http_body_util::Full<bytes::Bytes>> {
    let body =
        format!(r#"{{"model":"gpt-test","input":"hi","background":true,"stream":{stream}}}"#);
    http::Request::post("/v1/responses")
        .header("host", "gateway")
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::from(body)))
        .unwrap()
}

/// `retries = 1` and a first token later than the limit: the request went, so it is not sent
/// again. Its head passed at once, and the limit is an error event after it.
#[tokio::test]
async fn a_background_response_is_not_retried_after_a_late_first_token() {
    let p = pair(&responses_route("retries = 1"), "", "").await;
    p.primary
        .set_script(&[("x-fake-ttft-ms", "2600"), ("x-fake-headers-first", "1")]);
    let (resp, _c) = Conn::open(p.gw.addr).await.send(background(true)).await;
    assert_eq!(resp.status(), 200, "the head is not held for a retry");
    let read = read_body(resp.into_body()).await;
    let error = read.error_event().expect("the limit ends the stream");
    assert_eq!(error["code"], "first_token_timeout", "{}", read.text());
    assert_eq!(p.primary.requests().len(), 1, "sent once");
    p.wait_reported_on("responses", 1.0).await;
    // Cut by the limit, the response runs on at the provider: nothing was cancelled (UC 2).
    assert_eq!(
        p.metric("hourglass_detached_total{origin=\"first_token\",route=\"responses\"}")
            .await,
        1.0
    );
    assert_eq!(
        p.metric(
            "hourglass_retries_total{reason=\"first_token\",route=\"responses\",upstream=\"primary\"}"
        )
        .await,
        0.0
    );
}

/// A hedge would start a second background response, which the loser's close would not stop.
#[tokio::test]
async fn a_background_response_is_not_hedged() {
    let p = pair(
        &responses_route("fallbacks = [\"backup\"]\nhedge_after = \"200ms\""),
        "",
        "",
    )
    .await;
    p.primary.set_script(&[("x-fake-ttft-ms", "800")]);
    let (resp, _c) = Conn::open(p.gw.addr).await.send(background(true)).await;
    assert_eq!(resp.status(), 200);
    let read = read_body(resp.into_body()).await;
    assert!(read.error_event().is_none(), "{}", read.text());
    p.wait_reported_on("responses", 1.0).await;
    assert_eq!(p.primary.requests().len(), 1);
    assert!(p.backup.requests().is_empty(), "no hedge was sent");
    assert_eq!(
        p.metric("hourglass_cancellations_total{origin=\"hedge_loser\",route=\"responses\"}")
            .await,
        0.0
    );
}

/// An answer the route would move on from (a 503) passes through: the request reached the
/// upstream, which may have started the response. Unstreamed too.
#[tokio::test]
async fn a_background_response_does_not_fall_back_once_sent() {
    let p = pair(&responses_route("fallbacks = [\"backup\"]"), "", "").await;
    p.primary.set_script(&[("x-fake-status", "503")]);
    for stream in [true, false] {
        let (resp, _c) = Conn::open(p.gw.addr).await.send(background(stream)).await;
        assert_eq!(resp.status(), 503, "the upstream's answer passes through");
        read_body(resp.into_body()).await;
    }
    assert_eq!(p.primary.requests().len(), 2, "one each");
    assert!(p.backup.requests().is_empty());
}

/// A failure before the request could reach the upstream (a connect refused) still moves on.
#[tokio::test]
async fn a_background_response_falls_back_when_the_connect_failed() {
    let (_guard, refused) = closed_port();
    let p = pair_with(
        &responses_route("retries = 1\nfallbacks = [\"backup\"]"),
        "",
        "",
        Some(refused),
    )
    .await;
    let (resp, _c) = Conn::open(p.gw.addr).await.send(background(true)).await;
    assert_eq!(resp.status(), 200);
    read_body(resp.into_body()).await;
    assert_eq!(p.backup.requests().len(), 1);
}

/// A Responses POST whose body the gateway does not read: gzip on `/v1/responses`, and a
/// UTF-8 BOM before the JSON (which Python's and .NET's parsers accept) on Azure's path, whose
/// format is not read under `api = auto`. The provider may read `"background": true` in it,
/// so it is sent as one that does (audit VB 1: it was sent three times).
fn unread_bodies() -> Vec<http::Request<http_body_util::Full<bytes::Bytes>>> {
    let json = br#"{"model":"gpt-test","input":"hi","background":true}"#;
    // `json` compressed (Python's gzip.compress, mtime 0).
    let gzip: Vec<u8> = vec![
        31, 139, 8, 0, 0, 0, 0, 0, 2, 3, 171, 86, 202, 205, 79, 73, 205, 81, 178, 82, 74, 47, 40,
        209, 45, 73, 45, 46, 81, 210, 81, 202, 204, 43, 40, 45, 1, 10, 101, 100, 2, 57, 73, 137,
        201, 217, 233, 69, 249, 165, 121, 41, 74, 86, 37, 69, 165, 169, 181, 0, 107, 189, 231, 91,
        51, 0, 0, 0,
    ];
    let bom = [&b"\xEF\xBB\xBF"[..], json].concat();
    let post = |path: &str| {
        http::Request::post(path)
            .header("host", "gateway")
            .header("content-type", "application/json")
    };
    vec![
        post("/v1/responses")
            .header("content-encoding", "gzip")
            .body(http_body_util::Full::new(bytes::Bytes::from(gzip)))
            .unwrap(),
        post("/openai/responses?api-version=2025-04-01-preview")
            .body(http_body_util::Full::new(bytes::Bytes::from(bom)))
            .unwrap(),
    ]
}

/// The Responses route with `route`'s keys, and an Azure-style route on the primary alike.
fn unread_routes(route: &str) -> String {
    format!(
        "{}\n[[routes]]\nname = \"azure\"\npath_prefix = \"/openai\"\n\
         upstream = \"primary\"\n{route}",
        responses_route(route)
    )
}

/// `retries = 1` and a fallback: the 503 passes through, sent once, nothing to the fallback.
#[tokio::test]
async fn a_responses_post_the_gateway_cannot_read_is_sent_once() {
    let p = pair(
        &unread_routes("retries = 1\nfallbacks = [\"backup\"]"),
        "",
        "",
    )
    .await;
    p.primary.set_script(&[("x-fake-status", "503")]);
    for (n, request) in unread_bodies().into_iter().enumerate() {
        let path = request.uri().to_string();
        let (resp, _c) = Conn::open(p.gw.addr).await.send(request).await;
        let status = resp.status();
        read_body(resp.into_body()).await;
        assert!(p.backup.requests().is_empty(), "{path}: no fallback");
        assert_eq!(p.primary.requests().len(), n + 1, "{path}: sent once");
        assert_eq!(status, 503, "{path}: the upstream's answer passes through");
    }
}

/// A hedge would be a second send of what may be a background response.
#[tokio::test]
async fn a_responses_post_the_gateway_cannot_read_is_not_hedged() {
    let p = pair(
        &unread_routes("fallbacks = [\"backup\"]\nhedge_after = \"200ms\""),
        "",
        "",
    )
    .await;
    p.primary
        .set_script(&[("x-fake-status", "503"), ("x-fake-ttft-ms", "800")]);
    for (n, request) in unread_bodies().into_iter().enumerate() {
        let path = request.uri().to_string();
        let (resp, _c) = Conn::open(p.gw.addr).await.send(request).await;
        let status = resp.status();
        read_body(resp.into_body()).await;
        assert!(p.backup.requests().is_empty(), "{path}: no hedge was sent");
        assert_eq!(p.primary.requests().len(), n + 1, "{path}: sent once");
        assert_eq!(status, 503, "{path}");
    }
}
