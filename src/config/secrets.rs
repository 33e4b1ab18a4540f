//! Telling a credential from the name of one: [`looks_like_secret`]; keeping credentials out
//! of what the config says about itself ([`redacted_url`], [`scrub`]); and the warnings for
//! keys written into the config file itself.

/// Prefixes of providers' keys.
const PREFIXES: [&str; 14] = [
    "sk-", "sk_", "rk-", "xai-", "gsk_", "AIza", "hf_", "Bearer ", "pplx-", "nvapi-", "csk-",
    "r8_", "tgp_v1_", "fw_",
];

/// Whether a string from the config looks like a credential rather than the name of one:
/// a known provider key prefix, or a long random-looking token: letters of both cases and
/// digits, or letters and digits with no separator at all (Azure OpenAI's keys are 32
/// lowercase hex digits), where names, paths and URLs have separators.
pub fn looks_like_secret(v: &str) -> bool {
    if v.len() >= 12 && PREFIXES.iter().any(|p| v.starts_with(p)) {
        return true;
    }
    mixed_case_token(v)
        || (v
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            && random_run(v))
}

/// A token (letters, digits, `-`, `_`) with a run of 16 or more letters and digits that
/// mixes digits and letters of both cases: random text. Names have shorter words
/// (`Llama-4-Maverick-17B-128E-Instruct-FP8`).
fn mixed_case_token(v: &str) -> bool {
    v.bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        && v.split(['-', '_']).any(|run| {
            let has = |f: fn(&u8) -> bool| run.bytes().any(|b| f(&b));
            run.len() >= 16
                && has(u8::is_ascii_digit)
                && has(u8::is_ascii_lowercase)
                && has(u8::is_ascii_uppercase)
        })
}

/// The surer signs of a key, the ones that count where ids are common (a URL's path, a
/// Cloudflare account's 32 hex digits): a key's prefix, or random text of mixed case.
fn surely_secret(token: &str) -> bool {
    token.len() >= 12 && PREFIXES.iter().any(|p| token.starts_with(p)) || mixed_case_token(token)
}

/// Whether a URL's path or query (what follows its authority) holds a token with the surer
/// signs of a key. [`scrub`] masks such a token wherever it shows the URL; this says so, so
/// that a key pasted into a URL is warned of as one in any other value is (audit PE 3).
fn key_in_url(v: &str) -> bool {
    let Some((_, rest)) = v.split_once("://") else {
        return false;
    };
    let Some(i) = rest.find(['/', '?', '#']) else {
        return false;
    };
    rest[i..]
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_'))
        .any(surely_secret)
}

/// A run of 32 or more letters and digits, both, with no separator: a random token (Azure
/// OpenAI's keys are 32 hex digits; `pplx-` and others put one after a prefix).
fn random_run(v: &str) -> bool {
    v.split(|c: char| !c.is_ascii_alphanumeric()).any(|run| {
        run.len() >= 32
            && run.bytes().any(|b| b.is_ascii_digit())
            && run.bytes().any(|b| b.is_ascii_alphabetic())
    })
}

/// The name a shell-style reference (`$NAME`, `${NAME}`) written where a variable's name
/// belongs refers to. The file is not interpolated, so such a value is read as a name that is
/// never set; the name inside is shown, being plainly no key.
fn shell_reference(v: &str) -> Option<&str> {
    let inner = v.strip_prefix('$')?;
    let name = inner
        .strip_prefix('{')
        .and_then(|n| n.strip_suffix('}'))
        .unwrap_or(inner);
    let is_name = name
        .bytes()
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    is_name.then_some(name)
}

/// The refusal of a shell-style reference, completing the sentence `api_key_env …` (or another `*_env` key).
pub(super) fn shell_reference_refused(var: &str) -> Option<String> {
    shell_reference(var).map(|name| {
        format!(
            "{var:?} is a shell-style reference, but the file is not interpolated: write the \
             variable's name without `$` ({name:?})"
        )
    })
}

/// An environment variable's name as messages may show it. Names are words in upper case
/// joined by `_` (`OPENAI_API_KEY`); what is not a name, mixes lower case and digits without
/// an `_` (or with upper case too), or looks like a key may be the secret itself, pasted
/// where its name belongs.
pub fn var_shown(v: &str) -> &str {
    let has = |f: fn(&u8) -> bool| v.bytes().any(|b| f(&b));
    let name = v.bytes().next().is_some_and(|b| !b.is_ascii_digit())
        && v.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    let random = has(u8::is_ascii_digit)
        && has(u8::is_ascii_lowercase)
        && (!v.contains('_') || has(u8::is_ascii_uppercase));
    if name && !random && !looks_like_secret(v) {
        v
    } else {
        "(a name not shown: it may be the secret itself)"
    }
}

