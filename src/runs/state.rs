//! The state of one run and the two steps every call takes through it: admission (check every
//! limit, then reserve a call and its tokens, in one step) and the end of the call (replace
//! the reservation by what the call used, and follow the repeats). Plain data and plain
//! functions: a store runs them atomically, under its lock or as one script.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::config::RunLimits;
use crate::provider::tools::MAX_NAMES;
use crate::telemetry::log::clipped;

/// Why a run stopped taking calls (and the `end` label of `hourglass_runs_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunEnd {
    /// Forgotten `ttl` after its last call, however much of its deadline it had left: a run
    /// that stopped calling before its deadline never met it.
    Expired,
    /// A call was refused, or cut, for the run's deadline.
    Deadline,
    Calls,
    Tokens,
    Loop,
    /// Dropped to make room for newer runs (`max_runs`).
    Evicted,
}

impl RunEnd {
    pub const ALL: [RunEnd; 6] = [
        Self::Expired,
        Self::Deadline,
        Self::Calls,
        Self::Tokens,
        Self::Loop,
        Self::Evicted,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Expired => "expired",
            Self::Deadline => "deadline",
            Self::Calls => "calls",
            Self::Tokens => "tokens",
            Self::Loop => "loop",
            Self::Evicted => "evicted",
        }
    }

    /// The end named `s` (as `as_str` names it).
    pub fn named(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|e| e.as_str() == s)
    }
}

/// What a repeated answer or request looked like, for the refusal's message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Repeat {
    pub fingerprint: u64,
    /// The tools the model kept asking for (at most `MAX_NAMES` bytes of their names, see
    /// `ToolCalls::canonical`); `None` for a request body sent again and again.
    pub tool: Option<String>,
    pub count: u32,
}

/// One call's way into a run.
#[derive(Debug, Clone, Copy)]
pub struct Call {
    /// Tokens reserved for it: its `max_tokens` (or the like), else the route's estimate.
    pub reserve: u64,
    /// The client's `x-run-budget-ms`: may only shorten the run.
    pub asked_budget: Option<Duration>,
    /// Its request body's fingerprint, when the run stops loops (counted as a repeat when
    /// the call ends answered; see `Used::request`).
    pub request: Option<u64>,
    /// When the call arrived: a run's first call fixes its deadline from here.
    pub at: Instant,
    /// When it is admitted (after its body was read).
    pub now: Instant,
    /// What a call needs of the run's time to be worth making (its reserve and
    /// `min_useful`): with less left, it is refused.
    pub need: Duration,
}

/// What a run has left, as its answers tell the client (`x-run-*` headers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct View {
    pub deadline: Option<Instant>,
    /// Calls left once this one is counted.
    pub calls_left: Option<u32>,
    /// Tokens neither used nor reserved.
    pub tokens_left: Option<u64>,
}

/// A call the run took: what it may use, and what is left once it is counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admitted {
    pub view: View,
    /// The run's whole budget, for messages.
    pub budget: Option<Duration>,
    /// The most this call may use (what the others have not used or reserved): past it, its
    /// stream is cut.
    pub token_allowance: Option<u64>,
    /// The run was started by this call.
    pub started: bool,
}

/// What an admitted call needs to know of its run's limits (the run's, which the first of its
/// calls' routes with run keys fixed, not those of the call's own route).
#[derive(Debug, Clone, Copy)]
pub struct RunOf {
    pub max_tokens: Option<u64>,
    pub stops_loops: bool,
}

/// Why a run refused a call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The run's deadline passed, or what is `left` of it cannot fit a call.
    Deadline {
        budget: Duration,
        left: Duration,
    },
    Calls {
        limit: u32,
    },
    Tokens {
        limit: u64,
        used: u64,
        reserved: u64,
        asked: u64,
    },
    Loop(Repeat),
}

