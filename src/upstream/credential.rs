//! The upstream's own key: read from `api_key_env` or `api_key_file` and sent the way its
//! `auth` says, never logged.

use http::header::{HeaderName, AUTHORIZATION};
use http::HeaderValue;

use crate::config::{AuthMode, UpstreamConfig};
use crate::http::headers::{API_KEY, X_API_KEY, X_GOOG_API_KEY};
use crate::upstream::error::UpstreamBuildError;

/// U+FEFF, which Windows editors put at the start of a text file.
const BOM: char = '\u{feff}';

/// The provider key, from `api_key_env` (unset or empty: none, the client's own
/// credentials pass through) or `api_key_file` (which must exist and hold a key).
fn read_key(config: &UpstreamConfig) -> Result<Option<(String, String)>, UpstreamBuildError> {
    if let Some(path) = &config.api_key_file {
        let file_err = |reason: String| UpstreamBuildError::KeyFile {
            upstream: config.name.clone(),
            path: path.display().to_string(),
            reason,
        };
        let text =
            crate::config::file::read_to_string(path).map_err(|e| file_err(e.to_string()))?;
        // A byte-order mark that an editor wrote is no part of the key.
        let key = text.trim_start_matches(BOM).trim();
        if key.is_empty() {
            return Err(file_err("the file is empty".into()));
        }
        if key.contains(['\n', '\r']) {
            return Err(file_err("the file must hold exactly one key".into()));
        }
        return Ok(Some((
            key.to_owned(),
            format!("api_key_file {}", path.display()),
        )));
    }
    let Some(var) = &config.api_key_env else {
        return Ok(None);
    };
    let Ok(key) = std::env::var(var) else {
        return Ok(None);
    };
    let key = key.trim_start_matches(BOM).trim();
    if key.is_empty() {
        return Ok(None);
    }
    Ok(Some((key.to_owned(), var.clone())))
}

pub(super) fn credential(
    config: &UpstreamConfig,
) -> Result<Option<(HeaderName, HeaderValue)>, UpstreamBuildError> {
    // Under auth "none" a key source is ignored, as `check` says: its file is not read, so
    // one that is missing does not stop the gateway.
    if config.auth == AuthMode::None {
        return Ok(None);
    }
    let Some((key, var)) = read_key(config)? else {
        return Ok(None);
    };
    let key = key.as_str();
    let bad = || UpstreamBuildError::BadKey {
        upstream: config.name.clone(),
        var: var.clone(),
    };
    // A header value may carry bytes past ASCII (obs-text), which no provider's key has: a
    // key with them (a stray character pasted with it) would fail at the provider with a
    // 401 that does not say why.
    if !key.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(bad());
    }
    let name = match config.auth {
        AuthMode::Bearer => AUTHORIZATION,
        AuthMode::XApiKey => X_API_KEY,
        AuthMode::ApiKey => API_KEY,
        AuthMode::GoogApiKey => X_GOOG_API_KEY,
        AuthMode::None => return Ok(None),
    };
    let value = match config.auth {
        AuthMode::Bearer => format!("Bearer {key}"),
        _ => key.to_owned(),
    };
    let mut value = HeaderValue::from_str(&value).map_err(|_| bad())?;
    // Kept out of HPACK tables and printed as "Sensitive" by Debug.
    value.set_sensitive(true);
    Ok(Some((name, value)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upstream(auth: &str) -> UpstreamConfig {
        let text = format!(
            "[upstreams.u]\nurl = \"https://u.example\"\nauth = \"{auth}\"\n\
             api_key_file = \"/nonexistent/u.key\"\n\n\
             [[routes]]\nname = \"r\"\npath_prefix = \"/v1\"\nupstream = \"u\"\n"
        );
        let config = crate::config::Config::from_toml(&text, "t.toml").unwrap();
        (*config.upstreams[0]).clone()
    }

    /// A byte-order mark before the key is dropped; any other byte past ASCII refuses the
    /// key (it went out as obs-text, and the provider answered 401 without saying why).
    #[test]
    fn a_key_file_loses_its_byte_order_mark_and_holds_ascii() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("u.key");
        let mut config = upstream("bearer");
        config.api_key_file = Some(path.clone());
        std::fs::write(&path, "\u{feff}sk-bom-0123456789abcdef\r\n").unwrap();
        let (name, value) = credential(&config).unwrap().unwrap();
        assert_eq!(name, AUTHORIZATION);
        assert_eq!(value, "Bearer sk-bom-0123456789abcdef");
        std::fs::write(&path, "sk-caf\u{e9}-0123456789abcdef\n").unwrap();
        let e = credential(&config).unwrap_err().to_string();
        assert!(e.contains("printable ASCII"), "{e}");
        assert!(!e.contains("0123456789abcdef"), "{e}");
    }

    /// Audit WB 3: Azure OpenAI reads its key from `api-key` alone and native Gemini from
    /// `x-goog-api-key`; each `auth` sends the key as is in its header (only `bearer` adds a
    /// scheme), marked sensitive.
    #[test]
    fn each_auth_sends_the_key_in_its_header() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("u.key");
        std::fs::write(&path, "0123456789abcdef0123456789abcdef\n").unwrap();
        for (auth, header, value) in [
            (
                "bearer",
                "authorization",
                "Bearer 0123456789abcdef0123456789abcdef",
            ),
            ("x-api-key", "x-api-key", "0123456789abcdef0123456789abcdef"),
            ("api-key", "api-key", "0123456789abcdef0123456789abcdef"),
            (
                "x-goog-api-key",
                "x-goog-api-key",
                "0123456789abcdef0123456789abcdef",
            ),
        ] {
            let mut config = upstream(auth);
            config.api_key_file = Some(path.clone());
            assert_eq!(config.auth.to_string(), auth);
            let (name, sent) = credential(&config).unwrap().unwrap();
            assert_eq!((name.as_str(), sent.to_str().unwrap()), (header, value));
            assert!(sent.is_sensitive(), "{auth}");
        }
    }

    /// A key file that `auth = "none"` leaves unread may be missing; one that is read may not.
    #[test]
    fn a_key_file_is_read_only_where_auth_sends_it() {
        assert_eq!(credential(&upstream("none")).unwrap(), None);
        let e = credential(&upstream("bearer")).unwrap_err().to_string();
        assert!(e.contains("/nonexistent/u.key"), "{e}");
    }
}
