//! The words of the gateway's error messages: each names the limit, the value and what to
//! do, read by a person in a client's exception or the log line.

use std::time::Duration;

use super::{RunNeed, Uploading};

pub(super) fn overload_detail(waited: Duration) -> String {
    if waited.is_zero() {
        "the request's budget leaves no time to wait for a slot".to_owned()
    } else {
        format!(
            "no slot freed within the {} its budget allowed to wait",
            ms(waited)
        )
    }
}

pub(super) fn run_left(
    budget: Duration,
    left: Duration,
    reserve: Duration,
    need: Option<&RunNeed>,
) -> String {
    if left.is_zero() {
        format!("has spent its budget of {}{}", ms(budget), held(reserve))
    } else {
        let needed = need.map_or_else(String::new, |n| {
            let after = if reserve.is_zero() {
                String::new()
            } else {
                format!(" after the {} reserve", ms(reserve))
            };
            format!(
                " (at least {}{after}){}",
                ms(n.needed),
                expected(n.expected_by.as_ref(), n.needed)
            )
        });
        format!(
            "has {} of its budget of {} left, less than a call needs{needed}",
            ms(left),
            ms(budget)
        )
    }
}

/// `tool`: the names of the answer's calls, joined by commas, the last perhaps `+` and how
/// many more calls there were.
pub(super) fn loop_detail(tool: &Option<String>, count: u32) -> String {
    let Some(names) = tool else {
        return format!("the same request came {count} times in a row");
    };
    let mut names: Vec<&str> = names.split(',').collect();
    let more = match names.as_slice() {
        [_, .., last] => last.strip_prefix('+').and_then(|n| n.parse::<u64>().ok()),
        _ => None,
    };
    if more.is_some() {
        names.pop();
    }
    let mut quoted: Vec<String> = names.iter().map(|n| format!("{n:?}")).collect();
    if let Some(n) = more {
        quoted.push(format!("{n} more"));
    }
    let tools = match quoted.as_slice() {
        [one] => format!("tool {one}"),
        [init @ .., last] => format!("tools {} and {last}", init.join(", ")),
        [] => unreachable!("split yields at least one piece"),
    };
    format!("the model asked for {tools} with the same arguments {count} times in a row")
}

pub(super) fn body_limit_key(route: &Option<String>) -> String {
    match route {
        Some(r) => format!("max_request_body of route {r:?}"),
        None => "[server] max_request_body".to_owned(),
    }
}

pub(super) fn sent_suffix(sent: &Option<u64>) -> String {
    sent.map(|n| format!(" (Content-Length {n})"))
        .unwrap_or_default()
}

pub(super) fn model_suffix(model: &Option<String>, by_model: bool) -> String {
    match model {
        Some(m) => format!(" and model {m:?}"),
        // Else the message would deny the routes the path has.
        None if by_model => " without a model in its body: the routes of this path serve \
            only the models they name, read from the body's top-level \"model\" string"
            .to_owned(),
        None => String::new(),
    }
}

/// What a connect timeout waited for.
pub(super) fn connect_wait(after: Duration, sent: bool, proxy: Option<&str>) -> String {
    if sent {
        format!(
            "sent no HTTP/2 SETTINGS within {} of connecting (the request had been sent on the connection)",
            ms(after)
        )
    } else if let Some(proxy) = proxy {
        format!(
            "not connected (through the egress proxy {proxy}: TCP to it, its CONNECT tunnel, \
             and TLS) within {}",
            ms(after)
        )
    } else {
        format!(
            "not connected (name lookup, TCP and TLS) within {}",
            ms(after)
        )
    }
}

/// The end of an `insufficient_budget` message whose need was an upstream's expected time to
/// its first token: the client is told whose, since it is not the route's `min_useful`.
pub(super) fn expected(by: Option<&(String, Option<String>)>, need: Duration) -> String {
    by.map_or_else(String::new, |(u, model)| {
        let model = model
            .as_ref()
            .map_or_else(String::new, |m| format!(" for model {m:?}"));
        format!(
            ": upstream {u:?} is expected to take {} to its first token{model}",
            ms(need)
        )
    })
}

