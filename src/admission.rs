//! Who may use a route, and how many at once.
//!
//! Client keys: a route with `client_keys_env` / `client_keys_file` accepts a request only
//! when it carries one of its keys, as `Authorization: Bearer KEY` or `x-api-key: KEY`.
//! Only SHA-256 digests of the keys are kept, and a presented key is hashed once and
//! compared with every digest in constant time, so neither the time taken nor the memory of
//! the process gives a key away. The key is removed before the request is forwarded.
//!
//! Admission: a route with `max_in_flight` serves at most that many requests at once. A
//! request that finds the route full waits for a slot (first come, first served) only while
//! what would be left of its budget still fits an upstream attempt; past that point it is
//! answered 503 `overloaded` at once, instead of queueing past its deadline. The slot is
//! held until the response ends (it travels with the request's record).

use std::sync::Arc;
use std::time::Duration;

use http::header::{HeaderMap, AUTHORIZATION};
use ring::digest::{digest, SHA256};
use subtle::{Choice, ConstantTimeEq};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{timeout_at, Instant};

use crate::budget::Budget;
use crate::config::ClientAuth;
use crate::error::GatewayError;
use crate::upstream::{UpstreamBuildError, X_API_KEY};

/// Keys shorter than this are refused at startup: constant-time comparison is no help
/// against a key short enough to guess.
pub const MIN_KEY_LEN: usize = 16;

/// The keys one route accepts, as digests.
#[derive(Clone)]
pub struct ClientKeys {
    digests: Arc<[[u8; 32]]>,
}

impl std::fmt::Debug for ClientKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Not even the digests.
        write!(f, "ClientKeys({} keys)", self.digests.len())
    }
}

fn sha256(bytes: &[u8]) -> [u8; 32] {
    let d = digest(&SHA256, bytes);
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

impl ClientKeys {
    /// Reads a route's keys from its environment variable and/or file. Every configured
    /// source must be present, every key well formed, and at least one key found: a route
    /// that asks for keys must never start open.
    pub fn load(route: &str, auth: &ClientAuth) -> Result<Self, UpstreamBuildError> {
        let err = |reason: String| UpstreamBuildError::ClientKeys {
            route: route.to_owned(),
            reason,
        };
        let mut keys: Vec<String> = Vec::new();
        if let Some(var) = &auth.env {
            let value =
                std::env::var(var).map_err(|e| err(format!("client_keys_env {var}: {e}")))?;
            for (i, key) in value.split(',').map(str::trim).enumerate() {
                if key.is_empty() {
                    continue;
                }
                check_key(key)
                    .map_err(|why| err(format!("client_keys_env {var}: key {}: {why}", i + 1)))?;
                keys.push(key.to_owned());
            }
        }
        if let Some(path) = &auth.file {
            let text = std::fs::read_to_string(path)
                .map_err(|e| err(format!("client_keys_file {}: {e}", path.display())))?;
            for (i, line) in text.lines().enumerate() {
                let key = line.trim();
                if key.is_empty() || key.starts_with('#') {
                    continue;
                }
                check_key(key).map_err(|why| {
                    err(format!(
                        "client_keys_file {} line {}: {why}",
                        path.display(),
                        i + 1
                    ))
                })?;
                keys.push(key.to_owned());
            }
        }
        if keys.is_empty() {
            return Err(err(
                "client_keys_env/client_keys_file hold no key; the route would accept nobody"
                    .into(),
            ));
        }
        Ok(Self::from_keys(keys.iter().map(String::as_str)))
    }

    pub fn from_keys<'a>(keys: impl IntoIterator<Item = &'a str>) -> Self {
        let mut digests: Vec<[u8; 32]> = keys.into_iter().map(|k| sha256(k.as_bytes())).collect();
        digests.sort_unstable();
        digests.dedup();
        Self {
            digests: digests.into(),
        }
    }

    /// Whether the request carries one of the keys. Looks at the first `authorization`
    /// (scheme `Bearer`) and the first `x-api-key`; each is hashed once and compared with
    /// every digest without an early exit.
    pub fn accepts(&self, headers: &HeaderMap) -> bool {
        let mut ok = Choice::from(0);
        for presented in presented_keys(headers).into_iter().flatten() {
            let d = sha256(presented);
            for known in self.digests.iter() {
                ok |= known.ct_eq(&d);
            }
        }
        ok.into()
    }
}

