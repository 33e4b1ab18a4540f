use super::*;

/// Feeds SSE `events` (each one event's data) as the scanner would hand them over.
fn streamed(format: Format, events: &[&str]) -> Option<(Vec<u8>, String)> {
    let mut t = ToolCalls::new(format);
    for ev in events {
        // Split in two, as a line cut across frames would be.
        let (a, b) = ev.split_at(ev.len() / 2);
        t.data(a.as_bytes());
        t.data(b.as_bytes());
        t.line_end();
        t.event_end(true);
    }
    t.canonical()
}

fn whole(format: Format, doc: &str) -> Option<(Vec<u8>, String)> {
    let mut t = ToolCalls::new(format);
    for piece in doc.as_bytes().chunks(7) {
        t.data(piece);
    }
    t.document_end();
    t.canonical()
}

const CANON: &[u8] = b"get_weather\0{\"city\":\"Paris\",\"unit\":\"c\"}\0";

#[test]
fn chat_streamed_and_whole_give_the_same_call() {
    let s = streamed(
        Format::Chat,
        &[
            r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":null,"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get_weather","arguments":""}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"unit\": \"c\","}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":" \"city\":\"Paris\"}"}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}"#,
            r#"{"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":3}}"#,
            "[DONE]",
        ],
    );
    let w = whole(
        Format::Chat,
        r#"{"id":"x","choices":[{"index":0,"message":{"role":"assistant","content":null,"tool_calls":[{"id":"call_9","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\",\"unit\":\"c\"}"}}]},"finish_reason":"tool_calls"}]}"#,
    );
    assert_eq!(s, Some((CANON.to_vec(), "get_weather".into())));
    assert_eq!(s, w, "the ids differ; the calls do not");
}

#[test]
fn messages_streamed_and_whole_give_the_same_call() {
    let s = streamed(
        Format::Messages,
        &[
            r#"{"type":"message_start","message":{"id":"msg_1","usage":{"input_tokens":5}}}"#,
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Let me look."}}"#,
            r#"{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"toolu_1","name":"get_weather","input":{}}}"#,
            r#"{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"unit\":\"c\",\"ci"}}"#,
            r#"{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"ty\": \"Paris\"}"}}"#,
            r#"{"type":"content_block_stop","index":1}"#,
            r#"{"type":"message_delta","delta":{"stop_reason":"tool_use"},"usage":{"output_tokens":20}}"#,
        ],
    );
    let w = whole(
        Format::Messages,
        r#"{"id":"msg_2","type":"message","content":[{"type":"text","text":"Let me look."},{"type":"tool_use","id":"toolu_2","name":"get_weather","input":{"city":"Paris","unit":"c"}}],"stop_reason":"tool_use"}"#,
    );
    assert_eq!(s, Some((CANON.to_vec(), "get_weather".into())));
    assert_eq!(s, w);
}

#[test]
fn responses_streamed_and_whole_give_the_same_call() {
    let s = streamed(
        Format::Responses,
        &[
            r#"{"type":"response.created","response":{"id":"resp_1","output":[]}}"#,
            r#"{"type":"response.output_item.added","output_index":0,"item":{"type":"function_call","id":"fc_1","call_id":"call_1","name":"get_weather","arguments":""}}"#,
            r#"{"type":"response.function_call_arguments.delta","item_id":"fc_1","output_index":0,"delta":"{\"unit\":\"c\","}"#,
            r#"{"type":"response.function_call_arguments.delta","item_id":"fc_1","output_index":0,"delta":"\"city\":\"Paris\"}"}"#,
        ],
    );
    let w = whole(
        Format::Responses,
        r#"{"id":"resp_2","object":"response","output":[{"type":"function_call","id":"fc_2","call_id":"call_2","name":"get_weather","arguments":"{ \"city\" : \"Paris\", \"unit\": \"c\" }"}]}"#,
    );
    assert_eq!(s, Some((CANON.to_vec(), "get_weather".into())));
    assert_eq!(s, w);
}

