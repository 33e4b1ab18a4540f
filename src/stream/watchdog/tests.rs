use super::*;
use std::sync::Arc;
use std::time::Duration;

use crate::provider::inspect::Tokens;
use http_body_util::{BodyExt, Channel};
use std::sync::Mutex;

#[derive(Default, Debug)]
struct Seen {
    first_token: Option<Instant>,
    bytes: usize,
    /// What was handed to the client.
    sent: usize,
    end: Option<String>,
    dropped: bool,
    tokens: Option<Tokens>,
    undelivered: bool,
}

#[derive(Clone, Default)]
struct Probe(Arc<Mutex<Seen>>);

impl Observer for Probe {
    fn first_token(&mut self, at: Instant) {
        self.0.lock().unwrap().first_token.get_or_insert(at);
    }
    fn data(&mut self, len: usize) {
        self.0.lock().unwrap().bytes += len;
    }
    fn handed(&mut self, len: usize) {
        self.0.lock().unwrap().sent += len;
    }
    fn undelivered(&mut self) {
        self.0.lock().unwrap().undelivered = true;
    }
    fn tokens(&mut self, tokens: Tokens) {
        let mut seen = self.0.lock().unwrap();
        assert!(seen.tokens.is_none(), "tokens told twice");
        seen.tokens = Some(tokens);
    }

