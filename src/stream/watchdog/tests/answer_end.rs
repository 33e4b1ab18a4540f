//! The answer's end: after its final event, a silent upstream, the upstream's own end within
//! the grace, a client that leaves, and a limit or failure each end it whole, with no error
//! event.

use super::*;

/// Each format's answer, ending with the event after which nothing of it follows.
fn whole_answers() -> [(crate::provider::Format, &'static str); 3] {
    use crate::provider::Format;
    [
        (
            Format::Chat,
            concat!(
                "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n",
                "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
                "data: [DONE]\n\n",
            ),
        ),
        (
            Format::Messages,
            concat!(
                "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,",
                "\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n",
                "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
            ),
        ),
        (
            Format::Responses,
            concat!(
                "event: response.output_text.delta\n",
                "data: {\"type\":\"response.output_text.delta\",\"delta\":\"Hi\"}\n\n",
                "event: response.completed\n",
                "data: {\"type\":\"response.completed\",",
                "\"response\":{\"status\":\"completed\"}}\n\n",
            ),
        ),
    ]
}

/// Once the event that ends the answer has gone out, an upstream that neither ends its body
/// nor says more is waited for only `END_GRACE`, not the idle limit: the stream then ends
/// as whole as it is, with no error after it, and the upstream is let go.
#[tokio::test(start_paused = true)]
async fn after_its_final_event_a_silent_upstream_ends_the_stream_cleanly() {
    for (format, answer) in whole_answers() {
        let (mut tx, mut b, probe) = format_body(format, limits(1000, 3000, 60_000));
        tx.send_data(Bytes::from_static(answer.as_bytes()))
            .await
            .unwrap();
        let start = Instant::now();
        let (out, err) = drain(&mut b).await;
        assert_eq!(
            (out.as_slice(), err),
            (answer.as_bytes(), None),
            "{format:?}"
        );
        assert_eq!(Instant::now() - start, END_GRACE, "{format:?}");
        assert_eq!(
            probe.0.lock().unwrap().end.as_deref(),
            Some("complete"),
            "{format:?}"
        );
        assert!(
            tx.send_data(Bytes::from_static(b": late\n\n"))
                .await
                .is_err(),
            "{format:?}: the upstream body was dropped"
        );
    }
}

/// The upstream's own end, when it comes within the grace, ends the stream as always: the
/// body is read to its end (an HTTP/1.1 connection goes back to the pool).
#[tokio::test(start_paused = true)]
async fn after_its_final_event_the_upstreams_end_within_the_grace_ends_the_stream() {
    let (tx, mut b, probe) = chat_body(limits(1000, 3000, 60_000));
    let t = feeder(tx, vec![(0, CONTENT), (0, DONE)]);
    let ended = END_GRACE / 2;
    tokio::spawn(async move {
        let tx = t.await.unwrap();
        tokio::time::sleep(ended).await;
        drop(tx);
    });
    let start = Instant::now();
    let (out, err) = drain(&mut b).await;
    assert_eq!(out, [CONTENT, DONE].concat().as_bytes());
    assert!(err.is_none());
    assert_eq!(Instant::now() - start, ended);
    assert_eq!(probe.0.lock().unwrap().end.as_deref(), Some("complete"));
}

/// Polls the body as hyper does, until it waits: the frames that were ready.
async fn take_ready(b: &mut TestBody) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        match std::future::poll_fn(|cx| Poll::Ready(b.as_mut().poll_frame(cx))).await {
            Poll::Ready(Some(Ok(f))) => out.extend_from_slice(&f.into_data().unwrap()),
            Poll::Pending => return out,
            Poll::Ready(other) => panic!("the body ended: {other:?}"),
        }
    }
}

