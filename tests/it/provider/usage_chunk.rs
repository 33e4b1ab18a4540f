//! The usage chunk `include_usage = true` asks an OpenAI Chat stream for (audit UC 3): read
//! for the token counts, and left out of the stream of a client that did not ask for it
//! (whose loop may read `choices[0]` of every chunk); passed to one that did.

use std::net::SocketAddr;
use std::time::Duration;

use crate::support::*;
use bytes::Bytes;
use http::Request;
use http_body_util::Full;

use super::{post, tokens, STREAM_BODY};

const ASKED: &str =
    r#"{"model":"m","stream":true,"messages":[],"stream_options":{"include_usage":true}}"#;

const FIRST: &str = "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Hi\"},\"finish_reason\":null}],\"usage\":null}\n\n";
const LAST: &str = "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":null}\n\n";
const USAGE: &str = "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":3,\"total_tokens\":10}}\n\n";
const DONE: &str = "data: [DONE]\n\n";

/// An upstream that answers every request with an SSE stream written in `pieces`, each an
/// HTTP/1.1 chunk of its own, 30 ms apart.
async fn upstream(pieces: &[String]) -> SocketAddr {
    let mut answer = vec![(
        Duration::ZERO,
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n"
            .to_vec(),
    )];
    for piece in pieces {
        let chunk = format!("{:x}\r\n{piece}\r\n", piece.len());
        answer.push((Duration::from_millis(30), chunk.into_bytes()));
    }
    answer.push((Duration::ZERO, b"0\r\n\r\n".to_vec()));
    raw_upstream(answer).await
}

async fn gateway(up: SocketAddr) -> Harness {
    let toml = BASE.replace("{FAKE}", &format!("http://{up}")).replace(
        "auth = \"bearer\"\n",
        "auth = \"bearer\"\ninclude_usage = true\n",
    );
    Harness::with_config(&toml).await
}

/// Streams `body` from the chat route, over HTTP/2 or HTTP/1.1: what the client got.
async fn stream(h: &Harness, body: &str, h2: bool, headers: &[(&str, &str)]) -> Read {
    let req: Request<Full<Bytes>> = post("/v1/chat/completions", body, headers);
    if h2 {
        let resp = h2_send(h.addr(), req).await.expect("an answer");
        assert_eq!(resp.status(), 200);
        read_body(resp.into_body()).await
    } else {
        let (resp, _c) = h.send(req).await;
        assert_eq!(resp.status(), 200);
        read_body(resp.into_body()).await
    }
}

/// The usage chunk, whole in a frame, after the last chunk of the answer in the same frame,
/// in a frame of its own, or cut across two or three frames, one of them shared with
/// `[DONE]`: the client gets every other byte as it came, and the usage is counted.
#[tokio::test]
async fn the_usage_chunk_the_gateway_asked_for_is_left_out() {
    let (u1, u2) = USAGE.split_at(20);
    let (u2a, u2b) = u2.split_at(30);
    let cuts: Vec<Vec<String>> = vec![
        vec![format!("{FIRST}{LAST}{USAGE}{DONE}")],
        vec![FIRST.into(), LAST.into(), USAGE.into(), DONE.into()],
        vec![FIRST.into(), format!("{LAST}{u1}"), format!("{u2}{DONE}")],
        vec![
            format!("{FIRST}{LAST}{u1}"),
            u2a.into(),
            format!("{u2b}{DONE}"),
        ],
        // A CRLF stream whose usage chunk's last CR ends a frame.
        vec![
            format!("{FIRST}{LAST}{}", USAGE.replace("\n\n", "\r\n\r")),
            format!("\n{DONE}"),
        ],
    ];
    for (i, pieces) in cuts.iter().enumerate() {
        for h2 in [false, true] {
            let h = gateway(upstream(pieces).await).await;
            let read = stream(&h, STREAM_BODY, h2, &[]).await;
            // The CRLF's LF in the next frame goes with the event too (audit VC 3).
            let want = format!("{FIRST}{LAST}{DONE}");
            assert_eq!(read.text(), want, "cut {i}, h2 {h2}");
            assert!(read.error.is_none());
            h.wait_requests("chat", 1.0).await;
            assert_eq!(h.metric(&tokens("chat", "prompt", "reported")).await, 7.0);
            assert_eq!(
                h.metric(&tokens("chat", "completion", "reported")).await,
                3.0,
                "cut {i}, h2 {h2}"
            );
        }
    }
}

/// A client that asked for the usage chunk gets it, and the stream byte for byte.
#[tokio::test]
async fn a_client_that_asked_gets_the_usage_chunk() {
    let whole = format!("{FIRST}{LAST}{USAGE}{DONE}");
    for h2 in [false, true] {
        let h = gateway(upstream(&[FIRST.into(), format!("{LAST}{USAGE}{DONE}")]).await).await;
        let read = stream(&h, ASKED, h2, &[]).await;
        assert_eq!(read.text(), whole, "h2 {h2}");
    }
}

/// With the fake provider (one frame an event): the chunks a client that did not ask gets
/// all have a choice, so `chunk.choices[0]` never fails; the `"usage": null` members the
/// request's `stream_options` brings stay. A client that asked gets the usage chunk.
#[tokio::test]
async fn every_chunk_has_a_choice_unless_the_client_asked() {
    let h = Harness::with_config(&BASE.replace(
        "auth = \"bearer\"\n",
        "auth = \"bearer\"\ninclude_usage = true\n",
    ))
    .await;
    for h2 in [false, true] {
        let read = stream(&h, STREAM_BODY, h2, &[("x-fake-chunks", "3")]).await;
        let chunks: Vec<serde_json::Value> = read
            .data_lines()
            .iter()
            .filter(|d| *d != "[DONE]")
            .map(|d| serde_json::from_str(d).unwrap())
            .collect();
        assert!(chunks.len() >= 4, "{}", read.text());
        for c in &chunks {
            assert!(c["choices"][0].is_object(), "{c}");
            assert!(c["usage"].is_null());
        }
        assert_eq!(read.data_lines().last().unwrap(), "[DONE]");
        let read = stream(&h, ASKED, h2, &[("x-fake-chunks", "3")]).await;
        let lines = read.data_lines();
        let usage: serde_json::Value = serde_json::from_str(&lines[lines.len() - 2]).unwrap();
        assert_eq!(usage["choices"], serde_json::json!([]));
        assert!(usage["usage"]["completion_tokens"].is_u64());
    }
    h.wait_requests("chat", 4.0).await;
    assert!(h.metric(&tokens("chat", "completion", "reported")).await > 0.0);
}