    fn finish(&mut self, end: StreamEnd) {
        let s = match end {
            StreamEnd::Complete => "complete".to_string(),
            StreamEnd::WholeThen(code) => format!("complete after {code}"),
            StreamEnd::Cut(e) => e.code().to_string(),
            StreamEnd::UpstreamErrorEvent => "upstream_error_event".to_string(),
            StreamEnd::SendTimeout => "send_timeout".to_string(),
        };
        let mut seen = self.0.lock().unwrap();
        assert!(seen.end.is_none(), "finish called twice");
        seen.end = Some(s);
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        if let Ok(mut s) = self.0.lock() {
            s.dropped = true;
        }
    }
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn limits(first: u64, idle: u64, total: u64) -> StreamLimits {
    let now = Instant::now();
    StreamLimits {
        first_token_deadline: now + ms(first),
        first_token_timeout: ms(first),
        first_token_patience: false,
        idle_timeout: ms(idle),
        client_silence: None,
        deadline: now + ms(total),
        budget: ms(total),
        reserve: Duration::ZERO,
        client_budget: false,
        patience: false,
        upstream: Arc::from("up"),
        run: None,
        run_tokens: None,
        connection: None,
    }
}

type Sender = http_body_util::channel::Sender<Bytes, std::io::Error>;
type TestBody = Pin<Box<WatchdogBody<Channel<Bytes, std::io::Error>, Probe>>>;

fn body(sse: bool, l: StreamLimits) -> (Sender, TestBody, Probe) {
    let (tx, rx) = Channel::<Bytes, std::io::Error>::new(64);
    let probe = Probe::default();
    (
        tx,
        Box::pin(WatchdogBody::new(rx, sse, l, probe.clone())),
        probe,
    )
}

/// Collects frames until the body ends; returns the data and whether it ended in an error.
async fn drain<B: Body<Data = Bytes, Error = BoxError> + Unpin>(
    b: &mut B,
) -> (Vec<u8>, Option<String>) {
    let mut out = Vec::new();
    while let Some(f) = b.frame().await {
        match f {
            Ok(f) => out.extend_from_slice(&f.into_data().unwrap_or_default()),
            Err(e) => return (out, Some(e.to_string())),
        }
    }
    (out, None)
}

fn feeder(mut tx: Sender, script: Vec<(u64, &'static str)>) -> tokio::task::JoinHandle<Sender> {
    tokio::spawn(async move {
        for (delay, chunk) in script {
            tokio::time::sleep(ms(delay)).await;
            if tx
                .send_data(Bytes::from_static(chunk.as_bytes()))
                .await
                .is_err()
            {
                break;
            }
        }
        tx
    })
}

#[tokio::test(start_paused = true)]
async fn passes_complete_events_and_ends_cleanly() {
    let (tx, mut b, probe) = body(true, limits(1000, 1000, 10_000));
    let start = Instant::now();
    let t = feeder(
        tx,
        vec![(10, "data: a\n\n"), (10, "data: b\n\ndata: c\n\n")],
    );
    // The feeder's sender is dropped when it is done: the body's clean end.
    tokio::spawn(async move { drop(t.await) });
    let (out, err) = drain(&mut b).await;
    assert_eq!(out, b"data: a\n\ndata: b\n\ndata: c\n\n");
    assert!(err.is_none());
    let seen = probe.0.lock().unwrap();
    assert_eq!(seen.end.as_deref(), Some("complete"));
    assert_eq!(seen.first_token, Some(start + ms(10)));
    assert_eq!(seen.bytes, out.len());
}

#[tokio::test(start_paused = true)]
async fn first_token_limit_fires_and_says_so() {
    let (tx, mut b, probe) = body(true, limits(500, 1000, 10_000));
    // Keep-alives are not tokens: they are forwarded but do not satisfy the limit.
    let t = feeder(
        tx,
        vec![(100, ": ping\n\n"), (100, "event: ping\ndata: {}\n\n")],
    );
    let start = Instant::now();
    let (out, err) = drain(&mut b).await;
    assert!(err.is_none(), "SSE ends cleanly with an event");
    assert_eq!(Instant::now() - start, ms(500));
    let text = String::from_utf8(out).unwrap();
    assert!(
        text.starts_with(": ping\n\nevent: ping\ndata: {}\n\nevent: error\ndata: "),
        "{text}"
    );
    assert!(text.contains("\"code\":\"first_token_timeout\""));
    assert_eq!(
        probe.0.lock().unwrap().end.as_deref(),
        Some("first_token_timeout")
    );
    assert!(probe.0.lock().unwrap().first_token.is_none());
    // The upstream body was dropped when the limit fired, not later.
    let mut tx = t.await.unwrap();
    assert!(tx.send_data(Bytes::from_static(b"x")).await.is_err());
}

#[tokio::test(start_paused = true)]
async fn idle_limit_counts_only_data_events_and_drops_partial_event() {
    let (tx, mut b, probe) = body(true, limits(1000, 300, 10_000));
    let t = feeder(
        tx,
        vec![
            (10, "data: 1\n\n"),
            (200, "data: 2\n\n"),
            (200, ": keep-alive\n\n"),
            (50, "data: partial-with"),
        ],
    );
    let start = Instant::now();
    let (out, err) = drain(&mut b).await;
    assert!(err.is_none());
    // Last progress at 210 ms; keep-alive at 410 does not move the idle limit.
    assert_eq!(Instant::now() - start, ms(510));
    let text = String::from_utf8(out).unwrap();
    assert!(!text.contains("partial"), "{text}");
    assert!(
        text.starts_with("data: 1\n\ndata: 2\n\n: keep-alive\n\nevent: error\n"),
        "{text}"
    );
    assert!(text.contains("\"code\":\"idle_timeout\""));
    assert_eq!(probe.0.lock().unwrap().end.as_deref(), Some("idle_timeout"));
    drop(t);
}

#[tokio::test(start_paused = true)]
async fn total_deadline_beats_a_trickle() {
    let (tx, mut b, probe) = body(true, limits(1000, 1000, 2000));
    let script = (0..100).map(|_| (150, "data: t\n\n")).collect();
    let t = feeder(tx, script);
    let start = Instant::now();
    let (out, _) = drain(&mut b).await;
    assert_eq!(Instant::now() - start, ms(2000));
    let text = String::from_utf8(out).unwrap();
    assert!(text.ends_with("\n\n"));
    assert!(text.contains("\"code\":\"deadline_exceeded\""));
    assert_eq!(text.matches("event: error").count(), 1);
    assert_eq!(
        probe.0.lock().unwrap().end.as_deref(),
        Some("deadline_exceeded")
    );
    drop(t);
}

#[tokio::test(start_paused = true)]
async fn partial_events_are_held_until_complete() {
    let (mut tx, mut b, _probe) = body(true, limits(1000, 1000, 10_000));
    tx.send_data(Bytes::from_static(b"data: one\n\ndata: tw"))
        .await
        .unwrap();
    let f = b.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(&f[..], b"data: one\n\n");
    // Nothing more is ready: the partial event is held.
    assert!(futures_poll_once(&mut b).await.is_none());
    tx.send_data(Bytes::from_static(b"o\n\ndata: thr"))
        .await
        .unwrap();
    let a = b.frame().await.unwrap().unwrap().into_data().unwrap();
    let c = b.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!([&a[..], &c[..]].concat(), b"data: two\n\n");
}

async fn futures_poll_once<B: Body + Unpin>(b: &mut B) -> Option<()> {
    std::future::poll_fn(|cx| match Pin::new(&mut *b).poll_frame(cx) {
        Poll::Pending => Poll::Ready(None),
        Poll::Ready(_) => Poll::Ready(Some(())),
    })
    .await
}

#[tokio::test(start_paused = true)]
async fn upstream_error_event_passes_through_and_ends() {
    let (tx, mut b, probe) = body(true, limits(1000, 1000, 10_000));
    let t = feeder(
        tx,
        vec![(
            5,
            "data: a\n\nevent: error\ndata: {\"type\":\"error\"}\n\ndata: never\n\n",
        )],
    );
    let (out, err) = drain(&mut b).await;
    assert!(err.is_none());
    assert_eq!(
        out,
        b"data: a\n\nevent: error\ndata: {\"type\":\"error\"}\n\n"
    );
    assert_eq!(
        probe.0.lock().unwrap().end.as_deref(),
        Some("upstream_error_event")
    );
    drop(t);
}

#[tokio::test(start_paused = true)]
async fn an_error_event_cut_inside_its_crlf_keeps_its_lf_however_it_is_framed() {
    // Both readers: the scanner knows `event: error`, the inspector a data-only error.
    for chat in [false, true] {
        let l = limits(1000, 1000, 10_000);
        let (tx, mut b, probe) = if chat { chat_body(l) } else { body(true, l) };
        let head = if chat {
            "data: a\r\n\r\ndata: {\"error\":{\"type\":\"server_error\"}}\r\n\r"
        } else {
            "data: a\r\n\r\nevent: error\r\ndata: {}\r\n\r"
        };
        let t = feeder(tx, vec![(5, head), (5, "\ndata: never\r\n\r\n")]);
        let (out, err) = drain(&mut b).await;
        assert!(err.is_none());
        assert_eq!(out, format!("{head}\n").as_bytes(), "chat {chat}");
        assert_eq!(
            probe.0.lock().unwrap().end.as_deref(),
            Some("upstream_error_event")
        );
        drop(t);
    }
}

#[tokio::test(start_paused = true)]
async fn an_error_event_ending_in_a_cr_before_silence_gets_no_second_error() {
    // The event went out whole at once; the stream ends a moment later (END_GRACE: the
    // byte after the CR, an LF or not, is worth that wait, not the idle limit's), without
    // an event of Hourglass's own after the upstream's.
    let (tx, mut b, probe) = body(true, limits(1000, 20_000, 60_000));
    let head = "data: a\n\nevent: error\ndata: {}\n\r";
    let t = feeder(tx, vec![(5, head)]);
    let first = b.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(first, head.as_bytes());
    let start = Instant::now();
    let (out, err) = drain(&mut b).await;
    assert_eq!((out.as_slice(), err), (&b""[..], None));
    assert_eq!(Instant::now() - start, END_GRACE);
    assert_eq!(
        probe.0.lock().unwrap().end.as_deref(),
        Some("upstream_error_event")
    );
    // A body that ends instead ends it at once, the same way.
    let (tx, mut b, probe) = body(true, limits(1000, 300, 10_000));
    let t2 = feeder(tx, vec![(5, head)]);
    tokio::spawn(async move { drop(t2.await) });
    let start = Instant::now();
    let (out, _) = drain(&mut b).await;
    assert_eq!(out, head.as_bytes());
    assert_eq!(Instant::now() - start, ms(5));
    assert_eq!(
        probe.0.lock().unwrap().end.as_deref(),
        Some("upstream_error_event")
    );
    drop(t);
}

#[tokio::test(start_paused = true)]
async fn upstream_failure_mid_sse_becomes_error_event() {
    let (mut tx, mut b, probe) = body(true, limits(1000, 1000, 10_000));
    tx.send_data(Bytes::from_static(b"data: a\n\ndata: half"))
        .await
        .unwrap();
    tx.abort(std::io::Error::other("connection reset"));
    let (out, err) = drain(&mut b).await;
    assert!(err.is_none());
    let text = String::from_utf8(out).unwrap();
    assert!(text.starts_with("data: a\n\nevent: error\n"), "{text}");
    assert!(text.contains("\"code\":\"upstream_error\""));
    let seen = probe.0.lock().unwrap();
    assert_eq!(seen.end.as_deref(), Some("upstream_error"));
    // What came from the upstream (the half event too), and the error event written after.
    let event = text.len() - "data: a\n\n".len();
    assert_eq!(seen.bytes, "data: a\n\ndata: half".len() + event);
}

#[tokio::test(start_paused = true)]
async fn non_sse_body_is_aborted_not_truncated() {
    let (tx, mut b, probe) = body(false, limits(1000, 200, 10_000));
    let t = feeder(tx, vec![(10, "{\"partial\":")]);
    let (out, err) = drain(&mut b).await;
    assert_eq!(out, b"{\"partial\":");
    assert!(err.unwrap().contains("silent for 200ms"));
    assert_eq!(probe.0.lock().unwrap().end.as_deref(), Some("idle_timeout"));
    drop(t);
}

#[tokio::test(start_paused = true)]
async fn a_body_that_knows_its_end_completes_on_its_last_byte() {
    // Like a content-length response: hyper stops polling after the last byte.
    let inner = http_body_util::Full::new(Bytes::from_static(b"{\"ok\":true}"));
    let probe = Probe::default();
    let mut b = Box::pin(WatchdogBody::new(
        inner,
        false,
        limits(1000, 1000, 10_000),
        probe.clone(),
    ));
    let f = b.frame().await.unwrap().unwrap();
    assert_eq!(f.into_data().unwrap(), &b"{\"ok\":true}"[..]);
    assert!(b.is_end_stream());
    drop(b);
    assert_eq!(probe.0.lock().unwrap().end.as_deref(), Some("complete"));
}

/// Audit KC 1: over HTTP/2 the answer's last byte goes out as a frame of its own, and the
/// body ends only when asked for a frame after it (hyper asks once h2 has taken it). Dropped
/// before then (the connection ended with the end unsent), the answer was not delivered.
#[tokio::test(start_paused = true)]
async fn a_confirmed_answer_ends_only_when_asked_again_after_its_last_byte() {
    let doc = Bytes::from_static(b"{\"ok\":true}");
    for asked_again in [true, false] {
        let probe = Probe::default();
        let inner = http_body_util::Full::new(doc.clone());
        let mut b = Box::pin(WatchdogBody::new(
            inner,
            false,
            limits(1000, 1000, 10_000),
            probe.clone(),
        ));
        b.confirm_delivery();
        let first = b.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(first, doc.slice(..doc.len() - 1));
        assert!(!b.is_end_stream(), "its last byte is still to come");
        let last = b.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(last, doc.slice(doc.len() - 1..));
        assert!(!b.is_end_stream(), "not over before it is asked again");
        if asked_again {
            assert!(b.frame().await.is_none());
            assert!(b.is_end_stream());
        }
        drop(b);
        let seen = probe.0.lock().unwrap();
        assert_eq!(seen.end.as_deref(), Some("complete"));
        assert_eq!(seen.sent, doc.len());
        assert_eq!(seen.undelivered, !asked_again);
    }
}

#[tokio::test(start_paused = true)]
async fn shutdown_cuts_a_silent_stream_with_its_own_event() {
    let (mut tx, rx) = Channel::<Bytes, std::io::Error>::new(64);
    let probe = Probe::default();
    let token = crate::stream::signal::Signal::new();
    let mut body = WatchdogBody::new(rx, true, limits(1000, 5000, 10_000), probe.clone());
    body.watch_shutdown(&token);
    let mut b = Box::pin(body);
    tx.send_data(Bytes::from_static(b"data: a\n\n"))
        .await
        .unwrap();
    let first = b.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(&first[..], b"data: a\n\n");
    let t = token.clone();
    tokio::spawn(async move {
        tokio::time::sleep(ms(100)).await;
        t.fire();
    });
    let (out, err) = drain(&mut b).await;
    assert!(err.is_none());
    let text = String::from_utf8(out).unwrap();
    assert!(text.starts_with("event: error\n"), "{text}");
    assert!(text.contains("\"code\":\"shutdown\""));
    assert_eq!(probe.0.lock().unwrap().end.as_deref(), Some("shutdown"));
    drop(tx);
}

#[tokio::test(start_paused = true)]
async fn an_sse_body_that_knows_its_end_completes_on_its_last_event() {
    // An SSE answer framed by content-length: hyper stops polling after the last byte,
    // which here ends exactly on an event boundary (the fast path).
    let inner = http_body_util::Full::new(Bytes::from_static(b"data: a\n\ndata: [DONE]\n\n"));
    let probe = Probe::default();
    let mut b = Box::pin(WatchdogBody::new(
        inner,
        true,
        limits(1000, 1000, 10_000),
        probe.clone(),
    ));
    let f = b.frame().await.unwrap().unwrap();
    assert_eq!(f.into_data().unwrap(), &b"data: a\n\ndata: [DONE]\n\n"[..]);
    assert!(b.is_end_stream());
    drop(b);
    assert_eq!(probe.0.lock().unwrap().end.as_deref(), Some("complete"));
}

#[tokio::test(start_paused = true)]
async fn dropping_the_body_is_a_client_cancel() {
    let (mut tx, b, probe) = body(true, limits(1000, 1000, 10_000));
    drop(b);
    {
        let s = probe.0.lock().unwrap();
        assert!(
            s.end.is_none(),
            "no end recorded: the record calls it a client cancel"
        );
        assert!(s.dropped);
    }
    assert!(tx.send_data(Bytes::from_static(b"x")).await.is_err());
}

/// A client that takes nothing for `send_timeout`: its upstream goes, and the stream was ended
/// by `send_timeout`, whether the client reads again (and finds it aborted) or leaves without
/// (the usual end; audit EA 4 saw that counted as the client's leaving).
#[tokio::test(start_paused = true)]
async fn a_client_that_stalls_for_send_timeout_is_ended_by_it() {
    for reads_again in [true, false] {
        let send_timeout = ms(400);
        let (mut tx, rx) = Channel::<Bytes, std::io::Error>::new(4);
        let reaper =
            crate::stream::reaper::Reaper::new(send_timeout, crate::stream::signal::Signal::new());
        let reapable = reaper.guard(rx, None::<()>, Instant::now() + ms(60_000), None, None);
        let reaped = reapable.reaped_by();
        let probe = Probe::default();
        let mut b = Box::pin(WatchdogBody::new(
            reapable,
            true,
            limits(1000, 1000, 60_000),
            probe.clone(),
        ));
        b.watch_reaper(reaped);
        tx.send_data(Bytes::from_static(b"data: a\n\n"))
            .await
            .unwrap();
        assert_eq!(
            &b.frame().await.unwrap().unwrap().into_data().unwrap()[..],
            b"data: a\n\n"
        );
        // The client takes nothing more; well within the idle limit, the upstream goes.
        tokio::time::sleep(send_timeout * 2).await;
        assert!(
            tx.send_data(Bytes::from_static(b"data: b\n\n"))
                .await
                .is_err(),
            "upstream dropped"
        );
        if reads_again {
            // It finds the stream aborted, with no error event and no end of its own.
            let err = b.frame().await.unwrap().unwrap_err();
            assert!(err.to_string().contains("send_timeout"), "{err}");
            // hyper resets an HTTP/2 stream with the code among the error's sources: CANCEL,
            // a deliberate end, not INTERNAL_ERROR.
            let code = std::error::Error::source(&*err)
                .and_then(|s| s.downcast_ref::<h2::Error>())
                .and_then(h2::Error::reason);
            assert_eq!(code, Some(h2::Reason::CANCEL));
            assert!(b.frame().await.is_none());
        }
        drop(b);
        let s = probe.0.lock().unwrap();
        assert_eq!(
            s.end.as_deref(),
            Some("send_timeout"),
            "reads again: {reads_again}"
        );
        assert!(s.dropped);
    }
}

/// A client that stops reading past the deadline, whose upstream the reaper then ended, and
/// that leaves without reading again: the deadline ended the stream, not the client.
#[tokio::test(start_paused = true)]
async fn a_client_that_leaves_after_the_reaper_took_its_upstream_at_the_deadline_counts_as_the_deadline(
) {
    let (mut tx, rx) = Channel::<Bytes, std::io::Error>::new(4);
    let reaper =
        crate::stream::reaper::Reaper::new(ms(60_000), crate::stream::signal::Signal::new());
    let l = limits(1000, 1000, 500);
    let reapable = reaper.guard(rx, None::<()>, l.deadline, None, None);
    let reaped = reapable.reaped_by();
    let probe = Probe::default();
    let mut b = Box::pin(WatchdogBody::new(reapable, true, l, probe.clone()));
    b.watch_reaper(reaped);
    tx.send_data(Bytes::from_static(b"data: a\n\n"))
        .await
        .unwrap();
    b.frame().await.unwrap().unwrap();
    // Not polled again: only the reaper can see the deadline pass.
    tokio::time::sleep(ms(600)).await;
    assert!(
        tx.send_data(Bytes::from_static(b"data: b\n\n"))
            .await
            .is_err(),
        "upstream dropped at the deadline"
    );
    assert!(probe.0.lock().unwrap().end.is_none(), "not reported yet");
    drop(b);
    let s = probe.0.lock().unwrap();
    assert_eq!(s.end.as_deref(), Some("deadline_exceeded"));
    assert!(s.dropped);
}

/// Audit AD 2: a client not reading at the shutdown's cut, whose upstream the reaper then
/// ended, counts as the shutdown whether it leaves without reading again or reads again (and
/// then gets the `shutdown` event), not as leaving.
#[tokio::test(start_paused = true)]
async fn a_stream_the_reaper_took_at_the_cut_counts_as_the_shutdown() {
    for reads_again in [false, true] {
        let (mut tx, rx) = Channel::<Bytes, std::io::Error>::new(4);
        let cut = crate::stream::signal::Signal::new();
        let reaper = crate::stream::reaper::Reaper::new(ms(60_000), cut.clone());
        let l = limits(1000, 1000, 5000);
        let reapable = reaper.guard(rx, None::<()>, l.deadline, None, None);
        let reaped = reapable.reaped_by();
        let probe = Probe::default();
        let mut b = Box::pin(WatchdogBody::new(reapable, true, l, probe.clone()));
        b.watch_reaper(reaped);
        tx.send_data(Bytes::from_static(b"data: a\n\n"))
            .await
            .unwrap();
        b.frame().await.unwrap().unwrap();
        // Not polled again: only the reaper sees the cut.
        cut.fire();
        tokio::time::sleep(ms(10)).await;
        assert!(
            tx.send_data(Bytes::from_static(b"data: b\n\n"))
                .await
                .is_err(),
            "upstream dropped at the cut"
        );
        if reads_again {
            let event = b.frame().await.unwrap().unwrap().into_data().unwrap();
            let event = String::from_utf8_lossy(&event).into_owned();
            assert!(event.contains("\"code\":\"shutdown\""), "{event}");
        }
        drop(b);
        let s = probe.0.lock().unwrap();
        assert_eq!(
            s.end.as_deref(),
            Some("shutdown"),
            "reads again: {reads_again}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn oversized_event_is_forwarded_as_it_comes() {
    let (mut tx, mut b, _probe) = body(true, limits(1000, 1000, 10_000));
    let big = Bytes::from(vec![b'x'; MAX_HELD_EVENT + 1]);
    tx.send_data(Bytes::from_static(b"data: ")).await.unwrap();
    tx.send_data(big).await.unwrap();
    let a = b.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(&a[..], b"data: ");
}

/// Past the limit, the rest of the event is not held again until another MiB (or its end)
/// has come: each piece goes on as it arrives.
#[tokio::test(start_paused = true)]
async fn the_rest_of_an_oversized_event_is_not_held_again() {
    let (mut tx, mut b, _probe) = body(true, limits(1000, 1000, 10_000));
    tx.send_data(Bytes::from_static(b"data: ")).await.unwrap();
    tx.send_data(Bytes::from(vec![b'x'; MAX_HELD_EVENT + 1]))
        .await
        .unwrap();
    let mut out = 0;
    while out < 6 + MAX_HELD_EVENT + 1 {
        out += b.frame().await.unwrap().unwrap().into_data().unwrap().len();
    }
    tx.send_data(Bytes::from_static(b"yyyy")).await.unwrap();
    let next = b.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(&next[..], b"yyyy");
    tx.send_data(Bytes::from_static(b"zz\n\ndata: a"))
        .await
        .unwrap();
    let end = b.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(&end[..], b"zz\n\n", "the next event is held as any other");
}

#[tokio::test(start_paused = true)]
async fn a_limit_after_part_of_an_oversized_event_went_out_still_gives_a_parseable_error() {
    let (mut tx, mut b, probe) = body(true, limits(1000, 1000, 10_000));
    tx.send_data(Bytes::from_static(b"data: ")).await.unwrap();
    tx.send_data(Bytes::from(vec![b'x'; MAX_HELD_EVENT + 1]))
        .await
        .unwrap();
    // The event never ends; the first-token limit fires.
    let (out, err) = drain(&mut b).await;
    assert!(err.is_none());
    let text = String::from_utf8(out).unwrap();
    assert!(text.starts_with("data: xxx"));
    let (partial, error) = text.split_once("\n\n").expect("the open event is ended");
    assert_eq!(partial.len(), 6 + MAX_HELD_EVENT + 1);
    assert!(error.starts_with("event: error\ndata: "), "{error}");
    assert!(error.contains("first_token_timeout"));
    assert_eq!(
        probe.0.lock().unwrap().end.as_deref(),
        Some("first_token_timeout")
    );
    drop(tx);
}

#[tokio::test(start_paused = true)]
async fn a_held_partial_event_is_dropped_without_an_extra_blank_line() {
    let (mut tx, mut b, _probe) = body(true, limits(1000, 1000, 10_000));
    tx.send_data(Bytes::from_static(b"data: a\n\ndata: par"))
        .await
        .unwrap();
    let (out, _) = drain(&mut b).await;
    let text = String::from_utf8(out).unwrap();
    assert!(text.starts_with("data: a\n\nevent: error\n"), "{text}");
    drop(tx);
}

fn chat_body(l: StreamLimits) -> (Sender, TestBody, Probe) {
    let (tx, rx) = Channel::<Bytes, std::io::Error>::new(64);
    let probe = Probe::default();
    let inspector = Inspector::new(crate::provider::Format::Chat, true);
    let body = WatchdogBody::new(rx, true, l, probe.clone()).with_inspector(Some(inspector));
    (tx, Box::pin(body), probe)
}

const ROLE: &str =
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n";
const CONTENT: &str = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello\"}}]}\n\n";

#[tokio::test(start_paused = true)]
async fn with_a_known_format_the_first_token_is_the_first_output() {
    // The role preamble comes at once, the first content after 300 ms: that is the first
    // token, and the idle limit (100 ms) does not apply before it.
    let (tx, mut b, probe) = chat_body(limits(500, 100, 10_000));
    let start = Instant::now();
    let t = feeder(
        tx,
        vec![(10, ROLE), (290, CONTENT), (50, "data: [DONE]\n\n")],
    );
    tokio::spawn(async move { drop(t.await) });
    let (out, err) = drain(&mut b).await;
    assert!(err.is_none());
    assert_eq!(out, [ROLE, CONTENT, "data: [DONE]\n\n"].concat().as_bytes());
    drop(b);
    let seen = probe.0.lock().unwrap();
    assert_eq!(seen.end.as_deref(), Some("complete"));
    assert_eq!(seen.first_token, Some(start + ms(300)));
    let tokens = seen.tokens.expect("told on drop");
    assert_eq!((tokens.output_events, tokens.completion), (1, None));
}

#[tokio::test(start_paused = true)]
async fn a_preamble_alone_does_not_satisfy_the_first_token_limit() {
    let (tx, mut b, probe) = chat_body(limits(500, 100, 10_000));
    let t = feeder(tx, vec![(10, ROLE)]);
    let start = Instant::now();
    let (out, _) = drain(&mut b).await;
    assert_eq!(Instant::now() - start, ms(500));
    let text = String::from_utf8(out).unwrap();
    assert!(text.starts_with(ROLE), "{text}");
    assert!(text.contains("\"code\":\"first_token_timeout\""));
    assert_eq!(
        probe.0.lock().unwrap().end.as_deref(),
        Some("first_token_timeout")
    );
    drop(t);
}

#[tokio::test(start_paused = true)]
async fn after_the_first_token_any_data_event_moves_the_idle_limit() {
    let (tx, mut b, probe) = chat_body(limits(500, 100, 10_000));
    // Content, then non-output events 80 ms apart (each within the idle limit).
    let t = feeder(tx, vec![(10, CONTENT), (80, ROLE), (80, ROLE), (80, ROLE)]);
    let start = Instant::now();
    let (_, _) = drain(&mut b).await;
    assert_eq!(
        Instant::now() - start,
        ms(350),
        "idle counted from the last event"
    );
    assert_eq!(probe.0.lock().unwrap().end.as_deref(), Some("idle_timeout"));
    drop(t);
}

#[tokio::test(start_paused = true)]
async fn an_openai_error_data_event_ends_the_stream_like_an_error_event() {
    let (tx, mut b, probe) = chat_body(limits(1000, 1000, 10_000));
    let error = "data: {\"error\":{\"message\":\"m\",\"type\":\"server_error\"}}\n\n";
    let chunk: &'static str =
        Box::leak(format!("{CONTENT}{error}data: never\n\n").into_boxed_str());
    let t = feeder(tx, vec![(5, chunk)]);
    let (out, err) = drain(&mut b).await;
    assert!(err.is_none());
    assert_eq!(
        out,
        [CONTENT, error].concat().as_bytes(),
        "nothing added, nothing after"
    );
    drop(b);
    let seen = probe.0.lock().unwrap();
    assert_eq!(seen.end.as_deref(), Some("upstream_error_event"));
    assert_eq!(
        seen.tokens.and_then(|t| t.error),
        Some(crate::provider::ErrorType::Server)
    );
    drop(t);
}

#[tokio::test(start_paused = true)]
async fn a_json_body_is_read_for_its_usage() {
    let (mut tx, rx) = Channel::<Bytes, std::io::Error>::new(64);
    let probe = Probe::default();
    let inspector = Inspector::new(crate::provider::Format::Messages, false);
    let mut b = Box::pin(
        WatchdogBody::new(rx, false, limits(1000, 1000, 10_000), probe.clone())
            .with_inspector(Some(inspector)),
    );
    for piece in [
        "{\"usage\":{\"input_",
        "tokens\":12,\"output_tokens\":3",
        "}}",
    ] {
        tx.send_data(Bytes::from_static(piece.as_bytes()))
            .await
            .unwrap();
    }
    drop(tx);
    drain(&mut b).await;
    drop(b);
    let t = probe.0.lock().unwrap().tokens.unwrap();
    assert_eq!((t.prompt(), t.completion), (Some(12), Some(3)));
}

/// Reads the body as hyper's servers do: data frames until the end, and after a trailers
/// frame nothing more (they write the trailers and drop the body without polling it again).
async fn drain_as_hyper<B: Body<Data = Bytes, Error = BoxError> + Unpin>(
    b: &mut B,
) -> (Vec<u8>, Option<http::HeaderMap>) {
    let mut out = Vec::new();
    while let Some(f) = b.frame().await {
        match f.expect("the body ends cleanly").into_data() {
            Ok(d) => out.extend_from_slice(&d),
            Err(f) => return (out, f.into_trailers().ok()),
        }
    }
    (out, None)
}

fn header_map(fields: &[(&'static str, &'static str)]) -> http::HeaderMap {
    fields
        .iter()
        .map(|&(k, v)| {
            (
                http::HeaderName::from_static(k),
                http::HeaderValue::from_static(v),
            )
        })
        .collect()
}

/// Trailers end a body as its end does, so they are no way past the check that the answer
/// ended: two events without a finish reason or `[DONE]` are an answer cut short.
#[tokio::test(start_paused = true)]
async fn trailers_after_an_answer_without_its_end_are_an_upstream_failure() {
    let (mut tx, mut b, probe) = chat_body(limits(1000, 1000, 10_000));
    for piece in [CONTENT, CONTENT] {
        tx.send_data(Bytes::from_static(piece.as_bytes()))
            .await
            .unwrap();
    }
    tx.send_trailers(header_map(&[("x-tr", "v1")]))
        .await
        .unwrap();
    drop(tx);
    let (out, trailers) = drain_as_hyper(&mut b).await;
    drop(b);
    let text = String::from_utf8(out).unwrap();
    assert!(
        text.starts_with(&format!("{CONTENT}{CONTENT}event: error\ndata: ")),
        "{text}"
    );
    assert!(text.contains(ENDED_SHORT), "{text}");
    assert!(
        trailers.is_none(),
        "the error event ends the body: {trailers:?}"
    );
    assert_eq!(
        probe.0.lock().unwrap().end.as_deref(),
        Some("upstream_error")
    );
}

/// A half event before the trailers is dropped, so the error event parses on its own.
#[tokio::test(start_paused = true)]
async fn a_half_event_before_trailers_is_dropped_before_the_error_event() {
    let (mut tx, mut b, probe) = chat_body(limits(1000, 1000, 10_000));
    for piece in [CONTENT, "data: {\"partial"] {
        tx.send_data(Bytes::from_static(piece.as_bytes()))
            .await
            .unwrap();
    }
    tx.send_trailers(header_map(&[("x-tr", "v1")]))
        .await
        .unwrap();
    drop(tx);
    let (out, trailers) = drain_as_hyper(&mut b).await;
    drop(b);
    let text = String::from_utf8(out).unwrap();
    assert!(
        text.starts_with(&format!("{CONTENT}event: error\ndata: ")),
        "{text}"
    );
    assert!(!text.contains("partial"), "{text}");
    assert!(trailers.is_none());
    assert_eq!(
        probe.0.lock().unwrap().end.as_deref(),
        Some("upstream_error")
    );
}

/// A complete answer keeps its trailers, after everything else, less the hop-by-hop fields
/// (HTTP/2 refuses to send a connection-specific field and would reset the stream); its end
/// is noted before they go, since hyper drops the body once it has them.
#[tokio::test(start_paused = true)]
async fn a_complete_answer_with_trailers_is_complete_and_keeps_them() {
    let (mut tx, mut b, probe) = chat_body(limits(1000, 1000, 10_000));
    for piece in [CONTENT, "data: [DO", "NE]\n\n"] {
        tx.send_data(Bytes::from_static(piece.as_bytes()))
            .await
            .unwrap();
    }
    tx.send_trailers(header_map(&[
        ("x-tr", "v1"),
        ("connection", "x-secret"),
        ("x-secret", "s"),
        ("transfer-encoding", "chunked"),
    ]))
    .await
    .unwrap();
    drop(tx);
    let (out, trailers) = drain_as_hyper(&mut b).await;
    drop(b);
    assert_eq!(out, [CONTENT, "data: [DONE]\n\n"].concat().as_bytes());
    assert_eq!(trailers, Some(header_map(&[("x-tr", "v1")])));
    assert_eq!(probe.0.lock().unwrap().end.as_deref(), Some("complete"));
}

/// The same for a body that is not SSE: its trailers end it, complete.
#[tokio::test(start_paused = true)]
async fn a_json_body_with_trailers_is_complete() {
    let (mut tx, mut b, probe) = body(false, limits(1000, 1000, 10_000));
    tx.send_data(Bytes::from_static(b"{\"ok\":true}"))
        .await
        .unwrap();
    tx.send_trailers(header_map(&[("x-tr", "v1")]))
        .await
        .unwrap();
    drop(tx);
    let (out, trailers) = drain_as_hyper(&mut b).await;
    drop(b);
    assert_eq!(out, b"{\"ok\":true}");
    assert_eq!(trailers, Some(header_map(&[("x-tr", "v1")])));
    assert_eq!(probe.0.lock().unwrap().end.as_deref(), Some("complete"));
}

fn format_body(format: crate::provider::Format, l: StreamLimits) -> (Sender, TestBody, Probe) {
    let (tx, rx) = Channel::<Bytes, std::io::Error>::new(64);
    let probe = Probe::default();
    let inspector = Inspector::new(format, true);
    let body = WatchdogBody::new(rx, true, l, probe.clone()).with_inspector(Some(inspector));
    (tx, Box::pin(body), probe)
}

const DONE: &str = "data: [DONE]\n\n";
const FINISHED: &str =
    "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n";

/// An event that came a byte per frame goes out as one frame, not a chunk per byte (about
/// six times its size in chunk framing), with what completed it; whole events in a frame
/// of their own go out as they came, uncopied.
#[tokio::test(start_paused = true)]
async fn an_event_held_in_many_pieces_goes_out_as_one_frame() {
    let (mut tx, mut b, _probe) = chat_body(limits(1000, 1000, 10_000));
    for byte in CONTENT.as_bytes()[..CONTENT.len() - 1].chunks(1) {
        tx.send_data(Bytes::copy_from_slice(byte)).await.unwrap();
    }
    tx.send_data(Bytes::from(format!("\n{CONTENT}")))
        .await
        .unwrap();
    let first = b.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(first, [CONTENT, CONTENT].concat().as_bytes());
    let whole = Bytes::from_static(CONTENT.as_bytes());
    tx.send_data(whole.clone()).await.unwrap();
    let next = b.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(next.as_ptr(), whole.as_ptr(), "a whole event is not copied");
    drop(tx);
}

/// A large event whose pieces are large goes out as they came: their framing is a small
/// part of them, and a copy would cost more.
#[tokio::test(start_paused = true)]
async fn a_large_event_in_pieces_goes_out_uncopied() {
    let (mut tx, mut b, _probe) = chat_body(limits(1000, 1000, 10_000));
    let pieces = [
        Bytes::from(format!("data: {{\"x\":\"{}", "a".repeat(JOIN_MAX))),
        Bytes::from("b".repeat(1000)),
        Bytes::from_static(b"\"}\n\n"),
    ];
    for piece in &pieces {
        tx.send_data(piece.clone()).await.unwrap();
    }
    for piece in &pieces {
        let got = b.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(got.as_ptr(), piece.as_ptr());
    }
    drop(tx);
}

/// A medium event (a few KiB, a `response.completed` or a tool call's chunk) that arrives
/// in a few segments goes out as they came: two or three chunk heads of a few bytes each are
/// not worth an allocation and a copy of kilobytes. Only pieces of a few bytes are joined.
#[tokio::test(start_paused = true)]
async fn a_medium_event_in_a_few_pieces_goes_out_uncopied() {
    let (mut tx, mut b, _probe) = chat_body(limits(1000, 1000, 10_000));
    let pieces = [
        Bytes::from(format!("data: {{\"x\":\"{}", "a".repeat(2000))),
        Bytes::from("b".repeat(2000)),
        Bytes::from(format!("{}\"}}\n\n", "c".repeat(2000))),
    ];
    for piece in &pieces {
        tx.send_data(piece.clone()).await.unwrap();
    }
    for piece in &pieces {
        let got = b.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(got.as_ptr(), piece.as_ptr());
    }
    drop(tx);
}

/// An event split in two, the usual split, goes out as its two pieces: joining them would
/// cost a copy to save one chunk's framing.
#[tokio::test(start_paused = true)]
async fn an_event_split_in_two_goes_out_uncopied() {
    let (mut tx, mut b, _probe) = chat_body(limits(1000, 1000, 10_000));
    let (head, tail) = (
        Bytes::from_static(&CONTENT.as_bytes()[..10]),
        Bytes::from_static(&CONTENT.as_bytes()[10..]),
    );
    tx.send_data(head.clone()).await.unwrap();
    tx.send_data(tail.clone()).await.unwrap();
    let first = b.frame().await.unwrap().unwrap().into_data().unwrap();
    let second = b.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(
        (first.as_ptr(), second.as_ptr()),
        (head.as_ptr(), tail.as_ptr())
    );
    assert_eq!([first, second].concat(), CONTENT.as_bytes());
    drop(tx);
}

/// The answer's end, and what may follow it.
mod answer_end;

/// The client's own read timeout, and what is handed to it.
mod client;

/// A limit noticed late, the gateway itself stalled (audit ID 1).
mod late;

/// The run's token limit: one stream's own allowance, and a run's streams together.
mod run_tokens;

/// Audit KE 3: a keep-alive is one whether it comes with its `event:` line or data only
/// (Anthropic's `{"type":"ping"}`, the Responses API's `{"type":"keepalive"}`): after the first
/// token neither moves the idle limit, so the stream is cut by it as with `event: ping`.
#[tokio::test(start_paused = true)]
async fn data_only_keep_alives_do_not_move_the_idle_limit() {
    use crate::provider::Format;
    let text = "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n";
    let delta = "data: {\"type\":\"response.output_text.delta\",\"delta\":\"Hi\"}\n\n";
    for (format, first, ping) in [
        (
            Format::Messages,
            text,
            "event: ping\ndata: {\"type\":\"ping\"}\n\n",
        ),
        (Format::Messages, text, "data: {\"type\":\"ping\"}\n\n"),
        (
            Format::Messages,
            text,
            "event: message\ndata: {\"type\": \"ping\"}\n\n",
        ),
        (
            Format::Responses,
            delta,
            "event: keepalive\ndata: {\"type\":\"keepalive\",\"sequence_number\":3}\n\n",
        ),
        (
            Format::Responses,
            delta,
            "data: {\"type\":\"keepalive\",\"sequence_number\":3}\n\n",
        ),
    ] {
        let (tx, mut b, probe) = format_body(format, limits(500, 100, 10_000));
        let mut script = vec![(10, first)];
        script.extend([(60, ping); 10]);
        let t = feeder(tx, script);
        let start = Instant::now();
        let (_, _) = drain(&mut b).await;
        assert_eq!(Instant::now() - start, ms(110), "{ping}");
        assert_eq!(
            probe.0.lock().unwrap().end.as_deref(),
            Some("idle_timeout"),
            "{ping}"
        );
        drop(t);
    }
}

/// Audit WB 6: a cut Gemini stream ends with one data-only event in Gemini's error shape
/// (google-genai parses every line but `data: ` as JSON), its numeric code the status.
#[tokio::test(start_paused = true)]
async fn a_cut_gemini_stream_gets_a_data_only_error_in_geminis_shape() {
    let (tx, rx) = Channel::<Bytes, std::io::Error>::new(64);
    let probe = Probe::default();
    let progress = Progress::new(true, None).gemini_errors(true);
    let mut b = Box::pin(WatchdogBody::reading(
        rx,
        progress,
        limits(1000, 300, 10_000),
        probe.clone(),
    ));
    let t = feeder(
        tx,
        vec![
            (10, "data: {\"candidates\":[]}\r\n\r\n"),
            (10, "data: {\"cand"),
        ],
    );
    let (out, err) = drain(&mut b).await;
    assert!(err.is_none());
    let text = String::from_utf8(out).unwrap();
    let event = text
        .strip_prefix("data: {\"candidates\":[]}\r\n\r\n")
        .unwrap();
    assert!(!event.contains("event:"), "{event}");
    let data = event
        .strip_prefix("data: ")
        .unwrap()
        .strip_suffix("\n\n")
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(data).unwrap();
    assert_eq!(v["error"]["code"], 504);
    assert_eq!(v["error"]["status"], "DEADLINE_EXCEEDED");
    assert_eq!(v["error"]["details"][0]["reason"], "idle_timeout");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("silent for 300ms"));
    assert_eq!(probe.0.lock().unwrap().end.as_deref(), Some("idle_timeout"));
    drop(t);
}

/// Audit WB 7: an NDJSON body holds a line incomplete at a frame's end until its newline
/// (nothing of it goes out before), and a cut drops it and ends the body cleanly with an
/// error line in Ollama's shape; a body that ends by itself sends a last line without its
/// newline as it came.
#[tokio::test(start_paused = true)]
async fn an_ndjson_body_holds_half_lines_and_ends_a_cut_with_an_error_line() {
    let (tx, mut b, probe) = body(false, limits(1000, 300, 10_000));
    b.ndjson_lines();
    let t = feeder(
        tx,
        vec![
            (10, "{\"n\":1}\n{\"n\""),
            (10, ":2}\n"),
            (10, "{\"n\":3,\"par"),
        ],
    );
    let (out, err) = drain(&mut b).await;
    assert!(err.is_none());
    let text = String::from_utf8(out).unwrap();
    let line = text.strip_prefix("{\"n\":1}\n{\"n\":2}\n").unwrap();
    let v: serde_json::Value = serde_json::from_str(line.strip_suffix('\n').unwrap()).unwrap();
    assert!(
        v["error"].as_str().unwrap().contains("silent for 300ms"),
        "{v}"
    );
    assert_eq!(
        (&v["code"], &v["type"]),
        (&"idle_timeout".into(), &"timeout_error".into())
    );
    assert_eq!(probe.0.lock().unwrap().end.as_deref(), Some("idle_timeout"));
    drop(t);

    let (tx, mut b, probe) = body(false, limits(1000, 300, 10_000));
    b.ndjson_lines();
    let t = feeder(tx, vec![(10, "{\"n\":1}\n{\"n\""), (10, ":2}")]);
    tokio::spawn(async move { drop(t.await) });
    let (out, err) = drain(&mut b).await;
    assert_eq!((out, err), (b"{\"n\":1}\n{\"n\":2}".to_vec(), None));
    assert_eq!(probe.0.lock().unwrap().end.as_deref(), Some("complete"));
}