#[test]
fn an_answer_without_tool_calls_has_none_and_other_arguments_differ() {
    assert_eq!(
        whole(
            Format::Chat,
            r#"{"choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}]}"#
        ),
        None
    );
    let a = whole(
        Format::Chat,
        r#"{"choices":[{"index":0,"message":{"tool_calls":[{"function":{"name":"f","arguments":"{\"a\":1}"}}]}}]}"#,
    );
    let b = whole(
        Format::Chat,
        r#"{"choices":[{"index":0,"message":{"tool_calls":[{"function":{"name":"f","arguments":"{\"a\":2}"}}]}}]}"#,
    );
    assert!(a.is_some() && b.is_some() && a != b);
}

#[test]
fn an_answer_too_large_to_gather_gets_no_fingerprint() {
    let mut t = ToolCalls::new(Format::Chat);
    t.data(
        br#"{"choices":[{"index":0,"message":{"tool_calls":[{"function":{"name":"f","arguments":""#,
    );
    t.data(&vec![b'x'; MAX_GATHERED]);
    t.data(br#""}}]}}]}"#);
    t.document_end();
    assert_eq!(t.canonical(), None);
}

/// Gemini's OpenAI endpoint sends each parallel call whole, in a delta of its own, without
/// `index`: two calls, never one named `get_weatherget_time` (audit S). Pieces of one call
/// without an index still join, whether the pieces repeat its id or not.
#[test]
fn chat_calls_without_an_index_are_told_apart() {
    let gemini = streamed(
        Format::Chat,
        &[
            r#"{"choices":[{"index":0,"delta":{"role":"assistant","tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"id":"call_2","type":"function","function":{"name":"get_time","arguments":"{\"tz\":\"CET\"}"}}]}}]}"#,
        ],
    );
    let (canon, names) = gemini.unwrap();
    assert_eq!(names, "get_weather,get_time");
    // The calls in the order of the calls themselves (KE 4), the names in the answer's.
    assert_eq!(
        canon,
        b"get_time\0{\"tz\":\"CET\"}\0get_weather\0{\"city\":\"Paris\"}\0"
    );
    // Two in one delta, without ids.
    let (_, names) = streamed(
        Format::Chat,
        &[
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"function":{"name":"a","arguments":"{}"}},{"function":{"name":"b","arguments":"{}"}}]}}]}"#,
        ],
    )
    .unwrap();
    assert_eq!(names, "a,b");
    // One call in pieces, the id repeated or not.
    for id in [r#""id":"call_1","#, ""] {
        let (canon, names) = streamed(
            Format::Chat,
            &[
                r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"id":"call_1","function":{"name":"get_weather","arguments":""}}]}}]}"#,
                &format!(r#"{{"choices":[{{"index":0,"delta":{{"tool_calls":[{{{id}"function":{{"arguments":"{{\"unit\": \"c\","}}}}]}}}}]}}"#),
                &format!(r#"{{"choices":[{{"index":0,"delta":{{"tool_calls":[{{{id}"function":{{"arguments":" \"city\":\"Paris\"}}"}}}}]}}}}]}}"#),
            ],
        )
        .unwrap();
        assert_eq!(
            (canon.as_slice(), names.as_str()),
            (CANON, "get_weather"),
            "{id}"
        );
    }
}

fn chat_call(index: usize, name: &str, arguments: &str) -> String {
    format!(
        r#"{{"choices":[{{"index":0,"delta":{{"tool_calls":[{{"index":{index},"function":{{"name":"{name}","arguments":"{arguments}"}}}}]}}}}]}}"#
    )
}

fn feed(t: &mut ToolCalls, event: &str) {
    t.data(event.as_bytes());
    t.line_end();
    t.event_end(true);
}

