//! Telling a credential from the name of one: [`looks_like_secret`], and the warnings for
//! keys written into the config file itself.

/// Whether a string from the config looks like a credential rather than the name of one:
/// a known provider key prefix, or a long random-looking token (letters of both cases and
/// digits, no separators that names, paths and URLs have).
pub fn looks_like_secret(v: &str) -> bool {
    const PREFIXES: [&str; 8] = [
        "sk-", "sk_", "rk-", "xai-", "gsk_", "AIza", "hf_", "Bearer ",
    ];
    if v.len() >= 12 && PREFIXES.iter().any(|p| v.starts_with(p)) {
        return true;
    }
    v.len() >= 32
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        && v.bytes().any(|b| b.is_ascii_lowercase())
        && v.bytes().any(|b| b.is_ascii_uppercase())
        && v.bytes().any(|b| b.is_ascii_digit())
}

/// A config value as messages may show it: quoted, unless it looks like a key.
pub(super) fn shown(v: &str) -> String {
    if looks_like_secret(v) {
        "(a value that looks like an API key, not shown)".to_owned()
    } else {
        format!("{v:?}")
    }
}

/// Warnings for string values anywhere in the file that look like inlined credentials.
/// Keys belong in the environment or a file (`api_key_env`, `api_key_file`,
/// `client_keys_env`, `client_keys_file`); the value itself is never repeated.
pub(super) fn inlined_secrets(text: &str) -> Vec<String> {
    fn walk(path: &str, v: &toml::Value, out: &mut Vec<String>) {
        match v {
            toml::Value::String(s) if looks_like_secret(s) => out.push(format!(
                "{path} looks like an inlined API key; keep keys out of the config file (use api_key_env or api_key_file)"
            )),
            toml::Value::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    walk(&format!("{path}[{i}]"), item, out);
                }
            }
            toml::Value::Table(t) => {
                for (k, item) in t {
                    let sub = if path.is_empty() { k.clone() } else { format!("{path}.{k}") };
                    walk(&sub, item, out);
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    if let Ok(table) = text.parse::<toml::Table>() {
        walk("", &toml::Value::Table(table), &mut out);
    }
    out
}
