use std::sync::Arc;

use super::*;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn run(limits: RunLimits, at: Instant) -> RunState {
    RunState::new(Arc::from("chat"), limits, at)
}

fn call(at: Instant) -> Call {
    Call {
        reserve: 100,
        asked_budget: None,
        request: None,
        at,
        now: at,
        need: ms(100),
    }
}

fn tool(fp: u64) -> Used {
    Used {
        tokens: 10,
        answer: Answer::Tools(fp, "get_weather".into()),
        ..Used::default()
    }
}

#[tokio::test(start_paused = true)]
async fn the_first_call_fixes_the_deadline_and_later_ones_may_only_shorten_it() {
    let t0 = Instant::now();
    let limits = RunLimits {
        budget: Some(ms(10_000)),
        max_budget: Some(ms(20_000)),
        ..RunLimits::UNLIMITED
    };
    let mut r = run(limits, t0);
    let a = r.admit(&call(t0)).unwrap();
    assert!(a.started);
    assert_eq!(a.view.deadline, Some(t0 + ms(10_000)));
    // A later call asking for more does not lengthen the run.
    let later = t0 + ms(1000);
    let longer = Call {
        asked_budget: Some(ms(60_000)),
        ..call(later)
    };
    let a = r.admit(&longer).unwrap();
    assert!(!a.started);
    assert_eq!(a.view.deadline, Some(t0 + ms(10_000)));
    // One asking for less shortens it.
    let shorter = Call {
        asked_budget: Some(ms(2000)),
        ..call(later)
    };
    assert_eq!(
        r.admit(&shorter).unwrap().view.deadline,
        Some(later + ms(2000))
    );
    // Past the deadline every call is refused, and the run has ended.
    let e = r.admit(&call(later + ms(2000))).unwrap_err().0;
    assert_eq!(
        e,
        Refusal::Deadline {
            budget: ms(3000),
            left: ms(0)
        }
    );
    assert_eq!(r.ended, Some(RunEnd::Deadline));
}

#[tokio::test(start_paused = true)]
async fn a_call_that_the_runs_time_left_cannot_fit_is_refused() {
    let t0 = Instant::now();
    let limits = RunLimits {
        budget: Some(ms(1000)),
        ..RunLimits::UNLIMITED
    };
    let mut r = run(limits, t0);
    r.admit(&call(t0)).unwrap();
    let late = t0 + ms(950);
    let (e, view) = r.admit(&call(late)).unwrap_err();
    assert_eq!(
        e,
        Refusal::Deadline {
            budget: ms(1000),
            left: ms(50)
        }
    );
    assert_eq!(view.deadline, Some(t0 + ms(1000)));
    // The run has ended; a call past the deadline is told it is spent, not the 50ms left
    // at the refusal that ended it.
    let e = r.admit(&call(t0 + ms(4000))).unwrap_err().0;
    assert_eq!(
        e,
        Refusal::Deadline {
            budget: ms(1000),
            left: ms(0)
        }
    );
}

#[tokio::test(start_paused = true)]
async fn a_client_budget_is_clamped_by_run_max_budget() {
    let t0 = Instant::now();
    let limits = RunLimits {
        max_budget: Some(ms(5000)),
        ..RunLimits::UNLIMITED
    };
    let mut r = run(limits, t0);
    let asked = Call {
        asked_budget: Some(ms(60_000)),
        ..call(t0)
    };
    assert_eq!(r.admit(&asked).unwrap().view.deadline, Some(t0 + ms(5000)));
    // Without any budget a run has no deadline.
    let mut free = run(RunLimits::UNLIMITED, t0);
    assert_eq!(free.admit(&call(t0)).unwrap().view.deadline, None);
}

