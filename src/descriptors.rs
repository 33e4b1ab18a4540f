//! The process's file descriptors: its open-file limit, raised at start, and what the
//! upstream pools may keep idle of it. Every client connection, upstream connection and file
//! the gateway opens takes one. The lowest layer, beside `error`: it imports nothing.

use std::io;

/// The open-file limit (`RLIMIT_NOFILE`), soft and hard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenFileLimit {
    pub soft: u64,
    pub hard: u64,
}

pub fn open_file_limit() -> io::Result<OpenFileLimit> {
    let (soft, hard) = rlimit::getrlimit(rlimit::Resource::NOFILE)?;
    Ok(OpenFileLimit { soft, hard })
}

/// Raises the soft open-file limit to the hard one, and returns the limit as it was. A
/// process starts with the soft limit its parent had, often 1,024 (systemd's default
/// `LimitNOFILE=1024:524288`), which a gateway spends at about 500 streams (a client and an
/// upstream connection each) while the hard limit allows far more; Go's runtime and nginx
/// (`worker_rlimit_nofile`) raise it the same way (audit KF 6). It never lowers it: the soft
/// limit is at most the hard one.
pub fn raise_open_file_limit() -> io::Result<OpenFileLimit> {
    let was = open_file_limit()?;
    if was.soft < was.hard {
        rlimit::setrlimit(rlimit::Resource::NOFILE, was.hard, was.hard)?;
    }
    Ok(was)
}

/// The idle connections one upstream's pool keeps at most: a quarter of the open-file
/// limit (at least 16). hyper-util's pool keeps every connection a burst opened until its
/// reaper runs (up to twice `pool_idle_timeout`): after a burst to one upstream its idle
/// connections held nearly every descriptor, and a request for another upstream was answered
/// 503 "no file descriptor left", as a client the listener could not accept waited (audit
/// KF 3). With the cap, one upstream's idle connections leave three quarters of the limit to
/// clients, files and the other upstreams; past it, a connection that finished its request is
/// closed rather than pooled. At the limits a server has (systemd's hard 524,288, a
/// container's 1,048,576) it never binds; at 1,024 it keeps 256 per upstream.
pub fn idle_per_upstream() -> usize {
    let limit = open_file_limit().map_or(u64::MAX, |l| l.soft);
    usize::try_from(limit / 4).unwrap_or(usize::MAX).max(16)
}

/// What start-up warns of a `max_connections` the open-file limit `limit` cannot serve
/// (audit ME 5: 1,000,000 under a limit of 20,000 passed without a word): a streaming
/// client connection takes two descriptors, its own and its upstream's, so past half the
/// limit accepts fail for want of one before `max_connections` binds (deployment.md).
pub fn max_connections_warning(max_connections: Option<usize>, limit: u64) -> Option<String> {
    let n = max_connections?;
    let half = limit / 2;
    (n as u64 > half).then(|| {
        format!(
            "server: max_connections ({n}) is above half the open-file limit (RLIMIT_NOFILE \
             {limit}): each streaming client takes two descriptors, its own and its \
             upstream's, so clients would be refused for want of a descriptor before \
             max_connections is reached; set it to at most {half}, or raise the limit"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Raising in this (test) process: the soft limit ends at the hard one, never below
    /// where it was, and a second call changes nothing.
    #[test]
    fn the_soft_limit_is_raised_to_the_hard_one_and_never_lowered() {
        let before = open_file_limit().unwrap();
        let was = raise_open_file_limit().unwrap();
        assert!(
            was.soft >= before.soft && was.hard == before.hard,
            "{was:?}"
        );
        let now = open_file_limit().unwrap();
        assert_eq!(now.soft, now.hard);
        assert!(now.soft >= before.soft);
        assert_eq!(raise_open_file_limit().unwrap(), now);
        assert_eq!(open_file_limit().unwrap(), now);
    }

    #[test]
    fn an_upstream_keeps_idle_at_most_a_quarter_of_the_limit() {
        let limit = open_file_limit().unwrap().soft;
        assert_eq!(idle_per_upstream() as u64, (limit / 4).max(16));
    }

    /// Audit ME 5: a `max_connections` past half the limit is warned of, naming both.
    #[test]
    fn max_connections_past_half_the_limit_is_warned_of() {
        let w = max_connections_warning(Some(1_000_000), 20_000).unwrap();
        assert!(
            w.starts_with("server: max_connections (1000000) is above half the open-file limit (RLIMIT_NOFILE 20000)"),
            "{w}"
        );
        assert!(w.contains("at most 10000"), "{w}");
        assert!(max_connections_warning(Some(10_001), 20_000).is_some());
        assert_eq!(max_connections_warning(Some(10_000), 20_000), None);
        assert_eq!(max_connections_warning(None, 1_024), None);
    }
}
