//! The request's log line: the upstream that failed before its head, the target and model
//! as sent and asked for, the client's path and user agent cut to size, and the upstream's
//! timings kept apart from the gateway's own bytes.

use super::*;

/// The log line names the upstream a request failed on, when it failed before any answer,
/// and says why, as the client was told: the code alone does not (which certificate check,
/// which refusal).
#[tokio::test]
async fn the_log_line_names_the_upstream_that_failed_before_its_head() {
    let (_refusing, addr) = refused_addr();
    let toml = BASE
        .replace("{FAKE}", &format!("http://{addr}"))
        .replace("api_key_env = \"HOURGLASS_TEST_KEY_UNSET\"\n", "");
    let p = Process::spawn(&toml, &["--log-format", "json"], &[]).await;
    let (resp, _c) = Conn::open(p.addr).await.send(chat_request(&[], true)).await;
    assert_eq!(resp.status(), 502);
    let told = json_body(resp).await["error"]["message"]
        .as_str()
        .unwrap()
        .to_owned();
    let (stdout, stderr) = p.stop().await;
    let out = stdout + &stderr;
    let line = out
        .lines()
        .find(|l| l.contains("\"code\":\"upstream_unavailable\""))
        .unwrap_or_else(|| panic!("no log line: {out}"));
    let v: serde_json::Value = serde_json::from_str(line.trim()).unwrap();
    let fields = v.get("fields").unwrap_or(&v);
    assert_eq!(fields["upstream"], "fake", "{line}");
    assert!(told.contains("refused"), "{told}");
    assert_eq!(fields["error"], told.as_str(), "{line}");
}

/// A target that names no path (`GET host:443`, refused 400) is logged as it was sent, as
/// nginx logs it, not as an empty path (audit P).
#[tokio::test]
async fn a_target_with_no_path_is_logged_as_sent() {
    let toml = BASE.replace("{FAKE}", "http://127.0.0.1:9");
    let p = Process::spawn(&toml, &["--log-format", "json"], &[]).await;
    let mut s = TcpStream::connect(p.addr).await.unwrap();
    s.write_all(b"GET api.openai.com:443 HTTP/1.1\r\nhost: g\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    let (stdout, stderr) = p.stop().await;
    let out = stdout + &stderr;
    let line = out
        .lines()
        .find(|l| l.contains("\"code\":\"invalid_request\""))
        .unwrap_or_else(|| panic!("no log line: {out}"));
    let v: serde_json::Value = serde_json::from_str(line.trim()).unwrap();
    let fields = v.get("fields").unwrap_or(&v);
    assert_eq!(fields["path"], "api.openai.com:443", "{line}");
}

/// The log line names the model the upstream was asked for: the client's, or the upstream's
/// own where it sets one. A name longer than any model's is cut to 200 bytes, at a
/// character's boundary.
#[tokio::test]
async fn the_log_line_names_the_model_asked_for() {
    let fake = hourglass_fake::FakeUpstream::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let toml = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n\n\
         [upstreams.fake]\nurl = \"{0}\"\nauth = \"none\"\n\n\
         [upstreams.pinned]\nurl = \"{0}\"\nauth = \"none\"\nmodel = \"gpt-pinned\"\n\n\
         [[routes]]\nname = \"pinned\"\npath_prefix = \"/v1/chat/completions\"\n\
         models = [\"cheap-*\"]\nupstream = \"pinned\"\n\n\
         [[routes]]\nname = \"chat\"\npath_prefix = \"/v1/chat/completions\"\nupstream = \"fake\"\n",
        fake.url()
    );
    let p = Process::spawn(&toml, &["--log-format", "json"], &[]).await;
    let long = format!("{}é{}", "m".repeat(199), "x".repeat(300));
    for model in ["gpt-test", "cheap-one", long.as_str()] {
        let body =
            format!(r#"{{"model":"{model}","messages":[{{"role":"user","content":"hi"}}]}}"#);
        let req = Request::post("/v1/chat/completions")
            .header("host", "gateway")
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))
            .unwrap();
        let (resp, _c) = Conn::open(p.addr).await.send(req).await;
        assert_eq!(resp.status(), 200);
        read_body(resp.into_body()).await;
    }
    let models: Vec<String> = p
        .request_lines(3)
        .await
        .iter()
        .map(|v| v["model"].as_str().unwrap_or("(none)").to_owned())
        .collect();
    // 199 bytes, then the two-byte é would end past 200: cut before it.
    assert_eq!(models, ["gpt-test", "gpt-pinned", &"m".repeat(199)]);
    p.stop().await;
}

