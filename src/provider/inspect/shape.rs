//! The shape of a stream's events: what lets the inspector read most events without its JSON
//! tokenizer.
//!
//! A provider's events repeat themselves. Every `chat.completion.chunk` of one answer carries
//! the same `id`, `created`, `model` and `system_fingerprint`, the same keys in the same
//! order, and differs only in the text of its delta (and OpenAI's random `obfuscation`
//! padding); every Anthropic `content_block_delta` differs from the last only in its `text`.
//! The tokenizer in `json` costs about 2,500 instructions for such a chunk, most of a
//! streamed chunk's cost in the gateway, to learn again what the last event said.
//!
//! So the inspector keeps the last event it read in full as a shape: its bytes, the places
//! in them of the values whose bytes do not matter to the reader (strings it skips or only
//! measures, numbers and literals it skips: the holes, which `json` reports as it reads) and
//! what the reader made of it. An event that has the same bytes outside the holes, and in
//! each hole a value of the same kind (a string, or a scalar), is the same token sequence
//! with other values where none is looked at, so the reader would find in it exactly what it
//! found in the shape, with the lengths of its own output strings: that is what it is given,
//! found by comparing bytes. Anything else (a different key, `"finish_reason":"stop"` where
//! the shape had `null`, the usage at the end) goes to the tokenizer, whose reading becomes
//! the next shape. A shape is only taken from an event's first piece read whole (the
//! tokenizer back at depth 0, outside any string) that reported no usage and no error, and
//! the tokenizer's state after it is kept too, so a piece read either way leaves the same
//! state for whatever follows in the same event.
//!
//! A Chat choice's `index` is read (it says which choices finished), not a hole: the chunks
//! of an answer of several choices, which take turns, fit no shape of each other's, and such
//! a stream soon stops taking shapes and is read by the tokenizer (a single choice, the
//! common case, is not affected).
//!
//! `inspect/tests/properties.rs` checks the two readings against each other on generated
//! streams.

use super::event::Event;
use super::json::{skip_scalar, string_end, Holes, Json};

/// Holes a shape can have; an event with more is not kept as one. An OpenAI chunk has about
/// seven (`id`, `object`, `created`, `model`, `system_fingerprint`, the delta, `obfuscation`).
const MAX_HOLES: usize = 16;
/// Events longer than this are not kept (their copy would cost more than it saves).
const MAX_LEN: usize = 2048;
/// After this many events in a row that fit no shape, the stream's shapes stop being taken:
/// it does not repeat itself, and taking them only costs a copy an event.
const MAX_MISSES: u8 = 8;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HoleKind {
    /// A string's content, between its quotes.
    Skip,
    /// A string whose length is model output.
    Output,
    /// A number or literal.
    Scalar,
}

#[derive(Debug, Clone, Copy)]
struct Hole {
    start: u16,
    end: u16,
    kind: HoleKind,
}

const NO_HOLE: Hole = Hole {
    start: 0,
    end: 0,
    kind: HoleKind::Skip,
};

/// The last event read in full, and the holes found while reading the next one.
#[derive(Debug, Clone)]
pub(super) struct Shape {
    /// The shape's bytes: empty when there is none.
    bytes: Vec<u8>,
    holes: [Hole; MAX_HOLES],
    count: usize,
    /// The holes compared as holes, by index; the others as the bytes they had in the shape.
    /// Most holes hold the same value in every event (`id`, `model`, a tool call's `index`;
    /// a choice's `index` is read, so no hole), and a
    /// comparison of bytes is cheaper than finding a value's end: a hole is compared as one
    /// from the first event that has something else in it (and output strings always are).
    varying: [u8; MAX_HOLES],
    varying_count: usize,
    /// What the reader made of the shape, without its output strings.
    event: Event,
    /// The tokenizer's state after reading the shape.
    json: Json,
    misses: u8,
    /// While a piece is read to become the next shape: its address, and whether its holes
    /// overflowed.
    base: usize,
    overflow: bool,
}

impl Default for Shape {
    fn default() -> Self {
        Self {
            bytes: Vec::new(),
            holes: [NO_HOLE; MAX_HOLES],
            count: 0,
            varying: [0; MAX_HOLES],
            varying_count: 0,
            event: Event::default(),
            json: Json::default(),
            misses: 0,
            base: 0,
            overflow: false,
        }
    }
}

impl Holes for Shape {
    #[inline]
    fn string(&mut self, at: usize, len: usize, output: bool) {
        let kind = if output {
            HoleKind::Output
        } else {
            HoleKind::Skip
        };
        self.push(at, len, kind);
    }

    #[inline]
    fn scalar(&mut self, at: usize, len: usize) {
        self.push(at, len, HoleKind::Scalar);
    }
}

impl Shape {
    /// A shape that never reads an event: every event goes to the tokenizer (what the tests
    /// compare the shapes with).
    #[cfg(test)]
    pub(super) fn off() -> Self {
        Self {
            misses: MAX_MISSES,
            ..Self::default()
        }
    }

    /// Whether shapes are still worth taking on this stream.
    pub(super) fn active(&self) -> bool {
        self.misses < MAX_MISSES
    }