/// What a client sent as its key, in either header.
fn presented_keys(headers: &HeaderMap) -> [Option<&[u8]>; 2] {
    let bearer = headers.get(AUTHORIZATION).and_then(|v| {
        let v = v.as_bytes();
        let scheme = v.get(..7)?;
        if !scheme.eq_ignore_ascii_case(b"bearer ") {
            return None;
        }
        Some(v[7..].trim_ascii())
    });
    let api_key = headers.get(X_API_KEY).map(|v| v.as_bytes().trim_ascii());
    [bearer, api_key]
}

/// A key must travel in a header and survive comma-separated lists: printable ASCII, no
/// spaces or commas. The reason never quotes the key.
fn check_key(key: &str) -> Result<(), String> {
    if !key.bytes().all(|b| b.is_ascii_graphic() && b != b',') {
        return Err("a key must be printable ASCII without spaces or commas".into());
    }
    if key.len() < MIN_KEY_LEN {
        return Err(format!(
            "a key must be at least {MIN_KEY_LEN} characters long"
        ));
    }
    Ok(())
}

/// Removes what a client may have sent as its key, so that it never reaches the upstream
/// (the upstream's own key, if it has one, is added later).
pub fn strip_client_credentials(headers: &mut HeaderMap) {
    headers.remove(AUTHORIZATION);
    headers.remove(X_API_KEY);
}

/// A route's slots for requests in flight.
#[derive(Clone)]
pub struct Admission {
    route: Arc<str>,
    limit: usize,
    slots: Arc<Semaphore>,
}

/// One request's slot; dropping it frees the slot.
pub type Slot = OwnedSemaphorePermit;

/// Kept on top of what an attempt needs when deciding how long a request may wait for a
/// slot: the slot must come early enough that the attempt still fits once it is made.
pub const ADMIT_SLACK: Duration = Duration::from_millis(50);

/// What a client that found the route full is told to wait before trying again.
pub const RETRY_AFTER: Duration = Duration::from_secs(1);

