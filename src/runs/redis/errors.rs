//! How a Redis error becomes a `StoreError`: a redirection met without `store_cluster`,
//! a command that never reached the store, an error reply given before a script wrote
//! anything, and anything else (which may have run, and so may need undoing); and an ACL
//! denial inside a script, named by the command on the line Redis gives.

use std::sync::Arc;
use std::time::Duration;

/// Why the store did not answer.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// With the store's last error, when one came lately: a store that cannot be reached or
    /// refuses the password fails slower than `store_timeout` (the connection is tried again
    /// with backoff), and a timeout alone would call a wrong password latency.
    #[error("the run store did not answer within {}ms{}", .0.as_millis(),
            .1.as_deref().map(|e| format!(" (its last error: {e})")).unwrap_or_default())]
    Timeout(Duration, Option<String>),
    #[error("the run store failed: {0}")]
    Failed(String),
    /// Redis answered the command with an error reply that it gives before a script writes
    /// anything (see `refused_before_writing`): the script left nothing behind. Said as
    /// `Failed` is.
    #[error("the run store failed: {0}")]
    Refused(String),
    /// The command never reached the store: its connection could not be opened (nothing
    /// listening, a certificate or a password refused, no connection to a cluster's node;
    /// see `never_sent`). Nothing ran, so nothing needs undoing. Said as `Failed` is.
    #[error("the run store failed: {0}")]
    Unreached(String),
    /// The store is a node of a Redis Cluster, and `store_cluster` is not set: it sends the
    /// keys of runs on other nodes' slots there (MOVED), which the single-server client does
    /// not follow. Named as such, so that the operator is not left to read a redirection as
    /// an outage.
    #[error(
        "the run store is a Redis Cluster, and [runs] store_cluster is not set: it answered {0}"
    )]
    Cluster(String),
}

impl From<redis::RedisError> for StoreError {
    fn from(e: redis::RedisError) -> Self {
        // Only redirections: a cluster client follows them, so they reach here only from a
        // store not configured as one.
        if matches!(
            e.kind(),
            redis::ErrorKind::Server(redis::ServerErrorKind::Moved | redis::ServerErrorKind::Ask)
        ) {
            Self::Cluster(e.to_string())
        } else if never_sent(&e) {
            Self::Unreached(e.to_string())
        } else if refused_before_writing(&e) {
            Self::Refused(e.to_string())
        } else {
            Self::Failed(e.to_string())
        }
    }
}

impl StoreError {
    /// Whether the command may have run, in part or whole (a timeout, a lost connection, a
    /// script that failed midway), so that a script sent for a call may have left something
    /// the call must undo. An error reply that Redis gives before the script's first write
    /// (or before it runs at all), and a redirection, left nothing: an admission refused so
    /// needs no cancel (audit MD 1: under OOM every call sent cancel.lua, itself refused,
    /// for a minute). Nor did a command whose connection could not be opened (audit SE 2:
    /// each call refused by a stopped Redis left a cancel tried for a minute, which held a
    /// shutdown its whole grace, and wrote a tombstone once Redis was back).
    pub fn may_have_run(&self) -> bool {
        matches!(self, Self::Timeout(..) | Self::Failed(_))
    }
}

