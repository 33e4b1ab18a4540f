//! A provider's error sent as an event before any output (an Anthropic overload, a failed
//! Responses answer) while the head is held: retried or failed over like the status it
//! stands for, or answered as its code says.

use super::*;

/// A provider's error event that comes before any output (Anthropic sends its overload so:
/// a 200, then `event: error` with `overloaded_error`) while the head is held is retried like
/// the status it stands for: nothing has reached the client. It was passed through, though a
/// fallback stood ready. A bad request sent so is the client's, and still passes through.
#[tokio::test]
async fn an_overload_sent_as_an_error_event_before_any_output_falls_back() {
    // Anthropic's, and compatible servers' (audit Q): vLLM's error object and TGI's string,
    // whose kinds are named in their own words.
    let anthropic = |kind: &str| {
        format!(
            "event: error\ndata: {{\"type\":\"error\",\"error\":{{\"type\":\"{kind}\",\"message\":\"m\"}}}}\n\n"
        )
    };
    for (kind, event, falls_back) in [
        ("overloaded_error", anthropic("overloaded_error"), true),
        ("invalid_request_error", anthropic("invalid_request_error"), false),
        (
            "ServiceUnavailableError",
            "data: {\"object\":\"error\",\"message\":\"m\",\"type\":\"ServiceUnavailableError\",\"param\":null,\"code\":503}\n\n".to_owned(),
            true,
        ),
        (
            "overloaded",
            "data: {\"error\":\"m\",\"error_type\":\"overloaded\"}\n\n".to_owned(),
            true,
        ),
        (
            "BadRequestError",
            "data: {\"object\":\"error\",\"message\":\"m\",\"type\":\"BadRequestError\",\"param\":null,\"code\":400}\n\n".to_owned(),
            false,
        ),
        // Audit HB5: a named type outranks a numeric code (it was answered as the 400).
        (
            "hb5",
            "data: {\"error\":{\"code\":400,\"type\":\"overloaded_error\",\"message\":\"hb5\"}}\n\n".to_owned(),
            true,
        ),
        // Gemini's, typed by its numeric code alone (audit GB 6: it passed through as `other`).
        (
            "RESOURCE_EXHAUSTED",
            "data: {\"error\":{\"code\":429,\"message\":\"m\",\"status\":\"RESOURCE_EXHAUSTED\"}}\n\n".to_owned(),
            true,
        ),
    ] {
        let up = event_stream(&event).await;
        let p = pair_with(
            "fallbacks = [\"backup\"]",
            "",
            "",
            Some(format!("http://{up}")),
        )
        .await;
        let (resp, _c) = p.chat(&[("x-fake-chunks", "2")]).await;
        assert_eq!(resp.status(), 200, "{kind}");
        let read = read_body(resp.into_body()).await;
        let text = read.text();
        if falls_back {
            assert!(
                text.contains("tok2") && !text.contains(kind),
                "{kind}: {text}"
            );
            assert_eq!(
                p.metric(
                    "hourglass_fallbacks_total{from=\"primary\",route=\"chat\",to=\"backup\"}"
                )
                .await,
                1.0,
                "{kind}"
            );
        } else {
            assert!(text.contains(kind), "{kind}: {text}");
            assert!(p.backup.requests().is_empty(), "{kind}");
        }
    }
}