impl Refusal {
    /// The run's end this refusal makes (or confirms).
    pub fn end(&self) -> RunEnd {
        match self {
            Self::Deadline { .. } => RunEnd::Deadline,
            Self::Calls { .. } => RunEnd::Calls,
            Self::Tokens { .. } => RunEnd::Tokens,
            Self::Loop(_) => RunEnd::Loop,
        }
    }

    /// The `reason` label of `hourglass_run_refusals_total`.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Deadline { .. } => "deadline",
            Self::Calls { .. } => "calls",
            Self::Tokens { .. } => "tokens",
            Self::Loop(_) => "loop",
        }
    }
}

/// What a call used, told when it ends.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Used {
    /// Prompt and completion tokens, reported or estimated.
    pub tokens: u64,
    pub answer: Answer,
    /// The request body's fingerprint, when the call ended in a way a client does not retry
    /// (an answer, or a 4xx other than 408/409/429): the same body after that is the agent
    /// asking again, a repeat. After a 5xx, a 429 or a cut, the same body is a retry, and
    /// counts nowhere.
    pub request: Option<u64>,
    /// The run's deadline stopped the call: cut it (the run ended there, `deadline`, though
    /// no later call comes to be refused for it), or refused it before it was sent (see
    /// `RunState::short_of_time`).
    pub run_deadline: bool,
}

/// What the model answered, as the loop stop follows it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Answer {
    /// No answer was read to its end (a failure, a cut, a refusal): the streak stands, so a
    /// loop whose calls sometimes fail is still a loop.
    #[default]
    Unread,
    /// An answer without a tool call: it breaks the streak.
    Plain,
    /// The tool calls the model answered with: fingerprint, and their names as
    /// `ToolCalls::canonical` gives them (at most `MAX_NAMES` bytes are kept).
    Tools(u64, String),
}

/// What a run of the memory store has used, read and moved without its lock: by each of its
/// streams as it goes (audit KE 1: each stream compared only its own use with what was left
/// at its admission, and ten parallel streams used 5x `run_max_tokens`).
/// One counter, so that a stream reads and moves it in one atomic operation: its ended calls'
/// real use (added at each call's end) and its streams' estimates so far (each stream adds
/// what it used as it grows, and takes it all back when it ends, its real use then counted
/// at its call's end: never twice).
#[derive(Debug, Default)]
pub struct RunLive {
    pub used: AtomicU64,
}

impl RunLive {
    /// Adds `n` to the count, saturating at u64::MAX rather than wrapping to a small number
    /// that a stream would read as tokens left (audit WD 2); the new count.
    pub fn add(&self, n: u64) -> u64 {
        let old = self
            .used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |u| {
                Some(u.saturating_add(n))
            })
            .unwrap_or_else(|u| u);
        old.saturating_add(n)
    }

    /// Takes `n` back from the count, never below 0; the new count.
    pub fn sub(&self, n: u64) -> u64 {
        let old = self
            .used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |u| {
                Some(u.saturating_sub(n))
            })
            .unwrap_or_else(|u| u);
        old.saturating_sub(n)
    }
}

/// One run.
#[derive(Debug, Clone)]
pub struct RunState {
    /// The route whose limits the run took: the first of its calls' routes that has run keys
    /// (see `take_limits`), else the route of its first call.
    pub route: std::sync::Arc<str>,
    pub limits: RunLimits,
    pub started: Instant,
    pub last_call: Instant,
    pub deadline: Option<Instant>,
    pub budget: Option<Duration>,
    pub calls: u32,
    pub in_flight: u32,
    pub tokens_used: u64,
    pub tokens_reserved: u64,
    /// The answer fingerprint that came last, and how many times in a row.
    pub answer: Option<Repeat>,
    /// The request fingerprint that came last, and how many times in a row.
    pub request: Option<Repeat>,
    pub ended: Option<RunEnd>,
    /// The refusal that ended the run: every later call gets it.
    pub refused: Option<Refusal>,
    /// The run's end was counted (`hourglass_runs_total` and the run histograms): once,
    /// when it has ended and its last call in flight has come back with what it used.
    pub reported: bool,
    /// A call was refused before it was sent, the run's time left too short for its
    /// upstream: the run met its deadline, though a call on a faster route may still fit.
    pub short_of_time: bool,
    /// What the run has used, for its streams to read as they go (the memory store's).
    pub live: Arc<RunLive>,
}

