//! Canary keys: provider keys (from a file and from the environment), client keys (from a
//! file and from the environment) and keys in a query string (`?key=`, as Gemini takes one)
//! are pushed through every path a request can take, with every log line captured at TRACE,
//! and then looked for everywhere a secret could leak: logs in every `--log-format`,
//! answers (heads, bodies, error events), `/metrics`, the config's debug output,
//! `hourglass check`, and what the upstream received.
//!
//! Keys from the environment are given to a gateway process of its own: `set_var` in this
//! one would race the other test's threads reading theirs.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::*;
use bytes::Bytes;
use hourglass::config::Config;
use hourglass_fake::FakeUpstream;
use http::Request;
use http_body_util::Full;
use hyper_util::rt::{TokioExecutor, TokioIo};

const PROVIDER_FILE_KEY: &str = "sk-canary-FILEKEY-7f3a9c1e5b";
const PROVIDER_ENV_KEY: &str = "sk-canary-ENVKEY-2d8e4b6a0c";
const CLIENT_KEY: &str = "hg-canary-CLIENTKEY-91b7e3f5";
const CLIENT_FILE_KEY: &str = "hg-canary-CLIENTFILE-c4a2d8e6";
const WRONG_KEY: &str = "hg-canary-WRONGKEY-5e1f9a3b7d";
/// A key in the query string: forwarded (it is the provider's), never logged.
const QUERY_KEY: &str = "AIza-canary-QUERYKEY-3c5e7a9b1d";
/// The distinctive middle of every canary: none of these may appear anywhere but upstream.
const MARKERS: [&str; 6] = [
    "FILEKEY-7f3a",
    "ENVKEY-2d8e",
    "CLIENTKEY-91b7",
    "CLIENTFILE-c4a2",
    "WRONGKEY-5e1f",
    "QUERYKEY-3c5e",
];

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn assert_clean(what: &str, text: &str) {
    for m in MARKERS {
        assert!(
            !text.contains(m),
            "{what} leaks a key ({m}):\n{}",
            text.lines()
                .filter(|l| l.contains(m))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
}

/// Everything a client could see of one answer: status, head and whole body (or its error).
async fn seen(resp: http::Response<hyper::body::Incoming>) -> String {
    let head = format!("{:?} {:?}", resp.status(), resp.headers());
    let read = read_body(resp.into_body()).await;
    format!("{head}\n{}\n{:?}", read.text(), read.error)
}

/// Requests with `QUERY_KEY` in their query string: one served, one refused for its budget,
/// one for its client key, one that finds no route, one the upstream fails (all but the
/// no-route one on route `chat`).
fn query_requests(bearer: &str) -> Vec<Request<Full<Bytes>>> {
    let wrong = format!("Bearer {WRONG_KEY}");
    let body = br#"{"model":"m","stream":true}"#;
    [
        ("/v1/chat/completions?key=Q", bearer, ("x-fake-chunks", "2")),
        (
            "/v1/chat/completions?api_key=Q&x=1",
            bearer,
            ("x-request-budget-ms", "abc"),
        ),
        (
            "/v1/chat/completions?key=Q",
            wrong.as_str(),
            ("x-fake-chunks", "1"),
        ),
        ("/nowhere?key=Q", bearer, ("x-fake-chunks", "1")),
        (
            "/v1/chat/completions?alt=sse&key=Q",
            bearer,
            ("x-fake-status", "500"),
        ),
    ]
    .into_iter()
    .map(|(path, auth, (name, value))| {
        Request::post(path.replace('Q', QUERY_KEY))
            .header("host", "g")
            .header("content-type", "application/json")
            .header("authorization", auth)
            .header(name, value)
            .body(Full::new(Bytes::from_static(body)))
            .unwrap()
    })
    .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn canary_keys_never_leak() {
    let logs = Captured::default();
    let writer = logs.clone();
    tracing_subscriber::fmt()
        .json()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(move || writer.clone())
        .init();

    let dir = tempfile::Builder::new()
        .prefix("hourglass-canary-")
        .tempdir()
        .unwrap();
    let key_file = dir.path().join("provider.key");
    std::fs::write(&key_file, format!("{PROVIDER_FILE_KEY}\n")).unwrap();
    let client_file = dir.path().join("clients");
    std::fs::write(&client_file, format!("{CLIENT_FILE_KEY}\n")).unwrap();
    // The keys `environment_and_query_keys_never_reach_any_log_format` takes from the
    // environment come from files here.
    let provider2_file = dir.path().join("provider2.key");
    std::fs::write(&provider2_file, PROVIDER_ENV_KEY).unwrap();
    let chat_clients = dir.path().join("chat-clients");
    std::fs::write(&chat_clients, CLIENT_KEY).unwrap();

    let second = FakeUpstream::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let (_refusing, closed) = refused_addr();
    let closed_port = closed.port();
    let cfg = format!(
        r#"
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"

[defaults]
budget = "10s"
connect_timeout = "500ms"
first_token_timeout = "2s"
idle_timeout = "300ms"

[upstreams.fake]
url = "{{FAKE}}"
api_key_file = "{key_file}"

[upstreams.second]
url = "{second}"
api_key_file = "{provider2_file}"
auth = "x-api-key"

[upstreams.gone]
url = "http://127.0.0.1:{closed_port}"
api_key_file = "{provider2_file}"

[[routes]]
name = "chat"
path_prefix = "/v1/chat/completions"
upstream = "fake"
client_keys_file = "{chat_clients}"

[[routes]]
name = "messages"
path_prefix = "/v1/messages"
upstream = "second"
client_keys_file = "{client_file}"

[[routes]]
name = "gone"
path_prefix = "/gone"
upstream = "gone"
client_keys_file = "{chat_clients}"
"#,
        key_file = key_file.display(),
        client_file = client_file.display(),
        provider2_file = provider2_file.display(),
        chat_clients = chat_clients.display(),
        second = second.url(),
    );
    let h = Harness::with_config(&cfg).await;
    let bearer = format!("Bearer {CLIENT_KEY}");
    let wrong = format!("Bearer {WRONG_KEY}");
    let mut answers = String::new();

    // Every ending a request can have, each carrying a client key.
    let cases: Vec<Vec<(&str, &str)>> = vec![
        vec![("authorization", &bearer), ("x-fake-chunks", "3")],
        vec![("x-api-key", CLIENT_KEY), ("x-fake-freeze-after", "1")],
        vec![("authorization", &bearer), ("x-fake-status", "500")],
        vec![("authorization", &bearer), ("x-fake-status", "401")],
        vec![("authorization", &bearer), ("x-fake-disconnect-after", "1")],
        vec![("authorization", &bearer), ("x-request-budget-ms", "abc")],
        vec![("authorization", &bearer), ("x-request-budget-ms", "1")],
        vec![("authorization", &wrong)],
        vec![("x-api-key", WRONG_KEY)],
        vec![("authorization", &bearer), ("x-api-key", WRONG_KEY)],
    ];
    for headers in &cases {
        let (resp, _c) = h.chat(headers).await;
        answers.push_str(&seen(resp).await);
    }
    // A client that leaves mid-stream.
    let (resp, conn) = h
        .chat(&[("authorization", &bearer), ("x-fake-chunks", "1000")])
        .await;
    let mut body = resp.into_body();
    read_events(&mut body, 2).await;
    drop(body);
    conn.close();
    // The other provider key, the client key file, a non-streaming answer.
    for (path, key) in [
        ("/v1/messages", CLIENT_FILE_KEY),
        ("/v1/messages", WRONG_KEY),
        ("/gone/v1/chat/completions", CLIENT_KEY),
    ] {
        let req = Request::post(path)
            .header("host", "g")
            .header("x-api-key", key)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from_static(br#"{"model":"m"}"#)))
            .unwrap();
        let (resp, _c) = h.send(req).await;
        answers.push_str(&seen(resp).await);
    }
    // Keys in the query string, on every kind of ending: served, refused for its budget,
    // refused for its client key, no route, an upstream error.
    let queried = query_requests(&bearer).len();
    for req in query_requests(&bearer) {
        let (resp, _c) = h.send(req).await;
        answers.push_str(&seen(resp).await);
    }
    // HTTP/2 from the client (HPACK, h2's own tracing).
    let stream = tokio::net::TcpStream::connect(h.addr()).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http2::handshake::<_, _, Full<Bytes>>(
        TokioExecutor::new(),
        TokioIo::new(stream),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    for key in [CLIENT_KEY, WRONG_KEY] {
        let req = Request::post(format!(
            "http://{}/v1/chat/completions?key={QUERY_KEY}",
            h.addr()
        ))
        .header("authorization", format!("Bearer {key}"))
        .body(Full::new(Bytes::from_static(br#"{"stream":true}"#)))
        .unwrap();
        let resp = send.send_request(req).await.unwrap();
        answers.push_str(&seen(resp).await);
    }
    h.wait_requests("chat", (cases.len() + 3 + queried - 1) as f64)
        .await;

    // Upstreams got the provider keys (so the canaries were really in use), never a
    // client's key.
    let upstream_seen: Vec<String> = h
        .fake
        .requests()
        .iter()
        .chain(second.requests().iter())
        .map(|r| format!("{:?} {:?}", r.headers, r.body))
        .collect();
    assert!(upstream_seen
        .iter()
        .any(|r| r.contains(&format!("Bearer {PROVIDER_FILE_KEY}"))));
    assert!(upstream_seen.iter().any(|r| r.contains(PROVIDER_ENV_KEY)));
    // The query's key is a client's: never forwarded beside the provider's (audit WA 2),
    // though the requests that carried it were served, the rest of their query kept.
    assert!(h
        .fake
        .requests()
        .iter()
        .all(|r| !r.path.contains(QUERY_KEY)));
    assert!(h
        .fake
        .requests()
        .iter()
        .any(|r| r.path == "/v1/chat/completions?alt=sse"));
    for r in &upstream_seen {
        for m in ["CLIENTKEY-91b7", "CLIENTFILE-c4a2", "WRONGKEY-5e1f"] {
            assert!(!r.contains(m), "a client key reached the upstream: {r}");
        }
    }

    assert_clean("answers to clients", &answers);
    assert_clean("/metrics", &h.metrics_text().await);
    let config = Config::from_toml(
        &cfg.replace("{FAKE}", &h.fake.url()),
        &dir.path().join("hourglass.toml").display().to_string(),
    )
    .unwrap();
    assert_clean("the config's Debug", &format!("{config:?}"));
    assert_clean("hourglass check", &config.describe());
    assert_clean("warnings", &config.warnings().join("\n"));

    let config_path = dir.path().join("hourglass.toml");
    std::fs::write(&config_path, cfg.replace("{FAKE}", &h.fake.url())).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hourglass"))
        .args(["check", "--config"])
        .arg(&config_path)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_clean(
        "hourglass check output",
        &format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    );

    let logs = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    let request_lines = logs.matches("\"target\":\"hourglass::request\"").count();
    assert!(
        request_lines >= cases.len() + 6 + queried,
        "every request logged ({request_lines} lines):\n{logs}"
    );
    assert_clean("logs", &logs);
    dir.close().unwrap();
}

#[test]
fn check_warns_about_an_inlined_key_without_repeating_it() {
    let dir = tempfile::Builder::new()
        .prefix("hourglass-inlined-")
        .tempdir()
        .unwrap();
    let path = dir.path().join("inlined.toml");
    std::fs::write(
        &path,
        format!(
            "[upstreams.openai]\nurl = \"https://api.openai.com\"\napi_key_env = \"{PROVIDER_ENV_KEY}\"\n\n\
             [[routes]]\nname = \"chat\"\npath_prefix = \"/v1\"\nupstream = \"openai\"\n"
        ),
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hourglass"))
        .args(["check", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains(
            "warning: upstreams.openai.api_key_env looks like an inlined API key; keep keys out of the config file"
        ),
        "{stderr}"
    );
    assert_clean("hourglass check", &format!("{stdout}{stderr}"));
    dir.close().unwrap();
}

/// The binary itself, in each `--log-format`, at TRACE: keys from its environment (the
/// provider's and the clients'), client keys in headers and keys in query strings never
/// reach stdout or stderr, while every request is logged (by its path alone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn environment_and_query_keys_never_reach_any_log_format() {
    let fake = FakeUpstream::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let cfg = format!(
        r#"
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"

[defaults]
idle_timeout = "2s"

[upstreams.fake]
url = "{}"
api_key_env = "HOURGLASS_CANARY_PROVIDER"

[[routes]]
name = "chat"
path_prefix = "/v1/chat/completions"
upstream = "fake"
client_keys_env = "HOURGLASS_CANARY_CLIENTS"
"#,
        fake.url()
    );
    let bearer = format!("Bearer {CLIENT_KEY}");
    // Every format is run before any leak is reported, so a leak names all it reaches.
    let mut leaks = Vec::new();
    for format in ["pretty", "json", "access"] {
        let before = fake.requests().len();
        let gw = Process::spawn(
            &cfg,
            &["--log-format", format],
            &[
                ("HOURGLASS_CANARY_PROVIDER", PROVIDER_ENV_KEY),
                ("HOURGLASS_CANARY_CLIENTS", CLIENT_KEY),
                ("RUST_LOG", "trace"),
            ],
        )
        .await;
        let mut statuses = Vec::new();
        for req in query_requests(&bearer) {
            let (resp, _c) = Conn::open(gw.addr).await.send(req).await;
            statuses.push(resp.status().as_u16());
            assert_clean("an answer", &seen(resp).await);
        }
        assert_eq!(statuses, [200, 400, 401, 404, 500], "{format}");
        let (stdout, stderr) = gw.stop().await;
        let all = format!("{stdout}\n{stderr}");
        for m in MARKERS {
            for line in all.lines().filter(|l| l.contains(m)) {
                leaks.push(format!("--log-format {format} leaks {m}: {line}"));
            }
        }
        // The requests were logged, with their paths.
        let request_lines: Vec<&str> = match format {
            "json" => stdout
                .lines()
                .filter(|l| l.contains("\"target\":\"hourglass::request\""))
                .collect(),
            "access" => stdout
                .lines()
                .filter(|l| l.contains(" request_id="))
                .collect(),
            _ => all
                .lines()
                .filter(|l| l.contains("hourglass::request"))
                .collect(),
        };
        assert_eq!(request_lines.len(), 5, "--log-format {format}:\n{all}");
        assert!(
            request_lines
                .iter()
                .filter(|l| l.contains("/v1/chat/completions"))
                .count()
                == 4
                && request_lines.iter().any(|l| l.contains("/nowhere")),
            "--log-format {format}:\n{}",
            request_lines.join("\n")
        );
        // The provider got its key (so it was in use), and never the client's from the query
        // beside it (audit WA 2), though the requests that carried one were served.
        let got = &fake.requests()[before..];
        assert!(got
            .iter()
            .all(|r| r.headers["authorization"] == format!("Bearer {PROVIDER_ENV_KEY}").as_str()));
        assert!(got.iter().all(|r| !r.path.contains(QUERY_KEY)), "{format}");
        assert!(
            got.iter().any(|r| r.path == "/v1/chat/completions?alt=sse"),
            "{format}"
        );
    }
    assert!(leaks.is_empty(), "{}", leaks.join("\n"));
}

/// A key pasted into a field that names a file or a variable (`api_key_file`,
/// `client_keys_env`, `client_keys_file`, `ca_file`, `store_password_env`) passes the
/// config's own checks and fails later, when the gateway is built: those errors, which quote
/// the field's value, are scrubbed too, in the start-up error, the reload's log line and
/// `/readyz`; as is a url refused for the key in its query (audit OB 2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_pasted_into_a_file_or_variable_field_is_never_repeated() {
    const PASTED: &str = "sk-ant-api03-PASTEDkeyCANARY0123456789abcdefXYZ";
    let fake = FakeUpstream::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let base = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n\n\
         [upstreams.fake]\nurl = \"{}\"\n",
        fake.url()
    );
    let route = "[[routes]]\nname = \"chat\"\npath_prefix = \"/v1\"\nupstream = \"fake\"\n";
    let pasted = [
        format!("{base}api_key_file = \"{PASTED}\"\n{route}"),
        format!("{base}{route}client_keys_env = \"{PASTED}\"\n"),
        format!("{base}{route}client_keys_file = \"{PASTED}\"\n"),
        format!("{base}ca_file = \"{PASTED}\"\n{route}").replace("http://", "https://"),
        // Audit OB 2: a key in the url's query, not shaped like one (Azure takes `api-key=`).
        format!("{base}{route}").replace(
            &fake.url(),
            &format!(
                "{}/v1beta?api-key=correct-horse-CANARY-staple&token=abc123CANARY",
                fake.url()
            ),
        ),
        format!(
            "[runs]\nstore = \"redis://127.0.0.1:1/0\"\nstore_password_env = \"{PASTED}\"\n\
             {base}{route}"
        ),
    ];
    // At start-up.
    for text in &pasted {
        let dir = tempfile::Builder::new()
            .prefix("hourglass-pasted-")
            .tempdir()
            .unwrap();
        let path = dir.path().join("hourglass.toml");
        std::fs::write(&path, text).unwrap();
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_hourglass"))
            .arg("--config")
            .arg(&path)
            .env_remove("HOURGLASS_CONFIG")
            .env_remove(PASTED)
            .output()
            .await
            .unwrap();
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!out.status.success(), "{text}\n{said}");
        // The value masked, or (a store_password_env that is no variable's name, most
        // likely the password itself) not quoted at all.
        assert!(
            said.contains("***")
                || said.contains("store_password_env is not a variable name")
                || said.contains("(a name not shown: it may be the secret itself)"),
            "the error still says which field: {said}"
        );
        assert!(!said.contains("CANARY"), "{text}\n{said}");
    }
    // On a reload: the log line and /readyz, for each in turn.
    let gw = Process::spawn(&format!("{base}{route}"), &["--log-format", "json"], &[]).await;
    for (i, text) in pasted.iter().take(5).enumerate() {
        std::fs::write(&gw.config, text).unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let want = format!(
                "hourglass_config_reloads_total{{result=\"error\"}} {}",
                i + 1
            );
            if scrape(gw.admin).await.contains(&want) {
                break;
            }
            assert!(Instant::now() < deadline, "reload {i} never failed");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let ready = admin_get(gw.admin, "/readyz").await;
        assert!(ready.contains("last reload failed"), "{ready}");
        assert!(!ready.contains("CANARY"), "{ready}");
    }
    let (stdout, stderr) = gw.stop().await;
    let all = format!("{stdout}{stderr}");
    assert_eq!(all.matches("config reload failed").count(), 5, "{all}");
    assert!(!all.contains("CANARY"), "{all}");
}

/// A directory holding a provider key file and a client keys file (each with the test's
/// key), and the two paths, for configs that name them.
fn key_files(prefix: &str) -> (tempfile::TempDir, String, String) {
    let dir = tempfile::Builder::new().prefix(prefix).tempdir().unwrap();
    let key_file = dir.path().join("provider.key");
    std::fs::write(&key_file, format!("{PROVIDER_FILE_KEY}\n")).unwrap();
    let clients = dir.path().join("clients");
    std::fs::write(&clients, format!("{CLIENT_KEY}\n")).unwrap();
    let shown = |p: std::path::PathBuf| p.display().to_string();
    (dir, shown(key_file), shown(clients))
}

/// Two routes to the fake, both behind the clients' keys file when `bare_keyed`, else only
/// the first: `keyed` (`/v1/chat/completions`), where the gateway sends its provider key, and
/// `bare` (`/v1/messages`), an `auth = "none"` upstream, where the client's own key goes.
fn keyed_and_bare(key_file: &str, clients: &str, bare_keyed: bool) -> String {
    let bare_keys = if bare_keyed {
        format!("client_keys_file = \"{clients}\"\n")
    } else {
        String::new()
    };
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"

[upstreams.keyed]
url = "{{FAKE}}"
api_key_file = "{key_file}"

[upstreams.bare]
url = "{{FAKE}}"
auth = "none"

[[routes]]
name = "keyed"
path_prefix = "/v1/chat/completions"
upstream = "keyed"
client_keys_file = "{clients}"

[[routes]]
name = "bare"
path_prefix = "/v1/messages"
upstream = "bare"
{bare_keys}"#,
    )
}

/// A chat request to `path` with the client key and `extra` headers, answered 200: the
/// headers the upstream received.
async fn forwarded<'a>(
    h: &Harness,
    path: &str,
    extra: impl IntoIterator<Item = &'a (&'a str, &'a str)>,
) -> http::HeaderMap {
    let mut req = Request::post(path)
        .header("host", "gateway")
        .header("content-type", "application/json")
        .header("authorization", format!("Bearer {CLIENT_KEY}"));
    for (name, value) in extra {
        req = req.header(*name, *value);
    }
    let req = req
        .body(Full::new(Bytes::from_static(
            br#"{"model":"g","messages":[]}"#,
        )))
        .unwrap();
    let (resp, _c) = h.send(req).await;
    assert_eq!(resp.status(), 200, "{path}");
    h.fake.requests().last().expect("forwarded").headers.clone()
}

/// Audit IC 4: the keys clients send to the proxies and gateways an upstream may be
/// (LiteLLM, which prefers its own header to `Authorization`, Azure API Management,
/// Cloudflare AI Gateway, Portkey) reached the upstream beside the gateway's key, on a keyed
/// route with a provider key and on one without.
#[tokio::test]
async fn proxy_and_gateway_keys_do_not_ride_along_with_the_gateways() {
    let (_dir, key_file, clients) = key_files("hourglass-proxy-keys-");
    let h = Harness::with_config(&keyed_and_bare(&key_file, &clients, true)).await;
    let theirs = [
        ("x-litellm-api-key", "sk-client-litellm"),
        ("ocp-apim-subscription-key", "client-apim"),
        ("cf-aig-authorization", "Bearer client-cf"),
        ("x-portkey-api-key", "pk-client"),
    ];
    for path in ["/v1/chat/completions", "/v1/messages"] {
        let extra = [("x-portkey-trace-id", "t-1")];
        let sent = forwarded(&h, path, theirs.iter().chain(&extra)).await;
        for (name, _) in theirs {
            assert_eq!(sent.get(name), None, "{path}: {name}");
        }
        assert_eq!(sent["x-portkey-trace-id"], "t-1", "{path}");
        let keys: Vec<_> = sent.get_all("authorization").iter().collect();
        if path == "/v1/messages" {
            assert!(keys.is_empty(), "{path}: {keys:?}");
        } else {
            assert_eq!(keys, [&format!("Bearer {PROVIDER_FILE_KEY}")], "{path}");
        }
    }
}

/// Audit PC 4: a client's `OpenAI-Organization` and `OpenAI-Project` reached the upstream
/// beside the key the gateway injected, so a client holding only a gateway key chose which
/// organization or project the operator's key acted for (and billed). Where the gateway sends
/// its key, the headers that pick the key's account (OpenAI's two, Google's
/// `x-goog-user-project`) are dropped, or set to the upstream's `organization` and `project`;
/// where the client's own key goes, they are its own and pass.
#[tokio::test]
async fn a_client_cannot_pick_the_account_the_gateways_key_acts_for() {
    let (_dir, key_file, clients) = key_files("hourglass-account-");
    let cfg = format!(
        r#"
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"

[upstreams.keyed]
url = "{{FAKE}}"
api_key_file = "{key_file}"

[upstreams.pinned]
url = "{{FAKE}}"
api_key_file = "{key_file}"
organization = "org-operator"
project = "proj_operator"

[upstreams.bare]
url = "{{FAKE}}"
auth = "none"

[[routes]]
name = "keyed"
path_prefix = "/v1/chat/completions"
upstream = "keyed"
client_keys_file = "{clients}"

[[routes]]
name = "open"
path_prefix = "/v1/responses"
upstream = "pinned"

[[routes]]
name = "bare"
path_prefix = "/v1/messages"
upstream = "bare"
"#,
    );
    let h = Harness::with_config(&cfg).await;
    let account = [
        ("openai-organization", "org-someone-else"),
        ("openai-project", "proj_other"),
        ("x-goog-user-project", "their-project"),
    ];
    let theirs = account.map(|(_, v)| Some(v));
    for (path, want) in [
        ("/v1/chat/completions", [None; 3]),
        (
            "/v1/responses",
            [Some("org-operator"), Some("proj_operator"), None],
        ),
        ("/v1/messages", theirs),
    ] {
        let extra = [("openai-beta", "assistants=v2")];
        let sent = forwarded(&h, path, account.iter().chain(&extra)).await;
        for ((name, _), want) in account.iter().zip(want) {
            let all: Vec<_> = sent.get_all(*name).iter().collect();
            assert!(all.len() <= 1, "{path}: {name}: {all:?}");
            assert_eq!(
                sent.get(*name).map(|v| v.to_str().unwrap()),
                want,
                "{path}: {name}"
            );
        }
        // What selects no account passes.
        assert_eq!(sent["openai-beta"], "assistants=v2", "{path}");
    }
}

/// Audit SA 2: a client holding only a gateway key sent `x-portkey-provider: openai` and
/// `x-portkey-custom-host: http://attacker/v1` to a Portkey upstream, and Portkey sent the
/// key the gateway injected to the attacker's host. Where the gateway sends its key, the
/// headers that pick where a peer gateway sends it (Portkey's custom host and config,
/// Helicone's target URL) or which credentials and account it uses (Portkey's virtual key
/// and cloud headers, LiteLLM's `x-pass-` form of a key or account header) are dropped;
/// those that pick no host (Portkey's trace and metadata) pass. Audit UD 1: Portkey's
/// provider picks the host too (`groq` sends the key to api.groq.com, `azure-openai` to
/// `undefined.openai.azure.com`, a name anyone may register), so it is dropped with them.
/// Where the client's own key goes, the key is the client's, and so is where it goes: they
/// all pass.
#[tokio::test]
async fn a_client_cannot_pick_where_a_peer_gateway_sends_the_gateways_key() {
    let (_dir, key_file, clients) = key_files("hourglass-peer-host-");
    let h = Harness::with_config(&keyed_and_bare(&key_file, &clients, false)).await;
    let steering = [
        ("x-portkey-custom-host", "http://127.0.0.1:9/v1"),
        (
            "x-portkey-config",
            r#"{"provider":"openai","custom_host":"http://127.0.0.1:9/v1"}"#,
        ),
        ("x-portkey-virtual-key", "vk-someone-else"),
        ("x-portkey-azure-resource-name", "attacker"),
        ("x-portkey-aws-region", "attacker"),
        ("x-portkey-vertex-project-id", "their-project"),
        ("x-portkey-huggingface-base-url", "http://127.0.0.1:9"),
        ("x-portkey-openai-organization", "org-someone-else"),
        ("helicone-target-url", "http://127.0.0.1:9"),
        ("helicone-target-provider", "attacker"),
        ("helicone-openai-api-base", "http://127.0.0.1:9"),
        (
            "helicone-fallbacks",
            r#"[{"target-url":"http://127.0.0.1:9"}]"#,
        ),
        ("x-pass-openai-organization", "org-someone-else"),
        ("x-pass-authorization", "Bearer sk-someone-else"),
        ("x-portkey-provider", "azure-openai"),
    ];
    let harmless = [
        ("x-portkey-trace-id", "t-1"),
        ("x-portkey-metadata", r#"{"user":"u"}"#),
        ("helicone-user-id", "u"),
        ("x-pass-anthropic-beta", "b"),
    ];
    for path in ["/v1/chat/completions", "/v1/messages"] {
        let sent = forwarded(&h, path, steering.iter().chain(&harmless)).await;
        let injected = path == "/v1/chat/completions";
        for (name, value) in steering {
            let want = (!injected).then_some(value);
            assert_eq!(
                sent.get(name).map(|v| v.to_str().unwrap()),
                want,
                "{path}: {name}"
            );
        }
        for (name, value) in harmless {
            assert_eq!(sent[name], value, "{path}: {name}");
        }
        let key = if injected {
            format!("Bearer {PROVIDER_FILE_KEY}")
        } else {
            format!("Bearer {CLIENT_KEY}")
        };
        assert_eq!(sent["authorization"], key.as_str(), "{path}");
    }
}