/// A config value as messages may show it: quoted, unless it looks like a key.
pub(super) fn shown(v: &str) -> String {
    if looks_like_secret(v) {
        "(a value that looks like an API key, not shown)".to_owned()
    } else {
        format!("{v:?}")
    }
}

/// A URL as messages may show it: its userinfo's password masked (`redis://user:***@host`,
/// `http://***@host`), and every value in its query (`?api-key=***`). A URL is quoted mostly
/// because it was refused, and an upstream's is refused for the very query Azure (`api-key=`)
/// and Gemini (`key=`) take keys in, so no value there is known to be safe, shaped like a key
/// or not; the parameters' names stay, to say which one was wrong. (A fragment after a query
/// goes with its last value; one without a query is shown: redis-rs reads `#insecure`.)
pub fn redacted_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        // Not a URL the client reads, so no part of it is known to be safe.
        return match url.split_once(':') {
            Some((scheme, _)) => format!("{scheme}:..."),
            None => url.to_owned(),
        };
    };
    let (rest, query) = match rest.split_once('?') {
        Some((r, q)) => (r, Some(q)),
        None => (rest, None),
    };
    let mut out = match rest.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split(':').next().unwrap_or_default();
            if userinfo.contains(':') {
                format!("{scheme}://{user}:***@{host}")
            } else {
                format!("{scheme}://***@{host}")
            }
        }
        None => format!("{scheme}://{rest}"),
    };
    if let Some(query) = query {
        // A parameter without `=` may be a key on its own.
        let params: Vec<String> = query
            .split('&')
            .map(|p| match p.split_once('=') {
                Some((name, _)) => format!("{name}=***"),
                None if p.is_empty() => String::new(),
                None => "***".to_owned(),
            })
            .collect();
        out.push('?');
        out.push_str(&params.join("&"));
    }
    out
}

