//! The limits of one stream as plain data, fixed before its head arrived; the watchdog body
//! enforces them.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::budget::{deadline_error, RunBound};
use crate::error::GatewayError;
use crate::runs::state::RunLive;
use crate::upstream::ConnectionWatch;

/// The limits of one stream, as absolute instants fixed before the head arrived.
#[derive(Debug, Clone)]
pub struct StreamLimits {
    /// Request sent + first-token limit: the first data event must arrive before this.
    pub first_token_deadline: Instant,
    pub first_token_timeout: Duration,
    /// The client's patience (the timeout its SDK announced, less a margin) set
    /// `first_token_deadline`: a head held for its first token waits no longer.
    pub first_token_patience: bool,
    /// Longest silence between data events once streaming.
    pub idle_timeout: Duration,
    /// The client's read timeout (less a margin), when its SDK announced one: the longest
    /// the client goes without a byte. Every frame that goes out restarts it, keep-alives
    /// included, which the two limits above do not count.
    pub client_silence: Option<Duration>,
    /// The request's deadline less its reserve.
    pub deadline: Instant,
    /// The request's whole budget, and the reserve held back from it, for the error message.
    pub budget: Duration,
    pub reserve: Duration,
    /// The budget is the client's own (see `BudgetSource::is_client`).
    pub client_budget: bool,
    /// `deadline` is the client's patience for an answer held until whole (`budget` is that
    /// patience), which ends before the request's budget or its run's.
    pub patience: bool,
    pub upstream: Arc<str>,
    /// The run whose deadline is `deadline`, when it is the run's rather than the call's.
    /// (This and the next are boxed: most streams are in no run, and every open stream
    /// holds its limits.)
    pub run: Option<Box<RunBound>>,
    /// The most tokens this answer may use before its run passes `run_max_tokens`.
    pub run_tokens: Option<Box<RunTokens>>,
    /// The stream's HTTP/2 connection, retired when a limit cuts the stream and the whole
    /// connection was silent for `idle_timeout` (`upstream::ConnectionWatch`); `None` over
    /// HTTP/1.1, where a cut closes the connection anyway.
    pub connection: Option<ConnectionWatch>,
}

/// The token limit an answer streams under: its run's.
#[derive(Debug, Clone)]
pub struct RunTokens {
    pub run: Arc<str>,
    /// The run's `run_max_tokens`, for the message.
    pub limit: u64,
    /// What the run's other calls have not used or reserved: past it, the stream is cut.
    pub allowance: u64,
    /// The prompt's tokens, estimated from the request body, for a stream that does not
    /// report them.
    pub prompt_estimate: u64,
    /// What the whole run has used, live, where its store keeps that in this process (the
    /// memory store): past `limit`, the stream is cut, whatever its own allowance says.
    pub live: Option<Arc<RunLive>>,
    /// What this stream has added to `live` so far: taken back when it ends.
    pub added: u64,
}

impl StreamLimits {
    /// The error of `first_token_deadline` passing.
    pub fn first_token_error(&self) -> GatewayError {
        GatewayError::FirstTokenTimeout {
            upstream: self.upstream.to_string(),
            after: self.first_token_timeout,
            patience: self.first_token_patience,
        }
    }

    /// The error of the deadline passing: the call's, or its run's.
    pub fn deadline_error(&self) -> GatewayError {
        if self.patience {
            return GatewayError::DeadlineExceeded {
                budget: self.budget,
                reserve: Duration::ZERO,
                client_budget: false,
                patience: true,
                uploading: None,
            };
        }
        deadline_error(
            self.budget,
            self.reserve,
            self.client_budget,
            self.run.as_deref(),
            Duration::ZERO,
        )
    }
}
