//! Connects to an HTTP/2 upstream that fail, as every request that waited for them sees it.

use super::*;

const REQUESTS: usize = 6;

/// `REQUESTS` chat requests at once to an HTTP/2 upstream at `up`: each one's status and
/// error body, and the gateway.
async fn burst(up: std::net::SocketAddr) -> (Vec<(http::StatusCode, serde_json::Value)>, Harness) {
    burst_to(&format!("http://{up}")).await
}

/// [`burst`] to the upstream at `url`.
async fn burst_to(url: &str) -> (Vec<(http::StatusCode, serde_json::Value)>, Harness) {
    let toml = config("eject_after = 0").replace("{FAKE}", url);
    let h = Harness::with_config(&toml).await;
    let gateway = h.addr();
    let mut sent = tokio::task::JoinSet::new();
    for _ in 0..REQUESTS {
        sent.spawn(async move {
            let conn = Conn::open(gateway).await;
            let (resp, _conn) = conn.send(chat_request(&[], false)).await;
            (resp.status(), json_body(resp).await)
        });
    }
    let mut answers = Vec::new();
    while let Some(answer) = sent.join_next().await {
        answers.push(answer.unwrap());
    }
    (answers, h)
}

fn connect_errors(reason: &str) -> String {
    format!("hourglass_upstream_connect_errors_total{{reason=\"{reason}\",upstream=\"fake\"}}")
}

/// Audit SB 1: hyper-util's pool makes one connection at a time per HTTP/2 upstream, and the
/// requests that wait for it were told "request was canceled" when it failed: a cold burst
/// to an upstream whose connects hang got one 504 `connect_timeout` and the rest 502
/// `upstream_unavailable`, counted as connect errors of reason `other`. Every request that
/// waited takes the failure of the connect it waited for.
#[tokio::test]
async fn every_request_waiting_for_an_http2_connect_that_timed_out_gets_connect_timeout() {
    let (_held, addr) = hourglass_fake::never_accepting_listener().unwrap();
    let (answers, h) = burst(addr).await;
    for (status, body) in answers {
        assert_eq!(status, 504, "{body}");
        assert_eq!(body["error"]["code"], "connect_timeout", "{body}");
    }
    let n = REQUESTS as f64;
    let connect = "hourglass_cancellations_total{origin=\"connect\",route=\"chat\"}";
    assert_eq!(h.metric(connect).await, n);
    assert_eq!(h.metric(&connect_errors("timeout")).await, n);
    assert_eq!(h.metric(&connect_errors("other")).await, 0.0);
}

/// ... and a refused connect is a refusal for each request that waited for it.
#[tokio::test]
async fn every_request_waiting_for_an_http2_connect_that_was_refused_is_told_so() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = closed.local_addr().unwrap();
    drop(closed);
    let (answers, h) = burst(addr).await;
    for (status, body) in answers {
        assert_eq!(status, 502, "{body}");
        assert_eq!(body["error"]["code"], "upstream_unavailable", "{body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains("refused"), "{message}");
    }
    assert_eq!(h.metric(&connect_errors("refused")).await, REQUESTS as f64);
    assert_eq!(h.metric(&connect_errors("other")).await, 0.0);
}

/// ... and a name that does not resolve is a failed name lookup for each, as for a request
/// that made the connect itself: the waiters were counted as connect errors of reason `other`
/// (audit VA 4).
#[tokio::test]
async fn every_request_waiting_for_an_http2_connect_whose_name_did_not_resolve_is_told_so() {
    let (answers, h) = burst_to("http://nonexistent.invalid:80").await;
    for (status, body) in answers {
        assert_eq!(status, 502, "{body}");
        assert_eq!(body["error"]["code"], "upstream_unavailable", "{body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains("dns error"), "{message}");
    }
    assert_eq!(h.metric(&connect_errors("dns")).await, REQUESTS as f64);
    assert_eq!(h.metric(&connect_errors("other")).await, 0.0);
}