#[tokio::test(start_paused = true)]
async fn calls_are_counted_at_admission_and_the_limit_is_never_passed() {
    let t0 = Instant::now();
    let limits = RunLimits {
        max_calls: Some(3),
        ..RunLimits::UNLIMITED
    };
    let mut r = run(limits, t0);
    let left: Vec<_> = (0..3)
        .map(|_| r.admit(&call(t0)).unwrap().view.calls_left)
        .collect();
    assert_eq!(left, [Some(2), Some(1), Some(0)]);
    assert_eq!(r.in_flight, 3, "counted before any ended");
    let (e, view) = r.admit(&call(t0)).unwrap_err();
    assert_eq!(e, Refusal::Calls { limit: 3 });
    assert_eq!(view.calls_left, Some(0));
    r.finish(100, &Used::default());
    // Ended for good: a call ending does not give the count back.
    assert!(r.admit(&call(t0)).is_err());
    assert_eq!(r.calls, 3);
}

#[tokio::test(start_paused = true)]
async fn tokens_are_reserved_then_replaced_by_what_was_used() {
    let t0 = Instant::now();
    let limits = RunLimits {
        max_tokens: Some(1000),
        ..RunLimits::UNLIMITED
    };
    let mut r = run(limits, t0);
    let big = Call {
        reserve: 600,
        ..call(t0)
    };
    let a = r.admit(&big).unwrap();
    assert_eq!(a.view.tokens_left, Some(400));
    assert_eq!(a.token_allowance, Some(1000), "alone, it may use all of it");
    // A second reservation of 600 does not fit while the first is in flight.
    let (e, _) = r.admit(&big).unwrap_err();
    assert_eq!(
        e,
        Refusal::Tokens {
            limit: 1000,
            used: 0,
            reserved: 600,
            asked: 600
        }
    );
    assert_eq!(r.ended, None, "a smaller reservation may still fit");
    let small = Call {
        reserve: 300,
        ..call(t0)
    };
    let a = r.admit(&small).unwrap();
    assert_eq!(
        a.token_allowance,
        Some(400),
        "what the first call did not reserve"
    );
    // The first used less than it reserved: the rest comes back.
    r.finish(
        600,
        &Used {
            tokens: 150,
            ..Used::default()
        },
    );
    assert_eq!((r.tokens_used, r.tokens_reserved), (150, 300));
    assert_eq!(r.view().tokens_left, Some(550));
    r.finish(
        300,
        &Used {
            tokens: 900,
            ..Used::default()
        },
    );
    assert_eq!(r.ended, Some(RunEnd::Tokens), "used past the limit");
    assert!(matches!(
        r.admit(&small).unwrap_err().0,
        Refusal::Tokens { .. }
    ));
}

#[tokio::test(start_paused = true)]
async fn the_same_tool_call_max_repeats_times_in_a_row_refuses_the_next_call() {
    let t0 = Instant::now();
    let limits = RunLimits {
        max_repeats: Some(3),
        ..RunLimits::UNLIMITED
    };
    let mut r = run(limits, t0);
    // Two of the same, then another tool, then three of the same.
    for fp in [7, 7, 8, 9, 9] {
        r.admit(&call(t0)).unwrap();
        r.finish(100, &tool(fp));
    }
    r.admit(&call(t0)).unwrap();
    r.finish(100, &tool(9));
    let (e, _) = r.admit(&call(t0)).unwrap_err();
    assert_eq!(
        e,
        Refusal::Loop(Repeat {
            fingerprint: 9,
            tool: Some("get_weather".into()),
            count: 3
        })
    );
    assert_eq!(r.ended, Some(RunEnd::Loop));
    assert!(r.admit(&call(t0)).is_err(), "stays stopped");
}

#[tokio::test(start_paused = true)]
async fn an_answer_without_a_tool_call_breaks_the_streak() {
    let t0 = Instant::now();
    let limits = RunLimits {
        max_repeats: Some(2),
        ..RunLimits::UNLIMITED
    };
    let mut r = run(limits, t0);
    let plain = Used {
        answer: Answer::Plain,
        ..Used::default()
    };
    for used in [tool(1), plain.clone(), tool(1), plain, tool(1)] {
        r.admit(&call(t0)).unwrap();
        r.finish(100, &used);
    }
    assert!(r.admit(&call(t0)).is_ok());
}

