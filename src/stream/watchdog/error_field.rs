//! The provider's error that came as a block with an `error` field and no data (llama.cpp's;
//! see `provider::inspect::error_field`). The upstream's other error events pass as they came,
//! since clients read them; this one every SDK skips, as the WHATWG reading does, so it is
//! replaced by the gateway's own `event: error` with the provider's message (audit WB 2).

use bytes::Bytes;

use super::{release_held, Watched};
use crate::error::GatewayError;
use crate::http::sse::LeftOut;
use crate::stream::observer::Observer;

/// Puts the gateway's error event in place of `block`, the provider's error block that ended
/// in `data`: what came before it is ready to go, the block's own bytes (held, and in
/// `data`) are dropped, and the event follows. Returns false when there is nothing to
/// replace: no such block, or the stream is read by the gateway itself (a client that did not
/// stream gets the document rebuilt from it, which has the error already).
///
/// Part of the block may have gone out already, when it outgrew `MAX_HELD_EVENT` before it
/// ended (audit YC 3: the rest followed raw, the client read a cut answer as a success while
/// the log said error). That part is a line of an unknown field, which dispatches nothing:
/// `\n\n` ends it and its block, and the event that follows is read on its own. So the
/// client sees the error the log names, whatever the block's size.
pub(super) fn replaced<B, O: Observer>(
    this: &mut Watched<'_, B, O>,
    data: &Bytes,
    block: Option<LeftOut>,
) -> bool {
    let (Some(block), Some(sse)) = (block, this.sse.as_mut()) else {
        return false;
    };
    if sse.fail {
        return false;
    }
    let ready = &mut *this.ready;
    let mut written = 0;
    match block.start {
        Some(start) => release_held(sse, ready, data.slice(..start)),
        // It began in the frames held (or in those that went out past the limit): all its own.
        None => {
            sse.held.clear();
            sse.held_len = 0;
            if sse.partial_sent {
                ready.push_back(Bytes::from_static(b"\n\n"));
                written += 2;
            }
        }
    }
    sse.partial_sent = false;
    let err = GatewayError::UpstreamError {
        upstream: this.limits.upstream.to_string(),
        reason: this
            .progress
            .error_field_message()
            .unwrap_or("the provider sent an error")
            .to_owned(),
    };
    let event = err.stream_error(sse.shape, this.progress.next_sequence_number());
    written += event.len();
    ready.push_back(event);
    // Written for the client, no byte of the upstream's: the log line's `bytes` counts them.
    this.observer.own_data(written);
    true
}

/// `block`'s place once the `by` bytes before it were taken from its piece (`leave_out`).
pub(super) fn shifted(block: Option<LeftOut>, by: usize) -> Option<LeftOut> {
    block.map(|b| LeftOut {
        start: b.start.map(|s| s - by),
        end: b.end - by,
    })
}
