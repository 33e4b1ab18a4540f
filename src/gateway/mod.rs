//! The request path: route, budget, read the body, then the route's attempts (`retry`,
//! `attempt`) and the upstream's body handed to the watchdog (`answer`). Everything before the
//! response head is decided in `forward`, `retry` and `attempt`; everything after it by the
//! watchdog body. `record` is how the request ended, reported once.

pub mod answer;
mod assembled;
pub mod attempt;
mod balance;
pub mod body;
mod forward;
pub mod hedges;
pub mod preflight;
pub mod record;
pub mod retry;
pub mod routes;
mod run;
pub mod template;

pub use self::answer::LENGTH_CAP;
pub use self::body::ProxyBody;
pub use self::routes::{BuildError, Gateway};