#[tokio::test(start_paused = true)]
async fn the_same_request_body_again_and_again_is_a_loop_too() {
    let t0 = Instant::now();
    let limits = RunLimits {
        max_repeats: Some(2),
        ..RunLimits::UNLIMITED
    };
    let mut r = run(limits, t0);
    let asked = |fp| Used {
        answer: Answer::Plain,
        request: Some(fp),
        ..Used::default()
    };
    for fp in [42, 42, 43, 43] {
        let c = Call {
            request: Some(fp),
            ..call(t0)
        };
        r.admit(&c).unwrap();
        r.finish(100, &asked(fp));
    }
    // Not before the same body was answered twice.
    let (e, _) = r
        .admit(&Call {
            request: Some(43),
            ..call(t0)
        })
        .unwrap_err();
    assert_eq!(
        e,
        Refusal::Loop(Repeat {
            fingerprint: 43,
            tool: None,
            count: 2
        })
    );
}

#[tokio::test(start_paused = true)]
async fn a_retry_of_a_failed_call_is_not_a_repeat() {
    let t0 = Instant::now();
    let limits = RunLimits {
        max_repeats: Some(2),
        ..RunLimits::UNLIMITED
    };
    let mut r = run(limits, t0);
    let same = Call {
        request: Some(42),
        ..call(t0)
    };
    // An SDK retries a 5xx or a 429 with the same body: those calls end without counting.
    for _ in 0..5 {
        r.admit(&same).unwrap();
        r.finish(100, &Used::default());
    }
    r.admit(&same).unwrap();
    r.finish(
        100,
        &Used {
            answer: Answer::Plain,
            request: Some(42),
            ..Used::default()
        },
    );
    assert!(r.admit(&same).is_ok(), "answered once, retried five times");
}

#[tokio::test(start_paused = true)]
async fn a_failed_call_leaves_the_tool_call_streak_as_it_was() {
    let t0 = Instant::now();
    let limits = RunLimits {
        max_repeats: Some(3),
        ..RunLimits::UNLIMITED
    };
    let mut r = run(limits, t0);
    // tool, tool, a 503, tool: the loop is still three of the same in a row.
    for used in [tool(5), tool(5), Used::default(), tool(5)] {
        r.admit(&call(t0)).unwrap();
        r.finish(100, &used);
    }
    assert!(matches!(
        r.admit(&call(t0)).unwrap_err().0,
        Refusal::Loop(Repeat { count: 3, .. })
    ));
}

#[tokio::test(start_paused = true)]
async fn a_refused_call_counts_nowhere() {
    let t0 = Instant::now();
    let limits = RunLimits {
        max_tokens: Some(100),
        ..RunLimits::UNLIMITED
    };
    let mut r = run(limits, t0);
    let too_big = Call {
        reserve: 500,
        ..call(t0)
    };
    assert!(r.admit(&too_big).is_err());
    assert_eq!((r.calls, r.in_flight, r.tokens_reserved), (0, 0, 0));
}

#[tokio::test(start_paused = true)]
async fn the_longest_client_budget_a_header_can_carry_is_held_without_overflow() {
    let t0 = Instant::now();
    let mut r = run(RunLimits::UNLIMITED, t0);
    let huge = Call {
        asked_budget: Some(ms(u64::MAX)),
        ..call(t0)
    };
    let a = r.admit(&huge).unwrap();
    assert!(a.started);
    assert_eq!(a.view.deadline, Some(t0 + ms(u64::MAX)));
}

