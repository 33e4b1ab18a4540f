//! A usage no answer can have (audit WD 1): a count past 64 bits, or one near it, is read as
//! the gateway's cap for one answer, so the token counters only go up.

use super::*;
use hourglass::provider::inspect::MAX_REPORTED_TOKENS;
use tokio::io::AsyncWriteExt;

/// An upstream that answers its n-th call with a Chat document reporting `usages[n]` (the
/// last one again once they run out), one call a connection.
async fn reporting(usages: &[&str]) -> Harness {
    let answers: Vec<Vec<u8>> = usages
        .iter()
        .map(|usage| {
            let body = format!(
                r#"{{"id":"c","object":"chat.completion","model":"gpt-test","choices":[{{"index":0,"message":{{"role":"assistant","content":"hi"}},"finish_reason":"stop"}}],"usage":{usage}}}"#
            );
            format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            )
            .into_bytes()
        })
        .collect();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let up = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut n = 0;
        while let Ok((mut s, _)) = listener.accept().await {
            let answer = answers[n.min(answers.len() - 1)].clone();
            n += 1;
            tokio::spawn(async move {
                read_request(&mut s).await;
                let _ = s.write_all(&answer).await;
            });
        }
    });
    Harness::with_config(&BASE.replace("{FAKE}", &format!("http://{up}"))).await
}

/// Before: a `completion_tokens` of 1e23 was read as u64::MAX and added to an `AtomicU64`,
/// which wraps: after an answer of 18 tokens the counter went to 17, then 16, which
/// Prometheus reads as resets and a spike of 1.8e19 tokens each. Two counts whose sum passes
/// 2^64 (a prompt's parts) did the same.
#[tokio::test]
async fn an_absurd_reported_usage_never_takes_a_token_counter_down() {
    for absurd in [
        r#"{"prompt_tokens":5,"completion_tokens":99999999999999999999999}"#,
        r#"{"prompt_tokens":18446744073709551615,"completion_tokens":18446744073709551615}"#,
    ] {
        let h = reporting(&[r#"{"prompt_tokens":5,"completion_tokens":18}"#, absurd]).await;
        let mut last = (0.0, 0.0);
        for i in 1..=3u64 {
            let (resp, _c) = h.send(chat_request(&[], false)).await;
            assert_eq!(resp.status(), 200);
            read_body(resp.into_body()).await;
            h.wait_requests("chat", i as f64).await;
            let now = (
                h.metric(&tokens("chat", "completion", "reported")).await,
                h.metric(&tokens("chat", "prompt", "reported")).await,
            );
            assert!(
                now.0 > last.0 && now.1 > last.1,
                "{absurd}: call {i} took a counter down: {last:?} -> {now:?}"
            );
            last = now;
        }
        // Each absurd answer counted the cap, whatever it reported (exact in an f64).
        let cap = MAX_REPORTED_TOKENS as f64;
        assert_eq!(last.0, 18.0 + 2.0 * cap, "{absurd}");
    }
}
