//! Budgets from the client's headers: refused when malformed, fail fast when too small, and
//! the shrunken remainder forwarded upstream.

use std::time::Duration;

use crate::support::*;
use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

mod log_line;

#[tokio::test]
async fn every_bad_budget_header_is_refused_and_never_forwarded() {
    let h = Harness::start().await;
    let cases: &[&[(&str, &str)]] = &[
        &[("x-request-budget-ms", "abc")],
        &[("x-request-budget-ms", "0")],
        &[("x-request-budget-ms", "-5")],
        &[("x-request-budget-ms", "1e3")],
        &[("x-request-budget-ms", "99999999999999999999")],
        &[
            ("x-request-budget-ms", "100"),
            ("x-request-budget-ms", "200"),
        ],
        &[("grpc-timeout", "10")],
        &[("x-envoy-expected-rq-timeout-ms", "soon")],
    ];
    for headers in cases {
        let (resp, _c) = h.chat(headers).await;
        assert_eq!(resp.status(), 400, "{headers:?}");
        let v = json_body(resp).await;
        assert_eq!(v["error"]["code"], "invalid_budget", "{headers:?}");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains(headers[0].0), "{msg}");
        assert!(msg.contains(headers[0].1), "{msg}");
    }
    assert!(h.fake.requests().is_empty(), "nothing reaches the upstream");
    assert!(h.fake.connections().is_empty());
}

#[tokio::test]
async fn an_expired_budget_never_reaches_the_upstream() {
    let h = Harness::start().await;
    let (resp, _c) = h.chat(&[("x-request-budget-ms", "1")]).await;
    assert_eq!(resp.status(), 504);
    // The same budget cannot fit next time either: the SDKs' retries would only add their
    // backoff before the same answer.
    assert_eq!(resp.headers()["x-should-retry"], "false");
    let v = json_body(resp).await;
    assert_eq!(v["error"]["code"], "insufficient_budget");
    assert_eq!(v["error"]["type"], "timeout_error");
    assert_message_starts(&v["error"], "insufficient budget: ");
    h.wait_requests("chat", 1.0).await;
    assert_eq!(
        h.metric("hourglass_cancellations_total{origin=\"insufficient_budget\",route=\"chat\"}")
            .await,
        1.0
    );
    assert!(h.fake.connections().is_empty());
}

#[tokio::test]
async fn a_budget_spent_reading_a_slow_body_never_reaches_the_upstream() {
    let h = Harness::start().await;
    let mut s = TcpStream::connect(h.addr()).await.unwrap();
    let start = Instant::now();
    s.write_all(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
          x-request-budget-ms: 300\r\ncontent-length: 100\r\n\r\n{\"model\":",
    )
    .await
    .unwrap();
    let mut buf = vec![0; 4096];
    // Nothing else would answer for 10 s (the route's budget): the 300 ms one is the cause,
    // never early, and late only by what a busy machine adds.
    let n = tokio::time::timeout(Duration::from_secs(8), s.read(&mut buf))
        .await
        .expect("answered in time")
        .unwrap();
    let took = start.elapsed();
    let text = String::from_utf8_lossy(&buf[..n]);
    assert!(text.starts_with("HTTP/1.1 504"), "{text}");
    assert!(text.contains("deadline_exceeded"), "{text}");
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(5),
        "{took:?}"
    );
    assert!(h.fake.connections().is_empty());
}

#[tokio::test]
async fn the_remaining_budget_is_forwarded_and_shrinks() {
    let h =
        Harness::with_config(&BASE.replace("[defaults]\n", "[defaults]\nreserve = \"200ms\"\n"))
            .await;
    let start = Instant::now();
    let (resp, _c) = h
        .chat(&[("x-request-budget-ms", "5000"), ("grpc-timeout", "1S")])
        .await;
    let took = start.elapsed().as_millis() as u64;
    assert_eq!(resp.status(), 200);
    read_body(resp.into_body()).await;
    let reqs = h.fake.requests();
    let fwd = forwarded(&reqs[0]);
    // 5000 - 200 reserve, less the time spent before sending (less than the client waited
    // for the head, however loaded the machine).
    assert!(
        fwd <= 4800 && fwd + took + 1 >= 4800,
        "{fwd} after {took} ms"
    );
    assert!(reqs[0].headers.get("grpc-timeout").is_none());
}

