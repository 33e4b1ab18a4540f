//! The client's side of a stream: its announced read timeout (`client_silence`), which only
//! bytes handed to it restart, and the count of what was handed (the access line's size).

use super::*;

/// Route limits of 5 s, and a client that announced it waits 900 ms for any byte.
fn patient() -> StreamLimits {
    let mut l = limits(5_000, 5_000, 60_000);
    l.client_silence = Some(ms(900));
    l
}

/// Feeds `script` through a body with [`patient`] limits: what the client got, how long the
/// stream took, and how it ended.
async fn patiently(script: Vec<(u64, &'static str)>) -> (String, Duration, Option<String>) {
    let (tx, mut b, probe) = body(true, patient());
    let start = Instant::now();
    let t = feeder(tx, script);
    let (out, _) = drain(&mut b).await;
    let end = probe.0.lock().unwrap().end.clone();
    t.abort();
    (String::from_utf8(out).unwrap(), start.elapsed(), end)
}

/// A client that announced its read timeout sits through any silence in which bytes reach
/// it: keep-alives the upstream sends restart its reads, so they do not cut a stream whose
/// route limits are longer (a reasoning model's pings for 3 s under a 1 s read timeout came
/// through whole only without the gateway, audit N). A silence with no byte at all is cut
/// before the client's timeout, before the first token and after it, and says how long.
#[tokio::test(start_paused = true)]
async fn keep_alives_restart_the_clients_reads_but_not_the_routes_limits() {
    let (tx, mut b, probe) = body(true, patient());
    let mut script = vec![(500, ": keep-alive\n\n"); 6];
    script.extend([(500, "event: ping\ndata: {}\n\n"), (500, "data: 1\n\n")]);
    script.extend(vec![(500, ": keep-alive\n\n"); 6]);
    script.push((500, "data: 2\n\n"));
    let t = feeder(tx, script);
    tokio::spawn(async move { drop(t.await) });
    let (out, err) = drain(&mut b).await;
    assert!(err.is_none(), "{err:?}");
    assert!(out.ends_with(b"data: 1\n\n: keep-alive\n\n: keep-alive\n\n: keep-alive\n\n: keep-alive\n\n: keep-alive\n\n: keep-alive\n\ndata: 2\n\n"));
    assert_eq!(probe.0.lock().unwrap().end.as_deref(), Some("complete"));

    // Silent before the first token: cut at the client's 900 ms, not the route's 5 s.
    let (text, took, end) =
        patiently(vec![(400, ": keep-alive\n\n"), (2_000, "data: 1\n\n")]).await;
    assert!(text.starts_with(": keep-alive\n\nevent: error\n"), "{text}");
    assert!(text.contains("within 900ms"), "{text}");
    assert_eq!(took, ms(1_300));
    assert_eq!(end.as_deref(), Some("first_token_timeout"));

    // Silent after it: the idle limit's error, after the client's 900 ms.
    let (text, took, end) = patiently(vec![(100, "data: 1\n\n"), (3_000, "data: 2\n\n")]).await;
    assert!(text.starts_with("data: 1\n\nevent: error\n"), "{text}");
    assert!(
        text.contains("reached the client for 900ms: the client's SDK stops waiting then"),
        "{text}"
    );
    assert_eq!(took, ms(1_000));
    assert_eq!(end.as_deref(), Some("idle_timeout"));

    // Keep-alives alone never satisfy the route's first-token limit.
    let (text, took, end) = patiently(vec![(500, ": keep-alive\n\n"); 20]).await;
    assert!(
        text.contains("within 5000ms") || text.contains("within 5s"),
        "{text}"
    );
    assert_eq!(took, ms(5_000));
    assert_eq!(end.as_deref(), Some("first_token_timeout"));
}

/// The bytes of a half event the gateway holds reach no client: a trickle of them is silence
/// to a client with a read timeout, cut before it times out blind, as a silent upstream is. A
/// frame restarted the client's reads as it came in, held or not: an event written a byte
/// every 50 ms kept the gateway from ever speaking up, and the SDK's own timeout fired
/// (audit CB).
#[tokio::test(start_paused = true)]
async fn a_half_event_trickling_in_is_silence_to_the_client() {
    let trickle = |first: Vec<(u64, &'static str)>| {
        let mut script = first;
        script.push((50, "data: {\"slow\":"));
        script.extend(vec![(50, "x"); 100]);
        script
    };

    // After the first token: the idle error, 900 ms after the last byte that went out.
    let (text, took, end) = patiently(trickle(vec![(100, "data: 1\n\n")])).await;
    assert!(text.starts_with("data: 1\n\nevent: error\n"), "{text}");
    // Not "silent": the upstream was sending, a half event no one got (audit CE).
    assert!(
        text.contains(r#"no whole event from upstream \"up\" reached the client for 900ms"#),
        "{text}"
    );
    assert_eq!(took, ms(1_000));
    assert_eq!(end.as_deref(), Some("idle_timeout"));

    // Before it: the head was the last the client heard.
    let (text, took, end) = patiently(trickle(Vec::new())).await;
    assert!(text.starts_with("event: error\n"), "{text}");
    assert!(text.contains("within 900ms"), "{text}");
    assert_eq!(took, ms(900));
    assert_eq!(end.as_deref(), Some("first_token_timeout"));
}

/// What the observer is told was handed to the client is the client's body, byte for byte,
/// while `data` goes on counting the upstream's as it came (the log's `bytes`): the held
/// bytes a cut or the answer's end drops were counted as sent, and the access line's size
/// said more than the client got (audit CB).
#[tokio::test(start_paused = true)]
async fn what_is_handed_out_is_the_clients_body_not_what_came() {
    let half = "data: {\"half\":";
    let cases: [(&str, Vec<&'static str>, bool); 4] = [
        ("half event, idle cut", vec!["data: a\n\n", half], false),
        (
            "two data lines, no blank line, idle cut",
            vec!["data: a\n\n", "data: {\"x\":\ndata: 1}\n"],
            false,
        ),
        (
            "a whole answer, then [DONE] without its blank line",
            vec![CONTENT, FINISHED, "data: [DONE]\n"],
            true,
        ),
        ("nothing held", vec![CONTENT, FINISHED, DONE], true),
    ];
    for (case, frames, ends) in cases {
        let (mut tx, mut b, probe) = chat_body(limits(1000, 100, 10_000));
        let came: usize = frames.iter().map(|f| f.len()).sum();
        for f in frames {
            tx.send_data(Bytes::from_static(f.as_bytes()))
                .await
                .unwrap();
        }
        if ends {
            drop(tx);
            let (out, err) = drain(&mut b).await;
            assert!(err.is_none(), "{case}: {err:?}");
            drop(b);
            let seen = probe.0.lock().unwrap();
            assert_eq!(seen.sent, out.len(), "{case}");
            assert_eq!(seen.bytes, came, "{case}");
        } else {
            let (out, _) = drain(&mut b).await;
            let text = String::from_utf8(out).unwrap();
            assert!(
                text.starts_with("data: a\n\nevent: error\n"),
                "{case}: {text}"
            );
            drop(b);
            let seen = probe.0.lock().unwrap();
            assert_eq!(seen.sent, text.len(), "{case}");
            // The upstream's bytes and the gateway's own error event.
            let own = text.len() - "data: a\n\n".len();
            assert_eq!(seen.bytes, came + own, "{case}");
            drop(tx);
        }
    }
}