/// Each event is small, but the answer's arguments come to three times the bound (audit DD
/// F2: 122 MB of arguments were held whole): what is held stays under the bound, and the
/// answer gets no fingerprint.
#[test]
fn an_answer_whose_calls_are_too_large_in_all_gets_no_fingerprint() {
    let mut t = ToolCalls::new(Format::Chat);
    let piece = "x".repeat(64 << 10);
    for i in 0..3 * MAX_GATHERED / piece.len() {
        feed(&mut t, &chat_call(i % 100, "write_file", &piece));
        let held: usize = t
            .calls
            .iter()
            .map(|c| c.name.len() + c.arguments.len())
            .sum();
        assert!(held <= MAX_GATHERED, "{i}: {held}");
    }
    assert_eq!(t.canonical(), None);
    // Many empty calls are bounded as well as a few large ones.
    let mut t = ToolCalls::new(Format::Responses);
    for i in 0..MAX_GATHERED / 16 {
        feed(
            &mut t,
            &format!(
                r#"{{"type":"response.output_item.added","output_index":{i},"item":{{"type":"function_call","name":"f","arguments":"{{}}"}}}}"#
            ),
        );
        if t.calls.is_empty() {
            break;
        }
    }
    assert!(t.calls.is_empty());
    assert_eq!(t.canonical(), None);
}

/// Each piece finds its call without looking through the calls before it (audit DD F2:
/// 80,000 calls took 19 s of CPU, each delta scanning every call so far).
#[test]
fn a_piece_finds_its_call_without_a_scan() {
    let n = 2000;
    let mut t = ToolCalls::new(Format::Chat);
    for i in 0..n {
        feed(&mut t, &chat_call(i, "ab", "{}"));
    }
    assert_eq!(t.calls.len(), n);
    assert!(t.looked_at <= 2 * n, "{}", t.looked_at);
    assert!(t.canonical().is_some());
}

/// An answer of hundreds of calls with long names (audit DD F3: 400 of 64 characters made a
/// 26 KB string kept by every run, and a 28 KB refusal): the names that fit in `MAX_NAMES`,
/// then how many more there were.
#[test]
fn the_names_of_many_calls_are_bounded() {
    let mut t = ToolCalls::new(Format::Chat);
    let long = "n".repeat(64);
    for i in 0..400 {
        feed(&mut t, &chat_call(i, &format!("{i:03}{long}"), "{}"));
    }
    let (_, names) = t.canonical().unwrap();
    assert!(names.len() <= MAX_NAMES, "{}", names.len());
    assert_eq!(names, format!("000{long},001{long},+398"));
    // One name longer than the bound, alone or not.
    let mut t = ToolCalls::new(Format::Chat);
    let huge = "é".repeat(MAX_NAMES);
    feed(&mut t, &chat_call(0, &huge, "{}"));
    let (_, names) = t.canonical().unwrap();
    assert!(names.len() <= MAX_NAMES && names.ends_with('…'), "{names}");
    feed(&mut t, &chat_call(1, "b", "{}"));
    let (_, names) = t.canonical().unwrap();
    assert!(
        names.len() <= MAX_NAMES && names.ends_with("…,+1"),
        "{names}"
    );
}

/// Choice and call indexes come from the upstream: a huge choice index made `choice * 1024`
/// overflow (a panic in a debug build, a wrapped key in a release one), and a call index of
/// 1,024 or more fell among the next choice's calls.
#[test]
fn any_choice_and_call_index_keeps_calls_apart() {
    let event = |choice: u64, index: u64, name: &str| {
        format!(
            r#"{{"choices":[{{"index":{choice},"delta":{{"tool_calls":[{{"index":{index},"function":{{"name":"{name}","arguments":"{{}}"}}}}]}}}}]}}"#
        )
    };
    let mut t = ToolCalls::new(Format::Chat);
    feed(&mut t, &event(0, 1500, "first"));
    feed(&mut t, &event(1, 476, "second"));
    feed(&mut t, &event(u64::MAX, u64::MAX, "third"));
    let (_, names) = t.canonical().unwrap();
    assert_eq!(names, "first,second,third");
}