fn forwarded(r: &hourglass_fake::RequestRecord) -> u64 {
    r.headers["x-request-budget-ms"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap()
}

/// The budget forwarded is what is left when the request is sent, not when it arrived: a
/// body that takes 400 ms to arrive spends 400 ms of it. The bound is exact, not a window:
/// the gateway had parsed the head before it asked for the body (`100 Continue`), and the
/// body's last part was written only 400 ms after that, so at least that long passed
/// between arrival and sending.
#[tokio::test]
async fn time_spent_reading_the_body_is_taken_off_the_forwarded_budget() {
    let h =
        Harness::with_config(&BASE.replace("[defaults]\n", "[defaults]\nreserve = \"200ms\"\n"))
            .await;
    let body = br#"{"model":"m","stream":true}"#;
    let mut s = TcpStream::connect(h.addr()).await.unwrap();
    s.write_all(
        format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
             x-request-budget-ms: 5000\r\nexpect: 100-continue\r\ncontent-length: {}\r\n\
             connection: close\r\n\r\n",
            body.len()
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut buf = vec![0; 4096];
    let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
        .await
        .expect("100 Continue within 5 s")
        .unwrap();
    let asked = Instant::now();
    assert!(
        String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 100 Continue"),
        "{}",
        String::from_utf8_lossy(&buf[..n])
    );
    s.write_all(&body[..10]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    let spent = asked.elapsed();
    s.write_all(&body[10..]).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut answer))
        .await
        .expect("the answer within 10 s")
        .unwrap();
    let answered = asked.elapsed();
    assert!(
        String::from_utf8_lossy(&answer).starts_with("HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    let fwd = forwarded(&h.fake.requests()[0]);
    // 5000 less the 200 ms reserve less at least `spent`; and no less than what was left
    // when the answer had come (so it is still the client's budget, shrunk).
    let spent = spent.as_millis() as u64;
    assert!(
        fwd <= 4800 - spent,
        "forwarded {fwd} ms after {spent} ms spent"
    );
    assert!(fwd >= 4800 - answered.as_millis() as u64 - 1000, "{fwd}");
}

/// Until the body names the model, its read ends when the widest of the candidates' budgets
/// has nothing left for the upstream: with the client's one deadline, the candidate holding
/// back the least. A catch-all's reserve must not cut the body of a request for a route
/// without one (audit V: 504 naming the other route's reserve).
#[tokio::test]
async fn another_candidates_reserve_does_not_cut_the_body_read() {
    let h = Harness::with_config(&BASE.replace(
        "[[routes]]\nname = \"chat\"\n",
        "[[routes]]\nname = \"one\"\npath_prefix = \"/v1/chat/completions\"\n\
         models = [\"one-*\"]\nupstream = \"fake\"\n\n\
         [[routes]]\nname = \"chat\"\nreserve = \"1500ms\"\n",
    ))
    .await;
    // Past the catch-all's usable 500 ms, well within route one's 2000.
    let answer = body_in_two_parts(&h, "one-x", "x-request-budget-ms: 2000\r\n", 900).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert_eq!(h.fake.requests().len(), 1);
}

/// A body that arrives after the deadline of the route its model picks, within another
/// candidate's: the route's deadline passed, which is `deadline_exceeded`, not a budget too
/// small (audit DC 5: "insufficient_budget: 0ms of budget left" 200 ms past the deadline).
#[tokio::test]
async fn a_body_read_past_the_chosen_routes_deadline_is_deadline_exceeded() {
    let h = Harness::with_config(&BASE.replace(
        "[[routes]]\nname = \"chat\"\n",
        "[[routes]]\nname = \"short\"\npath_prefix = \"/v1/chat/completions\"\n\
         models = [\"short-*\"]\nupstream = \"fake\"\nbudget = \"300ms\"\nfirst_token_timeout = \"200ms\"\n\n\
         [[routes]]\nname = \"chat\"\n",
    ))
    .await;
    let answer = body_in_two_parts(&h, "short-x", "", 500).await;
    assert!(answer.starts_with("HTTP/1.1 504"), "{answer}");
    assert!(answer.contains("\"deadline_exceeded\""), "{answer}");
    // The client's upload spent it (audit PC 3): the same upload would again.
    assert!(answer.contains("x-should-retry: false"), "{answer}");
    assert!(
        answer.contains("while the client was still sending the request body"),
        "{answer}"
    );
    assert!(h.fake.requests().is_empty());
}

/// Each attempt forwards what is left at its own send: a retry after a 500 that took 300 ms
/// forwards at least 300 ms less than the first attempt did. Both bounds come from the fake's
/// own clock: the first request was sent before the fake saw it, and the retry only after
/// the 500 came, 300 ms after that.
#[tokio::test]
async fn a_retry_forwards_the_budget_left_at_its_own_send() {
    let h = Harness::with_config(&BASE.replace(
        "upstream = \"fake\"\n\n[[routes]]",
        "upstream = \"fake\"\nretries = 1\nretry_on = [\"5xx\"]\n\n[[routes]]",
    ))
    .await;
    h.fake
        .set_script(&[("x-fake-status", "500"), ("x-fake-ttft-ms", "300")]);
    let (resp, _c) = h.chat(&[("x-request-budget-ms", "5000")]).await;
    assert_eq!(resp.status(), 500, "the last answer passes through");
    read_body(resp.into_body()).await;
    let reqs = h.fake.requests();
    assert_eq!(reqs.len(), 2, "one retry");
    let (first, retry) = (forwarded(&reqs[0]), forwarded(&reqs[1]));
    assert!(first <= 5000, "{first}");
    assert!(
        retry + 300 <= first + 1,
        "the retry forwarded {retry} ms, the first attempt {first} ms"
    );
}

#[tokio::test]
async fn a_client_budget_above_the_maximum_is_clamped() {
    let h = Harness::start().await;
    let (resp, _c) = h.chat(&[("x-request-budget-ms", "999999999")]).await;
    assert_eq!(resp.status(), 200);
    read_body(resp.into_body()).await;
    let fwd: u64 = h.fake.requests()[0].headers["x-request-budget-ms"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(fwd <= 30_000 && fwd > 29_000, "{fwd}");
}

#[tokio::test]
async fn propagation_can_be_turned_off() {
    let h = Harness::with_config(&BASE.replace(
        "auth = \"bearer\"",
        "auth = \"bearer\"\npropagate_budget = false",
    ))
    .await;
    let (resp, _c) = h.chat(&[("x-request-budget-ms", "5000")]).await;
    read_body(resp.into_body()).await;
    assert!(h.fake.requests()[0]
        .headers
        .get("x-request-budget-ms")
        .is_none());
}

#[tokio::test]
async fn forwarding_rewrites_host_strips_hop_by_hop_and_keeps_request_id() {
    let h = Harness::start().await;
    let req = Request::post("/v1/chat/completions?x=1")
        .header("host", "gateway.example")
        .header("content-type", "application/json")
        .header("connection", "keep-alive, x-hop")
        .header("x-hop", "secret-hop")
        .header("keep-alive", "timeout=5")
        .header("x-request-id", "req-abc-123")
        .header("authorization", "Bearer client-own-key")
        .body(Full::new(Bytes::from_static(
            br#"{"model":"m","stream":true}"#,
        )))
        .unwrap();
    let (resp, _c) = h.send(req).await;
    assert_eq!(resp.headers()["x-request-id"], "req-abc-123");
    read_body(resp.into_body()).await;
    let r = &h.fake.requests()[0];
    assert_eq!(r.path, "/v1/chat/completions?x=1");
    assert_eq!(r.headers["host"], h.fake.addr().to_string().as_str());
    assert!(r.headers.get("x-hop").is_none());
    assert!(r.headers.get("keep-alive").is_none());
    assert_eq!(r.headers["x-request-id"], "req-abc-123");
    // No key configured (its variable is unset): the client's own credentials pass through.
    assert_eq!(r.headers["authorization"], "Bearer client-own-key");
    assert_eq!(&r.body[..], br#"{"model":"m","stream":true}"#);
}

/// The key comes from the gateway's environment, so the gateway runs as a process of its
/// own with the variable set: `set_var` here would race the other tests' gateways reading
/// theirs.
#[tokio::test]
async fn a_configured_key_replaces_the_clients_credentials() {
    let fake = hourglass_fake::FakeUpstream::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let config = BASE
        .replace("{FAKE}", &fake.url())
        .replace("HOURGLASS_TEST_KEY_UNSET", "HOURGLASS_TEST_KEY_SET");
    let gw = Process::spawn(
        &config,
        &[],
        &[("HOURGLASS_TEST_KEY_SET", "sk-upstream-canary")],
    )
    .await;
    let (resp, _c) = Conn::open(gw.addr)
        .await
        .send(chat_request(
            &[
                ("authorization", "Bearer client-key"),
                ("x-api-key", "client-key-2"),
                ("api-key", "client-key-3"),
                ("x-goog-api-key", "client-key-4"),
            ],
            true,
        ))
        .await;
    assert!(
        resp.headers().get("x-request-id").is_some(),
        "an id is made when none is sent"
    );
    read_body(resp.into_body()).await;
    let r = &fake.requests()[0];
    assert_eq!(r.headers["authorization"], "Bearer sk-upstream-canary");
    for other in ["x-api-key", "api-key", "x-goog-api-key"] {
        assert!(r.headers.get(other).is_none(), "{other} was forwarded");
    }
    gw.stop().await;
}

#[tokio::test]
async fn unknown_paths_get_no_route_and_large_bodies_413() {
    let h = Harness::with_config(&BASE.replace("[server]\n", "[server]\nmax_request_body = 64\n"))
        .await;
    let req = Request::post("/v2/unknown")
        .header("host", "x")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let (resp, _c) = h.send(req).await;
    assert_eq!(resp.status(), 404);
    assert_eq!(json_body(resp).await["error"]["code"], "no_route");
    let big = Request::post("/v1/chat/completions")
        .header("host", "x")
        .body(Full::new(Bytes::from(vec![b' '; 65])))
        .unwrap();
    let (resp, _c) = h.send(big).await;
    assert_eq!(resp.status(), 413);
    let error = &json_body(resp).await["error"];
    assert_eq!(error["code"], "body_too_large");
    // Audit M3: the setting to raise is named, with the length sent.
    assert_eq!(
        error["message"],
        "request body (Content-Length 65) exceeds the gateway's [server] max_request_body (64 bytes)"
    );
    // Chunked, no length to name: the limit is found while reading.
    let mut s = TcpStream::connect(h.addr()).await.unwrap();
    let chunk = " ".repeat(65);
    s.write_all(
        format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n\
             41\r\n{chunk}\r\n0\r\n\r\n"
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(PROMPTLY, s.read_to_end(&mut answer))
        .await
        .expect("the connection closes after the answer")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(
        answer.contains(
            "\"request body exceeds the gateway's [server] max_request_body (64 bytes)\""
        ),
        "{answer}"
    );
    assert!(h.fake.requests().is_empty());
}

#[tokio::test]
async fn routes_match_on_model_globs() {
    let cfg = BASE.replace(
        "[[routes]]\nname = \"chat\"",
        "[[routes]]\nname = \"reasoning\"\npath_prefix = \"/v1/chat/completions\"\nmodels = [\"o3*\"]\nupstream = \"fake\"\nfirst_token_timeout = \"300ms\"\n\n[[routes]]\nname = \"chat\"",
    );
    let h = Harness::with_config(&cfg).await;
    let req = Request::post("/v1/chat/completions")
        .header("host", "x")
        .header("x-fake-ttft-ms", "1000")
        .body(Full::new(Bytes::from_static(
            br#"{"model":"o3-mini","stream":true}"#,
        )))
        .unwrap();
    let (resp, _c) = h.send(req).await;
    assert_eq!(
        resp.status(),
        504,
        "the reasoning route's 300ms first-token limit applies"
    );
    h.wait_requests("reasoning", 1.0).await;
    let (resp, _c) = h.chat(&[("x-fake-ttft-ms", "500")]).await;
    assert_eq!(resp.status(), 200, "other models take the chat route");
}

/// The body is read as the provider reads it. A member name with an escape
/// (`"m\u006fdel"`) is that member: the upstream's pinned `model` replaces it, and
/// `include_usage` is added beside an escaped `stream`. A member the gateway reads, named
/// twice, is refused with the name, and nothing is forwarded: the provider might read the
/// other one (before, the rewrite passed such bodies on untouched, and model routing took
/// them to the route without models).
#[tokio::test]
async fn the_body_is_read_as_the_provider_reads_it() {
    let cfg = BASE
        .replace(
            "auth = \"bearer\"\n",
            "auth = \"bearer\"\nmodel = \"gpt-small\"\ninclude_usage = true\n",
        )
        .replace(
            "[[routes]]\nname = \"chat\"",
            "[[routes]]\nname = \"reasoning\"\npath_prefix = \"/v1/chat/completions\"\nmodels = [\"o3*\"]\nupstream = \"fake\"\n\n[[routes]]\nname = \"chat\"",
        );
    let h = Harness::with_config(&cfg).await;
    let post = |body: &'static str| {
        Request::post("/v1/chat/completions")
            .header("host", "x")
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from_static(body.as_bytes())))
            .unwrap()
    };
    for body in [
        r#"{"m\u006fdel":"o3-pro","str\u0065am":true,"messages":[]}"#,
        r#"{"model":"o3-pro","messag\u0065s":[],"stream":true}"#,
    ] {
        let (resp, _c) = h.send(post(body)).await;
        assert_eq!(resp.status(), 200, "{body}");
        read_body(resp.into_body()).await;
        let sent = h.fake.requests().last().unwrap().body.clone();
        let sent: serde_json::Value = serde_json::from_slice(&sent).unwrap();
        assert_eq!(sent["model"], "gpt-small", "{body}: {sent}");
        assert_eq!(
            sent["stream_options"]["include_usage"], true,
            "{body}: {sent}"
        );
    }
    h.wait_requests("reasoning", 2.0).await;
    let forwarded = h.fake.requests().len();
    for (body, name) in [
        (
            r#"{"model":"gpt-4o","model":"o3-pro","stream":true}"#,
            "model",
        ),
        (
            r#"{"model":"o3-pro","m\u006fdel":"gpt-4o","stream":true}"#,
            "model",
        ),
        (
            r#"{"model":"o3-pro","stream":true,"stream":false}"#,
            "stream",
        ),
    ] {
        let (resp, _c) = h.send(post(body)).await;
        assert_eq!(resp.status(), 400, "{body}");
        let error = json_body(resp).await;
        assert_eq!(error["error"]["code"], "invalid_request", "{body}");
        let message = error["error"]["message"].as_str().unwrap();
        assert!(
            message.contains(&format!("{name:?} more than once")),
            "{body}: {message}"
        );
    }
    assert_eq!(
        h.fake.requests().len(),
        forwarded,
        "nothing more was forwarded"
    );
}

/// A body other parsers read as a JSON object though serde_json does not (a byte order mark,
/// UTF-16, one object and then more, an array) was taken for a body with no model: routed
/// past the `models` route (and its client keys) to the route without models, and
/// forwarded without its upstream's model rewrite, so the provider served `o3-pro` on the
/// cheap route. It is refused where the gateway reads the body; what opens like no JSON (a
/// multipart upload) still passes as it is.
#[tokio::test]
async fn a_body_only_other_parsers_read_is_refused() {
    let cfg = BASE
        .replace("auth = \"bearer\"\n", "auth = \"bearer\"\nmodel = \"gpt-small\"\n")
        .replace(
            "[[routes]]\nname = \"chat\"",
            "[[routes]]\nname = \"reasoning\"\npath_prefix = \"/v1/chat/completions\"\nmodels = [\"o3*\"]\nupstream = \"fake\"\n\n[[routes]]\nname = \"chat\"",
        );
    let h = Harness::with_config(&cfg).await;
    let post = |path: &str, content_type: &str, body: Vec<u8>| {
        Request::post(path)
            .header("host", "x")
            .header("content-type", content_type)
            .body(Full::new(Bytes::from(body)))
            .unwrap()
    };
    let object = r#"{"model":"o3-pro","messages":[]}"#;
    let utf16: Vec<u8> = object.encode_utf16().flat_map(u16::to_le_bytes).collect();
    let mut bom = b"\xEF\xBB\xBF".to_vec();
    bom.extend_from_slice(object.as_bytes());
    // Audit N: a UTF-32 byte order mark, and UTF-16 or UTF-32 after much whitespace, got
    // past the first version of the check; so did a body not UTF-8 past its model (the
    // rewrite failed on it), a member spelled in another case (Go reads it), and a
    // charset=utf-7 label (Express decodes by it).
    let padded = format!("{}{object}", " ".repeat(40));
    let utf16_padded: Vec<u8> = padded.encode_utf16().flat_map(u16::to_le_bytes).collect();
    let mut utf32_bom = vec![0, 0, 0xFE, 0xFF];
    utf32_bom.extend(padded.chars().flat_map(|c| (c as u32).to_be_bytes()));
    let mut latin1 = br#"{"model":"o3-pro","messages":[],"user":"caf"#.to_vec();
    latin1.extend_from_slice(b"\xE9\"}");
    let json = "application/json";
    let cases: [(&str, Vec<u8>, &str, &str); 11] = [
        ("bom", bom, json, "byte order mark"),
        ("utf-16", utf16, json, "UTF-16"),
        ("utf-16 padded", utf16_padded, json, "UTF-16"),
        ("utf-32 bom", utf32_bom, json, "UTF-32"),
        ("latin-1", latin1, json, "not UTF-8"),
        (
            "trailing",
            format!("{object}\n{{}}").into_bytes(),
            json,
            "trailing",
        ),
        (
            "array",
            format!("[{object}]").into_bytes(),
            json,
            "JSON object",
        ),
        ("syntax", br#"{"model":"o3-pro",}"#.to_vec(), json, "line 1"),
        (
            "Model",
            br#"{"Model":"o3-pro","messages":[]}"#.to_vec(),
            json,
            "\"Model\", which Go",
        ),
        (
            "MODEL",
            br#"{"model":"gpt-4o","MODEL":"o3-pro"}"#.to_vec(),
            json,
            "\"MODEL\"",
        ),
        (
            "utf-7",
            b"+AHsAIg-model+ACIAOgAi-o3-pro+ACIAfQ-".to_vec(),
            "application/json; charset=utf-7",
            "charset=\"utf-7\"",
        ),
    ];
    for (name, body, content_type, reason) in cases {
        let (resp, _c) = h
            .send(post("/v1/chat/completions", content_type, body))
            .await;
        assert_eq!(resp.status(), 400, "{name}");
        let error = json_body(resp).await;
        assert_eq!(error["error"]["code"], "invalid_request", "{name}");
        let message = error["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("may be read otherwise by the provider") && message.contains(reason),
            "{name}: {message}"
        );
    }
    assert!(h.fake.requests().is_empty(), "nothing was forwarded");

    // What opens like no JSON, NULs and all, is forwarded as it is (the provider answers it).
    let mut upload = b"--b\r\ncontent-disposition: form-data; name=\"file\"\r\n\r\n".to_vec();
    upload.extend_from_slice(&[0, 0, 0, 1, b'{', 0]);
    upload.extend_from_slice(b"\r\n--b--\r\n");
    let (resp, _c) = h
        .send(post(
            "/v1/chat/completions",
            "multipart/form-data; boundary=b",
            upload.clone(),
        ))
        .await;
    read_body(resp.into_body()).await;
    let sent = h.fake.requests().last().expect("forwarded").body.clone();
    assert_eq!(&sent[..], &upload[..]);
}

/// One generation hung past the first-token limit (2 s) on an upstream nothing was known
/// of: that says its first token can take 2 s or more, not that it always does. Requests
/// whose budget fits the fast answers the upstream gives again still reach it; before, the
/// limit became the estimate, and every shorter budget was refused without the upstream
/// ever being asked again (so the estimate could never learn it was fast).
#[tokio::test]
async fn one_hung_generation_does_not_shut_out_shorter_budgets() {
    let h = Harness::start().await;
    let (resp, _c) = h
        .send(chat_request(&[("x-fake-ttft-ms", "5000")], false))
        .await;
    assert_eq!(resp.status(), 504);
    assert_eq!(
        json_body(resp).await["error"]["code"],
        "first_token_timeout"
    );
    for _ in 0..5 {
        let (resp, _c) = h.chat(&[("x-request-budget-ms", "1500")]).await;
        assert_eq!(resp.status(), 200);
        read_body(resp.into_body()).await;
    }
    assert_eq!(h.fake.requests().len(), 6, "every one reached the upstream");
}

/// The estimate of the first token is the model's, not the upstream's: a reasoning model's
/// slow first tokens say nothing of a small model's on the same upstream. Before, one slow
/// answer raised the one estimate, and every short budget for any model was refused without
/// the upstream being asked.
#[tokio::test]
async fn a_slow_model_does_not_shut_out_a_fast_one_on_the_same_upstream() {
    let h = Harness::start().await;
    let call = |model: &str, headers: &[(&str, &str)]| {
        let mut b = Request::post("/v1/chat/completions")
            .header("host", "gateway")
            .header("content-type", "application/json");
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        let body = format!(
            r#"{{"model":"{model}","stream":true,"messages":[{{"role":"user","content":"hi"}}]}}"#
        );
        b.body(Full::new(Bytes::from(body))).unwrap()
    };
    let (resp, _c) = h
        .send(call("slow-reasoner", &[("x-fake-ttft-ms", "1500")]))
        .await;
    assert_eq!(resp.status(), 200);
    read_body(resp.into_body()).await;

    // 1 s is too short for what the slow model was seen to take...
    let (resp, _c) = h
        .send(call("slow-reasoner", &[("x-request-budget-ms", "1000")]))
        .await;
    assert_eq!(resp.status(), 504);
    let v = json_body(resp).await;
    assert_eq!(v["error"]["code"], "insufficient_budget");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("upstream \"fake\" is expected to take")
            && msg.ends_with("to its first token for model \"slow-reasoner\""),
        "{msg}"
    );
    // ...and plenty for a model the upstream answers quickly.
    for _ in 0..3 {
        let (resp, _c) = h
            .send(call("gpt-test", &[("x-request-budget-ms", "1000")]))
            .await;
        assert_eq!(resp.status(), 200);
        read_body(resp.into_body()).await;
    }
    assert_eq!(
        h.fake.requests().len(),
        4,
        "only the refused call was not sent"
    );
}

/// The message's arithmetic: what is left after the reserve is what it says is left.
#[tokio::test]
async fn insufficient_budget_says_what_is_left_after_the_reserve() {
    let h = Harness::with_config(&BASE.replace(
        "idle_timeout = \"1s\"",
        "idle_timeout = \"1s\"\nreserve = \"500ms\"",
    ))
    .await;
    let (resp, _c) = h.chat(&[("x-request-budget-ms", "550")]).await;
    assert_eq!(resp.status(), 504);
    let v = json_body(resp).await;
    let msg = v["error"]["message"].as_str().unwrap();
    let left: u64 = msg
        .trim_start_matches("insufficient budget: ")
        .split("ms")
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(left <= 50, "{msg}");
    // Exactly reserve + min_useful can never pass either: no point retrying it.
    let (resp, _c) = h.chat(&[("x-request-budget-ms", "600")]).await;
    assert_eq!(resp.status(), 504);
    assert_eq!(resp.headers()["x-should-retry"], "false");
    json_body(resp).await;
    assert!(h.fake.requests().is_empty());
}

/// A client whose SDK waits less than `min_useful` for the answer (a read timeout of 10 ms)
/// is refused at once, as a budget that small is: the upstream is never called for a head
/// that could not reach the client in time.
#[tokio::test]
async fn a_client_that_waits_less_than_min_useful_never_reaches_the_upstream() {
    let h = Harness::start().await;
    let (resp, _c) = h.chat(&[("x-stainless-read-timeout", "0.01")]).await;
    assert_eq!(resp.status(), 504);
    assert_eq!(resp.headers()["x-should-retry"], "false");
    let v = json_body(resp).await;
    assert_eq!(v["error"]["code"], "insufficient_budget", "{v}");
    crate::support::assert_message_starts(
        &v["error"],
        "insufficient budget: the client stops waiting for the answer",
    );
    assert!(h.fake.requests().is_empty());
    let (resp, _c) = h.chat(&[("x-stainless-read-timeout", "5")]).await;
    assert_eq!(resp.status(), 200);
    read_body(resp.into_body()).await;
}

/// An error body's first byte is no token: it neither joins the time-to-first-token
/// histogram nor teaches the upstream's estimate.
#[tokio::test]
async fn an_error_answer_is_no_first_token() {
    let h = Harness::start().await;
    let (resp, _c) = h
        .send(chat_request(&[("x-fake-status", "429")], false))
        .await;
    assert_eq!(resp.status(), 429);
    json_body(resp).await;
    let (resp, _c) = h.chat(&[]).await;
    assert_eq!(resp.status(), 200);
    read_body(resp.into_body()).await;
    h.wait_requests("chat", 2.0).await;
    assert_eq!(
        h.metric("hourglass_time_to_first_token_seconds_count{route=\"chat\",upstream=\"fake\"}")
            .await,
        1.0
    );
}

/// Before the body names the model, a request is refused for its budget only when no
/// candidate route could use it: a route that wants more (its reserve and min_useful) than
/// the route the model picks does not refuse that route's requests. When none could, the
/// error is the route's the request is logged under.
#[tokio::test]
async fn a_budget_is_refused_before_the_body_only_when_no_candidate_route_fits_it() {
    let cfg = BASE.replace(
        "[[routes]]\nname = \"chat\"",
        "[[routes]]\nname = \"fast\"\npath_prefix = \"/v1/chat/completions\"\nmodels = [\"fast\"]\nupstream = \"fake\"\nmin_useful = \"100ms\"\nreserve = \"0ms\"\n\n[[routes]]\nname = \"chat\"\nmin_useful = \"2s\"\nreserve = \"1s\"",
    );
    let h = Harness::with_config(&cfg).await;
    let fast = |budget: &str| {
        Request::post("/v1/chat/completions")
            .header("host", "x")
            .header("x-request-budget-ms", budget)
            .body(Full::new(Bytes::from_static(br#"{"model":"fast"}"#)))
            .unwrap()
    };
    for budget in ["2500", "500"] {
        let (resp, _c) = h.send(fast(budget)).await;
        assert_eq!(resp.status(), 200, "{budget} ms fits the fast route");
    }
    // The chat route still refuses what it cannot use, once the body names no fast model.
    let (resp, _c) = h.chat(&[("x-request-budget-ms", "2500")]).await;
    assert_eq!(resp.status(), 504);
    // Nothing fits 50 ms: refused before the body, in the chat route's words.
    let (resp, _c) = h.send(fast("50")).await;
    assert_eq!(resp.status(), 504);
    let body = json_body(resp).await;
    assert_eq!(body["error"]["code"], "insufficient_budget", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("1000ms reserve"), "{message}");
    assert_eq!(h.fake.requests().len(), 2);
}

/// A deadline the client set is its own: its 504 tells the SDKs not to send the request again
/// (each retry came with a new budget, and the answer after the time asked for: openai 3.63,
/// a 2 s budget, a 504 after 7.3 s and three requests). A deadline of the route's config
/// leaves retrying to them. Both bodies carry Anthropic's top-level `type` as well.
#[tokio::test]
async fn a_deadline_the_client_set_tells_sdks_not_to_retry() {
    // The reserve ends the work at 1.5 s, before the first-token limit (2 s).
    let h = Harness::with_config(
        &BASE.replace("budget = \"10s\"", "budget = \"2500ms\"\nreserve = \"1s\""),
    )
    .await;
    h.fake.set_script(&[("x-fake-ttft-ms", "5000")]);
    let cases = [
        (Some(("x-request-budget-ms", "2500")), Some("false")),
        (Some(("grpc-timeout", "2500m")), Some("false")),
        (None, None),
    ];
    for (header, retry) in cases {
        let headers: Vec<_> = header.into_iter().collect();
        let headers = &headers[..];
        let (resp, _c) = h.send(chat_request(headers, false)).await;
        assert_eq!(resp.status(), 504, "{headers:?}");
        let should_retry = resp.headers().get("x-should-retry").cloned();
        assert_eq!(
            should_retry.as_ref().map(|v| v.to_str().unwrap()),
            retry,
            "{headers:?}"
        );
        let v = json_body(resp).await;
        assert_eq!(v["error"]["code"], "deadline_exceeded", "{headers:?}");
        assert_eq!(v["type"], "error");
    }
}

/// The client's SDK timeouts bound the silences it sits through, not the upstream's data:
/// a head sent at once and keep-alives after it reach a Python SDK's reads (its
/// `x-stainless-read-timeout`), and a Node SDK's `x-stainless-timeout` is its wait for the
/// head alone. Both streams came whole without the gateway and were cut at 0.9 s through it
/// (audit N). A silence with no byte at all is still cut before the client gives up.
#[tokio::test]
async fn what_reaches_the_client_restarts_its_sdks_timeout() {
    let h = Harness::with_config(&BASE.replace(
        "first_token_timeout = \"2s\"",
        "first_token_timeout = \"5s\"",
    ))
    .await;
    for headers in [
        vec![
            ("x-stainless-read-timeout", "1"),
            ("x-fake-keepalive-ms", "200"),
        ],
        vec![("x-stainless-timeout", "1"), ("x-stainless-lang", "js")],
    ] {
        let mut all = headers.clone();
        all.extend([("x-fake-ttft-ms", "2000"), ("x-fake-headers-first", "1")]);
        let (resp, _c) = h.chat(&all).await;
        assert_eq!(resp.status(), 200);
        let read = read_body(resp.into_body()).await;
        assert!(read.error_event().is_none(), "{headers:?}: {}", read.text());
        assert!(read.text().ends_with("data: [DONE]\n\n"), "{}", read.text());
    }
    // No keep-alive: the Python SDK's reads would time out at 1 s.
    let (resp, _c) = h
        .chat(&[
            ("x-stainless-read-timeout", "1"),
            ("x-fake-ttft-ms", "2000"),
            ("x-fake-headers-first", "1"),
        ])
        .await;
    let read = read_body(resp.into_body()).await;
    let e = read.error_event().expect("cut before the client's timeout");
    assert_eq!(e["code"], "first_token_timeout", "{e}");
    // The limit is the client's, which neither its code nor the config spells: said
    // (audit CD).
    let sdk = "900ms: the client's SDK stops waiting then";
    assert!(e["message"].as_str().unwrap().contains(sdk), "{e}");
    // The same for a silence after the first token, shorter than the route's idle limit.
    let (resp, _c) = h
        .chat(&[
            ("x-stainless-read-timeout", "1"),
            ("x-fake-interval-ms", "50"),
            ("x-fake-freeze-after", "2"),
        ])
        .await;
    let read = read_body(resp.into_body()).await;
    let e = read.error_event().expect("cut before the client's timeout");
    assert_eq!(e["code"], "idle_timeout", "{e}");
    assert!(e["message"].as_str().unwrap().contains(sdk), "{e}");
    // The route's own limits say nothing of the client.
    let (resp, _c) = h
        .chat(&[("x-fake-interval-ms", "50"), ("x-fake-freeze-after", "2")])
        .await;
    let read = read_body(resp.into_body()).await;
    let e = read.error_event().expect("cut at the idle limit");
    assert_eq!(
        e["message"],
        "idle timeout: upstream \"fake\" was silent for 1000ms"
    );
}

/// A client whose SDK waits longer than the route's first-token limit is cut by that limit,
/// and its message says nothing of the client's timeout, whether the head had gone out or not.
#[tokio::test]
async fn the_routes_own_first_token_limit_is_not_put_on_the_client() {
    let h = Harness::with_config(&BASE.replace(
        "first_token_timeout = \"2s\"",
        "first_token_timeout = \"300ms\"",
    ))
    .await;
    let said = "first token timeout: upstream \"fake\" sent no token within 300ms";
    let slow = [
        ("x-stainless-read-timeout", "10"),
        ("x-fake-ttft-ms", "2000"),
    ];
    let (resp, _c) = h.chat(&slow).await;
    assert_eq!(resp.status(), 504);
    assert_eq!(json_body(resp).await["error"]["message"], said);
    let mut first = slow.to_vec();
    first.push(("x-fake-headers-first", "1"));
    let (resp, _c) = h.chat(&first).await;
    let read = read_body(resp.into_body()).await;
    let e = read.error_event().expect("cut at the route's limit");
    assert_eq!(e["message"], said, "{e}");
}

/// `hourglass_budget_seconds` and `hourglass_budget_used_ratio` count the same requests: a
/// call refused because its run's deadline had passed (a budget of 0) was in the first and
/// not the second (audit L3).
#[tokio::test]
async fn both_budget_histograms_count_the_same_requests() {
    let toml = BASE.replace(
        "path_prefix = \"/v1/chat/completions\"\nupstream = \"fake\"\n",
        "path_prefix = \"/v1/chat/completions\"\nupstream = \"fake\"\nrun_budget = \"1m\"\n",
    );
    let h = Harness::with_config(&toml).await;
    let run = [("x-run-id", "r1"), ("x-run-budget-ms", "1000")];
    let (resp, _c) = h.send(chat_request(&run, false)).await;
    json_body(resp).await;
    // Past the run's deadline: the next call is refused before it is sent.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let (resp, _c) = h.send(chat_request(&run[..1], false)).await;
    assert_eq!(resp.status(), 504);
    assert_eq!(
        json_body(resp).await["error"]["code"],
        "run_deadline_exceeded"
    );
    h.wait_requests("chat", 2.0).await;
    let budget = h
        .metric("hourglass_budget_seconds_count{route=\"chat\"}")
        .await;
    let ratio = h
        .metric("hourglass_budget_used_ratio_count{route=\"chat\"}")
        .await;
    assert_eq!((budget, ratio), (1.0, 1.0));
}

/// A chat request for `model` whose body's first 10 bytes come with the head and the rest
/// `pause_ms` later; the whole answer, as text.
async fn body_in_two_parts(h: &Harness, model: &str, headers: &str, pause_ms: u64) -> String {
    let body = format!(r#"{{"model":"{model}","messages":[{{"role":"user","content":"hi"}}]}}"#);
    let mut s = TcpStream::connect(h.addr()).await.unwrap();
    s.write_all(
        format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
             {headers}content-length: {}\r\nconnection: close\r\n\r\n",
            body.len()
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    s.write_all(&body.as_bytes()[..10]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(pause_ms)).await;
    s.write_all(&body.as_bytes()[10..]).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut answer))
        .await
        .expect("the answer within 10 s")
        .unwrap();
    String::from_utf8_lossy(&answer).into_owned()
}

/// Audit IC 1: a second `charset` parameter, or one a split on `;` took from inside a quoted
/// string, got past the charset check; Express decodes by the last one, read `o3` in the
/// UTF-7 body, and served the keyed model on the open route. A second `Content-Type` line
/// is refused too (the field is a singleton; a framework that keeps the last would be
/// fooled). What RFC 9110 allows passes.
#[tokio::test]
async fn a_content_type_read_two_ways_is_refused() {
    let cfg = BASE.replace(
        "[[routes]]\nname = \"chat\"",
        "[[routes]]\nname = \"premium\"\npath_prefix = \"/v1/chat/completions\"\nmodels = [\"o3*\"]\nupstream = \"fake\"\n\n[[routes]]\nname = \"chat\"",
    );
    let h = Harness::with_config(&cfg).await;
    let post = |types: &[&str], body: &'static str| {
        let mut req = Request::post("/v1/chat/completions").header("host", "x");
        for t in types {
            req = req.header("content-type", *t);
        }
        req.body(Full::new(Bytes::from_static(body.as_bytes())))
            .unwrap()
    };
    let body = r#"{"model":"cheap+ACI-,+ACI-model+ACI-:+ACI-o3","messages":[]}"#;
    for (types, reason) in [
        (
            &["application/json; charset=utf-8; charset=utf-7"][..],
            "declares charset more than once",
        ),
        (
            &["application/json; foo=\"a;charset=utf-8\"; charset=utf-7"][..],
            "charset=\"utf-7\"",
        ),
        (
            &["application/json; foo=\"a;charset=utf-8; charset=utf-7"][..],
            "RFC 9110 5.6.6",
        ),
        (
            &["application/json", "application/json; charset=utf-7"][..],
            "the field is a singleton",
        ),
    ] {
        let (resp, _c) = h.send(post(types, body)).await;
        assert_eq!(resp.status(), 400, "{types:?}");
        let error = json_body(resp).await;
        assert_eq!(error["error"]["code"], "invalid_request", "{types:?}");
        let message = error["error"]["message"].as_str().unwrap();
        assert!(
            message.contains(reason) && message.contains("content-type"),
            "{types:?}: {message}"
        );
    }
    assert!(h.fake.requests().is_empty(), "nothing was forwarded");
    let (resp, _c) = h
        .send(post(
            &["application/json ; foo=\"a;charset=utf-7\" ; charset=UTF-8"],
            r#"{"model":"cheap","messages":[]}"#,
        ))
        .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(h.fake.requests().len(), 1);
}

/// The Node SDKs send `x-stainless-timeout` as whole seconds rounded down (`Math.trunc`):
/// `1` is read as the 1 s it says, less the margin, so that a client with a round timeout
/// (the usual case) hears why its call ended before it gives up. Read as the top of its
/// second (audit IA 1's fix), a 5 s client sent `5` timed out blind at 5.0 s, the gateway's
/// 504 due at 5.4 s (audit JA 2). An answer inside the 900 ms comes whole.
#[tokio::test]
async fn a_node_timeout_in_whole_seconds_is_read_as_it_says() {
    let h = Harness::start().await;
    let node = |ttft: &'static str| {
        [
            ("x-stainless-timeout", "1"),
            ("x-stainless-lang", "js"),
            ("x-fake-ttft-ms", ttft),
        ]
    };
    let (resp, _c) = h.send(chat_request(&node("300"), false)).await;
    assert_eq!(resp.status(), 200);
    let (resp, _c) = h.send(chat_request(&node("1300"), false)).await;
    assert_eq!(resp.status(), 504);
    let body = json_body(resp).await;
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert_eq!(body["error"]["code"], "first_token_timeout", "{body}");
    assert!(message.contains("x-stainless-timeout"), "{body}");
}

/// The Python SDKs' timeout (`x-stainless-read-timeout`, and anthropic-python's
/// `x-stainless-timeout`) is httpx's read timeout: it starts once the request is sent, so an
/// upload's time is none of it. Counted from the head's arrival, a body that took 1.5 s
/// left 300 ms of a 2 s read timeout (1.8 s with its margin) for an answer due 800 ms after
/// it, and the client got a 504 it would have waited for (audit IF 1: a 5 MiB upload at
/// 500 KB/s with a 20 s timeout). The Node SDKs' timeout covers the whole exchange, upload
/// and all: counted from arrival still.
#[tokio::test]
async fn a_python_read_timeout_starts_once_the_body_is_read() {
    let h = Harness::start().await;
    let python =
        "x-stainless-read-timeout: 2\r\nx-stainless-lang: python\r\nx-fake-ttft-ms: 800\r\n";
    let answer = body_in_two_parts(&h, "m", python, 1500).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let node = "x-stainless-timeout: 2.0\r\nx-stainless-lang: js\r\nx-fake-ttft-ms: 800\r\n";
    let answer = body_in_two_parts(&h, "m", node, 1500).await;
    assert!(answer.starts_with("HTTP/1.1 504"), "{answer}");
    assert!(answer.contains("x-stainless-timeout"), "named: {answer}");
}

/// Audit PC 3 (b): a budget that runs out while the client is still sending its body was
/// spent by the upload itself, and the same upload would spend it again: the 504 says so, and
/// says `x-should-retry: false` (the OpenAI SDK sent a 26 MB upload cut at its route's 5 s
/// budget three times). It is still `deadline_exceeded`, from the budget fixed on arrival.
#[tokio::test]
async fn a_budget_spent_by_the_clients_own_upload_says_not_to_retry() {
    let h = Harness::with_config(&BASE.replace(
        "[[routes]]\nname = \"chat\"\npath_prefix = \"/v1/chat/completions\"\nupstream = \"fake\"\n",
        "[[routes]]\nname = \"chat\"\npath_prefix = \"/v1/chat/completions\"\nupstream = \"fake\"\n\
         budget = \"300ms\"\nfirst_token_timeout = \"200ms\"\n",
    ))
    .await;
    let mut s = TcpStream::connect(h.addr()).await.unwrap();
    s.write_all(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
          content-length: 100\r\n\r\n{\"model\":",
    )
    .await
    .unwrap();
    // The rest never comes: the route's budget (from the config, not the client) ends the
    // read; the answer closes the connection.
    let mut answer = Vec::new();
    s.read_to_end(&mut answer).await.unwrap();
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 504"), "{text}");
    assert!(text.contains("\"code\":\"deadline_exceeded\""), "{text}");
    assert!(text.contains("x-should-retry: false"), "{text}");
    assert!(
        text.contains("while the client was still sending the request body (9 of 100 bytes came)"),
        "{text}"
    );
    assert!(h.fake.connections().is_empty());
}
