//! HTTP as the gateway speaks it, below any knowledge of providers or budgets.

pub mod client_steering;
pub mod conn;
pub mod content_type;
pub mod date;
pub mod framing;
pub mod headers;
pub mod hops;
pub mod path;
pub mod sse;