/// What ran out, in the message of `deadline_exceeded`.
pub(super) fn spent(budget: Duration, reserve: Duration, patience: bool) -> String {
    if patience {
        format!(
            "the answer was not whole {} after the request, when it had to go out to reach \
             the client before the timeout its SDK announced",
            ms(budget)
        )
    } else {
        format!(
            "the request's budget of {} is spent{}",
            ms(budget),
            held(reserve)
        )
    }
}

/// Why a deadline that passed during the client's upload is told not to retry: the budget
/// ran from the request's arrival (DESIGN 3), so the same upload at the same speed would be
/// cut the same way (audit PC 3: the OpenAI SDK sent a cut upload three times).
pub(super) fn uploading_words(uploading: &Option<Uploading>) -> String {
    let Some(u) = uploading else {
        return String::new();
    };
    let came = match u.length {
        Some(length) => format!("{} of {length} bytes came", u.received),
        None => format!("{} bytes came", u.received),
    };
    format!(
        " while the client was still sending the request body ({came}); the same upload would \
         spend it again: send it faster, or with a larger budget (x-request-budget-ms)"
    )
}

/// Why a call the client's upload left too little for is told not to retry: the budget ran
/// from the request's arrival, and the same upload would spend as much again (audit ZA 2:
/// a 1.2 s upload of a 3 s budget, sent three times by the OpenAI SDK).
pub(super) fn upload_spent(uploading: &Option<Uploading>) -> String {
    let Some(u) = uploading else {
        return String::new();
    };
    format!(
        "; the request body's upload ({} bytes) spent the rest, and the same upload would \
         again: send it faster, or with a larger budget (x-request-budget-ms)",
        u.received
    )
}

/// The reserve, in the message of `deadline_exceeded`.
pub(super) fn held(reserve: Duration) -> String {
    if reserve.is_zero() {
        String::new()
    } else {
        format!(", all but the {} held in reserve", ms(reserve))
    }
}

/// Why a first-token or idle limit was shorter than the route's.
pub(super) fn cut_to_patience(patience: bool) -> &'static str {
    if patience {
        ": the client's SDK stops waiting then (the timeout it announced in \
         x-stainless-timeout or x-stainless-read-timeout, less a margin), and hears why first"
    } else {
        ""
    }
}

/// What went quiet, in the message of `idle_timeout`. Cut for the client's patience, the
/// upstream may not have been silent: bytes of an event it had not finished reached no one.
pub(super) fn silence(upstream: &str, after: Duration, patience: bool) -> String {
    if patience {
        format!(
            "no whole event from upstream {upstream:?} reached the client for {}{}",
            ms(after),
            cut_to_patience(true)
        )
    } else {
        format!("upstream {upstream:?} was silent for {}", ms(after))
    }
}

/// What is left, in the message of `insufficient_budget`.
pub(super) fn left(remaining: Duration, reserve: Duration, patience: bool) -> String {
    if patience {
        format!(
            "the client stops waiting for the answer {} from now (the timeout its SDK \
             announced in x-stainless-timeout or x-stainless-read-timeout, less a margin)",
            ms(remaining)
        )
    } else {
        format!(
            "{} of budget left after the {} reserve",
            ms(remaining),
            ms(reserve)
        )
    }
}

/// Durations in messages read as milliseconds so that clients can compare them with the
/// `x-request-budget-ms` they sent.
pub(super) fn ms(d: Duration) -> String {
    format!("{}ms", d.as_millis())
}

pub(super) fn refused_words(upstream: &str, reason: &str, unanswered: bool) -> String {
    if unanswered {
        format!(
            "upstream {upstream:?} closed its connection without answering the request \
             ({reason})"
        )
    } else {
        format!(
            "upstream {upstream:?} refused the request before processing it ({reason}); \
             nothing of it was processed, it is safe to send again"
        )
    }
}

pub(super) fn method_refused_why(method: &str) -> &'static str {
    match method {
        "CONNECT" => "this gateway forwards API requests to its routes and does not open tunnels (it is not a forward proxy); send requests to it directly, e.g. POST /v1/chat/completions",
        "TRACE" => "an upstream that answers TRACE echoes the request back, with the provider key this gateway adds; the gateway forwards GET, HEAD, POST, PUT, PATCH, DELETE and OPTIONS",
        _ => "the gateway forwards GET, HEAD, POST, PUT, PATCH, DELETE and OPTIONS, the methods of the APIs it fronts",
    }
}
