use super::*;
use proptest::prelude::*;

/// llama.cpp's `error:` field, read by a sink that reads it (audit WB 2, YC 1).
mod error_field;

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

/// A scan whose dispatched events all count as progress (no keep-alives among them).
fn scan(last_boundary: Option<usize>, progress: u32, error_end: Option<usize>) -> Scan {
    Scan {
        last_boundary,
        progress,
        dispatched: progress,
        error_end,
        left_out: None,
        error_field: None,
    }
}

/// Straightforward spec parser over the whole stream, with real buffers.
#[derive(Debug, Default)]
struct Reference {
    boundaries: Vec<usize>,
    progress: u32,
    dispatched: u32,
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
                    b"ping" | b"keepalive" => {}
                    b"error" => {
                        out.error_end = Some(pos);
                        return out;
                    }
                    _ => out.progress += 1,
                }
                out.dispatched += 1;
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
/// after the CR in the first chunk (and after the LF in the second). The error event's
/// end is exact: a chunk ending in the CR of its blank line leaves it to the next chunk
/// (or, at the end, to `error_pending`).
fn check_split(stream: &[u8], cuts: &[usize]) -> Result<(), TestCaseError> {
    let r = reference(stream);
    let mut edges: Vec<usize> = cuts.iter().copied().chain([0, stream.len()]).collect();
    edges.sort_unstable();
    edges.dedup();
    let mut sc = SseScanner::new();
    let (mut progress, mut dispatched, mut last) = (0, 0, 0);
    let bom_end = if stream.starts_with(&BOM) { 3 } else { 0 };
    for w in edges.windows(2) {
        let (s, e) = (w[0], w[1]);
        let got = sc.scan(&stream[s..e]);
        progress += got.progress;
        dispatched += got.dispatched;
        let expect = |b: usize| {
            if b == e + 1 && stream[e - 1] == b'\r' && stream[e] == b'\n' {
                Some(e)
            } else {
                (s < b && b <= e).then_some(b)
            }
        };
        let exp_last = r.boundaries.iter().filter_map(|&b| expect(b)).max();
        let exp_err = r.error_end.filter(|&b| {
            let cr_ends_chunk = b == e && stream[b - 1] == b'\r';
            s < b && b <= e && !cr_ends_chunk || b == s && stream[b - 1] == b'\r'
        });
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
    let cr_ends_stream = r.error_end == Some(stream.len()) && stream.ends_with(b"\r");
    prop_assert_eq!(sc.error_pending(), cr_ends_stream);
    prop_assert_eq!(progress, r.progress);
    prop_assert_eq!(dispatched, r.dispatched);
    Ok(())
}

/// Collects what a sink is told: the data of every dispatched event (each line's value
/// followed by a line feed, as the standard builds its data buffer) with its type.
#[derive(Default)]
struct Recording {
    open: Vec<u8>,
    events: Vec<(Vec<u8>, EventType)>,
}

impl EventSink for Recording {
    fn data(&mut self, value: &[u8]) {
        self.open.extend_from_slice(value);
    }
    fn data_line_end(&mut self) {
        self.open.push(b'\n');
    }
    fn end_event(&mut self, dispatched: bool, kind: EventType) -> bool {
        let data = std::mem::take(&mut self.open);
        if dispatched {
            self.events.push((data, kind));
        }
        false
    }
}

/// The data of the events the standard dispatches, up to the first `error` event.
fn reference_events(stream: &[u8]) -> Vec<(Vec<u8>, EventType)> {
    let mut out = Vec::new();
    let mut pos = if stream.starts_with(&BOM) { 3 } else { 0 };
    let (mut data, mut ty, mut has_data) = (Vec::new(), Vec::new(), false);
    while let Some(i) = stream[pos..].iter().position(|&b| b == b'\n' || b == b'\r') {
        let line = &stream[pos..pos + i];
        pos += i + 1;
        if stream[pos - 1] == b'\r' && stream.get(pos) == Some(&b'\n') {
            pos += 1;
        }
        if line.is_empty() {
            if has_data {
                let kind = match &ty[..] {
                    b"ping" | b"keepalive" => EventType::Ping,
                    b"error" => EventType::Error,
                    _ => EventType::Other,
                };
                out.push((std::mem::take(&mut data), kind));
                if kind == EventType::Error {
                    return out;
                }
            }
            data.clear();
            ty.clear();
            has_data = false;
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
                    has_data = true;
                }
                b"event" => ty = value.to_vec(),
                _ => {}
            }
        }
    }
    out
}

