//! Connects to an HTTP/2 upstream that fail, as every request that waited for them sees it.

use super::*;

/// Audit SB 1: hyper-util's pool makes one connection at a time per HTTP/2 upstream, and the
/// requests that wait for it were told "request was canceled" when it failed: a cold burst
/// to an upstream whose connects hang got one 504 `connect_timeout` and the rest 502
/// `upstream_unavailable`, counted as connect errors of reason `other`. Every request that
/// waited takes the failure of the connect it waited for.
#[tokio::test]
async fn every_request_waiting_for_an_http2_connect_that_timed_out_gets_connect_timeout() {
    const REQUESTS: usize = 6;
    let (_held, addr) = hourglass_fake::never_accepting_listener().unwrap();
    let toml = config("eject_after = 0").replace("{FAKE}", &format!("http://{addr}"));
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
    while let Some(answer) = sent.join_next().await {
        let (status, body) = answer.unwrap();
        assert_eq!(status, 504, "{body}");
        assert_eq!(body["error"]["code"], "connect_timeout", "{body}");
    }
    let n = REQUESTS as f64;
    let connect = "hourglass_cancellations_total{origin=\"connect\",route=\"chat\"}";
    assert_eq!(h.metric(connect).await, n);
    let errors = |reason: &str| {
        format!("hourglass_upstream_connect_errors_total{{reason=\"{reason}\",upstream=\"fake\"}}")
    };
    assert_eq!(h.metric(&errors("timeout")).await, n);
    assert_eq!(h.metric(&errors("other")).await, 0.0);
}
