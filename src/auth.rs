//! Who may use a route: client keys.
//!
//! A route with `client_keys_env` / `client_keys_file` accepts a request only when it carries
//! one of its keys, as `Authorization: Bearer KEY` or `x-api-key: KEY`. Only SHA-256 digests
//! of the keys are kept, and a presented key is hashed once and looked up by its digest: the
//! time a lookup takes depends on the digest alone, which no guess can steer toward a key's
//! (that would be a preimage of SHA-256), so neither the time taken nor the memory of the
//! process gives a key away, and a route with 50,000 keys answers as fast as one with one.
//! The key is removed before the request is forwarded.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use http::header::{HeaderMap, AUTHORIZATION};
use ring::digest::{digest, SHA256};

use crate::config::ClientAuth;
use crate::http::headers::X_API_KEY;
use crate::telemetry::log::key_hex;

/// A route that asks clients for keys could not load them; it must not start open.
#[derive(Debug, thiserror::Error)]
#[error("route {route:?}: {reason}")]
pub struct ClientKeysError {
    pub route: String,
    pub reason: String,
}

/// Keys shorter than this are refused at startup: hashing is no help
/// against a key short enough to guess.
pub const MIN_KEY_LEN: usize = 16;

/// The keys one route accepts, as digests, each with the client's name when the key file
/// gives one.
#[derive(Clone)]
pub struct ClientKeys {
    /// Each key's name (if its file gives one), by the key's digest.
    entries: Arc<HashMap<[u8; 32], Option<Arc<str>>>>,
}

fn client_id(digest: &[u8; 32], name: &Option<Arc<str>>) -> ClientId {
    let mut key = [0u8; 8];
    key.copy_from_slice(&digest[..8]);
    ClientId {
        key,
        name: name.clone(),
    }
}

/// Who a request's key says the client is: the key's digest prefix (what its runs are
/// scoped by) and its name, if it has one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientId {
    pub key: KeyId,
    pub name: Option<Arc<str>>,
}

impl ClientId {
    /// The client as metrics name it: its name, else its key's digest prefix in hex.
    pub fn label(&self) -> Cow<'_, str> {
        match &self.name {
            Some(n) => Cow::Borrowed(n),
            None => Cow::Owned(key_hex(&self.key).map(char::from).iter().collect()),
        }
    }
}