impl RunState {
    /// A run that a call on `route` starts at `at`.
    pub fn new(route: std::sync::Arc<str>, limits: RunLimits, at: Instant) -> Self {
        Self {
            route,
            limits,
            started: at,
            last_call: at,
            deadline: None,
            budget: None,
            calls: 0,
            in_flight: 0,
            tokens_used: 0,
            tokens_reserved: 0,
            answer: None,
            request: None,
            ended: None,
            refused: None,
            reported: false,
            short_of_time: false,
            live: Arc::default(),
        }
    }

    /// A call on `route`, whose run keys are `limits`, is about to be admitted: a run whose
    /// limits are not fixed yet (its calls so far came on routes without run keys: the models
    /// listed, an embedding, a planner on another route) takes them, and is named by that
    /// route from now on. Audit SF 1: such a run kept its first call's limits, none, and a
    /// route with `run_max_repeats = 3` served eight identical tool calls of it. The calls
    /// before still count (calls, tokens, repeats); once fixed, the limits never change.
    /// A `run_budget` taken now counts from the run's first call's arrival (one deadline per
    /// run), and a deadline a client set before with `x-run-budget-ms` may only shorten it,
    /// as on any call (clamped by `run_max_budget` too). A run that has ended keeps its
    /// route and limits (audit TB 3): its end is counted under that route, and limits it
    /// never met would only show on its refusals.
    pub fn take_limits(&mut self, route: &std::sync::Arc<str>, limits: &RunLimits) {
        if self.ended.is_some() || self.limits.any() || !limits.any() {
            return;
        }
        self.route = route.clone();
        self.limits = *limits;
        // A run that has no call yet (its first ones withdrawn) starts with this call.
        if self.calls == 0 && self.deadline.is_none() {
            return;
        }
        self.budget = self.budget_for(self.budget);
        self.deadline = self.budget.map(|b| self.started + b);
    }

    /// The run's budget as a client asks for it: the route's `run_budget`, which the client's
    /// `x-run-budget-ms` may only shorten; where the route sets none, the client's, clamped
    /// by `run_max_budget`.
    fn budget_for(&self, asked: Option<Duration>) -> Option<Duration> {
        let l = &self.limits;
        let shorter = |a: Option<Duration>, b: Option<Duration>| match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        match asked {
            Some(a) => shorter(Some(a), shorter(l.budget, l.max_budget)),
            None => l.budget,
        }
    }

    /// When the run ended as `end`, reported at `now`: a run forgotten `ttl` after its last
    /// call (or evicted) ended with that call, not when it was forgotten (which would add
    /// the whole `ttl`, and the sweep's lag, to every run's duration); one whose deadline
    /// passed ended then at the latest.
    pub fn ended_at(&self, end: RunEnd, now: Instant) -> Instant {
        match end {
            RunEnd::Expired | RunEnd::Evicted => self.last_call.min(now),
            RunEnd::Deadline => self.deadline.map_or(now, |d| d.min(now)),
            RunEnd::Calls | RunEnd::Tokens | RunEnd::Loop => now,
        }
    }