impl Admission {
    pub fn new(route: Arc<str>, limit: usize) -> Self {
        Self {
            route,
            limit,
            slots: Arc::new(Semaphore::new(limit)),
        }
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Requests being served now.
    pub fn in_flight(&self) -> usize {
        self.limit - self.slots.available_permits()
    }

    /// Takes a slot, waiting (in arrival order) only while a slot taken later would still
    /// leave `need` of the budget for the upstream; otherwise `overloaded`, at once.
    pub async fn admit(&self, budget: &Budget, need: Duration) -> Result<Slot, GatewayError> {
        if let Ok(slot) = self.slots.clone().try_acquire_owned() {
            return Ok(slot);
        }
        let start = Instant::now();
        let latest = budget
            .work_deadline()
            .checked_sub(need + ADMIT_SLACK)
            .filter(|t| *t > start);
        let overloaded = |waited: Duration| GatewayError::Overloaded {
            route: self.route.to_string(),
            limit: self.limit,
            waited,
        };
        let Some(latest) = latest else {
            return Err(overloaded(Duration::ZERO));
        };
        match timeout_at(latest, self.slots.clone().acquire_owned()).await {
            Ok(Ok(slot)) => Ok(slot),
            // Timed out (or, never, the semaphore closed).
            _ => Err(overloaded(start.elapsed())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::BudgetRequest;
    use crate::config::Limits;
    use http::HeaderValue;

    const KEY: &str = "hg-test-key-0123456789";

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn keys_are_accepted_in_either_header_and_nothing_else() {
        let keys = ClientKeys::from_keys(["another-key-abcdefghij", KEY]);
        assert!(keys.accepts(&headers(&[("authorization", &format!("Bearer {KEY}"))])));
        assert!(keys.accepts(&headers(&[("authorization", &format!("bearer  {KEY} "))])));
        assert!(keys.accepts(&headers(&[("x-api-key", KEY)])));
        // The gateway key in one header, something else (a provider key) in the other.
        assert!(keys.accepts(&headers(&[
            ("authorization", "Bearer sk-provider"),
            ("x-api-key", KEY)
        ])));
        for bad in [
            vec![],
            vec![("authorization", KEY)],
            vec![("authorization", &*format!("Basic {KEY}"))],
            vec![("authorization", &*format!("Bearer {KEY}x"))],
            vec![("authorization", &KEY[..KEY.len() - 1])],
            vec![("x-api-key", "")],
            vec![("x-api-key", &*KEY.to_uppercase())],
            vec![("proxy-authorization", &*format!("Bearer {KEY}"))],
        ] {
            assert!(!keys.accepts(&headers(&bad)), "{bad:?}");
        }
    }

    #[test]
    fn debug_shows_no_key_material() {
        let keys = ClientKeys::from_keys([KEY]);
        assert_eq!(format!("{keys:?}"), "ClientKeys(1 keys)");
    }

    #[test]
    fn loading_refuses_bad_and_missing_keys_without_quoting_them() {
        let dir = tempfile::Builder::new()
            .prefix("hourglass-keys-")
            .tempdir()
            .unwrap();
        let file = dir.path().join("keys");
        std::fs::write(
            &file,
            format!("# clients\n\n{KEY}\n  other-key-0123456789  \n"),
        )
        .unwrap();
        let auth = ClientAuth {
            env: None,
            file: Some(file.clone()),
        };
        let keys = ClientKeys::load("chat", &auth).unwrap();
        assert!(keys.accepts(&headers(&[("x-api-key", "other-key-0123456789")])));

        std::fs::write(&file, "short-secret\n").unwrap();
        let e = ClientKeys::load("chat", &auth).unwrap_err().to_string();
        assert!(e.contains("line 1") && e.contains("at least 16"), "{e}");
        assert!(!e.contains("short-secret"), "{e}");

        std::fs::write(&file, "# nobody\n\n").unwrap();
        let e = ClientKeys::load("chat", &auth).unwrap_err().to_string();
        assert!(e.contains("no key"), "{e}");

        let missing = ClientAuth {
            env: Some("HOURGLASS_TEST_CLIENT_KEYS_NEVER_SET".into()),
            file: None,
        };
        let e = ClientKeys::load("chat", &missing).unwrap_err().to_string();
        assert!(e.starts_with("route \"chat\": client_keys_env"), "{e}");
        dir.close().unwrap();
    }

    #[test]
    fn stripping_removes_both_credential_headers() {
        let mut h = headers(&[
            ("authorization", "Bearer x"),
            ("x-api-key", "y"),
            ("content-type", "application/json"),
        ]);
        strip_client_credentials(&mut h);
        assert_eq!(h.len(), 1);
    }

    fn budget(ms: u64) -> Budget {
        let limits = Limits {
            budget: Duration::from_secs(60),
            max_budget: Duration::from_secs(600),
            connect_timeout: Duration::from_secs(2),
            first_token_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(20),
            reserve: Duration::ZERO,
            min_useful: Duration::from_millis(100),
        };
        let mut h = HeaderMap::new();
        h.insert("x-request-budget-ms", HeaderValue::from(ms));
        BudgetRequest::from_headers(&h)
            .unwrap()
            .resolve(&limits, Instant::now())
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_route_admits_in_order_while_the_budget_allows() {
        let adm = Admission::new("chat".into(), 1);
        let need = Duration::from_millis(100);
        let held = adm.admit(&budget(1000), need).await.unwrap();
        assert_eq!(adm.in_flight(), 1);

        // Waits up to 1000 - 100 - 50 ms; the slot frees at 300 ms.
        let waiter = {
            let adm = adm.clone();
            tokio::spawn(async move {
                let t = Instant::now();
                let slot = adm.admit(&budget(1000), need).await;
                (slot.is_ok(), t.elapsed())
            })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        drop(held);
        let (ok, waited) = waiter.await.unwrap();
        assert!(ok);
        assert_eq!(waited, Duration::from_millis(300));
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_route_refuses_when_the_budget_runs_out_and_at_once_when_none_is_left() {
        let adm = Admission::new("chat".into(), 1);
        let need = Duration::from_millis(100);
        let _held = adm.admit(&budget(10_000), need).await.unwrap();

        let t = Instant::now();
        let e = adm.admit(&budget(500), need).await.unwrap_err();
        assert_eq!(
            t.elapsed(),
            Duration::from_millis(350),
            "gave up when 100 ms (and the slack) were left"
        );
        assert_eq!(e.code(), "overloaded");
        assert_eq!(e.status(), http::StatusCode::SERVICE_UNAVAILABLE);

        let t = Instant::now();
        let e = adm.admit(&budget(100), need).await.unwrap_err();
        assert_eq!(
            t.elapsed(),
            Duration::ZERO,
            "nothing to wait with: refused at once"
        );
        assert_eq!(e.code(), "overloaded");
        assert_eq!(adm.in_flight(), 1);
    }
}
