//! Answers the gateway holds before their head goes out share `[server] response_body_memory`,
//! as request bodies share `request_body_memory`: a document rebuilt from a stream
//! (`stream_upstream`) and a JSON document read whole take from it as they grow, and one that
//! would take more is answered 503 `overloaded` while its upstream call is cancelled (audit
//! KF 2: each held up to `max_response_body` on its own, and 100 of them aborted the process).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, Semaphore};
use tokio::time::Instant;

use crate::stream_upstream::chat;
use crate::support::{json_body, read_request, refused_addr, Conn, Harness};

/// The least the memory may be (a JSON document is read whole up to 1 MiB), 16 granules of
/// 64 KiB: an answer of 600,000 bytes takes ten, and a second cannot.
const POOL: u64 = 1 << 20;
const SIZE: usize = 600_000;

fn config(upstream: SocketAddr) -> String {
    config_of(upstream, POOL)
}

fn config_of(upstream: SocketAddr, pool: u64) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
max_response_body = 1000000
response_body_memory = {pool}

[defaults]
budget = "20s"
max_budget = "30s"
connect_timeout = "1s"
first_token_timeout = "10s"
idle_timeout = "10s"

[upstreams.held]
url = "http://{upstream}"
auth = "none"

[[routes]]
name = "plain"
path_prefix = "/v1/chat/completions"
models = ["plain"]
upstream = "held"

[[routes]]
name = "watched"
path_prefix = "/v1/chat/completions"
models = ["watched"]
upstream = "held"
stream_upstream = true
"#
    )
}

/// What the held upstream tells the test of each connection, numbered from 0.
#[derive(Debug, PartialEq, Eq)]
enum Seen {
    /// The answer's head and first part went out; the rest waits for a permit of the gate.
    Held(usize),
    /// The gateway closed the connection while the rest waited.
    Closed(usize),
}

/// An upstream that answers every request with `head` and `first`, then holds the rest of the
/// answer until the test adds a permit to the gate (or the gateway goes away).
async fn held_upstream(
    head: &'static str,
    first: Vec<u8>,
    rest: Vec<u8>,
) -> (SocketAddr, Arc<Semaphore>, mpsc::UnboundedReceiver<Seen>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let gate = Arc::new(Semaphore::new(0));
    let (tx, rx) = mpsc::unbounded_channel();
    let g = gate.clone();
    tokio::spawn(async move {
        let mut n = 0;
        while let Ok((mut s, _)) = listener.accept().await {
            let (gate, tx, first, rest) = (g.clone(), tx.clone(), first.clone(), rest.clone());
            let i = n;
            n += 1;
            tokio::spawn(async move {
                read_request(&mut s).await;
                let mut answer = head.as_bytes().to_vec();
                answer.extend_from_slice(&first);
                if s.write_all(&answer).await.is_err() {
                    return;
                }
                let _ = tx.send(Seen::Held(i));
                let mut buf = [0u8; 1024];
                tokio::select! {
                    permit = gate.acquire() => {
                        permit.unwrap().forget();
                        let _ = s.write_all(&rest).await;
                    }
                    // The request was read whole: anything now is the gateway leaving.
                    _ = s.read(&mut buf) => {
                        let _ = tx.send(Seen::Closed(i));
                    }
                }
            });
        }
    });
    (addr, gate, rx)
}

async fn next(rx: &mut mpsc::UnboundedReceiver<Seen>) -> Seen {
    tokio::time::timeout(Duration::from_secs(5), rx.recv())
        .await
        .expect("the upstream saw it in time")
        .expect("the upstream runs")
}

