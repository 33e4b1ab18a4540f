//! A call joining its run: read the run id and the run budget the client asks for, reserve
//! the call's tokens, and admit it (or answer the refusal). Once admitted, the call's budget
//! ends by the run's deadline.

use std::sync::Arc;

use http::HeaderMap;
use tokio::time::Instant;

use crate::auth::KeyId;
use crate::budget::{run_budget, Budget};
use crate::config::MAX_RUN_TOKENS;
use crate::error::GatewayError;
use crate::gateway::routes::RouteRuntime;
use crate::provider::request::max_output_tokens;
use crate::runs::runtime::Joined;
use crate::runs::state::View;
use crate::runs::{fingerprint, run_id, Call, RunCall, RunKey, Runs};

/// Why a call did not join its run: the error, the run's id when the call named one, and,
/// when the run itself refused it, what the run has left (for the answer's headers).
pub struct NotJoined {
    pub error: GatewayError,
    pub run: Option<Arc<str>>,
    pub view: Option<View>,
}

impl From<GatewayError> for NotJoined {
    fn from(error: GatewayError) -> Self {
        Self {
            error,
            run: None,
            view: None,
        }
    }
}

/// What a call is of its run.
pub enum InRun {
    /// It names no run.
    No,
    Call(RunCall),
    /// It names this run, whose store could not answer: served without run limits.
    Unenforced(Arc<str>),
}

/// Admits the call into its run, if it carries a run id, and binds its budget to the run's
/// deadline. `Err` carries what the run has left, when the refusal came from the run.
pub async fn join(
    runs: &Runs,
    route: &RouteRuntime,
    client_key: Option<KeyId>,
    headers: &HeaderMap,
    path: &str,
    body: &[u8],
    budget: &mut Budget,
) -> Result<InRun, NotJoined> {
    // Read first: a malformed run budget is refused like any budget header, even on a call
    // that names no run (its client meant one, and would never learn it was ignored).
    let asked_budget = run_budget(headers)?;
    let Some(id) = run_id(headers, &route.route.run_id)? else {
        return Ok(InRun::No);
    };
    let limits = &route.route.run_limits;
    let key = RunKey {
        // A client can never touch another's run: the run is the key's.
        scope: client_key,
        id,
    };
    // A call without a body (a stored response polled, the models listed) asks the model for
    // nothing: it reserves no tokens, and is no request sent again, whatever its path.
    let asks = !body.is_empty();
    // Nor does any call but one of the API itself (embeddings, moderations, files, audio,
    // count_tokens), which is never charged tokens (`RequestRecord::asks_model`): it reserves
    // none either, or a run's `run_max_tokens` below the route's `run_token_estimate`
    // refused it (audit PC 5). Its upstream is not picked yet: a call any upstream of the
    // chain would take as one of its API reserves.
    let asks_model = route
        .chain
        .iter()
        .any(|e| e.upstream.asks_model(path, body.len() as u64));
    let call = Call {
        // Read whatever this route's limits: the run may have a token limit from the route
        // that fixed its limits.
        // At most `MAX_RUN_TOKENS`, more than any run may hold: a larger ask (up to a
        // number past 64 bits) is refused all the same, and both stores name the same
        // reservation, which the Redis store's Lua numbers hold exactly (audit WD 3).
        reserve: if asks_model {
            max_output_tokens(body)
                .map_err(GatewayError::from)?
                .unwrap_or(limits.token_estimate)
                .min(MAX_RUN_TOKENS)
        } else {
            0
        },
        asked_budget,
        request: (asks && route.fingerprint_requests).then(|| fingerprint::of(body)),
        at: budget.arrival,
        now: Instant::now(),
        need: budget.reserve + budget.min_useful,
    };
    let joined = runs
        .admit(
            &key,
            &route.name,
            limits,
            &call,
            // The store may spend the budget down to what the upstream call needs.
            budget
                .work_deadline()
                .checked_sub(budget.min_useful)
                .unwrap_or(call.now),
            budget.total,
        )
        .await
        .map_err(|(error, view)| NotJoined {
            error,
            run: Some(Arc::clone(&key.id)),
            view,
        })?;
    let admitted = match joined {
        Joined::Call(admitted) => *admitted,
        // The store could not answer, and the call is served without run limits.
        Joined::Unlimited => return Ok(InRun::Unenforced(key.id)),
        Joined::OutOfTime => {
            return Err(NotJoined {
                error: budget.too_little(Instant::now(), budget.min_useful, None, false),
                run: Some(key.id),
                view: None,
            })
        }
    };
    if let (Some(deadline), Some(run_budget)) =
        (admitted.admitted.view.deadline, admitted.admitted.budget)
    {
        budget.bind_run(Arc::clone(&key.id), deadline, run_budget);
    }
    Ok(InRun::Call(admitted))
}