/// Whether `e` is an error reply that Redis (7, and Valkey) gives before a script has
/// written anything. A failed script keeps the writes it made before failing, so only
/// these codes qualify:
/// - before the script runs at all: NOSCRIPT, BUSY (another script runs), LOADING,
///   MASTERDOWN, NOAUTH, WRONGPASS, NOPERM (a denial inside a script comes back as "ERR
///   ... can't run this command", which is not here), and a cluster's CLUSTERDOWN,
///   TRYAGAIN, CROSSSLOT, MOVED, ASK;
/// - at the script's first write, never later: OOM (deny-oom is checked only while the
///   script has written nothing), READONLY and MISCONF (neither can change while a script
///   runs, so the first write is the one refused);
/// - WRONGTYPE: every script here touches its one key first, and a key's type cannot change
///   while the script runs.
///
/// Anything else (ERR, a Lua error, a reply of another code) may come after a write.
fn refused_before_writing(e: &redis::RedisError) -> bool {
    if e.is_io_error() {
        return false;
    }
    matches!(
        e.code(),
        Some(
            "NOSCRIPT"
                | "BUSY"
                | "LOADING"
                | "MASTERDOWN"
                | "NOAUTH"
                | "WRONGPASS"
                | "NOPERM"
                | "CLUSTERDOWN"
                | "TRYAGAIN"
                | "CROSSSLOT"
                | "MOVED"
                | "ASK"
                | "OOM"
                | "READONLY"
                | "MISCONF"
                | "WRONGTYPE"
        )
    )
}

/// Whether `e` is a failure to open the command's connection, so that the command was never
/// sent: refused (nothing listening), a password or ACL user refused at connect
/// (`AuthenticationFailed`; a WRONGPASS reply is `refused_before_writing`), no connection to
/// a cluster's node, or a TLS handshake that refused the server's certificate. A connection
/// that timed out is not here: a command's reply that timed out says the same.
pub(super) fn never_sent(e: &redis::RedisError) -> bool {
    e.is_connection_refusal()
        || matches!(
            e.kind(),
            redis::ErrorKind::AuthenticationFailed | redis::ErrorKind::ClusterConnectionNotFound
        )
        || tls_handshake_refused(e)
}

/// Whether `e` is rustls refusing the TLS handshake: the server's certificate, or no protocol
/// version or cipher suite in common. These come only before the first byte of a command;
/// other rustls errors (a corrupt record) may come while a reply is read. The redis crate
/// keeps an I/O error as an `Arc` of it, and tokio-rustls puts rustls's error inside that.
fn tls_handshake_refused(e: &redis::RedisError) -> bool {
    type Inner = Arc<dyn std::error::Error + Send + Sync>;
    let rustls = std::error::Error::source(e)
        .and_then(|s| s.downcast_ref::<Inner>())
        .and_then(|inner| inner.downcast_ref::<std::io::Error>())
        .and_then(std::io::Error::get_ref)
        .and_then(|inner| inner.downcast_ref::<rustls::Error>());
    matches!(
        rustls,
        Some(
            rustls::Error::InvalidCertificate(_)
                | rustls::Error::PeerIncompatible(_)
                | rustls::Error::NoCertificatesPresented
        )
    )
}

/// Whether `e` says the command's connection was gone (closed by Redis, while idle or at a
/// restart), so that it may be sent again on a new one. A cluster client says it as "No
/// connections found" when its connection to the node had been dropped.
pub(super) fn dropped(e: &redis::RedisError) -> bool {
    e.is_connection_dropped() || e.kind() == redis::ErrorKind::ClusterConnectionNotFound
}

/// `e` said as what it is when it is Redis's ACL denying a command inside the script
/// `(name, text)`: Redis says "The user executing the script can't run this command ...,
/// on @user_script:LINE" and names no command (audit SE 6), so the command is read from that
/// line of the script.
pub(super) fn acl_denial(e: &StoreError, (name, text): (&str, &str)) -> Option<String> {
    let said = e.to_string();
    if !said.contains("can't run this command") {
        return None;
    }
    let line: usize = said
        .rsplit_once("@user_script:")?
        .1
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()?;
    let command = text
        .lines()
        .nth(line.checked_sub(1)?)?
        .split_once("redis.call('")?
        .1
        .split('\'')
        .next()?
        .to_uppercase();
    Some(format!(
        "Redis's ACL denied the run store's user the command {command} (line {line} of the \
         script {name}); give the user the ACL line of docs/deployment.md, and see ACL LOG on \
         the server ({})",
        said.trim_start_matches("the run store failed: ")
    ))
}

