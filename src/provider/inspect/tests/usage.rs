//! The usage a stream reports: Groq's `x_groq.usage`, the usage-only chunk the gateway asked
//! for left out of the client's stream (UC 3, VC 3, VC 4), and counts past any answer's (WD 1).

use super::*;

/// Audit GB 4: Groq reports a stream's usage under `x_groq.usage` in its last chunk (a
/// top-level `usage` only when `include_usage` asks): it is the usage, not an estimate.
#[test]
fn groq_reports_its_usage_under_x_groq() {
    let s = concat!(
        "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Hello\"},\"finish_reason\":null}],\"x_groq\":{\"id\":\"req_01\"}}\n\n",
        "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],\"x_groq\":{\"id\":\"req_01\",\"usage\":{\"queue_time\":0.01,\"prompt_tokens\":18,\"prompt_time\":0.002,\"completion_tokens\":7,\"completion_time\":0.03,\"total_tokens\":25,\"total_time\":0.032}}}\n\n",
        "data: [DONE]\n\n",
    );
    let got = run(Format::Chat, s.as_bytes(), true, &[]);
    assert_eq!(got.tokens.prompt(), Some(18));
    assert_eq!(got.tokens.completion(), (7, Source::Reported));
}

/// Audit HB4: with both a top-level `usage` and `x_groq.usage` in one chunk, the top-level
/// one is the usage whatever their order, as the document rebuilt from the stream says; the
/// run was charged `x_groq`'s when it came last.
#[test]
fn a_top_level_usage_wins_over_x_groqs() {
    let top = r#""usage":{"prompt_tokens":5,"completion_tokens":6,"total_tokens":11}"#;
    let groq = r#""x_groq":{"id":"req_01","usage":{"prompt_tokens":500,"completion_tokens":600,"total_tokens":1100}}"#;
    for (first, second) in [(top, groq), (groq, top)] {
        let s = format!(
            "data: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"Hi\"}},\"finish_reason\":\"stop\"}}],{first},{second}}}\n\ndata: [DONE]\n\n"
        );
        let got = run(Format::Chat, s.as_bytes(), true, &[]);
        assert_eq!(got.tokens.prompt(), Some(5), "{s}");
        assert_eq!(got.tokens.completion(), (6, Source::Reported), "{s}");
    }
}

/// What a client gets of `chunks` with the usage chunk hidden, the frames handled as the
/// watchdog handles them (`leave_out`): bytes after the last boundary are held until one
/// comes; a left-out range's bytes, and those held before it when it began earlier, go.
fn hidden_usage_out(chunks: &[&[u8]]) -> Vec<u8> {
    let mut ins = Inspector::new(Format::Chat, true).hiding_usage();
    let (mut out, mut held) = (Vec::new(), Vec::new());
    for chunk in chunks {
        let (scan, _) = ins.read(chunk);
        let (mut data, mut boundary) = (*chunk, scan.last_boundary);
        if let Some(lo) = scan.left_out {
            match lo.start {
                Some(start) => {
                    out.append(&mut held);
                    out.extend_from_slice(&data[..start]);
                }
                None => held.clear(),
            }
            data = &data[lo.end..];
            boundary = boundary.map(|b| b - lo.end);
        }
        match boundary {
            Some(b) => {
                out.append(&mut held);
                out.extend_from_slice(&data[..b]);
                held.extend_from_slice(&data[b..]);
            }
            None => held.extend_from_slice(data),
        }
    }
    out.append(&mut held);
    out
}