/// The two answers together exceed the memory: the second is refused with 503 `overloaded`
/// naming it, its upstream call cancelled; the first completes; the memory comes back, so a
/// third answer later is served.
async fn the_second_answer_past_the_memory_is_refused(
    model: &str,
    head: &'static str,
    first: Vec<u8>,
    rest: Vec<u8>,
    check: impl Fn(&serde_json::Value),
) {
    let (upstream, gate, mut seen) = held_upstream(head, first, rest).await;
    let h = Harness::with_config(&config(upstream)).await;
    let addr = h.addr();
    let request = || chat(model, &[]);

    let one = {
        let req = request();
        tokio::spawn(async move { Conn::open(addr).await.send(req).await })
    };
    assert_eq!(next(&mut seen).await, Seen::Held(0));
    // Its first part reaches the gateway before the second request is even sent.
    tokio::time::sleep(Duration::from_millis(100)).await;

    let (two, _c2) = h.send(request()).await;
    assert_eq!(next(&mut seen).await, Seen::Held(1));
    assert_eq!(two.status(), 503);
    assert_eq!(two.headers()["retry-after"], "1");
    let error = json_body(two).await;
    assert_eq!(error["error"]["code"], "overloaded", "{error}");
    let message = error["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("response_body_memory ({POOL} bytes)")),
        "{message}"
    );
    assert_eq!(
        next(&mut seen).await,
        Seen::Closed(1),
        "the refused answer's upstream call was cancelled"
    );

    gate.add_permits(1);
    let (resp, _c1) = one.await.unwrap();
    assert_eq!(resp.status(), 200);
    check(&json_body(resp).await);

    // The memory came back: a third answer as large is served.
    gate.add_permits(10);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (resp, _c) = h.send(request()).await;
        if resp.status() == 200 {
            check(&json_body(resp).await);
            break;
        }
        assert!(
            resp.status() == 503 && Instant::now() < deadline,
            "{}",
            resp.status()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let route = if model == "watched" {
        "watched"
    } else {
        "plain"
    };
    h.wait_requests(route, 3.0).await;
    assert_eq!(
        h.metric(&format!(
            "hourglass_cancellations_total{{origin=\"overloaded\",route=\"{route}\"}}"
        ))
        .await,
        1.0
    );
}

const SSE_HEAD: &str =
    "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n";

/// A document rebuilt from a stream (`stream_upstream`) takes from the memory as its text
/// grows.
#[tokio::test]
async fn assembled_answers_share_the_response_body_memory() {
    let (first, rest) = stream_answer();
    the_second_answer_past_the_memory_is_refused("watched", SSE_HEAD, first, rest, |doc| {
        let content = doc["choices"][0]["message"]["content"].as_str().unwrap();
        assert_eq!(content.len(), SIZE);
        assert_eq!(doc["choices"][0]["finish_reason"], "stop");
    })
    .await;
}

/// A reload that changes `response_body_memory` resizes the one memory answers share, as
/// `request_body_memory`'s: the answers held keep their shares and count against the new
/// limit (a new memory beside the old would let a second answer in).
#[tokio::test]
async fn a_reload_resizes_the_answers_memory_and_keeps_what_is_held() {
    let (first, rest) = stream_answer();
    let (upstream, gate, mut seen) = held_upstream(SSE_HEAD, first, rest).await;
    let h = Harness::with_config(&config_of(upstream, 2 * POOL)).await;
    let addr = h.addr();
    let one = tokio::spawn(async move { Conn::open(addr).await.send(chat("watched", &[])).await });
    assert_eq!(next(&mut seen).await, Seen::Held(0));
    tokio::time::sleep(Duration::from_millis(100)).await;

    let reload = hourglass::config::Config::from_toml(&config_of(upstream, POOL), "test.toml");
    h.gw.apply(reload.unwrap()).await.unwrap();
    let (two, _c2) = h.send(chat("watched", &[])).await;
    assert_eq!(two.status(), 503);
    let error = json_body(two).await;
    let message = error["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("response_body_memory ({POOL} bytes)")),
        "{message}"
    );
    gate.add_permits(10);
    let (resp, _c1) = one.await.unwrap();
    assert_eq!(resp.status(), 200);
}

/// An answer streamed as two parts: its text of `SIZE` bytes in one event, then its end.
fn stream_answer() -> (Vec<u8>, Vec<u8>) {
    let chunk = |delta: &str, finish: &str| {
        format!(
            "data: {{\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\
             \"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":{delta},\
             \"finish_reason\":{finish}}}]}}\n\n"
        )
    };
    let first = chunk(
        &format!(
            "{{\"role\":\"assistant\",\"content\":\"{}\"}}",
            "x".repeat(SIZE)
        ),
        "null",
    );
    let rest = chunk("{}", "\"stop\"")
        + "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\
           \"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":1,\
           \"completion_tokens\":2,\"total_tokens\":3}}\n\ndata: [DONE]\n\n";
    (first.into_bytes(), rest.into_bytes())
}

/// A 2xx JSON document, read whole before its head goes out, takes from the memory as it
/// is read.
#[tokio::test]
async fn documents_read_whole_share_the_response_body_memory() {
    let doc = format!(
        "{{\"id\":\"c1\",\"object\":\"chat.completion\",\"created\":1,\"model\":\"m\",\
         \"choices\":[{{\"index\":0,\"message\":{{\"role\":\"assistant\",\"content\":\"{}\"}},\
         \"finish_reason\":\"stop\"}}],\"usage\":{{\"prompt_tokens\":1,\
         \"completion_tokens\":2,\"total_tokens\":3}}}}",
        "x".repeat(SIZE)
    );
    let head: &'static str = Box::leak(
        format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n\
             content-length: {}\r\n\r\n",
            doc.len()
        )
        .into_boxed_str(),
    );
    let (first, rest) = doc.as_bytes().split_at(doc.len() - 10);
    the_second_answer_past_the_memory_is_refused(
        "plain",
        head,
        first.to_vec(),
        rest.to_vec(),
        |doc| {
            let content = doc["choices"][0]["message"]["content"].as_str().unwrap();
            assert_eq!(content.len(), SIZE);
        },
    )
    .await;
}