/// The client's path, `User-Agent` and `Referer` are cut like the model (audit DD F5: a
/// 30 KB path or user agent was logged whole): the path to 1000 bytes in every format, the
/// two headers to 500 in the access line. The path's cut is marked, and falls between `%XX`
/// triplets (audit EB F7: it ended `%E2%82%`, unmarked).
#[tokio::test]
async fn the_log_line_cuts_the_clients_path_and_user_agent() {
    let fake = hourglass_fake::FakeUpstream::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let toml = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n\n\
         [upstreams.fake]\nurl = \"{}\"\nauth = \"none\"\n\n\
         [[routes]]\nname = \"chat\"\npath_prefix = \"/v1/chat/completions\"\nupstream = \"fake\"\n",
        fake.url()
    );
    let path = format!(
        "/v1/chat/completions/{}{}",
        "%E2%82%AC".repeat(120),
        "p".repeat(20_000)
    );
    // 997 bytes leave room for the mark, and end `%E2%`: the `%` goes too.
    let logged_path = format!("{}…", &path[..996]);
    let agent = format!("agent/{}", "a".repeat(20_000));
    for format in ["json", "access"] {
        let p = Process::spawn(&toml, &["--log-format", format], &[]).await;
        let req = Request::post(path.as_str())
            .header("host", "gateway")
            .header("user-agent", agent.as_str())
            .header("referer", agent.as_str())
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(r#"{"model":"m","messages":[]}"#)))
            .unwrap();
        let (resp, _c) = Conn::open(p.addr).await.send(req).await;
        read_body(resp.into_body()).await;
        if format == "json" {
            let line = p.request_line().await;
            assert_eq!(line["path"], logged_path.as_str());
        } else {
            let deadline = Instant::now() + Duration::from_secs(5);
            let line = loop {
                let (out, _) = p.output();
                if let Some(l) = out.lines().find(|l| l.contains("HTTP/1.1\"")) {
                    break l.to_owned();
                }
                assert!(Instant::now() < deadline, "no access line: {out}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            };
            assert!(line.len() < 2500, "{}", line.len());
            assert!(
                line.contains(&format!("\"POST {logged_path} HTTP/1.1\"")),
                "{line}"
            );
            assert_eq!(line.matches(&format!("\"{}\"", &agent[..500])).count(), 2);
        }
        p.stop().await;
    }
}

/// The log's `ttfb_ms` is the upstream's first byte and `ttft_ms` its first token of a 2xx
/// answer, as the histograms: the gateway's own error answer (a 404) has neither, an
/// upstream's 500 no token, and a HEAD answer counts no body bytes it never sent.
#[tokio::test]
async fn the_log_line_keeps_the_gateways_own_bytes_out_of_the_upstreams_timings() {
    let fake = hourglass_fake::FakeUpstream::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let toml = BASE
        .replace("{FAKE}", &fake.url())
        .replace("api_key_env = \"HOURGLASS_TEST_KEY_UNSET\"\n", "");
    let p = Process::spawn(&toml, &["--log-format", "json"], &[]).await;
    let nowhere = |method: &str| {
        Request::builder()
            .method(method)
            .uri("/nowhere")
            .header("host", "x")
            .body(Full::new(Bytes::new()))
            .unwrap()
    };
    for method in ["GET", "HEAD"] {
        let (resp, _c) = Conn::open(p.addr).await.send(nowhere(method)).await;
        assert_eq!(resp.status(), 404);
        read_body(resp.into_body()).await;
    }
    let (resp, _c) = Conn::open(p.addr)
        .await
        .send(chat_request(&[("x-fake-status", "500")], false))
        .await;
    assert_eq!(resp.status(), 500);
    read_body(resp.into_body()).await;
    // A stream whose head came at once and then nothing: the error event ending it is the
    // gateway's byte, not the upstream's.
    let (resp, _c) = Conn::open(p.addr)
        .await
        .send(chat_request(
            &[("x-fake-headers-first", "1"), ("x-fake-ttft-ms", "20000")],
            true,
        ))
        .await;
    assert_eq!(resp.status(), 200);
    let read = read_body(resp.into_body()).await;
    assert!(read.error_event().is_some());
    let (stdout, stderr) = p.stop().await;
    let out = stdout + &stderr;
    let lines: Vec<serde_json::Value> = out
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l.trim()).ok())
        .map(|v| v.get("fields").cloned().unwrap_or(v))
        .filter(|f| f.get("outcome").is_some())
        .collect();
    assert_eq!(lines.len(), 4, "{out}");
    let (get, head, failed, cut) = (&lines[0], &lines[1], &lines[2], &lines[3]);
    assert_eq!(cut["code"], "first_token_timeout", "{cut}");
    assert!(cut.get("ttfb_ms").is_none(), "{cut}");
    assert!(cut["bytes"].as_u64().unwrap() > 0, "{cut}");
    assert_eq!(get["status"], 404, "{get}");
    assert!(get.get("ttfb_ms").is_none(), "{get}");
    assert!(get["bytes"].as_u64().unwrap() > 0, "{get}");
    assert_eq!(head["method"], "HEAD", "{head}");
    assert_eq!(head["bytes"], 0, "{head}");
    assert_eq!(failed["status"], 500, "{failed}");
    assert!(failed.get("ttfb_ms").is_some(), "{failed}");
    assert!(failed.get("ttft_ms").is_none(), "{failed}");
}

