//! A response body on its way to the client: the limits that watch it and the reaper that
//! ends an upstream call nobody reads.

pub mod limits;
pub mod observer;
pub mod progress;
pub mod reaper;
pub mod signal;
pub mod timer;
pub mod watchdog;

pub use self::limits::StreamLimits;
pub use self::observer::{Observer, StreamEnd};
pub use self::watchdog::{WatchdogBody, ENDED_SHORT};