/// Audits VC 3 and VC 4: the usage-only chunk the gateway asked for is left out whole, at
/// every split of the stream in two, with LF, CRLF or CR line ends, one usage chunk or two
/// in a row. Before: a CRLF stream split between the usage chunk's final CR and LF let the
/// LF through (VC 3), and of two usage chunks in one frame the first passed (VC 4).
#[test]
fn the_usage_chunk_is_left_out_whole_at_every_split() {
    let c1 = r#"data: {"choices":[{"index":0,"delta":{"content":"Hi"}}],"usage":null}"#;
    let c2 = r#"data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":null}"#;
    let u = r#"data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2}}"#;
    let done = "data: [DONE]";
    for eol in ["\n", "\r\n", "\r"] {
        for usages in [1, 2] {
            let event = |e: &str| format!("{e}{eol}{eol}");
            let kept = [c1, c2, done].map(event);
            let mut events: Vec<String> = kept[..2].to_vec();
            events.extend(std::iter::repeat_n(event(u), usages));
            events.push(kept[2].clone());
            let stream = events.concat();
            let want = kept.concat();
            for cut in 0..=stream.len() {
                let (a, b) = stream.as_bytes().split_at(cut);
                let got = hidden_usage_out(&[a, b]);
                assert_eq!(
                    String::from_utf8_lossy(&got),
                    want,
                    "eol {eol:?}, {usages} usage chunk(s), cut {cut}"
                );
            }
        }
    }
}

/// Audit WD 1: a reported count past any answer's, up to one past 64 bits, reads as the cap,
/// so the sums made of it (a prompt's parts, the token counters) cannot wrap.
#[test]
fn an_absurd_usage_reads_as_the_cap() {
    let s = "data: {\"usage\":{\"prompt_tokens\":18446744073709551615,\"completion_tokens\":99999999999999999999999}}\n\n";
    for cut in 0..s.len() {
        let got = run(Format::Chat, s.as_bytes(), true, &[cut]);
        assert_eq!(
            (got.tokens.prompt(), got.tokens.completion),
            (Some(MAX_REPORTED_TOKENS), Some(MAX_REPORTED_TOKENS))
        );
    }
    let s = "data: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":18446744073709551615,\"cache_creation_input_tokens\":18446744073709551615,\"cache_read_input_tokens\":1099511627777}}}\n\n";
    let got = run(Format::Messages, s.as_bytes(), true, &[]);
    assert_eq!(got.tokens.prompt(), Some(3 * MAX_REPORTED_TOKENS));
}

/// Audit ZB 6: Moonshot (Kimi) sends the answer's usage in its last chunk's choice,
/// `choices[0].usage`: it is the usage, as Groq's `x_groq.usage` is, and a top-level one in
/// the same chunk wins whatever their order.
#[test]
fn moonshot_reports_its_usage_in_the_choice() {
    let kimi = r#"{"index":0,"delta":{},"finish_reason":"stop","usage":{"prompt_tokens":812,"completion_tokens":5,"total_tokens":817,"cached_tokens":800}}"#;
    let s = format!(
        "data: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{{\"index\":0,\"delta\":{{\"role\":\"assistant\",\"content\":\"Hello\"}},\"finish_reason\":null}}]}}\n\ndata: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{kimi}]}}\n\ndata: [DONE]\n\n"
    );
    let cuts: Vec<usize> = (0..s.len()).collect();
    for cuts in [&[][..], &cuts[..]] {
        let got = run(Format::Chat, s.as_bytes(), true, cuts);
        assert_eq!(got.tokens.prompt(), Some(812));
        assert_eq!(got.tokens.completion(), (5, Source::Reported));
    }
    let top = r#""usage":{"prompt_tokens":5,"completion_tokens":6,"total_tokens":11}"#;
    let choices = format!(r#""choices":[{kimi}]"#);
    for (first, second) in [(top, choices.as_str()), (choices.as_str(), top)] {
        let s = format!("data: {{\"id\":\"c\",{first},{second}}}\n\ndata: [DONE]\n\n");
        let got = run(Format::Chat, s.as_bytes(), true, &[]);
        assert_eq!(got.tokens.prompt(), Some(5), "{s}");
        assert_eq!(got.tokens.completion(), (6, Source::Reported), "{s}");
    }
}
