//! A detached call (an OpenAI background response, or its stream resumed) goes on at the
//! provider when its connection closes: the client's leaving, or a limit that cuts it, closes
//! a connection and cancels no work. Counted apart, `hourglass_requests_total{outcome=
//! "detached"}` and `hourglass_detached_total{origin}`, never as a cancellation (audit UC 2:
//! each was counted in `hourglass_cancellations_total`, overstating the work saved).

use super::*;

const RESPONSES: &str = "\n[[routes]]\nname = \"responses\"\npath_prefix = \"/v1/responses\"\n\
                         upstream = \"fake\"\n";

fn post_background() -> hyper::Request<http_body_util::Full<bytes::Bytes>> {
    let body = r#"{"model":"gpt-test","input":"hi","background":true,"stream":true}"#;
    hyper::Request::post("/v1/responses")
        .header("host", "gateway")
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::from(body)))
        .unwrap()
}

/// The route's views agree: every request has one outcome, every cancellation one origin,
/// every detached close one origin, and nothing here was cancelled.
async fn assert_detached(h: &Harness, origin: &str) {
    h.wait_requests("responses", 1.0).await;
    let text = h.metrics_text().await;
    let sum = |metric: &str| -> f64 {
        text.lines()
            .filter(|l| l.starts_with(metric) && l.contains("route=\"responses\""))
            .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
            .sum()
    };
    let one = |sample: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(sample)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no sample {sample}"))
    };
    assert_eq!(
        one(&format!(
            "hourglass_detached_total{{origin=\"{origin}\",route=\"responses\"}}"
        )),
        1.0
    );
    assert_eq!(
        one("hourglass_requests_total{outcome=\"detached\",route=\"responses\"}"),
        1.0
    );
    assert_eq!(sum("hourglass_detached_total{"), 1.0);
    assert_eq!(
        sum("hourglass_cancellations_total{"),
        0.0,
        "nothing cancelled"
    );
    assert_eq!(
        one("hourglass_requests_total{outcome=\"cancelled\",route=\"responses\"}"),
        0.0
    );
}

#[tokio::test]
async fn a_client_that_leaves_a_background_stream_is_counted_detached() {
    let h = Harness::with_config(&(BASE.to_owned() + RESPONSES)).await;
    h.fake
        .set_script(&[("x-fake-chunks", "200"), ("x-fake-interval-ms", "100")]);
    let (resp, conn) = h.send(post_background()).await;
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    read_events(&mut body, 2).await;
    drop(body);
    conn.close();
    assert_detached(&h, "client").await;
}

/// A resume whose upstream falls silent past `idle_timeout`: the client gets the error event,
/// and the response runs on at the provider.
#[tokio::test]
async fn a_limit_that_cuts_a_resumed_stream_is_counted_detached() {
    let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n";
    let event =
        "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\
                 \"sequence_number\":4,\"delta\":\"Hi\"}\n\n";
    let up = raw_upstream(vec![
        (Duration::ZERO, head.as_bytes().to_vec()),
        (Duration::ZERO, event.as_bytes().to_vec()),
        (Duration::from_secs(30), Vec::new()),
    ])
    .await;
    let config = (BASE.to_owned() + RESPONSES).replace("{FAKE}", &format!("http://{up}"));
    let h = Harness::with_config(&config).await;
    let req = hyper::Request::get("/v1/responses/resp_1?stream=true&starting_after=3")
        .header("host", "gateway")
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    let (resp, _c) = h.send(req).await;
    assert_eq!(resp.status(), 200);
    let read = read_body(resp.into_body()).await;
    assert_eq!(read.error_event().expect("cut")["code"], "idle_timeout");
    assert_detached(&h, "idle").await;
}

/// The log line says so too: `outcome="detached"` with who closed it, not `cancelled`.
#[tokio::test]
async fn the_log_line_of_a_detached_close_says_detached() {
    let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n";
    let up = raw_upstream(vec![
        (Duration::ZERO, head.as_bytes().to_vec()),
        (Duration::from_secs(30), Vec::new()),
    ])
    .await;
    let toml = (BASE.to_owned() + RESPONSES)
        .replace("{FAKE}", &format!("http://{up}"))
        .replace("api_key_env = \"HOURGLASS_TEST_KEY_UNSET\"\n", "");
    let p = Process::spawn(&toml, &["--log-format", "json"], &[]).await;
    let req = hyper::Request::get("/v1/responses/resp_1?stream=true")
        .header("host", "gateway")
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    let (resp, _c) = Conn::open(p.addr).await.send(req).await;
    assert_eq!(resp.status(), 200);
    let read = read_body(resp.into_body()).await;
    assert_eq!(
        read.error_event().expect("cut")["code"],
        "first_token_timeout"
    );
    let (stdout, stderr) = p.stop().await;
    let out = stdout + &stderr;
    let line = out
        .lines()
        .find(|l| l.contains("\"code\":\"first_token_timeout\""))
        .unwrap_or_else(|| panic!("no log line: {out}"));
    let v: serde_json::Value = serde_json::from_str(line.trim()).unwrap();
    let fields = v.get("fields").unwrap_or(&v);
    assert_eq!(fields["outcome"], "detached", "{line}");
    assert_eq!(fields["origin"], "first_token", "{line}");
}