/// Audit ZD 2, ZD 3: a call in which the model generates nothing (a count of tokens) was held
/// to its model's time to a generation's first token (refused `insufficient_budget` with 1 s
/// left against a 1.5 s estimate, though it is answered in milliseconds), and its log line
/// had a `ttft_ms` the first-token histogram leaves out. It needs only `min_useful`, and its
/// log line has the first byte only, as the histogram has nothing.
#[tokio::test]
async fn a_count_of_tokens_is_no_generation_for_the_budget_or_the_log() {
    let doc = r#"{"input_tokens":9}"#;
    let answer = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
         connection: close\r\n\r\n{doc}",
        doc.len()
    );
    let up = raw_upstream(vec![(Duration::ZERO, answer.into_bytes())]).await;
    let toml = BASE.replace("{FAKE}", &format!("http://{up}")).replace(
        "api_key_env = \"HOURGLASS_TEST_KEY_UNSET\"\n",
        "expected_first_token = \"1500ms\"\n",
    );
    let p = Process::spawn(&toml, &["--log-format", "json"], &[]).await;
    let count = |path: &str| {
        Request::post(path)
            .header("host", "x")
            .header("content-type", "application/json")
            .header("x-request-budget-ms", "1000")
            .body(Full::new(Bytes::from_static(
                br#"{"model":"claude-x","messages":[{"role":"user","content":"hi"}]}"#,
            )))
            .unwrap()
    };
    let (resp, _c) = Conn::open(p.addr)
        .await
        .send(count("/v1/messages/count_tokens"))
        .await;
    assert_eq!(resp.status(), 200, "a count needs no generation's time");
    read_body(resp.into_body()).await;
    // A generation of the same model is still held to the estimate.
    let (resp, _c) = Conn::open(p.addr).await.send(count("/v1/messages")).await;
    assert_eq!(resp.status(), 504);
    assert_eq!(
        json_body(resp).await["error"]["code"],
        "insufficient_budget"
    );
    let (stdout, stderr) = p.stop().await;
    let out = stdout + &stderr;
    let counted = out
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l.trim()).ok())
        .map(|v| v.get("fields").cloned().unwrap_or(v))
        .find(|f| f.get("outcome").is_some() && f["status"] == 200)
        .unwrap_or_else(|| panic!("{out}"));
    assert!(counted.get("ttfb_ms").is_some(), "{counted}");
    assert!(counted.get("ttft_ms").is_none(), "{counted}");
}