/// `message` (an error, a warning, the resolved config) with what may be a credential taken
/// out: a URL's userinfo (`http://KEY@host`, `redis://user:PASSWORD@host`) and any token that
/// looks like a key. Every config message goes through it: a value is quoted to say what is
/// wrong with it, and a key written into the wrong field must not reach the log or `/readyz`.
pub fn scrub(message: &str) -> String {
    let masked = mask_userinfo(message);
    let is_token = |b: u8| b.is_ascii_alphanumeric() || b == b'-' || b == b'_';
    let bytes = masked.as_bytes();
    let (mut out, mut copied, mut i) = (String::with_capacity(masked.len()), 0, 0);
    while i < bytes.len() {
        if !is_token(bytes[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < bytes.len() && is_token(bytes[i]) {
            i += 1;
        }
        // A path segment between two `/` is an id more often than a key (a Cloudflare
        // account): only the surer signs count there. (A last one may be a key pasted into
        // a file's field, resolved against the config's folder.)
        let token = &masked[start..i];
        let in_path = start > 0 && bytes[start - 1] == b'/' && bytes.get(i) == Some(&b'/');
        let secret = if in_path {
            surely_secret(token)
        } else {
            looks_like_secret(token)
        };
        if secret {
            out.push_str(&masked[copied..start]);
            out.push_str("***");
            copied = i;
        }
    }
    out.push_str(&masked[copied..]);
    out
}

/// Every URL in `message` as `redacted_url` shows it (its userinfo masked): a URL runs from
/// its scheme to the next space or quote.
fn mask_userinfo(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(i) = rest.find("://") {
        // Scheme characters are ASCII: the URL starts after the last byte that is not one,
        // which is a character's last byte, so the next is a character boundary.
        let start = rest.as_bytes()[..i]
            .iter()
            .rposition(|&b| !(b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.')))
            .map_or(0, |j| j + 1);
        // Quoted as messages quote a value (`{:?}`), it runs to the closing quote, past any
        // space or escaped quote in it (a passphrase in its query); bare, to the next space
        // or quote.
        let end = if start > 0 && rest.as_bytes()[start - 1] == b'"' {
            closing_quote(&rest[i..]).map_or(rest.len(), |j| i + j)
        } else {
            rest[i..]
                .find(|c: char| matches!(c, '"' | '\'' | '`') || c.is_whitespace())
                .map_or(rest.len(), |j| i + j)
        };
        out.push_str(&rest[..start]);
        out.push_str(&redacted_url(&rest[start..end]));
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// Where the `"` that closes a Debug-quoted string falls in `text`, its escapes (`\"`,
/// `\\`) skipped.
fn closing_quote(text: &str) -> Option<usize> {
    let mut bytes = text.bytes().enumerate();
    while let Some((j, b)) = bytes.next() {
        match b {
            b'\\' => {
                bytes.next();
            }
            b'"' => return Some(j),
            _ => {}
        }
    }
    None
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
            toml::Value::String(s) if key_in_url(s) => out.push(format!(
                "{path} looks like it holds an inlined API key (masked where the URL is shown); \
                 keep keys out of the config file (use api_key_env or api_key_file)"
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

#[cfg(test)]
mod scrub_tests {
    use super::scrub;

    #[test]
    fn credentials_are_taken_out_of_messages() {
        let key = "sk-proj-CANARYabcDEF0123456789ghijKLMNopqrSTUVwx";
        for (message, shown) in [
            (
                format!("url \"http://{key}@127.0.0.1:1\" must not contain credentials"),
                "url \"http://***@127.0.0.1:1\" must not contain credentials".to_owned(),
            ),
            (
                format!("url \"http://127.0.0.1:1/?key={key}\" must not have a query"),
                "url \"http://127.0.0.1:1/?key=***\" must not have a query".to_owned(),
            ),
            (
                format!("unknown variant `{key}`, expected one of `bearer`"),
                "unknown variant `***`, expected one of `bearer`".to_owned(),
            ),
            // Azure OpenAI's keys: lowercase hex, no prefix.
            (
                "api_key_env 3f9a1c0e5b7d4e2a8c6b1d0f9e8a7c6b is not set".to_owned(),
                "api_key_env *** is not set".to_owned(),
            ),
            (
                "url \"https://x.openai.azure.com/?key=3f9a1c0e5b7d4e2a8c6b1d0f9e8a7c6b\""
                    .to_owned(),
                "url \"https://x.openai.azure.com/?key=***\"".to_owned(),
            ),
            (
                "store \"redis://user:PASSW0rd@/0\" names no host".to_owned(),
                "store \"redis://user:***@/0\" names no host".to_owned(),
            ),
            (
                "store \"redis://u:pa/ss@h/0\" names no host".to_owned(),
                "store \"redis://u:***@h/0\" names no host".to_owned(),
            ),
            (
                "store \"http://:pw@127.0.0.1:1/0\" must be a redis:// URL".to_owned(),
                "store \"http://:***@127.0.0.1:1/0\" must be a redis:// URL".to_owned(),
            ),
        ] {
            assert_eq!(scrub(&message), shown);
        }
        // A multi-byte character before `://` (the config fuzzer's find) is no scheme.
        assert_eq!(
            scrub("url \"http\u{fffd}://a@b\" is not a valid URL"),
            "url \"http\u{fffd}://***@b\" is not a valid URL"
        );
        // Nothing else changes: names, even long ones with digits, have separators.
        let plain =
            "upstream \"openai\": url \"https://api.openai.com/v1\" (OPENAI_API_KEY) t.toml:3:9";
        assert_eq!(scrub(plain), plain);
        let plain = "api_key_env AZURE_OPENAI_API_KEY_WESTEUROPE_2 is not set; \
                     /etc/hourglass/keys/production-openai-2.key";
        assert_eq!(scrub(plain), plain);
        // Nor are ids that are a path's inner segments (a Cloudflare AI Gateway account),
        // though the same hex is masked as a query's value or a file's name.
        let hex = "3f9a1c0e5b7d4e2a8c6b1d0f9e8a7c6b";
        let plain = format!(
            "upstream cf (https://gateway.ai.cloudflare.com/v1/{hex}/my-gateway/openai), \
             path_prefix: /client/v4/accounts/{hex}/ai/v1"
        );
        assert_eq!(scrub(&plain), plain);
        assert_eq!(
            scrub(&format!("https://x/v1?key={hex}")),
            "https://x/v1?key=***"
        );
        assert_eq!(
            scrub(&format!("api_key_file /etc/{hex}: not found")),
            "api_key_file /etc/***: not found"
        );
        // Model ids are names, however long: their words are short.
        let plain = "models: \"Llama-4-Maverick-17B-128E-Instruct-FP8\", \
                     \"DeepSeek-R1-Distill-Llama-70B-FP8-dynamic\"";
        assert_eq!(scrub(plain), plain);
        // A short key with a known prefix, and random text of mixed case in a token.
        assert_eq!(
            scrub("unknown variant `fw_3ZkQ9pL2xV7mN4rT8wYb6cJd`"),
            "unknown variant `***`"
        );
        // A random run after a key's prefix, lower case and all.
        assert_eq!(
            scrub(&format!(
                "api_key_env pplx-{hex}0123456789abcdef is not set"
            )),
            "api_key_env *** is not set"
        );
    }

    /// Audit OB 2: a URL is quoted in a message because it was refused, often for its very
    /// query (an upstream's `url` takes none), and Azure (`api-key=`) and Gemini (`key=`) do
    /// take keys there: every value, and any parameter without one, is masked, key-shaped or
    /// not; the names stay, to say which parameter was wrong.
    #[test]
    fn every_query_value_of_a_quoted_url_is_masked() {
        for (url, shown) in [
            (
                "http://127.0.0.1:1/v1beta?api-key=correct-horse-battery-staple",
                "http://127.0.0.1:1/v1beta?api-key=***",
            ),
            (
                "http://h/v1?api-key=Pa55word-Shorty&access_token=ya29.a0AfH6SMBx",
                "http://h/v1?api-key=***&access_token=***",
            ),
            ("http://h/?apikey=S3cr3t-Pr0d-K3y", "http://h/?apikey=***"),
            ("http://h/?secret=mysecretvalue", "http://h/?secret=***"),
            ("http://h/?token=abc123secret", "http://h/?token=***"),
            ("http://h/?auth=Basic%20dXNlcjpwYXNz", "http://h/?auth=***"),
            // A parameter without `=` may be the key alone.
            ("http://h/v1?hunter2", "http://h/v1?***"),
            ("http://h/v1?a=1&hunter2&b=", "http://h/v1?a=***&***&b=***"),
            ("http://h/v1?a=1#hunter2", "http://h/v1?a=***"),
            // A store's password in its userinfo or its query, as before.
            (
                "redis://app:hunter2@127.0.0.1:6379/0?password=x",
                "redis://app:***@127.0.0.1:6379/0?password=***",
            ),
        ] {
            let message = format!("upstream \"u\": url {url:?} must not have a query string");
            let want = format!("upstream \"u\": url {shown:?} must not have a query string");
            assert_eq!(scrub(&message), want);
        }
        // Quoted (as messages quote a value, with `{:?}`), a URL runs to its closing quote:
        // a space inside does not end it early.
        assert_eq!(
            scrub(r#"url "http://h/v1?api-key=correct horse \"battery\" staple" is not valid"#),
            r#"url "http://h/v1?api-key=***" is not valid"#
        );
    }

    /// A URL holds a key where its path or query has a token with the surer signs (audit
    /// PE 3); ids, names and the authority do not count.
    #[test]
    fn a_key_in_a_url_path_or_query_is_found() {
        use super::key_in_url;
        let key = "sk-proj-ABCDEFGHIJKLMNOPQRSTUVWXYZabcdef012345";
        for url in [
            format!("https://api.openai.com/v1/{key}"),
            format!("https://api.openai.com/{key}/v1"),
            format!("redis://127.0.0.1:6379/0?password={key}"),
            format!("https://h?key={key}"),
            "https://h/v1?token=AbCdEfGhIjKlMnOpQrStUvWxYz0123456789".to_owned(),
        ] {
            assert!(key_in_url(&url), "{url}");
        }
        for url in [
            "https://gateway.ai.cloudflare.com/v1/3f9a1c0e5b7d4e2a8c6b1d0f9e8a7c6b/gw/openai",
            "https://h/v1/models/Llama-4-Maverick-17B-128E-Instruct-FP8",
            "https://sk-proj-host.example.com",
            "https://x.openai.azure.com/?api-version=2024-10-21",
            "sk-proj-ABCDEFGHIJKLMNOPQRSTUVWXYZabcdef012345",
        ] {
            assert!(!key_in_url(url), "{url}");
        }
    }

    #[test]
    fn variable_names_are_shown_and_what_may_be_a_secret_is_not() {
        use super::var_shown;
        for name in ["OPENAI_API_KEY", "openai_key", "AZURE_KEY_2", "KEY"] {
            assert_eq!(var_shown(name), name);
        }
        for secret in [
            "Xk9pQ2vL7mN4rT8w",
            "Xk9p_Q2vL7mN4rT8w",
            "fw_3ZkQ9pL2xV7mN4rT8wYb6cJd",
            "aeR4eiN1ohPh7quu",
            "hunter2!pass",
            "pplx-0123456789abcdef",
            "3f9a1c0e-5b7d-4e2a-8c6b-1d0f9e8a7c6b",
            "sk-ant-api03-abcdefghijklmnop",
            "",
        ] {
            assert_eq!(
                var_shown(secret),
                "(a name not shown: it may be the secret itself)",
                "{secret}"
            );
        }
    }
}