    /// Checks every limit and, when they all leave room, counts the call and reserves its
    /// tokens. A refusal ends the run, which refuses every later call the same way, except a
    /// reservation that does not fit the tokens left: a smaller one may. A refused call
    /// counts nowhere.
    pub fn admit(&mut self, call: &Call) -> Result<Admitted, (Refusal, View)> {
        let started = self.calls == 0 && self.ended.is_none() && self.deadline.is_none();
        if started {
            self.budget = self.budget_for(call.asked_budget);
            self.deadline = self.budget.map(|b| call.at + b);
        } else if let Some(asked) = call.asked_budget {
            // May only shorten the run.
            let asked = self.budget_for(Some(asked)).unwrap_or(asked);
            let at = call.at + asked;
            if self.deadline.is_none_or(|d| at < d) {
                self.deadline = Some(at);
                self.budget = Some(at.saturating_duration_since(self.started));
            }
        }
        if let Some(r) = self.refusal(call) {
            if !matches!(r, Refusal::Tokens { .. }) || self.exhausted() {
                self.ended.get_or_insert(r.end());
                self.refused.get_or_insert_with(|| r.clone());
            }
            return Err((r, self.view()));
        }
        self.calls += 1;
        self.in_flight += 1;
        self.last_call = call.now;
        // What the others hold, before this call's reservation joins them.
        let others = self.committed();
        self.tokens_reserved = self.tokens_reserved.saturating_add(call.reserve);
        Ok(Admitted {
            view: self.view(),
            budget: self.budget,
            token_allowance: self.limits.max_tokens.map(|m| m.saturating_sub(others)),
            started,
        })
    }

    /// What the run has left now.
    pub fn view(&self) -> View {
        let l = &self.limits;
        View {
            deadline: self.deadline,
            calls_left: l.max_calls.map(|m| m.saturating_sub(self.calls)),
            tokens_left: l.max_tokens.map(|m| m.saturating_sub(self.committed())),
        }
    }

    /// The tokens the run has used and its calls in flight hold. Every sum of tokens here
    /// saturates: `tokens_used` may stand at u64::MAX, and a reservation beside it wrapped
    /// the sum to a small number, a run past its limit saying it had most of it left (audit
    /// WD 2).
    fn committed(&self) -> u64 {
        self.tokens_used.saturating_add(self.tokens_reserved)
    }

    /// The tokens the run has left once a call admitted with `reserve` tokens is charged
    /// `used` instead (that call still in flight): its other calls as they are now.
    pub fn tokens_left_after(&self, reserve: u64, used: u64) -> Option<u64> {
        let committed = self
            .tokens_used
            .saturating_add(used)
            .saturating_add(self.tokens_reserved.saturating_sub(reserve));
        self.limits.max_tokens.map(|m| m.saturating_sub(committed))
    }

    /// The run has used all its tokens.
    fn exhausted(&self) -> bool {
        self.limits
            .max_tokens
            .is_some_and(|m| self.tokens_used >= m)
    }

    fn refusal(&self, call: &Call) -> Option<Refusal> {
        let l = &self.limits;
        if let Some(r) = &self.refused {
            return Some(match r {
                // What the run holds now, and this call's reservation (or the time left
                // now), not the numbers of the refusal that ended it.
                Refusal::Tokens { limit, .. } => Refusal::Tokens {
                    limit: *limit,
                    used: self.tokens_used,
                    reserved: self.tokens_reserved,
                    asked: call.reserve,
                },
                Refusal::Deadline { budget, .. } => Refusal::Deadline {
                    budget: *budget,
                    left: self
                        .deadline
                        .map_or(Duration::ZERO, |d| d.saturating_duration_since(call.now)),
                },
                r => r.clone(),
            });
        }
        if let Some(d) = self.deadline {
            let left = d.saturating_duration_since(call.now);
            if left.is_zero() || left < call.need {
                return Some(Refusal::Deadline {
                    budget: self.budget.unwrap_or_default(),
                    left,
                });
            }
        }
        if let Some(limit) = l.max_calls {
            if self.calls >= limit {
                return Some(Refusal::Calls { limit });
            }
        }
        if let Some(n) = l.max_repeats {
            if let Some(a) = self.answer.as_ref().filter(|a| a.count >= n) {
                return Some(Refusal::Loop(a.clone()));
            }
            if let (Some(fp), Some(last)) = (call.request, &self.request) {
                if last.fingerprint == fp && last.count >= n {
                    return Some(Refusal::Loop(last.clone()));
                }
            }
        }
        if let Some(limit) = l.max_tokens {
            if self.committed().saturating_add(call.reserve) > limit {
                return Some(Refusal::Tokens {
                    limit,
                    used: self.tokens_used,
                    reserved: self.tokens_reserved,
                    asked: call.reserve,
                });
            }
        }
        None
    }