/// The copy of a provider's answer kept while a later attempt runs (SC 2) takes its bytes
/// from the memory too. With the memory full (a document of 1,000,000 bytes read whole holds
/// all 16 granules), none is kept, and the chain ends in the gateway's own error, as before
/// SC 2; once the document is written, the provider's 429 passes through again. The copy
/// was outside the bound: up to 64 KiB a request, while the later attempt ran (audit VA 2).
#[tokio::test]
async fn a_kept_answer_takes_from_the_response_body_memory() {
    let limited = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let limited_addr = limited.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = limited.accept().await {
            tokio::spawn(async move {
                read_request(&mut s).await;
                let body =
                    r#"{"error":{"message":"Rate limit reached","code":"rate_limit_exceeded"}}"#;
                let answer = format!(
                    "HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\n\
                     retry-after: 3\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = s.write_all(answer.as_bytes()).await;
            });
        }
    });
    let (_refusing, refused) = refused_addr();
    let doc = format!(
        "{{\"id\":\"c1\",\"object\":\"chat.completion\",\"created\":1,\"model\":\"m\",\
         \"choices\":[{{\"index\":0,\"message\":{{\"role\":\"assistant\",\"content\":\"{}\"}},\
         \"finish_reason\":\"stop\"}}]}}",
        "x".repeat(1_000_000)
    );
    let head: &'static str = Box::leak(
        format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n\
             content-length: {}\r\n\r\n",
            doc.len()
        )
        .into_boxed_str(),
    );
    let (first, rest) = doc.as_bytes().split_at(1_000_000);
    let (upstream, gate, mut seen) = held_upstream(head, first.to_vec(), rest.to_vec()).await;
    let config = format!(
        "{}\n[upstreams.limited]\nurl = \"http://{limited_addr}\"\nauth = \"none\"\n\n\
         [upstreams.refused]\nurl = \"http://{refused}\"\nauth = \"none\"\n\n\
         [[routes]]\nname = \"limited\"\npath_prefix = \"/v1/chat/completions\"\n\
         models = [\"limited\"]\nupstream = \"limited\"\nfallbacks = [\"refused\"]\n",
        config(upstream)
    );
    let h = Harness::with_config(&config).await;
    let addr = h.addr();
    let filler = tokio::spawn(async move { Conn::open(addr).await.send(chat("plain", &[])).await });
    assert_eq!(next(&mut seen).await, Seen::Held(0));
    // Its first part reaches the gateway, and fills the memory, before the next request.
    tokio::time::sleep(Duration::from_millis(200)).await;

    let (resp, _c) = h.send(chat("limited", &[])).await;
    assert_eq!(
        resp.status(),
        502,
        "no room for the copy: the gateway's own error"
    );
    let error = json_body(resp).await;
    assert_eq!(error["error"]["code"], "upstream_unavailable", "{error}");

    gate.add_permits(1);
    let (resp, _c1) = filler.await.unwrap();
    assert_eq!(resp.status(), 200);
    json_body(resp).await;
    // The document's bytes came back: the copy is kept, and the provider's answer passes.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (resp, _c) = h.send(chat("limited", &[])).await;
        if resp.status() == 429 {
            assert_eq!(resp.headers()["retry-after"], "3");
            let error = json_body(resp).await;
            assert_eq!(error["error"]["code"], "rate_limit_exceeded", "{error}");
            break;
        }
        assert!(
            resp.status() == 502 && Instant::now() < deadline,
            "{}",
            resp.status()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