impl std::fmt::Debug for ClientKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Not even the digests.
        write!(f, "ClientKeys({} keys)", self.entries.len())
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
        // Each key with where it was read, so that a key given two names can say where.
        let mut keys: Vec<(Option<String>, String, String)> = Vec::new();
        if let Some(var) = &auth.env {
            let shown = crate::config::var_shown(var);
            let value = env(var).map_err(|e| err(format!("client_keys_env {shown}: {e}")))?;
            // Commas or lines: a variable filled from a key file (`$(cat keys)`) holds lines.
            for (i, item) in value.split([',', '\n']).map(str::trim).enumerate() {
                if item.is_empty() {
                    continue;
                }
                let at = format!("client_keys_env {shown}: key {}", i + 1);
                let (name, key) = named_key(item).map_err(|why| err(format!("{at}: {why}")))?;
                keys.push((name, key, at));
            }
        }
        if let Some(path) = &auth.file {
            let text = crate::config::file::read_to_string(path)
                .map_err(|e| err(format!("client_keys_file {}: {e}", path.display())))?;
            for (i, line) in text.trim_start_matches('\u{feff}').lines().enumerate() {
                let line = line.trim();
                if line.is_empty() || line.starts_with('#') {
                    continue;
                }
                let at = format!("client_keys_file {} line {}", path.display(), i + 1);
                let (name, key) = named_key(line).map_err(|why| err(format!("{at}: {why}")))?;
                keys.push((name, key, at));
            }
        }
        if keys.is_empty() {
            return Err(err(
                "client_keys_env/client_keys_file hold no key; the route would accept nobody"
                    .into(),
            ));
        }
        // One key, one client: a key under two names would count one client's requests
        // and tokens as the other's, whichever came first. (By a map: a file of 50,000 keys
        // is read at every reload.)
        let mut named: HashMap<&str, (&str, &str)> = HashMap::new();
        for (name, key, at) in &keys {
            let Some(name) = name else { continue };
            let (first_name, first) = *named.entry(key).or_insert((name, at));
            if first_name != name {
                return Err(err(format!(
                    "{at}: the same key as {first}, under another name; a key belongs to one client"
                )));
            }
        }
        Ok(Self::from_named(
            keys.iter().map(|(n, k, _)| (n.as_deref(), k.as_str())),
        ))
    }

    pub fn from_keys<'a>(keys: impl IntoIterator<Item = &'a str>) -> Self {
        Self::from_named(keys.into_iter().map(|k| (None, k)))
    }

    /// Keys with their names; a key listed twice keeps its first name.
    pub fn from_named<'a>(keys: impl IntoIterator<Item = (Option<&'a str>, &'a str)>) -> Self {
        let mut entries: HashMap<[u8; 32], Option<Arc<str>>> = HashMap::new();
        for (name, key) in keys {
            let known = entries.entry(sha256(key.as_bytes())).or_default();
            // Listed unnamed and named: the name is the client's.
            if known.is_none() {
                *known = name.map(Arc::from);
            }
        }
        Self {
            entries: Arc::new(entries),
        }
    }

    /// Every client as metrics name it: its name, or the digest prefix of an unnamed key.
    pub fn clients(&self) -> Vec<String> {
        let clients: std::collections::BTreeSet<String> = self
            .entries
            .iter()
            .map(|(digest, name)| client_id(digest, name).label().into_owned())
            .collect();
        clients.into_iter().collect()
    }

    /// Whether the request carries one of the keys.
    pub fn accepts(&self, headers: &HeaderMap) -> bool {
        self.identify(headers).is_some()
    }

    /// The client the request's key names, when it is one of these. Looks at the first
    /// `authorization` (scheme `Bearer`) and the first `x-api-key`; each is hashed once and
    /// looked up by its digest.
    pub fn identify(&self, headers: &HeaderMap) -> Option<ClientId> {
        presented_keys(headers)
            .into_iter()
            .flatten()
            .find_map(|presented| {
                let digest = sha256(presented);
                let name = self.entries.get(&digest)?;
                Some(client_id(&digest, name))
            })
    }
}

/// A client key as logs and run scopes name it: the first 8 bytes of its SHA-256 digest
/// (`printf %s KEY | sha256sum | cut -c1-16` prints it).
pub type KeyId = [u8; 8];

/// The most a client's name may hold: it becomes a metric label and a log field.
pub const NAME_MAX: usize = 64;

/// A key, or a name and a key separated by white space (`team-a sk-...`). The reason never
/// quotes the key.
fn named_key(item: &str) -> Result<(Option<String>, String), String> {
    let mut fields = item.split_whitespace();
    let (name, key) = match (fields.next(), fields.next(), fields.next()) {
        (Some(key), None, None) => (None, key),
        (Some(name), Some(key), None) => (Some(name), key),
        _ => return Err("an entry is a key, or a name and a key separated by a space".into()),
    };
    // The name is never quoted: two keys on one line read as a name and a key, and the
    // name is then a key.
    if let Some(name) = name {
        if name.len() > NAME_MAX
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-@".contains(&b))
        {
            return Err(format!(
                "the name (before the key) must be at most {NAME_MAX} letters, digits, '.', '_', '-' or '@'"
            ));
        }
        if key_shaped(name) {
            return Err(
                "the name (before the key) looks like a key: one key per line (or comma-separated \
                 in client_keys_env), or a client's name and its key (`team-a KEY`)"
                    .into(),
            );
        }
    }
    check_key(key)?;
    Ok((name.map(str::to_owned), key.to_owned()))
}

