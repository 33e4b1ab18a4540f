//! The run's token limit as a stream meets it: a cut that saves what the answer would still
//! cost, never one after the answer ended, and a run's concurrent streams stopping together
//! near the limit (audit KE 1).

use super::*;

/// `l` in a run of 100 tokens that left this answer 50, its prompt estimated at 10.
fn with_run_tokens(mut l: StreamLimits) -> StreamLimits {
    l.run_tokens = Some(Box::new(crate::stream::limits::RunTokens {
        run: Arc::from("r"),
        limit: 100,
        allowance: 50,
        prompt_estimate: 10,
        live: None,
        added: 0,
    }));
    l
}

/// The run's token limit cuts a stream to save what it would still cost; the usage chunk
/// that follows a whole answer costs nothing more, and is no reason to turn it into an error.
#[tokio::test(start_paused = true)]
async fn a_usage_past_the_runs_tokens_after_the_answer_ended_cuts_nothing() {
    let l = with_run_tokens(limits(1000, 1000, 60_000));
    let usage =
        "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":90}}\n\n";
    let answer: &'static str =
        Box::leak(format!("{CONTENT}{FINISHED}{usage}{DONE}").into_boxed_str());
    let (tx, mut b, probe) = chat_body(l);
    let t = feeder(tx, vec![(0, CONTENT), (0, FINISHED), (0, usage), (0, DONE)]);
    tokio::spawn(async move { drop(t.await) });
    let (out, err) = drain(&mut b).await;
    assert_eq!((out.as_slice(), err), (answer.as_bytes(), None));
    assert_eq!(probe.0.lock().unwrap().end.as_deref(), Some("complete"));
}

/// A frame that carries the run's tokens past what the run left is cut after its whole
/// events: they came, they are paid for, and a frame that is ready wins over any limit (as
/// it does over the idle limit and the deadline). Before, the whole frame was dropped, so
/// the client's answer depended on how TCP had grouped the bytes, and its first token was
/// never recorded. The half event after them is not sent.
#[tokio::test(start_paused = true)]
async fn a_frame_past_the_runs_tokens_goes_out_whole_before_the_cut() {
    let l = with_run_tokens(limits(1000, 1000, 60_000));
    let event = format!(
        "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{}\"}}}}]}}\n\n",
        "abcd".repeat(10)
    );
    let whole = event.repeat(10);
    let frame = format!("{whole}data: {{\"cho");
    let (mut tx, mut b, probe) = chat_body(l);
    tx.send_data(Bytes::from(frame)).await.unwrap();
    let (out, err) = drain(&mut b).await;
    assert!(err.is_none());
    let out = String::from_utf8(out).unwrap();
    let (sent, error) = out.split_at(whole.len());
    assert_eq!(sent, whole, "every whole event of the frame");
    assert!(error.starts_with("event: error\n"), "{error}");
    assert!(error.contains("run_token_limit"), "{error}");
    let seen = probe.0.lock().unwrap();
    assert_eq!(seen.end.as_deref(), Some("run_token_limit"));
    assert!(seen.first_token.is_some(), "its first token is recorded");
}

/// Audit KE 1: two streams of one run, each under the run's limit alone and over it together
/// (each admitted when the run had all of it left: no `max_tokens`, the estimate reserved):
/// they read and add to the run's live count as they go, so together they stop near the
/// limit, and once they are gone the live count holds only what their calls' ends counted.
#[tokio::test(start_paused = true)]
async fn concurrent_streams_of_a_run_stop_together_near_its_limit() {
    let live = Arc::new(crate::runs::state::RunLive::default());
    let event: &'static str = Box::leak(
        format!(
            "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{}\"}}}}]}}\n\n",
            "abcd".repeat(100)
        )
        .into_boxed_str(),
    );
    let mut streams = Vec::new();
    for _ in 0..2 {
        let mut l = limits(1000, 1000, 60_000);
        l.run_tokens = Some(Box::new(crate::stream::limits::RunTokens {
            run: Arc::from("r"),
            limit: 1000,
            allowance: 1000,
            prompt_estimate: 10,
            live: Some(live.clone()),
            added: 0,
        }));
        let (tx, b, probe) = chat_body(l);
        let mut script = vec![(10, event); 8];
        script.push((10, DONE));
        let t = feeder(tx, script);
        streams.push((b, probe, t));
    }
    let mut ends = Vec::new();
    let mut used = 0;
    let mut drains = Vec::new();
    for (mut b, probe, t) in streams {
        let live = live.clone();
        drains.push(tokio::spawn(async move {
            let _ = drain(&mut b).await;
            drop(b);
            drop(t);
            // The call's end, as `RunState::finish` counts it: what it used.
            let used = 10 + probe.0.lock().unwrap().tokens.unwrap().completion().0;
            live.used
                .fetch_add(used, std::sync::atomic::Ordering::Relaxed);
            (probe, used)
        }));
    }
    for d in drains {
        let (probe, u) = d.await.unwrap();
        ends.push(probe.0.lock().unwrap().end.clone().unwrap());
        used += u;
    }
    // Alone each would use about 810 of 1000; together they stop within an event each
    // (about 100 tokens) of the limit.
    assert!(used <= 1000 + 2 * 110, "the run used {used}: {ends:?}");
    assert!(ends.iter().any(|e| e == "run_token_limit"), "{ends:?}");
    // Once both ended, the live count is what their calls' ends counted, nothing more.
    assert_eq!(live.used.load(std::sync::atomic::Ordering::Relaxed), used);
}
