//! Break audit YB 3: the `"done": true` line of an NDJSON answer, read in any pieces.

use super::*;

const CHAT: &str = "{\"model\":\"llama3\",\"message\":{\"role\":\"assistant\",\"content\":\"Hi\"},\"done\":false}\n";
const LAST: &str = "{\"model\":\"llama3\",\"message\":{\"role\":\"assistant\",\"content\":\"\"},\"done_reason\":\"stop\",\"done\": true,\"total_duration\":123,\"context\":[1,2,3]}\n";

/// Where (the offset of the piece) the answer was over, reading `stream` cut at `cut`.
fn over_at(stream: &str, cut: usize) -> Option<usize> {
    let mut r = NdjsonEnd::new();
    r.read(&stream.as_bytes()[..cut]);
    if r.over() {
        return Some(0);
    }
    r.read(&stream.as_bytes()[cut..]);
    r.over().then_some(cut)
}

/// The answer is over at the end of its `"done": true` line, not before its line end, split
/// anywhere; lines of `"done": false` end nothing.
#[test]
fn the_done_line_ends_the_answer_at_its_line_end() {
    let stream = format!("{CHAT}{CHAT}{LAST}");
    for cut in 0..=stream.len() {
        let want = if cut == stream.len() { 0 } else { cut };
        assert_eq!(over_at(&stream, cut), Some(want), "cut at {cut}");
    }
    // Without its line end, the last line is not over yet.
    let open = &stream[..stream.len() - 1];
    for cut in 0..=open.len() {
        assert_eq!(over_at(open, cut), None, "cut at {cut}");
    }
    assert_eq!(over_at(&format!("{CHAT}{CHAT}"), 3), None);
}

/// Only a top-level `done` that is `true`: one nested in a tool call's arguments, the text of
/// a string, a key that only contains it, `false` or a string value are not the end.
#[test]
fn only_a_top_level_done_true_ends_it() {
    for line in [
        "{\"message\":{\"tool_calls\":[{\"function\":{\"name\":\"f\",\"arguments\":{\"done\":true}}}]},\"done\":false}\n",
        "{\"message\":{\"content\":\"\\\"done\\\":true\"},\"done\":false}\n",
        "{\"x\\\"done\":true,\"done\":false}\n",
        "{\"undone\":true}\n",
        "{\"done\":\"true\"}\n",
        "{\"done\":[true]}\n",
        "{\"done\":truex}\n",
        "[{\"done\":true}]\n",
    ] {
        let mut r = NdjsonEnd::new();
        r.read(line.as_bytes());
        assert!(!r.over(), "{line}");
    }
    for line in [
        "{\"done\":true}\n",
        "{ \"done\" : true }\r\n",
        "{\"a\":{\"done\":false},\"done\":true}\n",
        "{\"context\":[1,[2]],\"done\":true}\n",
    ] {
        let mut r = NdjsonEnd::new();
        for b in line.as_bytes() {
            r.read(std::slice::from_ref(b));
        }
        assert!(r.over(), "{line}");
    }
    // A garbled line does not spoil the next.
    let mut r = NdjsonEnd::new();
    r.read(b"{{{[[\"a\":\n{\"done\":true}\n");
    assert!(r.over());
}

/// Break audit ZC 1: only Ollama's calls end at `"done": true`; a file's NDJSON content (or a
/// pull's progress) that holds such a line passes whole.
#[test]
fn only_ollamas_calls_end_at_their_done_line() {
    for path in [
        "/api/chat",
        "/api/generate",
        "/ollama/api/chat/",
        "/api/generate?x=1",
    ] {
        assert!(ends_at_done(path), "{path}");
    }
    for path in [
        "/v1/files/f1/content",
        "/api/pull",
        "/api/chats",
        "/v1/chat/completions",
    ] {
        assert!(!ends_at_done(path), "{path}");
    }
}