    /// A call admitted with `reserve` tokens ended having used `used`.
    pub fn finish(&mut self, reserve: u64, used: &Used) {
        self.in_flight = self.in_flight.saturating_sub(1);
        self.tokens_reserved = self.tokens_reserved.saturating_sub(reserve);
        self.tokens_used = self.tokens_used.saturating_add(used.tokens);
        self.live.add(used.tokens);
        match &used.answer {
            Answer::Tools(fp, tool) => bump(&mut self.answer, *fp, Some(tool)),
            Answer::Plain => self.answer = None,
            Answer::Unread => {}
        }
        if let Some(fp) = used.request {
            bump(&mut self.request, fp, None);
        }
        if used.run_deadline {
            // Cut at (or just before) the deadline: no call fits what is left.
            self.ended.get_or_insert(RunEnd::Deadline);
        }
        if self.exhausted() && self.ended.is_none() {
            let limit = self.limits.max_tokens.unwrap_or(0);
            self.ended = Some(RunEnd::Tokens);
            self.refused = Some(Refusal::Tokens {
                limit,
                used: self.tokens_used,
                reserved: self.tokens_reserved,
                asked: 0,
            });
        }
    }

    /// A call admitted that never reached an upstream goes back: its place among the run's
    /// calls and its reservation.
    /// `run_deadline`: it was refused for want of the run's time.
    pub fn withdraw(&mut self, reserve: u64, run_deadline: bool) {
        self.short_of_time |= run_deadline;
        self.in_flight = self.in_flight.saturating_sub(1);
        self.tokens_reserved = self.tokens_reserved.saturating_sub(reserve);
        self.calls = self.calls.saturating_sub(1);
        // A refusal that found the calls all taken by calls that then gave theirs back
        // (never served) ended nothing: the run has a call again (audit BA). Not counted
        // yet, as calls were in flight when it came.
        if self.ended == Some(RunEnd::Calls)
            && !self.reported
            && self.limits.max_calls.is_some_and(|m| self.calls < m)
        {
            self.ended = None;
            self.refused = None;
        }
    }

    /// How the run ended when it is forgotten `ttl` after its last call, had it not ended
    /// already: by its deadline if a call was refused for want of its time, else by its ttl.
    pub fn end_when_forgotten(&self) -> RunEnd {
        if self.short_of_time {
            RunEnd::Deadline
        } else {
            RunEnd::Expired
        }
    }

    /// The end to count now, once: the run has ended and no call of it is in flight (the
    /// calls admitted before the end still add what they used).
    pub fn take_report(&mut self) -> Option<RunEnd> {
        let end = self
            .ended
            .filter(|_| !self.reported && self.in_flight == 0)?;
        self.reported = true;
        Some(end)
    }

    /// The end to count as the run is forgotten (`forgotten`: expired or evicted), unless
    /// it was counted already: the end it had, if it had one.
    pub fn take_last_report(&mut self, forgotten: RunEnd) -> Option<RunEnd> {
        if std::mem::replace(&mut self.reported, true) {
            return None;
        }
        Some(self.ended.unwrap_or(forgotten))
    }

    /// When the run is to be forgotten: `ttl` after its last call, once no call is in flight.
    pub fn expires(&self, ttl: Duration) -> Instant {
        self.last_call + ttl
    }
}

fn bump(slot: &mut Option<Repeat>, fingerprint: u64, tool: Option<&String>) {
    match slot {
        Some(r) if r.fingerprint == fingerprint => r.count = r.count.saturating_add(1),
        _ => {
            *slot = Some(Repeat {
                fingerprint,
                // Bounded here too: whatever the answer's names, a run's state keeps its size.
                tool: tool.map(|t| clipped(t, MAX_NAMES).to_owned()),
                count: 1,
            })
        }
    }
}

#[cfg(test)]
mod tests;