/// Some OpenAI-compatible servers number every call 0: a new id at the last call's index is a
/// new call, not more of it (audit EB F9: `alpha` and `beta` made one call `alphabeta`). Its
/// pieces, at that index without an id or with its own, join it; a call after it at the next
/// index the upstream gives does not land on it.
#[test]
fn chat_calls_at_a_reused_index_are_told_apart() {
    let (canon, names) = streamed(
        Format::Chat,
        &[
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_a","type":"function","function":{"name":"alpha","arguments":"{}"}},{"index":0,"id":"call_b","type":"function","function":{"name":"beta","arguments":"{}"}}]}}]}"#,
        ],
    )
    .unwrap();
    assert_eq!(names, "alpha,beta");
    assert_eq!(canon, b"alpha\0{}\0beta\0{}\0");
    let (canon, names) = streamed(
        Format::Chat,
        &[
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_a","function":{"name":"alpha","arguments":"{\"x\":"}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_a","function":{"arguments":"1}"}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_b","function":{"name":"beta","arguments":"{\"y\":"}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"2}"}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"call_c","function":{"name":"gamma","arguments":"{}"}}]}}]}"#,
        ],
    )
    .unwrap();
    assert_eq!(names, "alpha,beta,gamma");
    assert_eq!(canon, b"alpha\0{\"x\":1}\0beta\0{\"y\":2}\0gamma\0{}\0");
}

/// Audit GB 1: a GPT-5 custom tool call (`custom`, no `function`) is keyed by its name and
/// input, streamed and whole: distinct calls differ, and the same call is the same.
#[test]
fn chat_custom_tool_calls_are_their_name_and_input() {
    let doc = |input: &str| {
        whole(
            Format::Chat,
            &format!(
                r#"{{"choices":[{{"index":0,"message":{{"tool_calls":[{{"id":"call_1","type":"custom","custom":{{"name":"code_exec","input":"{input}"}}}}]}}}}]}}"#
            ),
        )
    };
    let canon = Some((b"code_exec\0print(0)\0".to_vec(), "code_exec".into()));
    assert_eq!(doc("print(0)"), canon);
    assert_ne!(doc("print(1)"), doc("print(0)"));
    let s = streamed(
        Format::Chat,
        &[
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_2","type":"custom","custom":{"name":"code_exec","input":""}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"custom":{"input":"print("}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"custom":{"input":"0)"}}]}}]}"#,
        ],
    );
    assert_eq!(s, canon);
}

