//! Incremental, zero-copy scanner for `text/event-stream` bodies.
//!
//! The proxy forwards upstream SSE frames as they arrive, but it needs two facts about
//! them: where complete blocks end (so it can hold back a partial event) and whether real
//! events, not keep-alives, are being dispatched (progress). [`SseScanner`] answers both
//! by following the WHATWG "Interpreting an event stream" algorithm (HTML §9.2.6) byte for
//! byte, without ever copying the stream: classifying a line needs only its first few
//! bytes, so at most 16 bytes of a line that straddles two chunks are kept, and the rest
//! of every line is skipped with `memchr`.
//!
//! Working on bytes instead of decoded text is exact here: the UTF-8 decoder the standard
//! mandates never swallows an ASCII byte into a replacement character, so line terminators,
//! colons and the ASCII field names and event types compare the same either way.

use memchr::memchr2;

/// The UTF-8 byte order mark, which the standard's decoder strips once at stream start.
const BOM: [u8; 3] = [0xEF, 0xBB, 0xBF];

/// A leading BOM, matched across chunks at the start of a stream (here and in the response
/// inspector, which reads the same stream).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct LeadingBom {
    matched: u8,
    /// Past the point where a BOM may still appear.
    settled: bool,
}

impl LeadingBom {
    pub(crate) fn settled(&self) -> bool {
        self.settled
    }

    /// Some BOM bytes matched, and the chunk ended before the rest could tell.
    pub(crate) fn partial(&self) -> bool {
        !self.settled && self.matched > 0
    }

    /// Consumes the part of a leading BOM at the start of `chunk`: how many bytes it used,
    /// and, when the BOM turned out broken, the bytes of it matched so far (possibly in
    /// earlier chunks), which are then ordinary content of the first line (the decoder
    /// turns them into U+FFFD). Stays unsettled only when the chunk ended mid-BOM.
    pub(crate) fn skip(&mut self, chunk: &[u8]) -> (usize, &'static [u8]) {
        let mut pos = 0;
        while let (Some(&got), Some(&want)) = (chunk.get(pos), BOM.get(usize::from(self.matched))) {
            if got != want {
                break;
            }
            pos += 1;
            self.matched += 1;
        }
        if usize::from(self.matched) == BOM.len() {
            self.settled = true;
        } else if pos < chunk.len() {
            self.settled = true;
            return (pos, &BOM[..usize::from(self.matched)]);
        }
        (pos, &[])
    }
}

/// How many leading bytes of a line are looked at (and kept, when the line straddles
/// chunks). A line classifies the same as its first `PREFIX` bytes would on their own, as
/// long as `PREFIX` exceeds the longest line whose end matters, `event: error`: without a
/// colon in them the field name is longer than `data` or `event`, and with one, any `event`
/// value in them is already longer than `ping` or `error`. So no length needs tracking.
const PREFIX: usize = 16;
const _: () = assert!(PREFIX > b"event: error".len());

/// The event type of a block, reduced to what the proxy cares about.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Any type other than `ping` or `error` (including the default `message`).
    #[default]
    Other,
    /// Anthropic's keep-alive: dispatched but not progress.
    Ping,
    /// An upstream error event: reported through [`Scan::error_end`].
    Error,
}

/// What a complete line means to the block it belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Line {
    Blank,
    Data,
    Event(Kind),
    /// Comments, `id`, `retry` and unknown fields: they never make a block dispatch.
    Ignored,
}