    /// Reads `data`, the first piece of an event's data, from the shape when it fits one:
    /// then `json` and `ev` are left as the tokenizer would have left them, and true is
    /// returned. Else the tokenizer reads it, and the reading becomes the next shape when it
    /// can be one.
    #[inline]
    pub(super) fn read(
        &mut self,
        data: &[u8],
        json: &mut Json,
        ev: &mut Event,
        tokens: &mut super::Tokens,
    ) -> bool {
        if let Some(output_bytes) = self.fits(data) {
            self.misses = 0;
            // `ev` holds only the `[DONE]` match of this data so far, which the shape's own
            // must not replace.
            *ev = Event {
                output_bytes: self.event.output_bytes + output_bytes,
                done: ev.done,
                ..self.event
            };
            json.clone_from(&self.json);
            return true;
        }
        if data.first() != Some(&b'{') {
            // `[DONE]`, or not JSON: never worth a shape, and the one kept stays for the
            // events after it.
            json.feed(data, ev, tokens, &mut ());
            return false;
        }
        self.misses = self.misses.saturating_add(1);
        self.take(data, json, ev, tokens);
        false
    }

    /// The tokenizer reads `data`; what it found is kept as the shape if it can be one.
    fn take(&mut self, data: &[u8], json: &mut Json, ev: &mut Event, tokens: &mut super::Tokens) {
        let before = *tokens;
        self.bytes.clear();
        self.count = 0;
        self.varying_count = 0;
        self.overflow = data.len() > MAX_LEN;
        self.base = data.as_ptr() as usize;
        json.feed(data, ev, tokens, self);
        if self.overflow
            || !json.at_rest()
            || *tokens != before
            || ev.error
            || ev.nested_error
            || ev.failed
            || ev.error_type.is_some()
            || ev.error_code.is_some()
            || ev.root_code.is_some()
        {
            return;
        }
        self.bytes.extend_from_slice(data);
        for (i, hole) in self.holes[..self.count].iter().enumerate() {
            if hole.kind == HoleKind::Output {
                self.varying[self.varying_count] = i as u8;
                self.varying_count += 1;
            }
        }
        let output: u64 = self.holes[..self.count]
            .iter()
            .filter(|h| h.kind == HoleKind::Output)
            .map(|h| u64::from(h.end - h.start))
            .sum();
        self.event = Event {
            output_bytes: ev.output_bytes - output,
            ..*ev
        };
        self.json.clone_from(json);
    }

    #[inline]
    fn push(&mut self, at: usize, len: usize, kind: HoleKind) {
        if self.count == MAX_HOLES {
            self.overflow = true;
            return;
        }
        // Within the piece whenever it fits `MAX_LEN`, so `u16` holds it; `overflow` says
        // when it does not, and then nothing is kept.
        let start = at.wrapping_sub(self.base);
        self.holes[self.count] = Hole {
            start: start as u16,
            end: (start + len) as u16,
            kind,
        };
        self.count += 1;
    }

    /// The output bytes of `data` when it fits the shape: compared with the varying holes
    /// as holes, then, if that fails and some are not, with all of them, which marks those
    /// that `data` changed as varying.
    #[inline]
    fn fits(&mut self, data: &[u8]) -> Option<u64> {
        if self.bytes.is_empty() {
            return None;
        }
        if let Some(output) = self.walk(data, false) {
            return Some(output);
        }
        if self.varying_count == self.count {
            return None;
        }
        self.walk(data, true)
    }

    /// Compares `data` with the shape, with the varying holes (or `all`) as holes.
    #[inline]
    fn walk(&mut self, data: &[u8], all: bool) -> Option<u64> {
        let shape = self.bytes.as_slice();
        let n = if all { self.count } else { self.varying_count };
        let (mut at, mut from, mut output) = (0, 0, 0u64);
        for k in 0..n {
            let index = if all { k } else { usize::from(self.varying[k]) };
            let hole = self.holes[index];
            let fixed = &shape[from..usize::from(hole.start)];
            if data.get(at..at + fixed.len())? != fixed {
                return None;
            }
            at += fixed.len();
            let rest = &data[at..];
            let len = match hole.kind {
                HoleKind::Skip => string_len(rest)?,
                HoleKind::Output => {
                    let len = string_len(rest)?;
                    output += len as u64;
                    len
                }
                HoleKind::Scalar => scalar_len(rest)?,
            };
            if all
                && hole.kind != HoleKind::Output
                && rest[..len] != shape[usize::from(hole.start)..usize::from(hole.end)]
                && !self.varying[..self.varying_count].contains(&(index as u8))
            {
                // Marked even if the rest does not fit: a value that changed once will again.
                self.varying[self.varying_count] = index as u8;
                self.varying_count += 1;
                self.varying[..self.varying_count].sort_unstable();
            }
            at += len;
            from = usize::from(hole.end);
        }
        (data.get(at..)? == &shape[from..]).then_some(output)
    }
}

/// The length of a string's content up to its closing quote (not taken), escapes and all,
/// as the tokenizer reads it; `None` when `s` ends first.
#[inline]
fn string_len(s: &[u8]) -> Option<usize> {
    let mut i = 0;
    loop {
        let j = i + string_end(s.get(i..)?)?;
        if s[j] == b'"' {
            return Some(j);
        }
        // A backslash: the byte after it is content, whatever it is.
        i = j + 2;
    }
}

/// The length of a number or literal at the start of `s`, where the tokenizer would skip one
/// whole: it starts with a byte that starts no other token.
#[inline]
fn scalar_len(s: &[u8]) -> Option<usize> {
    match s.first()? {
        b'"' | b'{' | b'[' | b'}' | b']' | b':' | b',' | b' ' | b'\t' | b'\n' | b'\r' => None,
        _ => Some(1 + skip_scalar(&s[1..])),
    }
}
