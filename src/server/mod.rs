//! Listeners, connection tasks, reload and shutdown. The client listener speaks HTTP/1.1 and
//! HTTP/2 on one port (ALPN under TLS, prior knowledge without); the admin listener serves
//! metrics and health. The routing table lives behind an `ArcSwap`: a reload swaps it
//! atomically and every request keeps the table it started with.

pub mod admin;
mod client_cert;
pub mod client_io;
pub mod h2_idle;
pub mod h2_stuck;
mod head_timer;
mod listen;
mod reload;
mod running;
mod shared;
pub mod tls;
pub mod x509;

pub use self::reload::{Baseline, Hangups};
pub use self::running::{start, start_with_source, Running};
pub use self::shared::ServerError;
