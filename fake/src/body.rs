//! The streaming response body that plays a script's timing.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};

use crate::answer::Kind;
use crate::records::Finisher;
use crate::reply::Reply;
use crate::script::Script;

/// The response body: a state machine driven by hyper's polling, so a stream costs no task of
/// its own and everything (timer included) ends when hyper drops it.
pub(crate) struct ScriptBody {
    pub(crate) reply: Reply,
    pub(crate) script: Script,
    pub(crate) next: usize,
    pub(crate) content_sent: usize,
    /// When the next event is due.
    pub(crate) due: Instant,
    /// Last write of any kind, for spacing keep-alives.
    pub(crate) last_write: Instant,
    pub(crate) sleep: Pin<Box<Sleep>>,
    pub(crate) finisher: Finisher,
}

impl ScriptBody {
    pub(crate) fn new(
        reply: Reply,
        script: Script,
        first_delay: Duration,
        finisher: Finisher,
    ) -> ScriptBody {
        let now = Instant::now();
        let due = now + first_delay;
        let sleep = Box::pin(tokio::time::sleep_until(due));
        let (next, content_sent, last_write) = (0, 0, now);
        ScriptBody {
            reply,
            script,
            next,
            content_sent,
            due,
            last_write,
            sleep,
            finisher,
        }
    }

    pub(crate) fn keepalive_frame(&self) -> Bytes {
        Bytes::from_static(if self.script.keepalive_ping {
            b"event: ping\ndata: {\"type\":\"ping\"}\n\n"
        } else {
            b": keep-alive\n\n"
        })
    }
}

impl Body for ScriptBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        let this = self.get_mut();
        loop {
            if this.next >= this.reply.len() {
                this.finisher.finish(true);
                return Poll::Ready(None);
            }
            let now = Instant::now();
            let script = &this.script;
            let frozen = script.freeze_after.is_some_and(|n| this.content_sent >= n);
            if !frozen && this.due <= now {
                if script
                    .disconnect_after
                    .is_some_and(|n| this.content_sent >= n)
                {
                    // hyper buffers the frames it polls and throws the buffer away on an
                    // error: with no interval the tokens (the head too) never left. The abort
                    // waits until they have been flushed.
                    let settled = this.last_write + SETTLE;
                    if now < settled {
                        this.due = settled;
                        continue;
                    }
                    this.next = usize::MAX;
                    this.finisher.finish(false);
                    let error =
                        io::Error::new(io::ErrorKind::ConnectionAborted, "x-fake-disconnect-after");
                    return Poll::Ready(Some(Err(error)));
                }
                let kind = this.reply.kind(this.next);
                let bytes = this.reply.render(this.next, script.timestamps);
                this.next += 1;
                if this.next >= this.reply.len() {
                    // hyper stops polling once `is_end_stream` says so, so finish here.
                    this.finisher.finish(true);
                }
                if let Kind::Content = kind {
                    this.content_sent += 1;
                }
                let gap = matches!(this.reply.kind(this.next), Kind::Content | Kind::Closing);
                // From the last due time, not from now: the timer fires up to a millisecond
                // late, and counted from its firing every gap would carry that lateness on
                // (audit GF 1: 50 gaps of 1 ms took 110 ms). Event k is due at ttft + k
                // intervals; one a slow reader held back goes as soon as it may, as a
                // provider's tokens queued in the socket do.
                if gap {
                    this.due += script.interval;
                }
                this.last_write = now;
                return Poll::Ready(Some(Ok(Frame::data(bytes))));
            }
            let keepalive_due = script.keepalive.map(|every| this.last_write + every);
            if keepalive_due.is_some_and(|due| due <= now) {
                this.last_write = now;
                return Poll::Ready(Some(Ok(Frame::data(this.keepalive_frame()))));
            }
            let wake = match (frozen, keepalive_due) {
                (false, Some(keepalive)) => keepalive.min(this.due),
                (false, None) => this.due,
                (true, Some(keepalive)) => keepalive,
                // Frozen for good: nothing will wake us, and hyper drops us when the peer leaves.
                (true, None) => return Poll::Pending,
            };
            if this.sleep.deadline() != wake {
                this.sleep.as_mut().reset(wake);
            }
            if this.sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.next >= self.reply.len()
    }

    fn size_hint(&self) -> SizeHint {
        match &self.reply {
            Reply::Full(bytes) if self.next == 0 => SizeHint::with_exact(bytes.len() as u64),
            _ => SizeHint::default(),
        }
    }
}

/// How long an abort waits after the last write, for hyper to flush what it buffered.
const SETTLE: Duration = Duration::from_millis(5);

/// `sleep(0)` still waits for the timer's next millisecond tick: a ttft of 0 must not.
pub(crate) async fn pause(d: Duration) {
    if !d.is_zero() {
        tokio::time::sleep(d).await;
    }
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, SocketAddr};

    use http::{HeaderMap, HeaderValue};

    use super::*;
    use crate::answer::{Answer, Api};
    use crate::reply::Reply;
    use crate::script::Script;
    use crate::FakeUpstream;

    /// Each event is polled 3 ms after it was due, as a busy runtime's timer fires late: the
    /// gaps still end on the schedule, so the stream ends 3 ms late, not 3 ms per event late
    /// (audit GF 1).
    #[tokio::test(start_paused = true)]
    async fn a_late_timer_does_not_push_the_later_events_back() {
        let fake = FakeUpstream::start_unrecorded(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
            .await
            .unwrap();
        let mut headers = HeaderMap::new();
        headers.insert("x-fake-chunks", HeaderValue::from_static("5"));
        headers.insert("x-fake-interval-ms", HeaderValue::from_static("10"));
        let script = Script::from_headers(&headers).unwrap();
        let answer = Answer {
            api: Api::Chat,
            tag: "t".into(),
            model: "m".into(),
            created: 0,
            prompt_tokens: 1,
            chunks: 5,
            preamble: 0,
            reasoning: 0,
            choices: 1,
            logprobs: None,
            refusal: false,
            include_usage: false,
            calls: Vec::new(),
            arguments: None,
            echo: serde_json::Value::Null,
        };
        let finisher = Finisher {
            shared: fake.shared.clone(),
            index: usize::MAX,
            done: false,
        };
        let start = Instant::now();
        let mut body = ScriptBody::new(Reply::stream(answer), script, Duration::ZERO, finisher);
        let mut sent = Vec::new();
        loop {
            let polled = std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut body).poll_frame(cx)));
            match polled.await {
                Poll::Ready(Some(frame)) => {
                    frame.unwrap();
                    sent.push((Instant::now() - start).as_millis());
                }
                Poll::Ready(None) => break,
                Poll::Pending => {
                    let late = body.due + Duration::from_millis(3);
                    tokio::time::advance(late - Instant::now()).await;
                }
            }
        }
        // The role chunk, five tokens, the finish chunk (each token and the finish after a
        // gap), `[DONE]`.
        assert_eq!(sent, [0, 13, 23, 33, 43, 53, 63, 63]);
    }
}
