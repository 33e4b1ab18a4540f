//! The provider's error that came as a block with an `error` field and no data (llama.cpp's;
//! see `provider::inspect::error_field`). The upstream's other error events pass as they came,
//! since clients read them; this one every SDK skips, as the WHATWG reading does, so it is
//! replaced by the gateway's own `event: error` with the provider's message (audit WB 2).

use std::collections::VecDeque;

use bytes::Bytes;

use super::{drop_event, flush_held, Sse};
use crate::error::GatewayError;
use crate::http::sse::LeftOut;
use crate::provider::ErrorType;
use crate::stream::limits::StreamLimits;
use crate::stream::observer::Observer;
use crate::stream::progress::{Progress, Read};

/// The upstream's error event that ended in `data` (at `read.error_end`) goes to the client
/// and ends the stream: as it came, after what was held, or, when it is the provider's error
/// block that clients skip (`read.error_field`), replaced. Then what came before the block is
/// ready to go, the block's own bytes (held, and in `data`) are dropped, and the gateway's
/// event follows. A stream the gateway reads itself (for a client that did not stream, who
/// gets the document rebuilt from it, its error in it) passes as it came.
///
/// Part of the block may have gone out already, when it outgrew `MAX_HELD_EVENT` before it
/// ended (audit YC 3: the rest followed raw, the client read a cut answer as a success while
/// the log said error). That part is a line of an unknown field, which dispatches nothing:
/// `\n\n` ends it and its block, and the event that follows is read on its own. So the
/// client sees the error the log names, whatever the block's size.
///
/// Its fields, not the watchdog's projection: a reference to that would keep it in memory,
/// and every chunk's reads of it went through memory (175 instructions a chunk).
pub(super) fn pass<O: Observer>(
    sse: &mut Option<Sse>,
    ready: &mut VecDeque<Bytes>,
    observer: &mut O,
    progress: &Progress,
    limits: &StreamLimits,
    data: &Bytes,
    read: Read,
) {
    let block = match (read.error_field, sse.as_mut()) {
        (Some(block), Some(s)) if !s.fail => block,
        _ => {
            flush_held(sse, ready);
            match read.error_end {
                Some(end) if end > 0 => ready.push_back(data.slice(..end)),
                _ => {}
            }
            return;
        }
    };
    let Some(sse) = sse.as_mut() else { return };
    let mut written = 0;
    if drop_event(sse, ready, data, block.start) {
        ready.push_back(Bytes::from_static(b"\n\n"));
        written += 2;
    }
    let err = GatewayError::UpstreamError {
        upstream: limits.upstream.to_string(),
        reason: progress
            .error_field_message()
            .unwrap_or("the provider sent an error")
            .to_owned(),
    };
    // Of a kind no rule knows (a 409, a text): `other`, which a gateway in front reads as
    // such and passes on as this one does; its own `upstream_error` would read as the 502 a
    // broken upstream is, and be retried and failed over there (break audit AH 1).
    let kind = progress.error_type().unwrap_or(ErrorType::Other).as_str();
    let event = err.stream_error_as(sse.shape, progress.next_sequence_number(), kind);
    written += event.len();
    ready.push_back(event);
    // Written for the client, no byte of the upstream's: the log line's `bytes` counts them.
    observer.own_data(written);
}

/// `block`'s place once the `by` bytes before it were taken from its piece (`leave_out`).
pub(super) fn shifted(block: Option<LeftOut>, by: usize) -> Option<LeftOut> {
    block.map(|b| LeftOut {
        start: b.start.map(|s| s - by),
        end: b.end - by,
    })
}
