//! Hourglass: a reverse proxy for LLM APIs that gives every request a time budget, streams
//! answers unbuffered through first-token, idle and deadline watchdogs, and really cancels the
//! upstream call when the client leaves or a limit fires.

// One exception, allowed where it is: the ioctl that reads a client socket's unacknowledged
// bytes (`server::client_io`), which no safe crate in the tree offers.
#![deny(unsafe_code)]

pub mod descriptors;
pub(crate) mod error;

pub mod http;

pub(crate) mod pem;

pub mod provider;

pub mod config;

pub mod telemetry;

pub(crate) mod admission;
pub(crate) mod auth;
pub mod budget;
pub(crate) mod runs;
pub(crate) mod upstream;

pub mod stream;

pub mod gateway;

pub mod server;

/// The demo configuration, embedded so that `hourglass demo` works from any directory.
pub const DEMO_CONFIG: &str = include_str!("../config/demo.toml");