/// Incremental scanner of a `text/event-stream` body.
///
/// Feed it every chunk of the body, in order, with [`SseScanner::scan`]. It keeps only a
/// few bytes of state between calls (a line prefix of at most 16 bytes, a pending CR, the
/// BOM match and the open block's data/type flags), so it never allocates and never copies
/// the stream.
#[derive(Debug, Default, Clone)]
pub struct SseScanner {
    /// First bytes of the line in progress when it straddles chunks; `prefix_len == 0`
    /// means no line is in progress.
    prefix: [u8; PREFIX],
    prefix_len: u8,
    /// The previous chunk ended with a CR, so an LF starting the next chunk finishes that
    /// same CRLF terminator rather than ending an extra (blank) line.
    pending_cr: bool,
    /// The pending CR ended a blank line, so its LF also finishes a block boundary.
    cr_was_blank: bool,
    bom: LeadingBom,
    /// The open block has at least one `data` line, so it will dispatch.
    has_data: bool,
    kind: Kind,
    /// Some non-blank line belongs to the open block.
    block_open: bool,
    /// An `error` event was dispatched; nothing after it is scanned.
    stopped: bool,
}

/// What [`SseScanner::scan`] found in one chunk. Offsets are relative to that chunk.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Scan {
    /// Offset in this chunk just past the last block boundary (the end of a blank line,
    /// i.e. the line terminator of an empty line), if the chunk contains one.
    ///
    /// When a blank line ends in a CR that is the last byte of a chunk, the boundary is
    /// reported right after that CR (the block is complete; waiting for a possible LF would
    /// stall CR-terminated streams). If the next chunk then starts with the LF completing
    /// that CRLF, the boundary is reported again just past the LF (offset 1).
    pub last_boundary: Option<usize>,
    /// Events dispatched in this chunk that count as progress: every dispatched event
    /// whose type is neither exactly `ping` (keep-alive) nor exactly `error`.
    pub progress: u32,
    /// If an event whose type is `error` was dispatched in this chunk: the offset just past
    /// the end of that event's terminating blank line. Scanning STOPS there: the rest of the
    /// chunk is not scanned, and the scanner must not be fed again afterwards (later calls
    /// return an empty `Scan`). `last_boundary` is then that same offset.
    pub error_end: Option<usize>,
}

impl SseScanner {
    /// A scanner positioned at the start of a stream (a leading BOM is still expected).
    pub fn new() -> Self {
        Self::default()
    }

    /// Scans the next chunk of the body and reports the block boundaries and dispatched
    /// events it completes. Chunks may split the stream anywhere, including inside a CRLF
    /// or the BOM; an empty chunk is a no-op.
    ///
    /// After a `Scan` with `error_end` set, the scanner is finished: do not feed it again.
    pub fn scan(&mut self, chunk: &[u8]) -> Scan {
        let mut out = Scan::default();
        if self.stopped || chunk.is_empty() {
            return out;
        }
        let mut pos = 0;
        if !self.bom.settled() {
            let broken;
            (pos, broken) = self.bom.skip(chunk);
            self.push_prefix(broken);
            if !self.bom.settled() {
                return out;
            }
        }
        if self.pending_cr {
            // `pending_cr` implies the BOM was settled before this chunk, so `pos` is 0.
            self.pending_cr = false;
            if chunk[0] == b'\n' {
                pos = 1;
                if self.cr_was_blank {
                    out.last_boundary = Some(1);
                }
            }
        }
        while pos < chunk.len() {
            let rest = &chunk[pos..];
            let Some(i) = find_eol(rest) else {
                self.push_prefix(rest);
                break;
            };
            let eol = pos + i;
            let line = if self.prefix_len == 0 {
                let body = &chunk[pos..eol];
                classify(&body[..body.len().min(PREFIX)])
            } else {
                self.push_prefix(&chunk[pos..eol]);
                let line = classify(&self.prefix[..usize::from(self.prefix_len)]);
                self.prefix_len = 0;
                line
            };
            pos = eol + 1;
            if chunk[eol] == b'\r' {
                match chunk.get(pos) {
                    Some(b'\n') => pos += 1,
                    Some(_) => {}
                    None => {
                        self.pending_cr = true;
                        self.cr_was_blank = line == Line::Blank;
                    }
                }
            }
            match line {
                Line::Blank => {
                    out.last_boundary = Some(pos);
                    if self.end_block(&mut out) {
                        out.error_end = Some(pos);
                        self.stopped = true;
                        return out;
                    }
                }
                Line::Data => {
                    self.has_data = true;
                    self.block_open = true;
                }
                Line::Event(kind) => {
                    self.kind = kind;
                    self.block_open = true;
                }
                Line::Ignored => self.block_open = true,
            }
        }
        out
    }

