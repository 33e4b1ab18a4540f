//! Runs: one budget across the LLM calls of an agent run. A run is the calls that carry one
//! run id; it has one deadline, a call limit, a token budget reserved before each call, and a
//! stop for loops (the same tool call again and again).
//!
//! `id` reads which run a request is in, `state` is the arithmetic of one run (admission and
//! the end of a call), `memory` the embedded store that holds runs, and `call` the admitted
//! call's handle: it gives its reservation back however the call ends, and names what the
//! client is told (`x-run-*` headers). `redis` is the shared store's client and scripts, `shared`
//! what the calls of a Redis store share (bounds, failure policy), `runtime` the front that
//! picks the store.

pub mod call;
pub mod fingerprint;
pub mod id;
pub mod memory;
pub mod redis;
pub mod runtime;
mod shared;
pub mod state;

pub use self::call::RunCall;
pub use self::id::{run_id, RunKey};
pub use self::runtime::Runs;
pub use self::state::{Answer, Call, RunState, Used};
