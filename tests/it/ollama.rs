//! Ollama's NDJSON answers (`application/x-ndjson`, `/api/chat`, `/api/generate`): the line
//! whose `done` is `true` ends the answer (break audit YB 3).

use std::net::SocketAddr;
use std::time::Duration;

use crate::support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

const LINES: &str = concat!(
    "{\"model\":\"m\",\"message\":{\"role\":\"assistant\",\"content\":\"Hi\"},\"done\":false}\n",
    "{\"model\":\"m\",\"message\":{\"role\":\"assistant\",\"tool_calls\":[{\"function\":{\"name\":\"f\",\"arguments\":{\"done\":true}}}]},\"done\":false}\n",
    "{\"model\":\"m\",\"message\":{\"role\":\"assistant\",\"content\":\"\"},\"done_reason\":\"stop\",\"done\":true,\"eval_count\":2}\n",
);

/// An upstream that answers one request with `lines` (one HTTP/1.1 chunk each) and then
/// holds its connection open, never ending the body; the receiver is told when the gateway
/// closed that connection.
async fn ollama_upstream(
    lines: &[&'static str],
) -> (SocketAddr, tokio::sync::oneshot::Receiver<()>) {
    let lines = lines.to_vec();
    let (closed, closed_rx) = tokio::sync::oneshot::channel();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        s.set_nodelay(true).unwrap();
        read_request(&mut s).await;
        let head = "HTTP/1.1 200 OK\r\ncontent-type: application/x-ndjson\r\ntransfer-encoding: chunked\r\n\r\n";
        s.write_all(head.as_bytes()).await.unwrap();
        for line in lines {
            tokio::time::sleep(Duration::from_millis(20)).await;
            let frame = format!("{:x}\r\n{line}\r\n", line.len());
            s.write_all(frame.as_bytes()).await.unwrap();
        }
        let mut buf = [0u8; 64];
        // Silent for a minute; a read that ends is the gateway's close.
        if let Ok(Ok(0)) = tokio::time::timeout(Duration::from_secs(60), s.read(&mut buf)).await {
            let _ = closed.send(());
        }
    });
    (addr, closed_rx)
}

fn chat() -> http::Request<http_body_util::Full<bytes::Bytes>> {
    http::Request::post("/api/chat")
        .header("host", "gateway")
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::from_static(
            br#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#,
        )))
        .unwrap()
}

async fn gateway(up: SocketAddr) -> Harness {
    let toml = BASE.replace("{FAKE}", &format!("http://{up}"))
        + "\n[[routes]]\nname = \"ollama\"\npath_prefix = \"/api/\"\nupstream = \"fake\"\n";
    Harness::with_config(&toml).await
}

/// After the `"done": true` line the answer is whole: an upstream that then holds its
/// connection open (no end of body) no longer has the idle limit append an error line to a
/// whole answer (which ollama-python raised after the answer was complete). The stream ends
/// cleanly with that line, logged `ok`, and the upstream's connection is closed; a `done`
/// nested in a tool call's arguments ends nothing.
#[tokio::test]
async fn an_ndjson_answer_ends_at_its_done_line() {
    let lines: Vec<&'static str> = LINES.split_inclusive('\n').collect();
    let (up, closed) = ollama_upstream(&lines).await;
    let h = gateway(up).await;
    let (resp, _c) = h.send(chat()).await;
    assert_eq!(resp.status(), 200);
    let read = read_body(resp.into_body()).await;
    assert_eq!(read.error, None);
    assert_eq!(
        read.text(),
        LINES,
        "the answer whole, no error line after it"
    );
    h.wait_requests("ollama", 1.0).await;
    let outcome = |o: &str| format!("hourglass_requests_total{{outcome=\"{o}\",route=\"ollama\"}}");
    assert_eq!(h.metric(&outcome("ok")).await, 1.0);
    assert_eq!(h.metric(&outcome("cancelled")).await, 0.0);
    tokio::time::timeout(Duration::from_secs(10), closed)
        .await
        .expect("the upstream's connection closed")
        .expect("closed, not dropped");
}

/// A stream that stalls before its `done` line is still cut with the error line (WB 7).
#[tokio::test]
async fn an_ndjson_answer_without_its_done_line_is_still_cut() {
    let lines: Vec<&'static str> = LINES.split_inclusive('\n').take(2).collect();
    let (up, _closed) = ollama_upstream(&lines).await;
    let h = gateway(up).await;
    let (resp, _c) = h.send(chat()).await;
    let read = read_body(resp.into_body()).await;
    let text = read.text();
    let rest = text
        .strip_prefix(&lines.concat())
        .unwrap_or_else(|| panic!("{text:?}"));
    let v: serde_json::Value = serde_json::from_str(rest.trim_end()).unwrap();
    assert_eq!(v["code"], "idle_timeout", "{v}");
}
