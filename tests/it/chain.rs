//! Hourglass behind Hourglass: a front gateway whose upstream is another gateway (the inner
//! one), in front of the fake provider. Budgets shrink along such a chain (DESIGN 3.6), so the
//! inner gateway's limit is usually the one that fires: the front must answer its cut as it
//! would answer its own.

use crate::stream_upstream::{chat, CONFIG as INNER};
use crate::support::{json_body, Harness};

/// The front: its routes name the inner gateway's models, with the same `stream_upstream` and
/// `partial_answers`, and limits wider than the inner's (idle 3 s to its 600 ms), so that the
/// inner one always fires first.
const FRONT: &str = r#"
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"

[defaults]
budget = "10s"
max_budget = "30s"
connect_timeout = "500ms"
first_token_timeout = "5s"
idle_timeout = "3s"

[upstreams.inner]
url = "{INNER}"
auth = "none"

[[routes]]
name = "watched"
path_prefix = "/v1/chat/completions"
models = ["watched"]
upstream = "inner"
stream_upstream = true

[[routes]]
name = "partial"
path_prefix = "/v1/chat/completions"
models = ["partial"]
upstream = "inner"
stream_upstream = true
partial_answers = true
"#;

/// The inner gateway (over the fake) and the front over it; `inner_max`, when given, is the
/// inner gateway's budget and `max_budget` (which clamps the budget the front forwards).
async fn chain(inner_max: Option<&str>) -> (Harness, Harness) {
    let mut inner = INNER.to_owned();
    if let Some(max) = inner_max {
        inner = inner
            .replace("max_budget = \"30s\"", &format!("max_budget = \"{max}\""))
            .replace("budget = \"10s\"", &format!("budget = \"{max}\""))
            .replace(
                "first_token_timeout = \"5s\"",
                "first_token_timeout = \"500ms\"",
            );
    }
    let inner = Harness::with_config(&inner).await;
    let front = FRONT.replace("{INNER}", &format!("http://{}", inner.addr()));
    (inner, Harness::with_config(&front).await)
}

/// Audit KB 1: the inner gateway's idle cut after output reached the front as an error event,
/// which the front answered as a provider's error: a 504, the three tokens lost. It is the
/// partial answer the inner gateway itself would have given, and the front's own cut gives.
#[tokio::test]
async fn an_idle_cut_down_the_chain_leaves_the_partial_answer() {
    let (_inner, front) = chain(None).await;
    let (resp, _c) = front
        .send(chat(
            "partial",
            &[("x-fake-chunks", "6"), ("x-fake-freeze-after", "3")],
        ))
        .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-hourglass-partial"], "idle_timeout");
    let doc = json_body(resp).await;
    let choice = &doc["choices"][0];
    assert_eq!(choice["finish_reason"], "length");
    assert_eq!(choice["message"]["content"], "tok1 tok2 tok3 ");
    front.wait_requests("partial", 1.0).await;
    assert_eq!(
        front
            .metric("hourglass_partial_answers_total{origin=\"idle\",route=\"partial\"}")
            .await,
        1.0
    );
}

/// Audit KB 1: the inner gateway's deadline (its `max_budget`, below the client's budget)
/// cut the answer; without `partial_answers` the front's 504 did not say `x-should-retry:
/// false`, which its own cut at a budget the client set says: the SDKs retried a budget
/// already spent. With `partial_answers`, what was generated.
#[tokio::test]
async fn a_deadline_down_the_chain_is_answered_as_the_fronts_own() {
    let (_inner, front) = chain(Some("800ms")).await;
    let slow = [("x-fake-chunks", "100"), ("x-fake-interval-ms", "100")];
    let with_budget = |model| {
        let mut h = slow.to_vec();
        h.push(("x-request-budget-ms", "5000"));
        chat(model, &h)
    };

    let (resp, _c) = front.send(with_budget("watched")).await;
    assert_eq!(resp.status(), 504);
    assert_eq!(resp.headers()["x-should-retry"], "false");
    assert!(resp.headers().get("x-hourglass-partial").is_none());
    let body = json_body(resp).await;
    assert_eq!(body["error"]["code"], "deadline_exceeded");

    // The budget is the front's own (its config's): a retry gets no new one, and the front's
    // own cut would not tell the SDK not to retry.
    let (resp, _c) = front.send(chat("watched", &slow)).await;
    assert_eq!(resp.status(), 504);
    assert!(resp.headers().get("x-should-retry").is_none());
    assert_eq!(json_body(resp).await["error"]["code"], "deadline_exceeded");

    let (resp, _c) = front.send(with_budget("partial")).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-hourglass-partial"], "deadline_exceeded");
    let doc = json_body(resp).await;
    let text = doc["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(text.starts_with("tok1 tok2 "), "{text}");
}
