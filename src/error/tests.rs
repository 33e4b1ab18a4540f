//! The errors' words: what each message names, and the bodies and headers they go out with.

use super::*;

#[test]
fn a_loop_of_parallel_calls_names_every_tool() {
    let detail = |names: &str| loop_detail(&Some(names.to_owned()), 3);
    assert_eq!(
        detail("a"),
        "the model asked for tool \"a\" with the same arguments 3 times in a row"
    );
    assert_eq!(
        detail("a,b,c"),
        "the model asked for tools \"a\", \"b\" and \"c\" with the same arguments 3 times in a row"
    );
    assert_eq!(
        detail("a,b,+398"),
        "the model asked for tools \"a\", \"b\" and 398 more with the same arguments 3 times in a row"
    );
    assert_eq!(
        loop_detail(&None, 2),
        "the same request came 2 times in a row"
    );
}

#[test]
fn only_a_budget_too_small_from_the_start_tells_sdks_not_to_retry() {
    let insufficient = |whole| GatewayError::InsufficientBudget {
        remaining: Duration::from_millis(40),
        reserve: Duration::ZERO,
        min_useful: Duration::from_millis(100),
        expected_by: None,
        whole,
        patience: false,
        uploading: None,
    };
    let hopeless = insufficient(true).response();
    assert_eq!(hopeless.status(), StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(hopeless.headers()["x-should-retry"], "false");
    // Spent on attempts or waiting: the client's retry comes with a new budget.
    let spent = insufficient(false).response();
    assert!(!spent.headers().contains_key("x-should-retry"));
}

/// A 503 says when to try again, whether the route was full or the gateway draining.
#[test]
fn every_503_says_when_to_try_again() {
    for e in [
        GatewayError::Shutdown,
        GatewayError::Overloaded {
            route: "r".into(),
            limit: 1,
            waited: Duration::ZERO,
        },
        GatewayError::Starved {
            upstream: "u".into(),
            starved: Starved::Descriptors,
            reason: "tcp open error: Too many open files (os error 24)".into(),
        },
    ] {
        let resp = e.response();
        assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(resp.headers()[http::header::RETRY_AFTER], "1", "{e}");
    }
}

/// Audit GC6: "1 requests".
#[test]
fn an_overload_counts_its_requests_in_words() {
    let overloaded = |limit| {
        GatewayError::Overloaded {
            route: "chat".into(),
            limit,
            waited: Duration::ZERO,
        }
        .to_string()
    };
    assert!(
        overloaded(1).starts_with("route \"chat\" is at its limit of 1 request in flight;"),
        "{}",
        overloaded(1)
    );
    assert!(
        overloaded(2).starts_with("route \"chat\" is at its limit of 2 requests in flight;"),
        "{}",
        overloaded(2)
    );
}

/// A run out of tokens stays out of them: the 429 of a non-streaming call the run's
/// tokens cut (stream_upstream) says so like the refusal at admission.
#[test]
fn a_run_out_of_tokens_tells_sdks_not_to_retry_however_it_was_found() {
    let spent = GatewayError::RunTokensSpent {
        run: "r".into(),
        limit: 10,
    }
    .response();
    assert_eq!(spent.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(spent.headers()["x-should-retry"], "false");
}

/// Several clients (LiteLLM, for one) show the message and drop the code: the message
/// alone must say which limit fired (DESIGN 6).
#[test]
fn every_limit_is_named_in_words_in_its_message() {
    let upstream = || "fake".to_owned();
    let after = Duration::from_millis(1000);
    let cases = [
        (
            GatewayError::InsufficientBudget {
                remaining: Duration::from_millis(40),
                reserve: Duration::ZERO,
                min_useful: Duration::from_millis(100),
                expected_by: None,
                whole: false,
                patience: false,
                uploading: None,
            },
            "insufficient budget: 40ms of budget left",
        ),
        (
            GatewayError::ConnectTimeout {
                upstream: upstream(),
                after,
                proxy: None,
                sent: false,
            },
            "connect timeout: upstream \"fake\" not connected (name lookup, TCP and TLS) within 1000ms",
        ),
        (
            // Audit QC 6: through a proxy, the proxy is named.
            GatewayError::ConnectTimeout {
                upstream: upstream(),
                after,
                proxy: Some("http://u:***@proxy.corp:3128".to_owned()),
                sent: false,
            },
            "connect timeout: upstream \"fake\" not connected (through the egress proxy http://u:***@proxy.corp:3128: TCP to it, its CONNECT tunnel, and TLS) within 1000ms",
        ),
        (
            GatewayError::FirstTokenTimeout {
                upstream: upstream(),
                after,
                patience: false,
            },
            "first token timeout: upstream \"fake\" sent no token within 1000ms",
        ),
        (
            GatewayError::IdleTimeout {
                upstream: upstream(),
                after,
                patience: false,
            },
            "idle timeout: upstream \"fake\" was silent for 1000ms",
        ),
        (
            GatewayError::IdleTimeout {
                upstream: upstream(),
                after,
                patience: true,
            },
            "idle timeout: no whole event from upstream \"fake\" reached the client for \
             1000ms: the client's SDK stops waiting then (the timeout it announced in \
             x-stainless-timeout or x-stainless-read-timeout, less a margin), and hears why \
             first",
        ),
        (
            GatewayError::DeadlineExceeded {
                budget: after,
                reserve: Duration::ZERO,
                client_budget: false,
                patience: false,
                uploading: None,
            },
            "deadline exceeded: the request's budget of 1000ms is spent",
        ),
        (
            GatewayError::DeadlineExceeded {
                budget: after,
                reserve: Duration::ZERO,
                client_budget: false,
                patience: true,
                uploading: None,
            },
            "deadline exceeded: the answer was not whole 1000ms after the request, when it had to go out to reach the client before the timeout its SDK announced",
        ),
    ];
    for (e, start) in cases {
        let message = e.to_string();
        assert!(message.starts_with(start), "{}: {message}", e.code());
        // The words are the code's, so the two never tell different stories.
        let words = e.code().replace('_', " ");
        let words = words.trim_end_matches(" timeout").to_owned();
        assert!(message.starts_with(&words), "{}: {message}", e.code());
        for body in [e.json_body(), e.sse_event(None)] {
            let text = String::from_utf8(body.to_vec()).unwrap();
            assert!(text.contains(&start.replace('"', "\\\"")), "{text}");
        }
    }
}

#[test]
fn json_body_has_contract_shape() {
    let e = GatewayError::InvalidBudget {
        header: "x-request-budget-ms",
        value: "abc".into(),
        reason: "is not a positive integer",
    };
    let v: serde_json::Value = serde_json::from_slice(&e.json_body()).unwrap();
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert_eq!(v["error"]["code"], "invalid_budget");
    assert_eq!(
        v["error"]["message"],
        "x-request-budget-ms: \"abc\" is not a positive integer"
    );
    assert_eq!(e.status(), StatusCode::BAD_REQUEST);
}

#[test]
fn sse_event_is_one_parseable_event() {
    let e = GatewayError::IdleTimeout {
        upstream: "openai".into(),
        after: Duration::from_millis(1500),
        patience: false,
    };
    let ev = e.sse_event(None);
    let text = std::str::from_utf8(&ev).unwrap();
    assert!(text.starts_with("event: error\ndata: "));
    assert!(text.ends_with("\n\n"));
    let data = text.lines().nth(1).unwrap().strip_prefix("data: ").unwrap();
    let v: serde_json::Value = serde_json::from_str(data).unwrap();
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["code"], "idle_timeout");
    assert_eq!(v["error"]["type"], "timeout_error");
    assert!(v["error"]["message"].as_str().unwrap().contains("1500ms"));
    // The exact bytes, keys in the order clients have always seen.
    assert_eq!(
        text,
        "event: error\ndata: {\"error\":{\"code\":\"idle_timeout\",\"message\":\
         \"idle timeout: upstream \\\"openai\\\" was silent for 1500ms\",\"type\":\"timeout_error\"},\
         \"type\":\"error\"}\n\n"
    );
    // Before the head: the same, Anthropic's top-level `type` included.
    assert_eq!(
        &e.json_body()[..],
        &br#"{"error":{"code":"idle_timeout","message":"idle timeout: upstream \"openai\" was silent for 1500ms","type":"timeout_error"},"type":"error"}"#[..]
    );
}

/// On a Responses stream the event takes the number the next event would have had, as
/// the API's own `error` event does.
#[test]
fn an_sse_event_on_a_responses_stream_is_numbered() {
    let e = GatewayError::DeadlineExceeded {
        budget: Duration::from_secs(2),
        reserve: Duration::ZERO,
        client_budget: false,
        patience: false,
        uploading: None,
    };
    let ev = e.sse_event(Some(7));
    let text = std::str::from_utf8(&ev).unwrap();
    let data = text.lines().nth(1).unwrap().strip_prefix("data: ").unwrap();
    let v: serde_json::Value = serde_json::from_str(data).unwrap();
    assert_eq!(v["sequence_number"], 7);
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["code"], "deadline_exceeded");
    assert!(!String::from_utf8(e.sse_event(None).to_vec())
        .unwrap()
        .contains("sequence_number"));
}