/// Audit GB 5: Responses custom tool calls (`custom_tool_call`, its `input`), computer-use and
/// shell calls (their `action`), and Chat's legacy `function_call` are calls, streamed and
/// whole, and the same one streamed or not is the same call.
#[test]
fn custom_builtin_and_legacy_calls_are_calls() {
    let canon =
        |name: &str, args: &str| Some((format!("{name}\0{args}\0").into_bytes(), name.to_owned()));
    let s = streamed(
        Format::Responses,
        &[
            r#"{"type":"response.output_item.added","output_index":0,"item":{"type":"custom_tool_call","id":"ctc_1","call_id":"call_1","name":"code_exec","input":""}}"#,
            r#"{"type":"response.custom_tool_call_input.delta","output_index":0,"item_id":"ctc_1","delta":"print("}"#,
            r#"{"type":"response.custom_tool_call_input.delta","output_index":0,"item_id":"ctc_1","delta":"0)"}"#,
        ],
    );
    let w = whole(
        Format::Responses,
        r#"{"output":[{"type":"custom_tool_call","id":"ctc_2","call_id":"call_2","name":"code_exec","input":"print(0)"}]}"#,
    );
    assert_eq!(s, canon("code_exec", "print(0)"));
    assert_eq!(s, w);
    let s = streamed(
        Format::Responses,
        &[
            r#"{"type":"response.output_item.added","output_index":0,"item":{"type":"computer_call","id":"cu_1","call_id":"c1","status":"in_progress"}}"#,
            r#"{"type":"response.output_item.done","output_index":0,"item":{"type":"computer_call","id":"cu_1","call_id":"c1","action":{"y":2,"type":"click","x":1},"pending_safety_checks":[]}}"#,
        ],
    );
    assert_eq!(s, canon("computer", r#"{"type":"click","x":1,"y":2}"#));
    let w = whole(
        Format::Responses,
        r#"{"output":[{"type":"local_shell_call","id":"ls_1","call_id":"c1","action":{"type":"exec","command":["ls"]}}]}"#,
    );
    assert_eq!(
        w,
        canon("local_shell", r#"{"command":["ls"],"type":"exec"}"#)
    );
    let s = streamed(
        Format::Chat,
        &[
            r#"{"choices":[{"index":0,"delta":{"role":"assistant","function_call":{"name":"get_weather","arguments":""}}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"function_call":{"arguments":"{\"unit\":\"c\","}}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"function_call":{"arguments":"\"city\":\"Paris\"}"}}}]}"#,
            r#"{"choices":[{"index":0,"delta":{},"finish_reason":"function_call"}]}"#,
        ],
    );
    let w = whole(
        Format::Chat,
        r#"{"choices":[{"index":0,"message":{"role":"assistant","content":null,"function_call":{"name":"get_weather","arguments":"{\"city\":\"Paris\",\"unit\":\"c\"}"}},"finish_reason":"function_call"}]}"#,
    );
    assert_eq!(s, Some((CANON.to_vec(), "get_weather".into())));
    assert_eq!(s, w);
}

/// Audit KE 4: the same parallel calls at swapped indexes (sampling often reorders them) are
/// the same set of actions, so the same fingerprint, streamed or whole, in Chat (`tool_calls`)
/// and Messages (`tool_use` blocks); calls of different choices stay apart. The names keep the
/// answer's order.
#[test]
fn parallel_calls_in_another_order_are_the_same_calls() {
    let weather = r#"{\"city\":\"Paris\"}"#;
    let time = r#"{\"tz\":\"CET\"}"#;
    let chat = |first: (&str, &str), second: (&str, &str)| {
        streamed(
            Format::Chat,
            &[
                &chat_call(0, first.0, first.1),
                &chat_call(1, second.0, second.1),
            ],
        )
    };
    let canon = |c: Option<(Vec<u8>, String)>| c.unwrap().0;
    let a = chat(("get_weather", weather), ("get_time", time));
    let b = chat(("get_time", time), ("get_weather", weather));
    assert_eq!(a.as_ref().unwrap().1, "get_weather,get_time");
    assert_eq!(b.as_ref().unwrap().1, "get_time,get_weather");
    let a = canon(a);
    assert_eq!(a, canon(b));
    let whole_chat = whole(
        Format::Chat,
        r#"{"choices":[{"index":0,"message":{"tool_calls":[{"function":{"name":"get_time","arguments":"{\"tz\":\"CET\"}"}},{"function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]}}]}"#,
    );
    assert_eq!(canon(whole_chat), a);
    // The same name with other arguments is ordered by its arguments.
    let c = chat(("f", r#"{\"x\":2}"#), ("f", r#"{\"x\":1}"#));
    let d = chat(("f", r#"{\"x\":1}"#), ("f", r#"{\"x\":2}"#));
    assert_eq!(canon(c), canon(d));

    let block = |i: usize, name: &str, input: &str| {
        format!(
            r#"{{"type":"content_block_start","index":{i},"content_block":{{"type":"tool_use","id":"toolu_{i}","name":"{name}","input":{input}}}}}"#
        )
    };
    let m1 = streamed(
        Format::Messages,
        &[
            &block(0, "get_weather", r#"{"city":"Paris"}"#),
            &block(1, "get_time", r#"{"tz":"CET"}"#),
        ],
    );
    let m2 = streamed(
        Format::Messages,
        &[
            &block(0, "get_time", r#"{"tz":"CET"}"#),
            &block(1, "get_weather", r#"{"city":"Paris"}"#),
        ],
    );
    let m1 = canon(m1);
    assert_eq!(m1, canon(m2));
    assert_eq!(m1, a, "the same calls in either format");

    // Choices stay apart: choice 0's calls come before choice 1's whatever their names.
    let mut t = ToolCalls::new(Format::Chat);
    let event = |choice: u64, name: &str| {
        format!(
            r#"{{"choices":[{{"index":{choice},"delta":{{"tool_calls":[{{"index":0,"function":{{"name":"{name}","arguments":"{{}}"}}}}]}}}}]}}"#
        )
    };
    feed(&mut t, &event(1, "a"));
    feed(&mut t, &event(0, "b"));
    assert_eq!(t.canonical().unwrap().1, "b,a");
}

/// Audit SF 3: numbers an f64 cannot tell apart (integers past i64/u64, decimals past its
/// precision) are different arguments, compared as written: `get_order` asked for three
/// different 20-digit ids was refused as a loop on the 4th call. (`2.0` and `2` stay apart, as
/// they always were.)
#[test]
fn numbers_are_compared_as_written() {
    let repros = [
        [
            r#"{"order_id":98765432109876543210}"#,
            r#"{"order_id":98765432109876543211}"#,
            r#"{"order_id":98765432109876543212}"#,
        ],
        [
            r#"{"amount":0.1000000000000000001}"#,
            r#"{"amount":0.1000000000000000002}"#,
            r#"{"amount":0.1}"#,
        ],
        [
            r#"{"n":-9223372036854775809}"#,
            r#"{"n":-9223372036854775810}"#,
            r#"{"n":-9223372036854775811}"#,
        ],
        [r#"{"b":2.0}"#, r#"{"b":2}"#, r#"{"b":2e0}"#],
    ];
    for [a, b, c] in repros {
        let (a, b, c) = (canonical_json(a), canonical_json(b), canonical_json(c));
        assert!(a != b && b != c && a != c, "{a} {b} {c}");
    }
    // Through a whole answer too, and each number keeps its text, nested or not.
    let call = |arguments: &str| {
        let arguments = serde_json::to_string(arguments).unwrap();
        whole(
            Format::Chat,
            &format!(
                r#"{{"choices":[{{"index":0,"message":{{"tool_calls":[{{"function":{{"name":"get_order","arguments":{arguments}}}}}]}}}}]}}"#
            ),
        )
        .unwrap()
        .0
    };
    assert_ne!(
        call(r#"{"order_id":98765432109876543210}"#),
        call(r#"{"order_id":98765432109876543211}"#)
    );
    assert_eq!(
        canonical_json(r#"{ "b" : [ 1.50 , -0, 1E400, {"x": 98765432109876543210} ], "a": 1e-7 }"#),
        r#"{"a":1e-7,"b":[1.50,-0,1E400,{"x":98765432109876543210}]}"#
    );
}

/// What made two equal calls one before SF 3 still does: key order at every depth,
/// whitespace, a string's escapes (`"\u0041"` is `"A"`), and a key given twice (the last one
/// counts, as serde_json's own map has it); text that is not JSON is compared trimmed.
#[test]
fn equal_arguments_are_one_canonical_text() {
    let canon = r#"{"a":{"x":"A","y":[true,null,"é\n"]},"b":2}"#;
    for same in [
        r#"{"a":{"x":"A","y":[true,null,"é\n"]},"b":2}"#,
        r#"{"b":2,"a":{"y":[true,null,"é\n"],"x":"A"}}"#,
        " {\n \"b\" : 2 ,\t\"a\" : { \"y\" : [ true , null , \"\\u00e9\\n\" ] , \"x\" : \"\\u0041\" } } ",
        r#"{"\u0062":1,"a":{"x":"\u0041","y":[true,null,"\u00e9\u000a"]},"b":2}"#,
    ] {
        assert_eq!(canonical_json(same), canon, "{same}");
    }
    assert_eq!(canonical_json(r#""\u0041\/""#), r#""A/""#);
    assert_eq!(
        canonical_json(r#"{"a":"\u0000\"\\"}"#),
        r#"{"a":"\u0000\"\\"}"#
    );
    assert_eq!(canonical_json("  ls -la /tmp \n"), "ls -la /tmp");
    assert_eq!(canonical_json(r#"{"a":1,}"#), r#"{"a":1,}"#, "not JSON");
    assert_eq!(canonical_json(" [] "), "[]");
    assert_eq!(canonical_json(" {} "), "{}");
    // Whatever the text holds, its canonical form is the same JSON, at the same length or less.
    for text in [
        r#"{"a":"x\\","b":"}\"], {","c":[[],{},[{}]],"d":"\\\"","e":-1.5e-3}"#,
        " [ \"a,b\" , { \"k\" : \"\\u2028\\ud83d\\ude00😀\" } , false , null ] ",
        r#"{"":0,"é":{"ß":[0.5,"]"]}}"#,
    ] {
        let canon = canonical_json(text);
        let value = |t: &str| serde_json::from_str::<serde_json::Value>(t).unwrap();
        assert_eq!(value(&canon), value(text), "{canon}");
        assert!(canon.len() <= text.len(), "{canon}");
    }
}

/// Arguments nested past serde_json's own limit (128) are compared as written, as they were
/// before SF 3: however deep, never a stack overflow.
#[test]
fn deeply_nested_arguments_are_compared_as_written() {
    let deep = |depth: usize| format!("{}1{}", "[".repeat(depth), "]".repeat(depth));
    assert_eq!(canonical_json(&deep(100)), deep(100));
    let very = format!(" {} ", deep(1 << 20));
    assert_eq!(canonical_json(&very), deep(1 << 20));
    let objects =
        |depth: usize| format!("{}1{}", r#"{"b":0, "a":"#.repeat(depth), "}".repeat(depth));
    assert_eq!(
        canonical_json(&objects(3)),
        r#"{"a":{"a":{"a":1,"b":0},"b":0},"b":0}"#
    );
    assert_eq!(
        canonical_json(&objects(200)),
        objects(200),
        "as written past the limit"
    );
}

/// `Canon` reads only what serde_json found to be JSON; were it anything else, it ends in
/// `None`, never in a panic or a loop.
#[test]
fn canon_ends_on_text_that_is_not_json() {
    for text in [
        r#"{"a":1"#,
        "[1,",
        r#"["a"#,
        r#"{"a"#,
        r#"{"a\"#,
        "[",
        "{",
        "",
        " ",
        "[1 2",
        r#"{"a" 1}"#,
    ] {
        let mut out = String::new();
        assert_eq!(
            Canon { text, at: 0 }.value(MAX_DEPTH, &mut out),
            None,
            "{text}"
        );
    }
}

/// Each byte of the arguments is copied a bounded number of times however deep it sits (audit
/// TA 3: each object level copied its members' text into its own again, 127 levels around 4
/// MiB cost 50 times a flat one). Counted in bytes, not timed.
#[test]
fn a_deep_argument_is_copied_no_more_than_a_flat_one() {
    let big = "a".repeat(1 << 16);
    let copied = |text: &str| {
        COPIED.with(|c| c.set(0));
        let canon = canonical_json(text);
        (canon, COPIED.with(|c| c.get()))
    };
    let (_, flat) = copied(&format!(r#"{{"k":"{big}"}}"#));
    for (open, close) in [(r#"{"k":"#, "}"), ("[", "]")] {
        let deep = format!(r#"{}"{big}"{}"#, open.repeat(127), close.repeat(127));
        let (canon, deep) = copied(&deep);
        assert_eq!(
            canon.len(),
            big.len() + 2 + 127 * (open.len() + close.len())
        );
        assert!(
            deep <= 2 * flat + 127 * 16,
            "{open}: {deep} bytes copied, flat {flat}"
        );
    }
}

/// Audit UE 1: a tool call's arguments with an invalid UTF-8 byte reach a client that streams,
/// whose decoder reads it as U+FFFD; the event was skipped here (serde_json refuses invalid
/// UTF-8), so the call had no arguments and its fingerprint was another call's. It is read
/// as the standard decodes it, as the rebuilt document reads it.
#[test]
fn an_invalid_utf8_byte_in_streamed_arguments_is_read_as_the_standard_decodes_it() {
    let mut t = ToolCalls::new(Format::Chat);
    for ev in [
        &br#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get_weather","arguments":""}}]}}]}"#[..],
        b"{\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"{\\\"city\\\":\\\"Par\xffis\\\"}\"}}]}}]}",
    ] {
        t.data(ev);
        t.line_end();
        t.event_end(true);
    }
    let (canon, names) = t.canonical().expect("a call");
    assert_eq!(names, "get_weather");
    assert_eq!(
        String::from_utf8(canon).unwrap(),
        "get_weather\0{\"city\":\"Par\u{FFFD}is\"}\0"
    );
}
