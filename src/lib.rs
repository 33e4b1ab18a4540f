//! Hourglass: a reverse proxy for LLM APIs that gives every request a time budget, streams
//! answers unbuffered through first-token, idle and deadline watchdogs, and really cancels the
//! upstream call when the client leaves or a limit fires.
//!
//! Where to read: `budget` (the deadline of one request), `watchdog` (the streaming body
//! wrapper), `sse` (event boundaries), `inspect` and `provider` (what counts as a token, what
//! an answer cost), `proxy` (the request path), `upstream` (the client side), `outcome` (how a
//! request ended, logged and counted once).

#![forbid(unsafe_code)]

pub mod access;
pub mod admin;
pub mod admission;
pub mod attempt;
pub mod budget;
pub mod client_io;
pub mod config;
pub mod error;
pub mod fake;
pub mod headers;
pub mod idle;
pub mod inspect;
pub mod json_log;
pub mod log_writer;
pub mod metrics;
pub mod outcome;
pub mod policy;
pub mod provider;
pub mod proxy;
pub mod reaper;
pub mod retry;
pub mod server;
pub mod sse;
pub mod tls;
pub mod upstream;
pub mod watchdog;

/// The demo configuration, embedded so that `hourglass demo` works from any directory.
pub const DEMO_CONFIG: &str = include_str!("../config/demo.toml");