    /// True when bytes have been seen since the last block boundary (a partial block is
    /// open). A complete leading BOM does not count; a partial one does, since it may turn
    /// out to be line content.
    pub fn in_block(&self) -> bool {
        self.block_open || self.prefix_len > 0 || self.bom.partial()
    }

    /// Appends the next bytes of the line in progress, keeping only its first `PREFIX`.
    fn push_prefix(&mut self, bytes: &[u8]) {
        let len = usize::from(self.prefix_len);
        let take = bytes.len().min(PREFIX - len);
        self.prefix[len..len + take].copy_from_slice(&bytes[..take]);
        // `len + take <= PREFIX`, which fits in a u8.
        self.prefix_len = (len + take) as u8;
    }

    /// Ends the open block at a blank line, counting its event if it dispatches. Returns
    /// true when the dispatched event is an `error`.
    fn end_block(&mut self, out: &mut Scan) -> bool {
        let dispatches = std::mem::take(&mut self.has_data);
        let kind = std::mem::take(&mut self.kind);
        self.block_open = false;
        if !dispatches {
            return false;
        }
        match kind {
            Kind::Other => out.progress = out.progress.saturating_add(1),
            Kind::Ping => {}
            Kind::Error => return true,
        }
        false
    }
}

/// Position of the next CR or LF. Checking the first byte before calling `memchr2` pays
/// off because every event ends with a blank line, which starts with its terminator.
#[inline]
fn find_eol(s: &[u8]) -> Option<usize> {
    match s.first() {
        Some(b'\n' | b'\r') => Some(0),
        _ => memchr2(b'\n', b'\r', s),
    }
}