/// Whatever the answer's names, a run keeps at most `MAX_NAMES` bytes of them (audit DD F3:
/// 400 calls of 64-character names kept 26 KB a run).
#[tokio::test(start_paused = true)]
async fn a_run_keeps_a_bounded_part_of_the_answers_names() {
    let t0 = Instant::now();
    let limits = RunLimits {
        max_repeats: Some(3),
        ..RunLimits::UNLIMITED
    };
    let mut r = run(limits, t0);
    let names = vec!["é".repeat(32); 400].join(",");
    r.admit(&call(t0)).unwrap();
    r.finish(
        100,
        &Used {
            answer: Answer::Tools(1, names),
            ..Used::default()
        },
    );
    let kept = r.answer.as_ref().and_then(|a| a.tool.as_deref()).unwrap();
    assert!(kept.len() <= MAX_NAMES, "{}", kept.len());
    assert!(kept.starts_with(&"é".repeat(32)));
}

/// Audit SF 1: a run whose first calls came on a route without run keys takes the limits of
/// the first call on a route that has some; the calls before count against them, a
/// `run_budget` taken so runs from the run's first call, and the limits never change again.
#[tokio::test(start_paused = true)]
async fn a_run_without_limits_takes_those_of_the_first_route_that_has_some() {
    let t0 = Instant::now();
    let mut r = RunState::new(Arc::from("free"), RunLimits::UNLIMITED, t0);
    // Its client asked for 20 s on the free route: the run's deadline, for now.
    let asked = Call {
        asked_budget: Some(ms(20_000)),
        ..call(t0)
    };
    assert_eq!(
        r.admit(&asked).unwrap().view.deadline,
        Some(t0 + ms(20_000))
    );
    r.finish(100, &tool(7));
    let later = t0 + ms(1000);
    // A route without run keys fixes nothing.
    r.take_limits(&Arc::from("other-free"), &RunLimits::UNLIMITED);
    assert_eq!((&*r.route, r.limits.any()), ("free", false));
    let limits = RunLimits {
        budget: Some(ms(10_000)),
        max_calls: Some(3),
        max_repeats: Some(2),
        ..RunLimits::UNLIMITED
    };
    r.take_limits(&Arc::from("chat"), &limits);
    let a = r.admit(&call(later)).unwrap();
    assert_eq!(&*r.route, "chat");
    assert_eq!(
        a.view.calls_left,
        Some(1),
        "the call on the free route counts"
    );
    assert_eq!(
        a.view.deadline,
        Some(t0 + ms(10_000)),
        "from the run's first call, the client's longer budget shortened"
    );
    r.finish(100, &tool(7));
    // Another route's limits change nothing now.
    let looser = RunLimits {
        max_calls: Some(100),
        ..RunLimits::UNLIMITED
    };
    r.take_limits(&Arc::from("wide"), &looser);
    assert_eq!((&*r.route, r.limits.max_calls), ("chat", Some(3)));
    // The same tool call twice, once on each route: a loop.
    assert!(matches!(
        r.admit(&call(later)).unwrap_err().0,
        Refusal::Loop(_)
    ));
    // A client's budget shorter than the route's stays the run's.
    let mut r = RunState::new(Arc::from("free"), RunLimits::UNLIMITED, t0);
    let short = Call {
        asked_budget: Some(ms(3000)),
        ..call(t0)
    };
    r.admit(&short).unwrap();
    r.take_limits(&Arc::from("chat"), &limits);
    assert_eq!(
        r.admit(&call(later)).unwrap().view.deadline,
        Some(t0 + ms(3000))
    );
}