fn check_sink(stream: &[u8], cuts: &[usize]) -> Result<(), TestCaseError> {
    let mut edges: Vec<usize> = cuts.iter().copied().chain([0, stream.len()]).collect();
    edges.sort_unstable();
    edges.dedup();
    let mut sc = SseScanner::new();
    let mut sink = Recording::default();
    for w in edges.windows(2) {
        if sc
            .scan_with(&stream[w[0]..w[1]], &mut sink)
            .error_end
            .is_some()
        {
            break;
        }
    }
    prop_assert_eq!(sink.events, reference_events(stream));
    Ok(())
}

fn value() -> impl Strategy<Value = Vec<u8>> {
    let byte = prop_oneof![
        4 => Just(b'a'),
        2 => Just(b' '),
        2 => Just(b':'),
        1 => Just(0xEF),
        // Mapped, not filtered: proptest caps rejections per run (65536), which a
        // filter on every byte of every case reaches in a deep run.
        2 => any::<u8>().prop_map(|b| if b == b'\n' || b == b'\r' { b'x' } else { b }),
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
        " keepalive",
        "keepalive",
        " keepalivex",
        " keepalive ",
        " Keepalive",
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
    let start = prop::sample::select(vec![&b""[..], &BOM, &BOM[..2], &BOM[..1], b"\xEF\xBB\xEF"]);
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

/// `cases` per property, unless `PROPTEST_CASES` asks for another number (a deep run:
/// `PROPTEST_CASES=20000 cargo test`).
pub(crate) fn cases(cases: u32) -> ProptestConfig {
    let config = ProptestConfig::default();
    if std::env::var_os("PROPTEST_CASES").is_some() {
        config
    } else {
        ProptestConfig { cases, ..config }
    }
}

proptest! {
    #![proptest_config(cases(1024))]

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

    /// What the sink is handed (the data the inspector reads) is the standard's data
    /// buffer of every dispatched event, wherever the chunks are cut.
    #[test]
    fn the_sink_gets_every_events_data_wherever_the_cuts(
        s in stream(),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..12),
    ) {
        let cuts: Vec<usize> = cuts.iter().map(|i| i.index(s.len() + 1)).collect();
        check_sink(&s, &cuts)?;
        check_sink(&s, &(0..=s.len()).collect::<Vec<_>>())?;
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
    #![proptest_config(cases(96))]

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

/// Audit PB 1: `ends_in_blank_cr` says the stream so far ends in the CR of a blank line, and
/// an LF written after it completes that CRLF: the standard dispatches the same events, with
/// an event appended after the LF on its own.
#[test]
fn a_stream_ending_in_a_blank_lines_cr_takes_an_lf_as_no_extra_line() {
    for (chunks, expect) in [
        (&[&b"data: a\r\n\r"[..]][..], true),
        (&[b"data: a\r\r"], true),
        (&[b"data: a\r\n\r", b"\n"], false),
        (&[b"data: a\r"], false),
        (&[b"data: a\n\n"], false),
        (&[b"data: a\r\n\r\n"], false),
        (&[b"event: error\ndata: x\r\r"], false),
    ] {
        let (_, sc) = feed(chunks);
        assert_eq!(sc.ends_in_blank_cr(), expect, "{chunks:?}");
    }
    let stream = b"data: a\r\n\r\nevent: error\ndata: e\n\n";
    let events = reference_events(stream);
    assert_eq!(
        events,
        vec![
            (b"a\n".to_vec(), EventType::Other),
            (b"e\n".to_vec(), EventType::Error)
        ]
    );
    let error = b"event: error\ndata: e\n\n";
    let (scans, _) = feed(&[b"data: a\r\n\r", b"\n", error]);
    assert_eq!(scans[1], scan(Some(1), 0, None));
    assert_eq!(scans[2].error_end, Some(error.len()));
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
    assert_eq!(
        one(ping).0,
        Scan {
            dispatched: 1,
            ..scan(Some(ping.len()), 0, None)
        }
    );
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

/// OpenAI's Responses API sends `event: keepalive` during a long think: a keep-alive like
/// Anthropic's ping, or a model that only thinks would pass its first-token limit at the
/// first heartbeat.
#[test]
fn keepalive_is_not_progress() {
    let ka = b"event: keepalive\ndata: {\"type\":\"keepalive\",\"sequence_number\":3}\n\n";
    // Dispatched all the same: the Responses API numbers its keep-alives too.
    assert_eq!(
        one(ka).0,
        Scan {
            dispatched: 1,
            ..scan(Some(ka.len()), 0, None)
        }
    );
    assert_eq!(one(b"event:keepalive\ndata\n\n").0.progress, 0);
    assert_eq!(one(b"event: keepalivex\ndata\n\n").0.progress, 1);
    assert_eq!(one(b"event: keepalive \ndata\n\n").0.progress, 1);
    for cut in 1..ka.len() {
        let (scans, _) = feed(&[&ka[..cut], &ka[cut..]]);
        assert_eq!(scans.iter().map(|s| s.progress).sum::<u32>(), 0, "{cut}");
    }
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
fn an_error_ending_a_chunk_in_a_cr_ends_where_the_next_byte_says() {
    // The event is complete at the CR (a boundary), but the end of what is forwarded
    // waits for the next byte: the LF of a CRLF belongs to the event.
    let head: &[u8] = b"event: error\r\ndata: x\r\n\r";
    let mut sc = SseScanner::new();
    assert_eq!(sc.scan(head), scan(Some(head.len()), 0, None));
    assert!(sc.error_pending());
    assert_eq!(sc.scan(b"\ndata: y\r\n\r\n"), scan(Some(1), 0, Some(1)));
    assert!(!sc.error_pending());
    assert_eq!(sc.scan(b"\n"), Scan::default());
    // A lone CR: the event ended at it, nothing of the next chunk is the stream's.
    let mut sc = SseScanner::new();
    sc.scan(b"event: error\rdata: x\r\r");
    assert_eq!(sc.scan(b"data: y\r\r"), scan(None, 0, Some(0)));
    // An empty chunk changes nothing; the end of the body leaves it pending.
    let mut sc = SseScanner::new();
    sc.scan(b"event: error\ndata: x\n\r");
    assert_eq!(sc.scan(b""), Scan::default());
    assert!(sc.error_pending());
    // Whole, the same stream ends past the LF.
    assert_eq!(
        one(b"event: error\r\ndata: x\r\n\r\ndata: y").0.error_end,
        Some(head.len() + 1)
    );
}

#[test]
fn multiple_events_in_one_chunk() {
    let s = b"data: 1\n\n: c\n\nevent: ping\ndata: p\n\ndata: 2\n\nid: 9\ndata: 3\n\ndata: part";
    let (got, sc) = one(s);
    assert_eq!(
        got,
        Scan {
            dispatched: 4,
            ..scan(Some(s.len() - 10), 3, None)
        }
    );
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
    assert_eq!(
        got,
        Scan {
            dispatched: 17,
            ..scan(Some(s.len()), 15, None)
        }
    );
    assert!(!sc.in_block());
    let mut sc = SseScanner::new();
    let total: u32 = s.as_bytes().chunks(13).map(|c| sc.scan(c).progress).sum();
    assert_eq!(total, 15);
    // Overloaded mid-stream: everything before counts, the error stops the scan.
    let err = "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n";
    let cut = s.find("event: content_block_stop").unwrap_or(0);
    let stream = format!("{}{err}{}", &s[..cut], &s[cut..]);
    let (got, _) = one(stream.as_bytes());
    assert_eq!(
        got,
        Scan {
            dispatched: 13,
            ..scan(Some(cut + err.len()), 12, Some(cut + err.len()))
        }
    );
}

/// Audit UE 2: the end marker is `[DONE]` at the start of the data, whatever follows, in
/// whatever pieces the data comes.
#[test]
fn the_end_marker_is_done_at_the_start_of_the_data() {
    for (data, is) in [
        (&b"[DONE]"[..], true),
        (b"[DONE]x", true),
        (b"[DONE]\n", true),
        (b"[DONE] {}", true),
        (b"[DONE", false),
        (b"", false),
        (b" [DONE]", false),
        (b"[DONe]", false),
        (b"[DO\nNE]", false),
        (b"{\"choices\":[]}", false),
    ] {
        assert_eq!(
            EndMarker::is(data),
            is,
            "{:?}",
            String::from_utf8_lossy(data)
        );
        for at in 0..=data.len() {
            let mut m = EndMarker::default();
            m.note(&data[..at]);
            m.note(&data[at..]);
            assert_eq!(m.found(), is, "{data:?} cut at {at}");
        }
    }
}
