//! A first-token or idle limit noticed late, the runtime stalled past it while the upstream's
//! frame waited for its connection task: one look more before it fires (audit ID 1).

use super::*;

/// The runtime stalls past a limit (a stopped or throttled gateway) while the upstream's
/// frame waits for its connection task's next turn: `go` lets that task run, after the
/// clock has jumped past the limit in one step and before the watchdog is polled again.
async fn stalled_past(b: &mut TestBody, tx: Sender, chunk: &'static str, stall: Duration) {
    assert!(futures_poll_once(b).await.is_none(), "nothing came yet");
    let (go, wait) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        let mut tx = tx;
        if wait.await.is_ok() {
            let _ = tx.send_data(Bytes::from_static(chunk.as_bytes())).await;
        }
        // Held open, as an upstream still streaming is.
        tokio::time::sleep(Duration::from_secs(3600)).await;
        drop(tx);
    });
    tokio::time::advance(stall).await;
    go.send(()).unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_first_token_limit_checked_late_gives_the_waiting_token_a_turn() {
    let (tx, mut b, probe) = body(true, limits(1000, 2000, 60_000));
    let start = Instant::now();
    stalled_past(&mut b, tx, "data: a\n\n", ms(4000)).await;
    let f = b.frame().await.expect("a frame").expect("not an error");
    assert_eq!(f.into_data().unwrap(), "data: a\n\n");
    let seen = probe.0.lock().unwrap();
    assert_eq!(seen.end, None, "no limit fired");
    assert_eq!(seen.first_token, Some(start + ms(4000)));
}

#[tokio::test(start_paused = true)]
async fn an_idle_limit_checked_late_gives_the_waiting_event_a_turn() {
    let (mut tx, mut b, probe) = body(true, limits(1000, 2000, 60_000));
    tx.send_data(Bytes::from_static(b"data: 1\n\n"))
        .await
        .unwrap();
    assert!(b.frame().await.unwrap().is_ok());
    stalled_past(&mut b, tx, "data: 2\n\n", ms(3000)).await;
    let f = b.frame().await.expect("a frame").expect("not an error");
    assert_eq!(f.into_data().unwrap(), "data: 2\n\n");
    assert_eq!(probe.0.lock().unwrap().end, None, "no limit fired");
}

#[tokio::test(start_paused = true)]
async fn a_limit_checked_late_still_fires_when_nothing_was_waiting() {
    let (tx, mut b, probe) = body(true, limits(1000, 2000, 60_000));
    let start = Instant::now();
    assert!(futures_poll_once(&mut b).await.is_none());
    tokio::time::advance(ms(4000)).await;
    let (out, err) = drain(&mut b).await;
    assert!(err.is_none());
    assert!(String::from_utf8(out)
        .unwrap()
        .contains("\"code\":\"first_token_timeout\""));
    assert_eq!(
        probe.0.lock().unwrap().end.as_deref(),
        Some("first_token_timeout")
    );
    // After one short look at what the upstream sent, never later.
    assert_eq!(
        Instant::now() - start,
        ms(4000) + crate::stream::timer::RECHECK
    );
    drop(tx);
}

#[tokio::test(start_paused = true)]
async fn a_deadline_checked_late_fires_at_once() {
    let (tx, mut b, probe) = body(true, limits(1000, 2000, 3000));
    let start = Instant::now();
    stalled_past(&mut b, tx, "data: a\n\n", ms(4000)).await;
    let (out, _) = drain(&mut b).await;
    assert!(String::from_utf8(out)
        .unwrap()
        .contains("\"code\":\"deadline_exceeded\""));
    assert_eq!(Instant::now() - start, ms(4000));
    assert_eq!(
        probe.0.lock().unwrap().end.as_deref(),
        Some("deadline_exceeded")
    );
}