/// Audit SF 2: what the run has left once a call in flight is charged what it used, with its
/// other calls as they are now (one ended since, one still holding its reservation).
#[tokio::test(start_paused = true)]
async fn tokens_left_after_a_call_count_the_runs_other_calls_as_they_are_now() {
    let t0 = Instant::now();
    let limits = RunLimits {
        max_tokens: Some(2500),
        ..RunLimits::UNLIMITED
    };
    let mut r = run(limits, t0);
    let mine = r.admit(&call(t0)).unwrap();
    assert_eq!(mine.view.tokens_left, Some(2400));
    r.admit(&call(t0)).unwrap();
    r.admit(&call(t0)).unwrap();
    // One of the others ends, having used 400 of its 100.
    r.finish(
        100,
        &Used {
            tokens: 400,
            ..Used::default()
        },
    );
    // Mine used 400 too: 2500 - 400 - 400 - 100 (the other in flight).
    assert_eq!(r.tokens_left_after(100, 400), Some(1600));
    r.finish(
        100,
        &Used {
            tokens: 400,
            ..Used::default()
        },
    );
    assert_eq!(
        r.view().tokens_left,
        Some(1600),
        "as the run says once mine is back"
    );
    assert_eq!(run(RunLimits::UNLIMITED, t0).tokens_left_after(0, 5), None);
}

/// Audit TB 3: a run that has ended (here its client's deadline passed) keeps its route and
/// its limits, none: a later call on a route with run keys is refused as any call of it,
/// and does not rename the run its end was counted under.
#[tokio::test(start_paused = true)]
async fn an_ended_run_takes_no_limits() {
    let t0 = Instant::now();
    let mut r = RunState::new(Arc::from("free"), RunLimits::UNLIMITED, t0);
    let asked = Call {
        asked_budget: Some(ms(500)),
        ..call(t0)
    };
    r.admit(&asked).unwrap();
    r.finish(100, &Used::default());
    let late = t0 + ms(1000);
    assert!(matches!(
        r.admit(&call(late)).unwrap_err().0,
        Refusal::Deadline { .. }
    ));
    assert_eq!(r.ended, Some(RunEnd::Deadline));
    let limits = RunLimits {
        max_calls: Some(100),
        max_repeats: Some(3),
        ..RunLimits::UNLIMITED
    };
    r.take_limits(&Arc::from("loops"), &limits);
    assert_eq!((&*r.route, r.limits.any()), ("free", false));
    let (refusal, view) = r.admit(&call(late)).unwrap_err();
    assert!(matches!(refusal, Refusal::Deadline { .. }));
    assert_eq!(view.calls_left, None);
}

/// Audit WD 2: a run that used near u64::MAX tokens with a call still in flight had its sums
/// `used + reserved` wrap: it said 99,001 tokens left (in `x-run-tokens-left` and
/// `/runs/{id}`) while refusing calls for its tokens. Every sum saturates: none left.
#[tokio::test(start_paused = true)]
async fn a_run_that_used_near_u64_max_tokens_has_none_left() {
    let t0 = Instant::now();
    let limits = RunLimits {
        max_tokens: Some(100_000),
        ..RunLimits::UNLIMITED
    };
    let mut r = run(limits, t0);
    let held = Call {
        reserve: 1000,
        ..call(t0)
    };
    r.admit(&held).unwrap();
    let b = r.admit(&call(t0)).unwrap();
    assert_eq!(b.token_allowance, Some(99_000));
    assert_eq!(r.tokens_left_after(100, u64::MAX), Some(0), "B's own head");
    r.finish(
        100,
        &Used {
            tokens: u64::MAX,
            ..Used::default()
        },
    );
    assert_eq!(r.ended, Some(RunEnd::Tokens));
    assert_eq!(r.view().tokens_left, Some(0), "what /runs/{{id}} says");
    assert_eq!(r.tokens_left_after(1000, 0), Some(0));
    let (e, view) = r.admit(&call(t0)).unwrap_err();
    assert!(matches!(e, Refusal::Tokens { .. }), "{e:?}");
    assert_eq!(view.tokens_left, Some(0), "C's header");
    // The live count its streams read saturates as well: not wrapped to a small number.
    assert_eq!(r.live.used.load(Ordering::Relaxed), u64::MAX);
    r.finish(
        100,
        &Used {
            tokens: 5,
            ..Used::default()
        },
    );
    assert_eq!(r.live.used.load(Ordering::Relaxed), u64::MAX);
    assert_eq!(r.view().tokens_left, Some(0));
}
