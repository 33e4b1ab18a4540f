//! Who may use a route: client keys.
//!
//! A route with `client_keys_env` / `client_keys_file` accepts a request only when it carries
//! one of its keys, as `Authorization: Bearer KEY` or `x-api-key: KEY`. Only SHA-256 digests
//! of the keys are kept, and a presented key is hashed once and compared with every digest in
//! constant time, so neither the time taken nor the memory of the process gives a key away.
//! The key is removed before the request is forwarded.

use std::sync::Arc;

use http::header::{HeaderMap, AUTHORIZATION};
use ring::digest::{digest, SHA256};
use subtle::{Choice, ConstantTimeEq};

use crate::config::ClientAuth;
use crate::http::headers::X_API_KEY;

/// A route that asks clients for keys could not load them; it must not start open.
#[derive(Debug, thiserror::Error)]
#[error("route {route:?}: {reason}")]
pub struct ClientKeysError {
    pub route: String,
    pub reason: String,
}

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
    pub fn load(route: &str, auth: &ClientAuth) -> Result<Self, ClientKeysError> {
        Self::load_with(route, auth, &|var| std::env::var(var))
    }

    /// [`ClientKeys::load`] with the environment read through `env` (tests give their own).
    fn load_with(
        route: &str,
        auth: &ClientAuth,
        env: &dyn Fn(&str) -> Result<String, std::env::VarError>,
    ) -> Result<Self, ClientKeysError> {
        let err = |reason: String| ClientKeysError {
            route: route.to_owned(),
            reason,
        };
        let mut keys: Vec<String> = Vec::new();
        if let Some(var) = &auth.env {
            let value = env(var).map_err(|e| err(format!("client_keys_env {var}: {e}")))?;
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

    /// Whether the request carries one of the keys.
    pub fn accepts(&self, headers: &HeaderMap) -> bool {
        self.identify(headers).is_some()
    }

    /// The key the request carries, when it is one of these, named by the start of its
    /// digest: what the log line and the client's runs are scoped by, which never holds the
    /// key. Looks at the first `authorization` (scheme `Bearer`) and the first `x-api-key`;
    /// each is hashed once and compared with every digest without an early exit.
    pub fn identify(&self, headers: &HeaderMap) -> Option<KeyId> {
        let mut found = None;
        for presented in presented_keys(headers).into_iter().flatten() {
            let d = sha256(presented);
            let known = self
                .digests
                .iter()
                .fold(Choice::from(0), |ok, known| ok | known.ct_eq(&d));
            if found.is_none() && bool::from(known) {
                let mut id = [0u8; 8];
                id.copy_from_slice(&d[..8]);
                found = Some(id);
            }
        }
        found
    }
}

/// A client key as logs and run scopes name it: the first 8 bytes of its SHA-256 digest
/// (`printf %s KEY | sha256sum | cut -c1-16` prints it).
pub type KeyId = [u8; 8];

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

#[cfg(test)]
mod tests {
    use super::*;
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
    fn a_key_is_named_by_the_start_of_its_digest() {
        let keys = ClientKeys::from_keys(["another-key-abcdefghij", KEY]);
        // printf %s hg-test-key-0123456789 | sha256sum | cut -c1-16
        let id = sha256(KEY.as_bytes());
        let want: KeyId = id[..8].try_into().unwrap();
        assert_eq!(keys.identify(&headers(&[("x-api-key", KEY)])), Some(want));
        // An unknown key in the first header does not hide a known one in the second.
        assert_eq!(
            keys.identify(&headers(&[
                ("authorization", "Bearer sk-provider"),
                ("x-api-key", KEY)
            ])),
            Some(want)
        );
        assert_eq!(
            keys.identify(&headers(&[("x-api-key", "nope-0123456789abc")])),
            None
        );
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
    fn a_variable_holds_a_comma_separated_list_and_adds_to_the_file() {
        let dir = tempfile::Builder::new()
            .prefix("hourglass-keys-")
            .tempdir()
            .unwrap();
        let file = dir.path().join("keys");
        std::fs::write(&file, "file-key-0123456789\n").unwrap();
        let auth = ClientAuth {
            env: Some("KEYS".into()),
            file: Some(file),
        };
        let env = |value: &'static str| {
            move |var: &str| {
                assert_eq!(var, "KEYS");
                Ok(value.to_owned())
            }
        };
        let list = " hg-test-key-0123456789 , , other-key-0123456789 ";
        let keys = ClientKeys::load_with("chat", &auth, &env(list)).unwrap();
        for key in [KEY, "other-key-0123456789", "file-key-0123456789"] {
            assert!(keys.accepts(&headers(&[("x-api-key", key)])), "{key}");
        }
        let e = ClientKeys::load_with("chat", &auth, &env("fine-key-0123456789,short-secret"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("client_keys_env KEYS: key 2"), "{e}");
        assert!(!e.contains("short-secret"), "{e}");
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
}