/// Audit XA 1: a client that leaves once it has the answer's end (`[DONE]`, or every
/// choice's finish reason), while the rest of the stream is still waited for (the upstream's
/// framing, a usage chunk), had the answer whole: its leaving cancels nothing, and the
/// upstream is let go as ever. One that leaves before the answer ended cancelled it.
#[tokio::test(start_paused = true)]
async fn a_client_that_leaves_after_the_answer_ended_had_it_whole() {
    for (pieces, end) in [
        (&[CONTENT, FINISHED, DONE][..], Some("complete")),
        (
            &[CONTENT, FINISHED][..],
            Some("complete after client_closed"),
        ),
        (&[CONTENT][..], None),
    ] {
        let (mut tx, mut b, probe) = chat_body(limits(1000, 3000, 60_000));
        for piece in pieces {
            tx.send_data(Bytes::from_static(piece.as_bytes()))
                .await
                .unwrap();
        }
        assert_eq!(take_ready(&mut b).await, pieces.concat().as_bytes());
        drop(b);
        {
            let seen = probe.0.lock().unwrap();
            assert_eq!(seen.end.as_deref(), end, "{pieces:?}");
            assert!(!seen.undelivered, "{pieces:?}");
        }
        assert!(
            tx.send_data(Bytes::from_static(b": late\n\n"))
                .await
                .is_err(),
            "{pieces:?}: the upstream body was dropped"
        );
    }
}

/// The same over HTTP/2, where h2 may still hold what was handed over (audit KC 1): the
/// answer's end goes out as a last byte of its own, though the upstream's framing has not
/// ended, and the client had it only once the body was asked for a frame after it.
#[tokio::test(start_paused = true)]
async fn over_http2_a_client_leaving_after_the_answer_ended_had_it_once_its_end_was_taken() {
    let answer = [CONTENT, FINISHED, DONE].concat();
    for asked_again in [true, false] {
        let (mut tx, mut b, probe) = chat_body(limits(1000, 3000, 60_000));
        b.confirm_delivery();
        tx.send_data(Bytes::from(answer.clone())).await.unwrap();
        let first = b.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(first, &answer.as_bytes()[..answer.len() - 1]);
        let last = b.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(last, &answer.as_bytes()[answer.len() - 1..]);
        if asked_again {
            assert!(take_ready(&mut b).await.is_empty());
        }
        drop(b);
        let seen = probe.0.lock().unwrap();
        assert_eq!(seen.end.as_deref(), Some("complete"));
        assert_eq!(seen.sent, answer.len());
        assert_eq!(seen.undelivered, !asked_again);
        drop(seen);
        drop(tx);
    }
}

/// A Chat answer whose every choice has its finish reason has ended (a stream that stopped
/// there would be whole), though a usage chunk and `[DONE]` may still come: the idle limit
/// still waits for them, but what ends the stream then adds no error to a whole answer.
#[tokio::test(start_paused = true)]
async fn a_limit_or_a_failure_after_the_answer_ended_adds_no_error_event() {
    let (mut tx, mut b, probe) = chat_body(limits(1000, 300, 60_000));
    for piece in [CONTENT, FINISHED] {
        tx.send_data(Bytes::from_static(piece.as_bytes()))
            .await
            .unwrap();
    }
    let start = Instant::now();
    let (out, err) = drain(&mut b).await;
    assert_eq!(out, [CONTENT, FINISHED].concat().as_bytes());
    assert!(err.is_none());
    assert_eq!(
        Instant::now() - start,
        ms(300),
        "the idle limit, not the grace"
    );
    // Counted whole, and the log says what ended it (audit V).
    assert_eq!(
        probe.0.lock().unwrap().end.as_deref(),
        Some("complete after idle_timeout")
    );

    // A reset after `[DONE]`, with half an event after it: the half event never goes out.
    let (mut tx, mut b, probe) = chat_body(limits(1000, 300, 60_000));
    for piece in [CONTENT, DONE, "data: {\"late"] {
        tx.send_data(Bytes::from_static(piece.as_bytes()))
            .await
            .unwrap();
    }
    tx.abort(std::io::Error::other("connection reset"));
    let (out, err) = drain(&mut b).await;
    assert_eq!(out, [CONTENT, DONE].concat().as_bytes());
    assert!(err.is_none());
    assert_eq!(probe.0.lock().unwrap().end.as_deref(), Some("complete"));

    // The same half event at the body's end.
    let (mut tx, mut b, probe) = chat_body(limits(1000, 300, 60_000));
    for piece in [CONTENT, DONE, "data: {\"late"] {
        tx.send_data(Bytes::from_static(piece.as_bytes()))
            .await
            .unwrap();
    }
    drop(tx);
    let (out, err) = drain(&mut b).await;
    assert_eq!(out, [CONTENT, DONE].concat().as_bytes());
    assert!(err.is_none());
    assert_eq!(probe.0.lock().unwrap().end.as_deref(), Some("complete"));
}