/// Audit GB 3: a Responses stream that fails before any output (`response.created`, then
/// `response.failed` with `server_error`) is the provider's error event, as an `error` event
/// is: failed over to the fallback; without one, a client that did not stream gets it as
/// the 500 the provider would have answered, logged as an error.
#[tokio::test]
async fn a_response_failed_before_any_output_falls_back() {
    let stream = concat!(
        "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"r\",\"status\":\"in_progress\",\"output\":[],\"error\":null}}\n\n",
        "event: response.failed\ndata: {\"type\":\"response.failed\",\"response\":{\"id\":\"r\",\"status\":\"failed\",\"output\":[],\"error\":{\"code\":\"server_error\",\"message\":\"The model failed\"}}}\n\n",
    );
    let up = event_stream(stream).await;
    let backup = FakeUpstream::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let request = |stream: bool| {
        http::Request::post("/v1/responses")
            .header("host", "gateway")
            .header("content-type", "application/json")
            .body(http_body_util::Full::new(bytes::Bytes::from(format!(
                r#"{{"model":"m","input":"hi","stream":{stream}}}"#
            ))))
            .unwrap()
    };
    for (route, stream) in [
        ("fallbacks = [\"backup\"]", true),
        ("stream_upstream = true", false),
    ] {
        let text = config(&format!("http://{up}"), &backup.url(), route, "", "")
            .replace("/v1/chat/completions", "/v1/responses");
        let gw = server::start(Config::from_toml(&text, "retry-test.toml").unwrap())
            .await
            .unwrap();
        let (resp, _c) = Conn::open(gw.addr).await.send(request(stream)).await;
        let outcome =
            |o: &str| format!("hourglass_requests_total{{outcome=\"{o}\",route=\"chat\"}}");
        if stream {
            assert_eq!(resp.status(), 200);
            let text = read_body(resp.into_body()).await.text();
            assert!(!text.contains("server_error"), "{text}");
            assert!(text.contains("response.completed"), "{text}");
            assert_eq!(backup.requests().len(), 1);
            let fell_back =
                "hourglass_fallbacks_total{from=\"primary\",route=\"chat\",to=\"backup\"}";
            assert_eq!(metric(gw.admin_addr, fell_back).await, 1.0);
        } else {
            assert_eq!(resp.status(), 500);
            let body = json_body(resp).await;
            assert_eq!(body["error"]["code"], "server_error", "{body}");
            assert_eq!(body["error"]["message"], "The model failed", "{body}");
            let deadline = Instant::now() + Duration::from_secs(5);
            while metric(gw.admin_addr, &outcome("error")).await < 1.0 {
                assert!(Instant::now() < deadline, "not logged as an error");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            assert_eq!(metric(gw.admin_addr, &outcome("ok")).await, 0.0);
        }
    }
}

/// Audit HB3, HB6: a failed response's `error.code` that is the request's fault
/// (`invalid_prompt`) was answered 502, a server error the SDKs retry, its code copied as the
/// envelope's `type`; it is OpenAI's 400 of `invalid_request_error`. One with `"error": null`
/// passed as a success (200, logged `ok`, no fallback); it is a server's error: failed over,
/// and without a fallback a 502, logged as an error.
#[tokio::test]
async fn a_failed_response_is_answered_as_its_code_says() {
    let backup = FakeUpstream::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let request = |stream: bool| {
        http::Request::post("/v1/responses")
            .header("host", "gateway")
            .header("content-type", "application/json")
            .body(http_body_util::Full::new(bytes::Bytes::from(format!(
                r#"{{"model":"m","input":"hi","stream":{stream}}}"#
            ))))
            .unwrap()
    };
    for (error, status, ty) in [
        (
            r#"{"code":"invalid_prompt","message":"bad prompt"}"#,
            400,
            "invalid_request_error",
        ),
        ("null", 502, "server_error"),
    ] {
        let stream = format!(
            "event: response.created\ndata: {{\"type\":\"response.created\",\"response\":{{\"id\":\"r\",\"status\":\"in_progress\",\"output\":[],\"error\":null}}}}\n\n\
             event: response.failed\ndata: {{\"type\":\"response.failed\",\"response\":{{\"id\":\"r\",\"status\":\"failed\",\"output\":[],\"error\":{error}}}}}\n\n"
        );
        let up = event_stream(&stream).await;
        let text = config(
            &format!("http://{up}"),
            &backup.url(),
            "stream_upstream = true",
            "",
            "",
        )
        .replace("/v1/chat/completions", "/v1/responses");
        let gw = server::start(Config::from_toml(&text, "retry-test.toml").unwrap())
            .await
            .unwrap();
        let (resp, _c) = Conn::open(gw.addr).await.send(request(false)).await;
        assert_eq!(resp.status(), status, "{error}");
        let body = json_body(resp).await;
        assert_eq!(body["error"]["type"], ty, "{error}: {body}");
        let outcome = "hourglass_requests_total{outcome=\"error\",route=\"chat\"}";
        let deadline = Instant::now() + Duration::from_secs(5);
        while metric(gw.admin_addr, outcome).await < 1.0 {
            assert!(Instant::now() < deadline, "{error}: not logged as an error");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    // A failed response with no error, to a streaming client whose route has a fallback.
    let stream = concat!(
        "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"r\",\"status\":\"in_progress\",\"output\":[],\"error\":null}}\n\n",
        "event: response.failed\ndata: {\"type\":\"response.failed\",\"response\":{\"id\":\"r\",\"status\":\"failed\",\"output\":[],\"error\":null}}\n\n",
    );
    let up = event_stream(stream).await;
    let text = config(
        &format!("http://{up}"),
        &backup.url(),
        "fallbacks = [\"backup\"]",
        "",
        "",
    )
    .replace("/v1/chat/completions", "/v1/responses");
    let gw = server::start(Config::from_toml(&text, "retry-test.toml").unwrap())
        .await
        .unwrap();
    let (resp, _c) = Conn::open(gw.addr).await.send(request(true)).await;
    assert_eq!(resp.status(), 200);
    let text = read_body(resp.into_body()).await.text();
    assert!(text.contains("response.completed"), "{text}");
    assert!(!text.contains("response.failed"), "{text}");
    assert_eq!(backup.requests().len(), 1);
}

/// An upstream that answers one request with `stream` as a whole `text/event-stream` body
/// and closes.
async fn event_stream(stream: &str) -> std::net::SocketAddr {
    let head = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\n\
         connection: close\r\n\r\n{stream}",
        stream.len()
    );
    raw_upstream(vec![(Duration::ZERO, head.into_bytes())]).await
}
