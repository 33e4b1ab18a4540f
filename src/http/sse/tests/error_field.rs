//! A block with an `error` field: llama.cpp's error event for a sink that reads the field
//! (the inspector), and the standard's reading for any other, or when the block has data.

use super::*;

/// Records the events' data and the `error` fields' values; reads a block of the field and
/// no data as the provider's error.
#[derive(Default)]
struct Fields {
    events: Recording,
    field: Vec<u8>,
    /// Each block with the field that ended: its value, and whether it had data.
    blocks: Vec<(Vec<u8>, bool)>,
}

impl EventSink for Fields {
    fn data(&mut self, value: &[u8]) {
        self.events.data(value);
    }
    fn data_line_end(&mut self) {
        self.events.data_line_end();
    }
    fn end_event(&mut self, dispatched: bool, kind: EventType) -> bool {
        self.events.end_event(dispatched, kind)
    }
    fn error_field(&mut self, value: &[u8]) {
        self.field.extend_from_slice(value);
    }
    fn error_block_end(&mut self, dispatched: bool) -> bool {
        let value = std::mem::take(&mut self.field);
        self.blocks.push((value, dispatched));
        !dispatched
    }
}

const VALUE: &str = r#"{"code":400,"message":"the request exceeds the available context size","type":"exceed_context_size_error"}"#;

/// Feeds `stream` in two pieces, cut at `k`, to `sink`: both scans.
fn two<S: EventSink>(stream: &[u8], k: usize, sink: &mut S) -> (Scan, Scan) {
    let (a, b) = stream.split_at(k);
    let mut sc = SseScanner::new();
    let first = sc.scan_with(a, sink);
    (first, sc.scan_with(b, sink))
}

/// The block, cut anywhere, with any line end: the sink gets the value whole (its line end
/// as `\n`), the scan stops at its blank line, even at a CR that ends the piece (the block is
/// replaced, its line end with it), and reports where it lies; the event before it is
/// delivered. Read by the standard (`()`), the field is ignored and `[DONE]` read after it.
#[test]
fn a_block_of_an_error_field_is_the_providers_error_for_a_sink_that_reads_it() {
    for eol in ["\n", "\r\n", "\r"] {
        for space in ["", " "] {
            let head = format!("data: {{\"a\":1}}{eol}{eol}");
            let block = format!("id: 7{eol}error:{space}{VALUE}{eol}{eol}");
            let stream = format!("{head}{block}data: [DONE]{eol}{eol}");
            let stream = stream.as_bytes();
            let end = head.len() + block.len();
            for k in 0..=stream.len() {
                let case = format!("{eol:?} {space:?} cut at {k}");
                let mut sink = Fields::default();
                let (first, second) = two(stream, k, &mut sink);
                let (scan, offset) = match first.error_end {
                    Some(_) => (first, 0),
                    None => (second, k),
                };
                // A CRLF cut between its CR and LF: the block ends at the CR, the LF unread.
                let end = if eol == "\r\n" && k == end - 1 {
                    end - 1
                } else {
                    end
                };
                assert_eq!(scan.error_end.map(|e| e + offset), Some(end), "{case}");
                let field = scan.error_field.expect(&case);
                assert_eq!(field.end + offset, end, "{case}");
                match field.start {
                    Some(start) => assert_eq!(start + offset, head.len(), "{case}"),
                    // Begun before the piece: at its start, or in the piece before.
                    None => assert!(offset > 0 && k >= head.len(), "{case}"),
                }
                assert_eq!(
                    sink.events.events,
                    vec![(b"{\"a\":1}\n".to_vec(), EventType::Other)],
                    "{case}"
                );
                let want = format!("{space}{VALUE}\n");
                assert_eq!(sink.blocks, vec![(want.into_bytes(), false)], "{case}");
                // The standard's reading: the field is ignored, and `[DONE]` is read.
                let (first, second) = two(stream, k, &mut ());
                for s in [first, second] {
                    assert!(s.error_end.is_none() && s.error_field.is_none(), "{case}");
                }
                assert_eq!(first.progress + second.progress, 2, "{case}");
            }
        }
    }
}

/// Audit YC 1: a block with both an `error` field and a `data` line is read as the standard
/// reads it, whichever comes first: its data is delivered, and the scan goes on.
#[test]
fn a_block_with_data_and_an_error_field_is_read_as_the_standard_reads_it() {
    for block in [
        format!("error: {VALUE}\ndata: {{\"a\":1}}\n\n"),
        format!("data: {{\"a\":1}}\nerror: {VALUE}\n\n"),
    ] {
        let stream = format!("{block}data: {{\"b\":2}}\n\n");
        let stream = stream.as_bytes();
        for k in 0..=stream.len() {
            let mut sink = Fields::default();
            let (first, second) = two(stream, k, &mut sink);
            let case = format!("{block:?} cut at {k}");
            assert!(
                first.error_end.is_none() && second.error_end.is_none(),
                "{case}"
            );
            assert_eq!(first.progress + second.progress, 2, "{case}");
            assert_eq!(
                sink.events.events,
                vec![
                    (b"{\"a\":1}\n".to_vec(), EventType::Other),
                    (b"{\"b\":2}\n".to_vec(), EventType::Other)
                ],
                "{case}"
            );
            assert_eq!(sink.blocks.len(), 1, "{case}");
            assert!(sink.blocks[0].1, "had data: {case}");
        }
    }
}

/// `error` without a colon is the field with an empty value; a field whose name only starts
/// with `error` is another field, ignored.
#[test]
fn an_error_field_is_named_exactly() {
    let mut sink = Fields::default();
    let scan = SseScanner::new().scan_with(b"error\n\n", &mut sink);
    assert_eq!(scan.error_end, Some(7));
    assert_eq!(sink.blocks, vec![(b"\n".to_vec(), false)]);
    for other in ["errors: x\n\n", "error2:x\n\n", "event: x\nerrorx\n\n"] {
        let stream = other.as_bytes();
        for k in 0..=stream.len() {
            let mut sink = Fields::default();
            let (first, second) = two(stream, k, &mut sink);
            assert!(
                first.error_end.is_none() && second.error_end.is_none(),
                "{other:?}"
            );
            assert!(sink.blocks.is_empty(), "{other:?} cut at {k}");
        }
    }
}
