//! What the gateway tells operators: Prometheus metrics and the request log.

pub mod access;
pub mod json;
pub mod log;
pub mod metrics;
pub mod throttle;
pub mod writer;