/// Whether a client's name looks like a key: a run of letters and digits that reads as
/// random, not as words and numbers: 20 or more with a digit in it, 16 or more mixing digits
/// with letters of both cases, or 16 or more hex digits with a letter. Customer and tenant
/// ids (`customer12345`, `tenant-7f3a9c21b4e8`) and addresses are names. A name becomes a
/// metric label and a log field, where a key must never be.
fn key_shaped(name: &str) -> bool {
    name.split(|c: char| !c.is_ascii_alphanumeric()).any(|run| {
        let has = |f: fn(&u8) -> bool| run.bytes().any(|b| f(&b));
        let (digit, letter) = (has(u8::is_ascii_digit), has(u8::is_ascii_alphabetic));
        digit
            && letter
            && (run.len() >= 20
                || (run.len() >= 16
                    && ((has(u8::is_ascii_lowercase) && has(u8::is_ascii_uppercase))
                        || run.bytes().all(|b| b.is_ascii_hexdigit()))))
    })
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

/// Removes what a client may have sent as a key, this gateway's or any other's, so that it
/// never reaches the upstream (the upstream's own key, if it has one, is added later).
pub fn strip_client_credentials(headers: &mut HeaderMap) {
    crate::http::client_steering::strip_credentials(headers);
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
        let id = |key: &str| {
            keys.identify(&headers(&[("x-api-key", key)]))
                .map(|c| c.key)
        };
        assert_eq!(id(KEY), Some(want));
        // An unknown key in the first header does not hide a known one in the second.
        assert_eq!(
            keys.identify(&headers(&[
                ("authorization", "Bearer sk-provider"),
                ("x-api-key", KEY)
            ]))
            .map(|c| c.key),
            Some(want)
        );
        assert_eq!(id("nope-0123456789abc"), None);
    }

    #[test]
    fn a_key_file_may_name_its_clients() {
        let dir = tempfile::Builder::new()
            .prefix("hourglass-keys-")
            .tempdir()
            .unwrap();
        let file = dir.path().join("keys");
        std::fs::write(
            &file,
            format!(
                "# the two keys of team-a, during a rotation\nteam-a {KEY}\nteam-a\tnew-key-0123456789\n\
                 unnamed-key-0123456789\nteam-a {KEY}\n"
            ),
        )
        .unwrap();
        let auth = ClientAuth {
            env: Some("KEYS".into()),
            file: Some(file.clone()),
        };
        let env = |_: &str| Ok("ops@acme env-key-0123456789, other-key-0123456789".to_owned());
        let keys = ClientKeys::load_with("chat", &auth, &env).unwrap();
        let name = |key: &str| {
            keys.identify(&headers(&[("x-api-key", key)]))
                .map(|c| c.name.as_deref().map(str::to_owned))
        };
        assert_eq!(
            name(KEY),
            Some(Some("team-a".into())),
            "a key listed twice under its name"
        );
        assert_eq!(name("new-key-0123456789"), Some(Some("team-a".into())));
        assert_eq!(name("unnamed-key-0123456789"), Some(None));
        assert_eq!(name("env-key-0123456789"), Some(Some("ops@acme".into())));
        assert_eq!(name("other-key-0123456789"), Some(None));
        let unnamed = |key: &str| {
            let d = sha256(key.as_bytes());
            d[..8]
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        };
        let mut want = vec![
            "ops@acme".to_owned(),
            "team-a".to_owned(),
            unnamed("unnamed-key-0123456789"),
            unnamed("other-key-0123456789"),
        ];
        want.sort();
        assert_eq!(keys.clients(), want, "team-a once");

        for (line, why) in [
            (
                format!("team a {KEY}"),
                "line 1: an entry is a key, or a name and a key separated by a space",
            ),
            (
                format!("team/a {KEY}"),
                "line 1: the name (before the key) must be at most 64 letters, digits",
            ),
            // Two keys on a line: the first would have become a client's name, a metric
            // label and a log field.
            (
                format!("hgk-first-0123456789ABCDEF {KEY}"),
                "line 1: the name (before the key) looks like a key",
            ),
            (
                format!("sk-proj-AbC9xYz0123456789QwErTy+/LmNoPq {KEY}"),
                "line 1: the name (before the key) must be",
            ),
            (
                format!("team-a {KEY}\n\nteam-b {KEY}"),
                "line 3: the same key as client_keys_file",
            ),
            (
                format!("tenant-0123456789abcdef0123 {KEY}"),
                "line 1: the name (before the key) looks like a key",
            ),
            (
                format!("svc-Ab3dEf7hIj9kLm2n {KEY}"),
                "line 1: the name (before the key) looks like a key",
            ),
            (
                "team-a short-secret".to_owned(),
                "line 1: a key must be at least 16",
            ),
        ] {
            std::fs::write(&file, &line).unwrap();
            let e = ClientKeys::load_with("chat", &auth, &env)
                .unwrap_err()
                .to_string();
            assert!(e.contains(why), "{e}");
            for secret in ["short-secret", KEY, "0123456789ABCDEF", "LmNoPq"] {
                assert!(!e.contains(secret), "{e}");
            }
        }
        dir.close().unwrap();
    }

    /// Names people give their clients are names, ids and addresses included (audit Q: these
    /// were refused as looking like keys).
    #[test]
    fn customer_ids_and_addresses_are_names() {
        for name in [
            "customer12345",
            "acmecorp2024",
            "githubactions1",
            "backend2service",
            "tenant-7f3a9c21b4e8",
            "org-abc123def456",
            "johnsmith1987@example.com",
            "rk-analytics-team",
            "hf_research_group",
            "team-2024-prod",
            "ops@acme.example",
        ] {
            let (got, _) = named_key(&format!("{name} {KEY}")).unwrap();
            assert_eq!(got.as_deref(), Some(name));
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

    /// Audit CA: 50,000 keys took 6 s to load (every key compared with every earlier one,
    /// at every reload) and every request compared its key with all of them.
    #[test]
    fn a_file_of_many_named_keys_loads_and_finds_each() {
        let dir = tempfile::Builder::new()
            .prefix("hourglass-keys-")
            .tempdir()
            .unwrap();
        let file = dir.path().join("keys");
        let key = |i: usize| format!("hg-many-keys-{i:08}");
        let text: String = (0..50_000)
            .map(|i| format!("team-{} {}\n", i % 100, key(i)))
            .collect();
        std::fs::write(&file, format!("{text}team-0 {}\n", key(0))).unwrap();
        let auth = ClientAuth {
            env: None,
            file: Some(file.clone()),
        };
        let keys = ClientKeys::load_with("chat", &auth, &|_| unreachable!()).unwrap();
        for i in [0, 1, 49_999] {
            let client = keys.identify(&headers(&[("x-api-key", &key(i))])).unwrap();
            assert_eq!(client.name.as_deref(), Some(&*format!("team-{}", i % 100)));
        }
        assert!(keys
            .identify(&headers(&[("x-api-key", &key(50_000))]))
            .is_none());
        assert_eq!(keys.clients().len(), 100);
        // The last line gives key 0 a second name: refused, naming both lines.
        std::fs::write(&file, format!("{text}team-1 {}\n", key(0))).unwrap();
        let e = ClientKeys::load_with("chat", &auth, &|_| unreachable!())
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 50001: the same key as"), "{e}");
        assert!(e.contains(" line 1, under another name"), "{e}");
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
        // A variable filled from a key file holds lines: each is a key, not a name.
        let lines = ClientKeys::load_with(
            "chat",
            &auth,
            &env("hgk-first-0123456789ABCDEF\nhgk-second-0123456789ABCD\n"),
        )
        .unwrap();
        for key in ["hgk-first-0123456789ABCDEF", "hgk-second-0123456789ABCD"] {
            let client = lines.identify(&headers(&[("x-api-key", key)])).unwrap();
            assert_eq!(client.name, None, "{key}");
        }
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

    /// Audit IC 4: the keys of the proxies and gateways an upstream may be (LiteLLM, Azure
    /// API Management, Cloudflare AI Gateway, Portkey) went on beside the gateway's.
    #[test]
    fn stripping_removes_every_key_a_proxy_or_gateway_reads() {
        let mut h = headers(&[
            ("authorization", "Bearer x"),
            ("api-key", "a"),
            ("x-goog-api-key", "g"),
            ("x-litellm-api-key", "sk-client-litellm"),
            ("ocp-apim-subscription-key", "client-apim"),
            ("cf-aig-authorization", "Bearer client-cf"),
            ("x-portkey-api-key", "pk-client"),
            ("x-portkey-provider", "openai"),
            ("x-litellm-tags", "t"),
            ("cookie", "c=1"),
        ]);
        strip_client_credentials(&mut h);
        let mut left: Vec<&str> = h.keys().map(|n| n.as_str()).collect();
        left.sort_unstable();
        assert_eq!(left, ["cookie", "x-litellm-tags", "x-portkey-provider"]);
    }
}
