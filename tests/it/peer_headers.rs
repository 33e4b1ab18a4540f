//! Peer gateways behind Hourglass: an upstream's `headers`, set on every attempt in place of
//! the client's (audit UD 1), and its `hide_headers`, dropped from every answer (audit UD 2).
//! The upstream is a loopback stub that records each request head and answers as a LiteLLM
//! would, with its internal headers.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::Request;
use http_body_util::Full;

use crate::support::{read_body, read_request, Harness};

const PROVIDER_KEY: &str = "sk-operator-ud";

/// Answers like a LiteLLM in front of a provider: its internal headers on every answer, an
/// event stream to a request whose model is `sse`, a 500 to `err`, JSON otherwise. Each
/// request's head is recorded (lowercased).
async fn peer() -> (std::net::SocketAddr, Arc<Mutex<Vec<String>>>) {
    use tokio::io::AsyncWriteExt;
    let heads = Arc::new(Mutex::new(Vec::new()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = heads.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                let req = read_request(&mut s).await;
                // The provider's wait (longer than any budget here) and its "do not retry".
                let extra = if req.contains(r#""model":"wait""#) {
                    "retry-after: 3600\r\nretry-after-ms: 3600000\r\n"
                } else if req.contains(r#""model":"final""#) {
                    "x-should-retry: false\r\n"
                } else {
                    ""
                };
                let (status, kind, body) = if req.contains(r#""model":"wait""#) {
                    (
                        "429 Too Many Requests",
                        "application/json",
                        r#"{"error":{"message":"slow down"}}"#,
                    )
                } else if req.contains(r#""model":"sse""#) {
                    (
                        "200 OK",
                        "text/event-stream",
                        "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n",
                    )
                } else if req.contains(r#""model":"err""#) || req.contains(r#""model":"final""#) {
                    (
                        "500 Internal Server Error",
                        "application/json",
                        r#"{"error":{"message":"down"}}"#,
                    )
                } else {
                    (
                        "200 OK",
                        "application/json",
                        r#"{"choices":[{"message":{"role":"assistant","content":"hi"}}]}"#,
                    )
                };
                seen.lock().unwrap().push(req);
                let answer = format!(
                    "HTTP/1.1 {status}\r\ncontent-type: {kind}\r\ncontent-length: {}\r\n\
                     x-litellm-model-api-base: http://127.0.0.1:9/v1\r\n\
                     x-litellm-key-spend: 0.0\r\nX-LiteLLM-Version: 1.108.7\r\n\
                     x-request-id: peer-id\r\nx-peer-kept: yes\r\n{extra}connection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = s.write_all(answer.as_bytes()).await;
            });
        }
    });
    (addr, heads)
}

/// Audit UD 1 and UD 2: behind a key the gateway injects, the client's
/// `x-portkey-provider: azure-openai` had a Portkey upstream send the operator's key to
/// `undefined.openai.azure.com`; now the client's is dropped, and the upstream's `headers`
/// pins the provider on every attempt (a retried 500's too). LiteLLM's
/// `x-litellm-model-api-base` told clients the provider's address behind it; the upstream's
/// `hide_headers` drops it from every answer (JSON, streamed, and an error kept across a
/// retry), and never the gateway's own `x-request-id`.
#[tokio::test]
async fn an_upstreams_headers_are_set_and_hidden_on_every_attempt_and_answer() {
    let (addr, heads) = peer().await;
    let dir = crate::support::temp_dir("hourglass-peer-headers-");
    let key_file = dir.path().join("key");
    std::fs::write(&key_file, PROVIDER_KEY).unwrap();
    let cfg = format!(
        r#"
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"

[upstreams.peer]
url = "http://{addr}"
api_key_file = "{}"
headers = {{ "X-Portkey-Provider" = "openai" }}
hide_headers = ["x-litellm-*", "x-request-id"]

[[routes]]
name = "peer"
path_prefix = "/v1/chat/completions"
upstream = "peer"
retries = 1
retry_on = ["5xx"]
"#,
        key_file.display()
    );
    let h = Harness::with_config(&cfg).await;
    for (model, status, attempts) in [("json", 200, 1), ("sse", 200, 1), ("err", 500, 2)] {
        let before = heads.lock().unwrap().len();
        let req = Request::post("/v1/chat/completions")
            .header("host", "gateway")
            .header("content-type", "application/json")
            .header("x-portkey-provider", "azure-openai")
            .header("x-portkey-trace-id", "t-1")
            .body(Full::new(Bytes::from(format!(
                r#"{{"model":"{model}","stream":{},"messages":[]}}"#,
                model == "sse"
            ))))
            .unwrap();
        let (resp, _c) = h.send(req).await;
        assert_eq!(resp.status(), status, "{model}");
        let head = resp.headers().clone();
        for hidden in [
            "x-litellm-model-api-base",
            "x-litellm-key-spend",
            "x-litellm-version",
            "x-upstream-request-id",
        ] {
            assert_eq!(head.get(hidden), None, "{model}: {hidden}");
        }
        assert_eq!(head["x-peer-kept"], "yes", "{model}");
        // The gateway's own id, never hidden.
        let id = head["x-request-id"].to_str().unwrap();
        assert_ne!(id, "peer-id", "{model}");
        assert!(
            !read_body(resp.into_body()).await.text().is_empty(),
            "{model}"
        );
        let sent: Vec<String> = heads.lock().unwrap()[before..].to_vec();
        assert_eq!(sent.len(), attempts, "{model}");
        for req in sent {
            let lines: Vec<&str> = req
                .lines()
                .filter(|l| l.starts_with("x-portkey-provider:"))
                .collect();
            assert_eq!(lines, ["x-portkey-provider: openai"], "{model}");
            assert!(req.contains("x-portkey-trace-id: t-1"), "{model}");
            assert!(
                req.contains(&format!("authorization: bearer {PROVIDER_KEY}")),
                "{model}"
            );
        }
    }
}

