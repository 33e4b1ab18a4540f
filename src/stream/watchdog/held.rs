//! What the watchdog holds of an SSE event (or an NDJSON line) not yet complete, and how it
//! lets it go: whole, joined when it came in many small pieces, or left out (an event the
//! client is not to see).

use std::collections::VecDeque;

use bytes::{Bytes, BytesMut};

use super::error_field;
use super::{JOIN_MAX, JOIN_PIECE};
use crate::error::StreamErrorShape;
use crate::http::sse::LeftOut;
use crate::stream::progress::Read;

/// The frames of an SSE event not yet complete; or, on an NDJSON body (`shape` `Line`), of a
/// line not yet complete.
pub(super) struct Sse {
    /// The bytes of an event not yet complete, as the frames that carried them.
    pub(super) held: Vec<Bytes>,
    pub(super) held_len: usize,
    /// Part of the open event already went to the client (it outgrew `MAX_HELD_EVENT`), so
    /// an error event must first end that event's line and block to parse on its own.
    pub(super) partial_sent: bool,
    /// A cut is an error of the body rather than an error event: the reader is the gateway
    /// itself, assembling the stream for a client that did not stream.
    pub(super) fail: bool,
    /// How the error that ends a cut stream is written (and, `Line`, that its records are
    /// lines).
    pub(super) shape: StreamErrorShape,
}

/// The held event is complete with `rest`, the frame up to its last boundary. Each piece it
/// came in would go out as a chunk of its own: an event written a byte at a time cost the
/// client six times its size in chunk framing. So one that came in three pieces or more of a
/// few bytes each is copied into one frame, with `rest` (whose whole events the scanner does
/// not tell apart from the held event's end). Two pieces, the usual split, and events in
/// pieces of more than `JOIN_PIECE` bytes on average, whose framing is a small part of them,
/// go out as they came, uncopied.
pub(super) fn release_held(sse: &mut Sse, ready: &mut VecDeque<Bytes>, rest: Bytes) {
    let len = sse.held_len + rest.len();
    let pieces = sse.held.len() + 1;
    // Pieces of a few bytes on average: each costs a chunk head of about as many.
    if pieces >= 3 && len <= JOIN_MAX && len <= JOIN_PIECE * pieces {
        let mut joined = BytesMut::with_capacity(len);
        for piece in sse.held.drain(..) {
            joined.extend_from_slice(&piece);
        }
        joined.extend_from_slice(&rest);
        ready.push_back(joined.freeze());
    } else {
        ready.extend(sse.held.drain(..));
        if !rest.is_empty() {
            ready.push_back(rest);
        }
    }
    sse.held_len = 0;
}

/// Leaves `event`, which ended in `data`, out of what goes to the client: what came before
/// it (held, and in `data`) is ready to go, and what follows it is returned, with what the
/// piece read in it (its offsets then in that rest). Once a stream, so the slices cost
/// nothing a chunk.
/// Lets what came before an event that began at `start` in `data` (`None`: in the frames
/// held, which are then all its own) go to the client, and drops the event's bytes held.
/// Whether part of the event had gone out already (it outgrew `MAX_HELD_EVENT`).
pub(super) fn drop_event(
    sse: &mut Sse,
    ready: &mut VecDeque<Bytes>,
    data: &Bytes,
    start: Option<usize>,
) -> bool {
    match start {
        Some(start) => release_held(sse, ready, data.slice(..start)),
        None => {
            sse.held.clear();
            sse.held_len = 0;
        }
    }
    let partial = std::mem::take(&mut sse.partial_sent);
    start.is_none() && partial
}

pub(super) fn leave_out(
    sse: &mut Sse,
    ready: &mut VecDeque<Bytes>,
    mut data: Bytes,
    mut read: Read,
    event: LeftOut,
) -> (Bytes, Read) {
    drop_event(sse, ready, &data, event.start);
    let rest = data.split_off(event.end);
    // Both at or past the event's end: the last boundary, and an error after it.
    read.boundary = read.boundary.map(|b| b - event.end);
    read.error_end = read.error_end.map(|e| e - event.end);
    read.error_field = error_field::shifted(read.error_field, event.end);
    (rest, read)
}

impl Sse {
    pub(super) fn new(shape: StreamErrorShape) -> Self {
        Self {
            held: Vec::new(),
            held_len: 0,
            partial_sent: false,
            fail: false,
            shape,
        }
    }

    /// The body is NDJSON, not SSE (`WatchdogBody::ndjson_lines`).
    pub(super) fn lines(&self) -> bool {
        self.shape == StreamErrorShape::Line
    }
}

pub(super) fn flush_held(sse: &mut Option<Sse>, ready: &mut VecDeque<Bytes>) {
    if let Some(sse) = sse {
        ready.extend(sse.held.drain(..));
        sse.held_len = 0;
    }
}