/// Classifies a line from its first bytes `head` (at most `PREFIX` of them).
#[inline]
fn classify(head: &[u8]) -> Line {
    if head.starts_with(b"data:") {
        return Line::Data;
    }
    let (name, value) = match head.iter().position(|&b| b == b':') {
        Some(0) => return Line::Ignored,
        Some(colon) => (&head[..colon], &head[colon + 1..]),
        None if head.is_empty() => return Line::Blank,
        None => (head, &[][..]),
    };
    match name {
        b"data" => Line::Data,
        b"event" => Line::Event(match value.strip_prefix(b" ").unwrap_or(value) {
            b"ping" => Kind::Ping,
            b"error" => Kind::Error,
            _ => Kind::Other,
        }),
        _ => Line::Ignored,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Feeds `chunks` in order; returns the per-chunk results and the final scanner.
    fn feed(chunks: &[&[u8]]) -> (Vec<Scan>, SseScanner) {
        let mut sc = SseScanner::new();
        let scans = chunks.iter().map(|c| sc.scan(c)).collect();
        (scans, sc)
    }

    fn one(stream: &[u8]) -> (Scan, SseScanner) {
        let mut sc = SseScanner::new();
        (sc.scan(stream), sc)
    }

    fn scan(last_boundary: Option<usize>, progress: u32, error_end: Option<usize>) -> Scan {
        Scan {
            last_boundary,
            progress,
            error_end,
        }
    }

    /// Straightforward spec parser over the whole stream, with real buffers.
    #[derive(Debug, Default)]
    struct Reference {
        boundaries: Vec<usize>,
        progress: u32,
        error_end: Option<usize>,
    }

    fn reference(stream: &[u8]) -> Reference {
        let mut out = Reference::default();
        let mut pos = if stream.starts_with(&BOM) { 3 } else { 0 };
        let (mut data, mut ty) = (Vec::new(), Vec::new());
        while let Some(i) = stream[pos..].iter().position(|&b| b == b'\n' || b == b'\r') {
            let line = &stream[pos..pos + i];
            pos += i + 1;
            if stream[pos - 1] == b'\r' && stream.get(pos) == Some(&b'\n') {
                pos += 1;
            }
            if line.is_empty() {
                out.boundaries.push(pos);
                if !data.is_empty() {
                    let t: &[u8] = if ty.is_empty() { b"message" } else { &ty };
                    match t {
                        b"ping" => {}
                        b"error" => {
                            out.error_end = Some(pos);
                            return out;
                        }
                        _ => out.progress += 1,
                    }
                }
                data.clear();
                ty.clear();
            } else if line[0] != b':' {
                let (name, value) = match line.iter().position(|&b| b == b':') {
                    Some(c) => (&line[..c], &line[c + 1..]),
                    None => (line, &[][..]),
                };
                let value = value.strip_prefix(b" ").unwrap_or(value);
                match name {
                    b"data" => {
                        data.extend_from_slice(value);
                        data.push(b'\n');
                    }
                    b"event" => ty = value.to_vec(),
                    _ => {}
                }
            }
        }
        out
    }

    /// Feeds `stream` cut at `cuts` and checks every chunk's report against the reference.
    /// A blank line's CRLF cut between its CR and LF is expected to report the boundary
    /// after the CR in the first chunk (and after the LF in the second).
    fn check_split(stream: &[u8], cuts: &[usize]) -> Result<(), TestCaseError> {
        let r = reference(stream);
        let mut edges: Vec<usize> = cuts.iter().copied().chain([0, stream.len()]).collect();
        edges.sort_unstable();
        edges.dedup();
        let mut sc = SseScanner::new();
        let (mut progress, mut last) = (0, 0);
        let bom_end = if stream.starts_with(&BOM) { 3 } else { 0 };
        for w in edges.windows(2) {
            let (s, e) = (w[0], w[1]);
            let got = sc.scan(&stream[s..e]);
            progress += got.progress;
            let expect = |b: usize| {
                if b == e + 1 && stream[e - 1] == b'\r' && stream[e] == b'\n' {
                    Some(e)
                } else {
                    (s < b && b <= e).then_some(b)
                }
            };
            let exp_last = r.boundaries.iter().filter_map(|&b| expect(b)).max();
            let exp_err = r.error_end.and_then(expect);
            prop_assert_eq!(
                got.last_boundary.map(|o| s + o),
                exp_last,
                "chunk {}..{}",
                s,
                e
            );
            prop_assert_eq!(got.error_end.map(|o| s + o), exp_err, "chunk {}..{}", s, e);
            if exp_err.is_some() {
                break;
            }
            last = exp_last.unwrap_or(last);
            let settled = if e >= bom_end {
                last.max(bom_end)
            } else {
                last
            };
            prop_assert_eq!(sc.in_block(), e > settled, "in_block after {}", e);
        }
        prop_assert_eq!(progress, r.progress);
        Ok(())
    }

    fn value() -> impl Strategy<Value = Vec<u8>> {
        let byte = prop_oneof![
            4 => Just(b'a'),
            2 => Just(b' '),
            2 => Just(b':'),
            1 => Just(0xEF),
            2 => any::<u8>().prop_filter("no EOL", |b| *b != b'\n' && *b != b'\r'),
        ];
        prop_oneof![
            4 => prop::collection::vec(byte.clone(), 0..24),
            1 => prop::collection::vec(byte, 0..200),
        ]
    }

    fn event_value() -> impl Strategy<Value = Vec<u8>> {
        let fixed = [
            " ping",
            "ping",
            "  ping",
            " error",
            "error",
            "  error",
            " message",
            "",
            " ",
            " pingx",
            " errorx",
            " Ping",
            "ping ",
            " content_block_delta",
        ];
        prop_oneof![
            3 => prop::sample::select(fixed.to_vec()).prop_map(|s| s.as_bytes().to_vec()),
            1 => value(),
        ]
    }

    fn line() -> impl Strategy<Value = Vec<u8>> {
        let odd = [
            "id: 3",
            "retry: 100",
            "dat: x",
            "data : x",
            "Data: x",
            "eventx: ping",
            "event",
            "event : ping",
            "data",
            "id",
            ":",
            "\u{feff}data: x",
        ];
        prop_oneof![
            4 => Just(Vec::new()),
            4 => value().prop_map(|v| [&b"data: "[..], &v].concat()),
            1 => value().prop_map(|v| [&b"data:"[..], &v].concat()),
            3 => event_value().prop_map(|v| [&b"event:"[..], &v].concat()),
            1 => value().prop_map(|v| [&b":"[..], &v].concat()),
            1 => value(),
            2 => prop::sample::select(odd.to_vec()).prop_map(|s| s.as_bytes().to_vec()),
        ]
    }

    fn stream() -> impl Strategy<Value = Vec<u8>> {
        let start =
            prop::sample::select(vec![&b""[..], &BOM, &BOM[..2], &BOM[..1], b"\xEF\xBB\xEF"]);
        let eol = prop::sample::select(vec![&b"\n"[..], b"\r", b"\r\n"]);
        (
            start,
            prop::collection::vec((line(), eol), 0..40),
            prop::option::of(line()),
        )
            .prop_map(|(start, lines, tail)| {
                let mut s = start.to_vec();
                for (line, eol) in lines {
                    s.extend_from_slice(&line);
                    s.extend_from_slice(eol);
                }
                s.extend_from_slice(&tail.unwrap_or_default());
                s
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1024))]

        #[test]
        fn whole_stream_matches_reference(s in stream()) {
            check_split(&s, &[])?;
        }

        #[test]
        fn arbitrary_splits_match_reference(
            s in stream(),
            cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..12),
        ) {
            let cuts: Vec<usize> = cuts.iter().map(|i| i.index(s.len() + 1)).collect();
            check_split(&s, &cuts)?;
        }

        #[test]
        fn byte_by_byte_matches_reference(s in stream()) {
            let cuts: Vec<usize> = (0..=s.len()).collect();
            check_split(&s, &cuts)?;
        }

        /// Not only streams shaped like SSE: any bytes at all, cut anywhere.
        #[test]
        fn arbitrary_bytes_split_anywhere_match_reference(
            s in prop::collection::vec(any::<u8>(), 0..600),
            cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..12),
        ) {
            let cuts: Vec<usize> = cuts.iter().map(|i| i.index(s.len() + 1)).collect();
            check_split(&s, &cuts)?;
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(96))]

        /// The stream in two pieces, split at every byte boundary in turn.
        #[test]
        fn every_two_piece_split_matches_reference(s in stream()) {
            for k in 0..=s.len() {
                check_split(&s, &[k])?;
            }
        }
    }

    #[test]
    fn lf_crlf_and_cr_endings() {
        assert_eq!(one(b"data: a\n\n").0, scan(Some(9), 1, None));
        assert_eq!(one(b"data: a\r\n\r\n").0, scan(Some(11), 1, None));
        assert_eq!(one(b"data: a\r\r").0, scan(Some(9), 1, None));
        // Mixed terminators within one block.
        assert_eq!(one(b"event: x\rdata: a\r\n\n").0, scan(Some(19), 1, None));
        // "\n\r" is two terminators: a line end and then a blank line.
        assert_eq!(one(b"data: a\n\r").0, scan(Some(9), 1, None));
    }

    #[test]
    fn crlf_split_across_chunks_is_one_line_end() {
        // The CR ends "data: a"; the LF finishes that CRLF and is not a blank line.
        let (scans, sc) = feed(&[b"data: a\r", b"\n", b"data: b\n"]);
        assert_eq!(scans, vec![Scan::default(); 3]);
        assert!(sc.in_block());
        // A blank line's CRLF split: boundary after the CR, then again after the LF.
        let (scans, sc) = feed(&[b"data: a\r\n\r", b"\ndata: b\n"]);
        assert_eq!(scans, vec![scan(Some(10), 1, None), scan(Some(1), 0, None)]);
        assert!(sc.in_block());
        let (scans, sc) = feed(&[b"data: a\r\n\r", b"\n"]);
        assert_eq!(scans[1], scan(Some(1), 0, None));
        assert!(!sc.in_block());
        // A CR followed by a non-LF chunk: the next line starts right away.
        let (scans, _) = feed(&[b"data: a\r", b"\rdata: b\r\r"]);
        assert_eq!(scans[1], scan(Some(10), 2, None));
    }

    #[test]
    fn leading_bom_is_ignored_whole_or_split() {
        assert_eq!(one(b"\xEF\xBB\xBFdata: a\n\n").0, scan(Some(12), 1, None));
        // Without stripping, the first field name would be "\u{feff}data".
        let (scans, sc) = feed(&[b"\xEF", b"\xBB", b"\xBF", b"data: a\n\n"]);
        assert!(!sc.in_block());
        assert_eq!(scans[3], scan(Some(9), 1, None));
        // Only one BOM is stripped: a second one makes the field unknown.
        assert_eq!(
            one(b"\xEF\xBB\xBF\xEF\xBB\xBFdata: a\n\n").0,
            scan(Some(15), 0, None)
        );
        // A BOM later in the stream is content.
        assert_eq!(one(b"\n\xEF\xBB\xBFdata: a\n\n").0, scan(Some(13), 0, None));
    }

    #[test]
    fn broken_bom_is_line_content() {
        let (scans, sc) = feed(&[b"\xEF\xBB", b"data: a\n"]);
        assert_eq!(scans, vec![Scan::default(); 2]);
        assert!(sc.in_block());
        let (scans, _) = feed(&[b"\xEF", b"\n\ndata: a\n\n"]);
        assert_eq!(scans[1], scan(Some(11), 1, None));
        assert!(feed(&[b"\xEF"]).1.in_block());
    }

    #[test]
    fn data_field_forms() {
        assert_eq!(one(b"data:a\n\n").0.progress, 1);
        assert_eq!(one(b"data: a\n\n").0.progress, 1);
        assert_eq!(one(b"data:\n\n").0.progress, 1);
        // A bare `data` line appends an empty value, which still makes the block dispatch.
        assert_eq!(one(b"data\n\n").0.progress, 1);
        // Field names are exact: these are unknown fields.
        assert_eq!(one(b"data :a\n\nData: a\n\ndatas: a\n\n").0.progress, 0);
        // Several data lines are one event.
        assert_eq!(one(b"data: a\ndata: b\n\n").0.progress, 1);
    }

    #[test]
    fn comments_and_non_data_blocks_are_boundaries_without_progress() {
        let (s, sc) = one(b": keep-alive\n\n");
        assert_eq!(s, scan(Some(14), 0, None));
        assert!(!sc.in_block());
        assert_eq!(one(b"id: 3\n\n").0, scan(Some(7), 0, None));
        assert_eq!(one(b"retry: 1000\n\n").0, scan(Some(13), 0, None));
        assert_eq!(one(b"event: message\n\n").0, scan(Some(16), 0, None));
        assert_eq!(one(b":data: a\n\n").0, scan(Some(10), 0, None));
        assert_eq!(one(b"\n\n\n").0, scan(Some(3), 0, None));
    }

    #[test]
    fn ping_is_not_progress() {
        let ping = b"event: ping\ndata: {\"type\": \"ping\"}\n\n";
        assert_eq!(one(ping).0, scan(Some(ping.len()), 0, None));
        assert_eq!(one(b"event:ping\ndata\n\n").0.progress, 0);
        // Only one leading space is removed, and the comparison is case-sensitive.
        assert_eq!(one(b"event:  ping\ndata\n\n").0.progress, 1);
        assert_eq!(one(b"event: Ping\ndata\n\n").0.progress, 1);
        assert_eq!(one(b"event: ping \ndata\n\n").0.progress, 1);
        // The last `event` line of a block wins, and the type resets after each block.
        assert_eq!(one(b"event: ping\nevent: x\ndata\n\n").0.progress, 1);
        assert_eq!(one(b"event: x\nevent: ping\ndata\n\n").0.progress, 0);
        assert_eq!(one(b"event: ping\n\ndata\n\n").0.progress, 1);
        assert_eq!(one(b"event: ping\ndata\n\ndata\n\n").0.progress, 1);
    }

    #[test]
    fn error_stops_the_scan_at_its_end() {
        let stream = b"data: a\n\nevent: error\ndata: {\"type\":\"error\"}\n\ndata: b\n\n";
        let end = stream.len() - 9;
        let mut sc = SseScanner::new();
        assert_eq!(sc.scan(stream), scan(Some(end), 1, Some(end)));
        assert_eq!(sc.scan(b"data: c\n\n"), Scan::default());
        // CRLF: the end is past the LF.
        assert_eq!(
            one(b"event:error\r\ndata\r\n\r\nx").0,
            scan(Some(21), 0, Some(21))
        );
        // An `error` event without data does not dispatch.
        assert_eq!(one(b"event: error\n\ndata\n\n").0, scan(Some(20), 1, None));
        assert_eq!(one(b"event:  error\ndata\n\n").0.error_end, None);
        // Split: reported in the chunk holding the blank line.
        let (scans, _) = feed(&[b"event: err", b"or\ndata: x", b"\n", b"\ndata: y\n\n"]);
        let tail = [None, None, None, Some(1)];
        assert_eq!(scans.iter().map(|s| s.error_end).collect::<Vec<_>>(), tail);
    }

    #[test]
    fn multiple_events_in_one_chunk() {
        let s =
            b"data: 1\n\n: c\n\nevent: ping\ndata: p\n\ndata: 2\n\nid: 9\ndata: 3\n\ndata: part";
        let (got, sc) = one(s);
        assert_eq!(got, scan(Some(s.len() - 10), 3, None));
        assert!(sc.in_block());
    }

    #[test]
    fn event_split_across_many_chunks() {
        let s = b"event: content_block_delta\r\ndata: {\"delta\":\"hi\"}\r\n\r\n";
        for size in 1..s.len() {
            let chunks: Vec<&[u8]> = s.chunks(size).collect();
            let (scans, sc) = feed(&chunks);
            assert_eq!(
                scans.iter().map(|s| s.progress).sum::<u32>(),
                1,
                "size {size}"
            );
            let last = scans.last().and_then(|s| s.last_boundary);
            assert_eq!(last, Some(s.len() - (chunks.len() - 1) * size));
            assert!(!sc.in_block());
        }
    }

    #[test]
    fn empty_chunks_are_no_ops() {
        let (scans, sc) = feed(&[b"", b"data: a\r", b"", b"\n", b"", b"\n", b""]);
        assert_eq!(scans[5], scan(Some(1), 1, None));
        assert_eq!(scans.iter().map(|s| s.progress).sum::<u32>(), 1);
        assert!(!sc.in_block());
        assert!(!SseScanner::new().in_block());
    }

    #[test]
    fn very_long_lines_split_anywhere() {
        let mut s = b"event: ".to_vec();
        s.extend(std::iter::repeat_n(b'x', 50_000));
        s.extend_from_slice(b"\ndata: ");
        s.extend(std::iter::repeat_n(b'y', 3_000_000));
        s.extend_from_slice(b"\n\n: ");
        s.extend(std::iter::repeat_n(b'z', 100_000));
        s.extend_from_slice(b"\n\nevent: ping\ndata: ");
        s.extend(std::iter::repeat_n(b'p', 100_000));
        s.extend_from_slice(b"\n\n");
        for cut in [
            1,
            5,
            6,
            7,
            12,
            16,
            17,
            50_007,
            50_008,
            50_014,
            2_000_000,
            s.len() - 1,
        ] {
            let mut sc = SseScanner::new();
            let (a, b) = s.split_at(cut);
            let (x, y) = (sc.scan(a), sc.scan(b));
            assert_eq!(x.progress + y.progress, 1, "cut {cut}");
            assert_eq!(y.last_boundary, Some(b.len()), "cut {cut}");
        }
        for size in [7, 1000, 65_536] {
            let mut sc = SseScanner::new();
            let total: u32 = s.chunks(size).map(|c| sc.scan(c).progress).sum();
            assert_eq!(total, 1);
        }
    }

    /// A typical OpenAI chat completion stream: `n` content deltas plus role and finish
    /// chunks and the `[DONE]` sentinel, all of which are progress.
    fn openai_stream(n: usize) -> Vec<u8> {
        let head = r#"{"id":"chatcmpl-9","object":"chat.completion.chunk","created":1700000000,"model":"gpt-4o-2024-08-06","system_fingerprint":"fp_1","choices":[{"index":0,"#;
        let mut s = format!(
            "data: {head}\"delta\":{{\"role\":\"assistant\",\"content\":\"\"}},\"logprobs\":null,\"finish_reason\":null}}]}}\n\n"
        );
        for i in 0..n {
            s += &format!(
                "data: {head}\"delta\":{{\"content\":\" word{i}\"}},\"logprobs\":null,\"finish_reason\":null}}]}}\n\n"
            );
        }
        s += &format!(
            "data: {head}\"delta\":{{}},\"logprobs\":null,\"finish_reason\":\"stop\"}}]}}\n\n"
        );
        s += "data: [DONE]\n\n";
        s.into_bytes()
    }

    #[test]
    fn realistic_openai_stream() {
        let s = openai_stream(40);
        let (got, sc) = one(&s);
        assert_eq!(got, scan(Some(s.len()), 43, None));
        assert!(!sc.in_block());
        let mut sc = SseScanner::new();
        assert_eq!(s.chunks(97).map(|c| sc.scan(c).progress).sum::<u32>(), 43);
    }

    #[test]
    fn realistic_anthropic_stream() {
        let mut s = String::from(concat!(
            "event: message_start\n",
            r#"data: {"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"model":"claude-sonnet-4-20250514","stop_reason":null,"usage":{"input_tokens":25,"output_tokens":1}}}"#,
            "\n\nevent: content_block_start\n",
            r#"data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
            "\n\nevent: ping\n",
            r#"data: {"type": "ping"}"#,
            "\n\n",
        ));
        for i in 0..10 {
            s += &format!(
                "event: content_block_delta\ndata: {{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{{\"type\":\"text_delta\",\"text\":\"tok{i} \"}}}}\n\n"
            );
        }
        s += concat!(
            "event: content_block_stop\n",
            r#"data: {"type":"content_block_stop","index":0}"#,
            "\n\nevent: ping\n",
            r#"data: {"type": "ping"}"#,
            "\n\nevent: message_delta\n",
            r#"data: {"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":15}}"#,
            "\n\nevent: message_stop\n",
            r#"data: {"type":"message_stop"}"#,
            "\n\n",
        );
        // 2 + 10 deltas + stop + message_delta + message_stop; the 2 pings do not count.
        let (got, sc) = one(s.as_bytes());
        assert_eq!(got, scan(Some(s.len()), 15, None));
        assert!(!sc.in_block());
        let mut sc = SseScanner::new();
        let total: u32 = s.as_bytes().chunks(13).map(|c| sc.scan(c).progress).sum();
        assert_eq!(total, 15);
        // Overloaded mid-stream: everything before counts, the error stops the scan.
        let err = "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n";
        let cut = s.find("event: content_block_stop").unwrap_or(0);
        let stream = format!("{}{err}{}", &s[..cut], &s[cut..]);
        let (got, _) = one(stream.as_bytes());
        assert_eq!(got, scan(Some(cut + err.len()), 12, Some(cut + err.len())));
    }
}