/// Audit VB 2: hiding `retry-after`, `retry-after-ms` and `x-should-retry` from clients made
/// the gateway itself ignore them, as they were dropped when the head arrived: a 429 whose
/// one-hour wait fits no budget was retried at once, and a 500 with `x-should-retry: false` was
/// retried. Hiding changes only what the client sees (as nginx's `proxy_hide_header`).
#[tokio::test]
async fn hidden_headers_still_steer_the_gateways_retries() {
    let (addr, heads) = peer().await;
    let cfg = format!(
        r#"
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"

[upstreams.peer]
url = "http://{addr}"
auth = "none"
hide_headers = ["retry-after", "retry-after-ms", "x-should-retry", "x-litellm-*"]

[[routes]]
name = "peer"
path_prefix = "/v1/chat/completions"
upstream = "peer"
retries = 1
retry_on = ["429", "5xx"]
"#
    );
    let h = Harness::with_config(&cfg).await;
    for (model, status) in [("wait", 429), ("final", 500)] {
        let before = heads.lock().unwrap().len();
        let req = Request::post("/v1/chat/completions")
            .header("host", "gateway")
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(format!(
                r#"{{"model":"{model}","messages":[]}}"#
            ))))
            .unwrap();
        let (resp, _c) = h.send(req).await;
        let (got, head) = (resp.status(), resp.headers().clone());
        read_body(resp.into_body()).await;
        let sent = heads.lock().unwrap().len() - before;
        assert_eq!(
            sent, 1,
            "{model}: the provider's word was heeded, sent once"
        );
        assert_eq!(got, status, "{model}: the provider's answer passes through");
        for hidden in ["retry-after", "retry-after-ms", "x-litellm-version"] {
            assert_eq!(
                head.get(hidden),
                None,
                "{model}: {hidden} hidden from the client"
            );
        }
    }
}

/// Audit WB 3: Azure OpenAI takes its key only in `api-key`, native Gemini in
/// `x-goog-api-key`, and `auth` had no mode for either, so the gateway could not hold those
/// keys at all. With `auth = "api-key"` / `"x-goog-api-key"` the upstream gets the operator's
/// key in that header, and none of the keys the client sent (its gateway key, or its own
/// provider key in any header) rides beside it.
#[tokio::test]
async fn azure_and_gemini_keys_go_in_their_own_headers() {
    let (addr, heads) = peer().await;
    let dir = crate::support::temp_dir("hourglass-auth-headers-");
    let key_file = dir.path().join("key");
    std::fs::write(&key_file, PROVIDER_KEY).unwrap();
    let clients = dir.path().join("clients");
    std::fs::write(&clients, "hg-client-wb3-0123456789\n").unwrap();
    let key = key_file.display();
    let cfg = format!(
        r#"
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"

[upstreams.azure]
url = "http://{addr}"
api_key_file = "{key}"
auth = "api-key"

[upstreams.gemini]
url = "http://{addr}"
api_key_file = "{key}"
auth = "x-goog-api-key"

[[routes]]
name = "azure"
path_prefix = "/openai/"
upstream = "azure"
client_keys_file = "{clients}"

[[routes]]
name = "gemini"
path_prefix = "/v1beta/"
upstream = "gemini"
"#,
        clients = clients.display()
    );
    let h = Harness::with_config(&cfg).await;
    for (path, header, client_key) in [
        (
            "/openai/deployments/d/chat/completions?api-version=2024-10-21",
            "api-key",
            ("api-key", "hg-client-wb3-0123456789"),
        ),
        (
            "/v1beta/models/gemini-2.0-flash:generateContent",
            "x-goog-api-key",
            ("x-goog-api-key", "client-own-gemini-key"),
        ),
    ] {
        let before = heads.lock().unwrap().len();
        let req = Request::post(path)
            .header("host", "gateway")
            .header("content-type", "application/json")
            .header(client_key.0, client_key.1)
            .header("authorization", "Bearer hg-client-wb3-0123456789")
            .header("x-api-key", "client-x-api-key")
            .body(Full::new(Bytes::from_static(br#"{"model":"json"}"#)))
            .unwrap();
        let (resp, _c) = h.send(req).await;
        assert_eq!(resp.status(), 200, "{path}");
        read_body(resp.into_body()).await;
        let sent: Vec<String> = heads.lock().unwrap()[before..].to_vec();
        assert_eq!(sent.len(), 1, "{path}");
        let req = &sent[0];
        let keys: Vec<&str> = req
            .lines()
            .filter(|l| {
                [
                    "authorization:",
                    "x-api-key:",
                    "api-key:",
                    "x-goog-api-key:",
                ]
                .iter()
                .any(|k| l.starts_with(k))
            })
            .collect();
        assert_eq!(
            keys,
            [format!("{header}: {PROVIDER_KEY}")],
            "{path}: only the operator's key, in {header}"
        );
        assert!(!req.contains("client"), "{path}: {req}");
    }
}