/// The failure `e` to make a connection (a cluster's, which is made before any command is
/// sent on it): whatever it says, no command was sent.
pub(super) fn unreached(e: redis::RedisError) -> StoreError {
    StoreError::Unreached(e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runs::redis::FINISH_LUA;

    /// A Redis Cluster node's redirection, met without `store_cluster`, names the cluster and
    /// the key: read as an outage, it left run limits off for two runs in three under `allow`.
    #[test]
    fn a_cluster_redirection_names_redis_cluster() {
        let moved = redis::RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::Moved),
            "An error was signalled by the server",
            "13571 127.0.0.1:21026".to_owned(),
        ));
        let e = StoreError::from(moved).to_string();
        assert!(
            e.starts_with("the run store is a Redis Cluster, and [runs] store_cluster is not set"),
            "{e}"
        );
        assert!(e.contains("13571 127.0.0.1:21026"), "{e}");
    }

    /// An ACL denial inside a script names the command on the line Redis gives (audit SE 6).
    #[test]
    fn an_acl_denial_names_the_command_of_its_line() {
        let denied = StoreError::Failed(
            "ResponseError: The user executing the script can't run this command or \
             subcommand script: 6819, on @user_script:68."
                .to_owned(),
        );
        let said = acl_denial(&denied, ("finish.lua", FINISH_LUA)).unwrap();
        assert!(
            said.contains("the command HSET (line 68 of the script finish.lua)"),
            "{said}"
        );
        assert!(said.contains("ACL LOG"), "{said}");
        let other = StoreError::Failed("ResponseError: oops".to_owned());
        assert_eq!(acl_denial(&other, ("finish.lua", FINISH_LUA)), None);
    }

    /// An error reply that Redis gives before a script's first write left nothing behind,
    /// and so needs no cancel; one that may come after a write (ERR: a Lua error, or an ACL
    /// denial inside the script, which Redis says as ERR), a lost connection and a timeout
    /// may have left an admission made (audit MD 1).
    #[test]
    fn only_what_may_have_run_needs_undoing() {
        let reply = |code: &str, detail: &str| {
            StoreError::from(redis::make_extension_error(
                code.to_owned(),
                Some(detail.to_owned()),
            ))
        };
        for (code, detail) in [
            (
                "OOM",
                "command not allowed when used memory > 'maxmemory'. script: 5f2e",
            ),
            (
                "MISCONF",
                "Redis is configured to save RDB snapshots, but it's unable to",
            ),
            ("BUSY", "Redis is busy running a script."),
            (
                "WRONGTYPE",
                "Operation against a key holding the wrong kind of value",
            ),
        ] {
            let e = reply(code, detail);
            assert!(!e.may_have_run(), "{code}: {e:?}");
            assert!(e.to_string().contains(code), "named: {e}");
        }
        for kind in [
            redis::ServerErrorKind::ReadOnly,
            redis::ServerErrorKind::NoPerm,
            redis::ServerErrorKind::NoScript,
            redis::ServerErrorKind::BusyLoading,
            redis::ServerErrorKind::TryAgain,
        ] {
            let e = StoreError::from(redis::RedisError::from((
                redis::ErrorKind::Server(kind),
                "An error was signalled by the server",
                "refused".to_owned(),
            )));
            assert!(!e.may_have_run(), "{kind:?}: {e:?}");
        }
        let midway = StoreError::from(redis::RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError),
            "An error was signalled by the server",
            "The user executing the script can't run this command or subcommand script: 8a0a"
                .to_owned(),
        )));
        assert!(midway.may_have_run(), "{midway:?}");
        let dropped = StoreError::from(redis::RedisError::from(std::io::Error::from(
            std::io::ErrorKind::ConnectionReset,
        )));
        assert!(dropped.may_have_run(), "{dropped:?}");
        assert!(StoreError::Timeout(Duration::from_millis(200), None).may_have_run());
    }
}
