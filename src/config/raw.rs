//! The file-shaped side of loading: private serde types that mirror the TOML one-to-one,
//! every key optional and every table closed to unknown keys, with the hand-written
//! deserializers that phrase their errors.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use std::marker::PhantomData;

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

use super::{Limits, RetryCause, MAX_DURATION};

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table")]
pub(super) struct RawConfig {
    #[serde(default, deserialize_with = "server_table")]
    pub(super) server: RawServer,
    #[serde(default, deserialize_with = "defaults_table")]
    pub(super) defaults: RawLimits,
    #[serde(default)]
    pub(super) upstreams: RawUpstreams,
    #[serde(default, deserialize_with = "routes_array")]
    pub(super) routes: Vec<RawRoute>,
    #[serde(default, deserialize_with = "runs_table")]
    pub(super) runs: RawRuns,
}

fn server_table<'de, D: Deserializer<'de>>(d: D) -> Result<RawServer, D::Error> {
    table(d, "server")
}

fn defaults_table<'de, D: Deserializer<'de>>(d: D) -> Result<RawLimits, D::Error> {
    table(d, "defaults")
}

fn runs_table<'de, D: Deserializer<'de>>(d: D) -> Result<RawRuns, D::Error> {
    table(d, "runs")
}

fn tls_table<'de, D: Deserializer<'de>>(d: D) -> Result<Option<RawTls>, D::Error> {
    table(d, "server.tls").map(Some)
}

/// A table (`[header]`). A derived struct also accepts a sequence, filling its fields by
/// position, so `[[server]]` was reported as its first field's type error ("expected an
/// IP:port string"), naming no key: it is refused here as what it is.
fn table<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
    header: &str,
) -> Result<T, D::Error> {
    struct V<'h, T>(&'h str, PhantomData<T>);
    impl<'de, T: Deserialize<'de>> Visitor<'de> for V<'_, T> {
        type Value = T;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "a table ([{}])", self.0)
        }
        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
            T::deserialize(de::value::MapAccessDeserializer::new(map))
        }
        fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> Result<T, A::Error> {
            // Named here: the error points at the header, which `key_at` names no key for.
            Err(de::Error::custom(format!(
                "`{h}` must be a table ([{h}]), not an array of tables ([[{h}]])",
                h = self.0
            )))
        }
    }
    d.deserialize_any(V(header, PhantomData))
}

/// `[[routes]]`: a sequence, which `[routes]` (one table) is not; serde's own message
/// ("invalid type: map, expected a sequence") says neither.
fn routes_array<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<RawRoute>, D::Error> {
    struct V;
    impl<'de> Visitor<'de> for V {
        type Value = Vec<RawRoute>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("an array of tables ([[routes]])")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
            Vec::deserialize(de::value::SeqAccessDeserializer::new(seq))
        }
        fn visit_map<A: MapAccess<'de>>(self, _: A) -> Result<Self::Value, A::Error> {
            Err(de::Error::custom(
                "`routes` must be an array of tables ([[routes]], one per route), not a table \
                 ([routes])",
            ))
        }
    }
    d.deserialize_any(V)
}

/// `[runs]`: where runs are kept and for how long.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a [runs] table")]
pub(super) struct RawRuns {
    pub(super) ttl: Option<RawDuration>,
    pub(super) max_runs: Option<usize>,
    pub(super) store: Option<String>,
    pub(super) store_password_env: Option<String>,
    pub(super) store_ca_file: Option<PathBuf>,
    pub(super) store_cluster: Option<bool>,
    pub(super) store_nodes: Option<Vec<String>>,
    pub(super) store_timeout: Option<RawDuration>,
    pub(super) on_store_error: Option<RawOnStoreError>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum RawOnStoreError {
    Allow,
    Deny,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a [server] table")]
pub(super) struct RawServer {
    pub(super) listen: Option<RawSocketAddr>,
    pub(super) admin_listen: Option<RawSocketAddr>,
    pub(super) max_request_body: Option<u64>,
    pub(super) max_response_body: Option<u64>,
    pub(super) request_body_memory: Option<u64>,
    pub(super) response_body_memory: Option<u64>,
    pub(super) header_read_timeout: Option<RawDuration>,
    pub(super) shutdown_grace: Option<RawDuration>,
    pub(super) drain_delay: Option<RawDuration>,
    pub(super) send_timeout: Option<RawDuration>,
    pub(super) max_connections: Option<usize>,
    pub(super) max_header_bytes: Option<usize>,
    pub(super) max_headers: Option<usize>,
    pub(super) http2_max_concurrent_streams: Option<u32>,
    #[serde(default, deserialize_with = "tls_table")]
    pub(super) tls: Option<RawTls>,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a [server.tls] table")]
pub(super) struct RawTls {
    pub(super) cert: Option<PathBuf>,
    pub(super) key: Option<PathBuf>,
    pub(super) client_ca: Option<PathBuf>,
    pub(super) client_crl: Option<PathBuf>,
}

/// The limit keys, as written in `[defaults]` or (via [`RawRoute::overrides`])
/// in a route. `None` means "inherit".
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a [defaults] table")]
pub(super) struct RawLimits {
    pub(super) run_id_header: Option<String>,
    pub(super) run_budget: Option<RawDuration>,
    pub(super) run_max_budget: Option<RawDuration>,
    pub(super) run_max_calls: Option<u64>,
    pub(super) run_max_tokens: Option<u64>,
    pub(super) run_max_repeats: Option<u64>,
    pub(super) run_token_estimate: Option<u64>,
    budget: Option<RawDuration>,
    max_budget: Option<RawDuration>,
    connect_timeout: Option<RawDuration>,
    first_token_timeout: Option<RawDuration>,
    idle_timeout: Option<RawDuration>,
    reserve: Option<RawDuration>,
    min_useful: Option<RawDuration>,
}

impl RawLimits {
    pub(super) fn resolve(&self, base: &Limits) -> Limits {
        let pick = |v: Option<RawDuration>, d: Duration| v.map_or(d, |v| v.0);
        Limits {
            budget: pick(self.budget, base.budget),
            max_budget: pick(self.max_budget, base.max_budget),
            connect_timeout: pick(self.connect_timeout, base.connect_timeout),
            first_token_timeout: pick(self.first_token_timeout, base.first_token_timeout),
            idle_timeout: pick(self.idle_timeout, base.idle_timeout),
            reserve: pick(self.reserve, base.reserve),
            min_useful: pick(self.min_useful, base.min_useful),
        }
    }

    pub(super) fn is_set(&self, key: &str) -> bool {
        match key {
            "budget" => self.budget.is_some(),
            "max_budget" => self.max_budget.is_some(),
            "connect_timeout" => self.connect_timeout.is_some(),
            "first_token_timeout" => self.first_token_timeout.is_some(),
            "idle_timeout" => self.idle_timeout.is_some(),
            "reserve" => self.reserve.is_some(),
            "min_useful" => self.min_useful.is_some(),
            _ => false,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(super) enum RawAuth {
    Bearer,
    XApiKey,
    ApiKey,
    XGoogApiKey,
    None,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, expecting = "an [upstreams.NAME] table")]
pub(super) struct RawUpstream {
    pub(super) url: Option<String>,
    pub(super) api_key_env: Option<String>,
    pub(super) api_key_file: Option<PathBuf>,
    pub(super) auth: Option<RawAuth>,
    pub(super) organization: Option<String>,
    pub(super) project: Option<String>,
    pub(super) headers: Option<std::collections::BTreeMap<String, String>>,
    pub(super) hide_headers: Option<Vec<String>>,
    pub(super) ca_file: Option<PathBuf>,
    pub(super) trust_public_roots: Option<bool>,
    pub(super) client_cert: Option<PathBuf>,
    pub(super) client_cert_key: Option<PathBuf>,
    pub(super) propagate_budget: Option<bool>,
    pub(super) model: Option<String>,
    pub(super) expected_first_token: Option<RawDuration>,
    pub(super) api: Option<RawApi>,
    pub(super) include_usage: Option<bool>,
    pub(super) pool_idle_timeout: Option<RawDuration>,
    pub(super) eject_after: Option<u64>,
    pub(super) eject_for: Option<RawDuration>,
    pub(super) http2: Option<RawHttp2Mode>,
    pub(super) http2_max_streams_per_connection: Option<u64>,
    pub(super) http2_max_connections: Option<u64>,
    pub(super) http2_stream_window: Option<u64>,
    pub(super) http2_connection_window: Option<u64>,
    pub(super) proxy: Option<String>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum RawHttp2Mode {
    Auto,
    Always,
    Never,
}

#[derive(Debug, Clone, Copy, Deserialize)]
pub(super) enum RawApi {
    #[serde(rename = "openai")]
    OpenAi,
    #[serde(rename = "anthropic")]
    Anthropic,
    #[serde(rename = "auto")]
    Auto,
}

/// `[upstreams.*]` kept in file order (a plain map would sort by name), so
/// that `Config::upstreams`, warnings and errors follow the file.
#[derive(Debug, Default)]
pub(super) struct RawUpstreams(pub(super) Vec<(String, RawUpstream)>);

impl<'de> Deserialize<'de> for RawUpstreams {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RawUpstreams;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a table of named upstreams, e.g. [upstreams.openai]")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut out = Vec::new();
                // TOML itself rejects duplicate keys, so no check here.
                while let Some(k) = map.next_key::<String>()? {
                    let v = map.next_value_seed(UpstreamTable(&k))?;
                    out.push((k, v));
                }
                Ok(RawUpstreams(out))
            }
        }
        d.deserialize_map(V)
    }
}

/// One `[upstreams.NAME]` (the name), refused as `[[upstreams.NAME]]` as other tables are.
struct UpstreamTable<'n>(&'n str);

impl<'de> de::DeserializeSeed<'de> for UpstreamTable<'_> {
    type Value = RawUpstream;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<RawUpstream, D::Error> {
        table(d, &format!("upstreams.{}", self.0))
    }
}

/// Route keys are spelled out rather than `#[serde(flatten)]`ing `RawLimits`,
/// because serde cannot combine `flatten` with `deny_unknown_fields`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a [[routes]] table")]
pub(super) struct RawRoute {
    pub(super) name: Option<String>,
    pub(super) path_prefix: Option<String>,
    pub(super) upstream: Option<String>,
    pub(super) models: Option<Vec<String>>,
    pub(super) retries: Option<u32>,
    pub(super) retry_on: Option<Vec<RawRetryCause>>,
    pub(super) balance_with: Option<Vec<String>>,
    pub(super) fallbacks: Option<Vec<String>>,
    pub(super) hedge_after: Option<RawDuration>,
    pub(super) max_in_flight: Option<usize>,
    pub(super) max_request_body: Option<u64>,
    pub(super) stream_upstream: Option<bool>,
    pub(super) partial_answers: Option<bool>,
    pub(super) client_keys_env: Option<String>,
    pub(super) client_keys_file: Option<PathBuf>,
    budget: Option<RawDuration>,
    max_budget: Option<RawDuration>,
    connect_timeout: Option<RawDuration>,
    first_token_timeout: Option<RawDuration>,
    idle_timeout: Option<RawDuration>,
    reserve: Option<RawDuration>,
    min_useful: Option<RawDuration>,
    pub(super) run_id_header: Option<String>,
    pub(super) run_budget: Option<RawDuration>,
    pub(super) run_max_budget: Option<RawDuration>,
    pub(super) run_max_calls: Option<u64>,
    pub(super) run_max_tokens: Option<u64>,
    pub(super) run_max_repeats: Option<u64>,
    pub(super) run_token_estimate: Option<u64>,
}

impl RawRoute {
    pub(super) fn overrides(&self) -> RawLimits {
        RawLimits {
            budget: self.budget,
            max_budget: self.max_budget,
            connect_timeout: self.connect_timeout,
            first_token_timeout: self.first_token_timeout,
            idle_timeout: self.idle_timeout,
            reserve: self.reserve,
            min_useful: self.min_useful,
            run_id_header: self.run_id_header.clone(),
            run_budget: self.run_budget,
            run_max_budget: self.run_max_budget,
            run_max_calls: self.run_max_calls,
            run_max_tokens: self.run_max_tokens,
            run_max_repeats: self.run_max_repeats,
            run_token_estimate: self.run_token_estimate,
        }
    }
}

/// A humantime duration string. Hand-rolled rather than `humantime_serde` so
/// the error quotes the value and says why humantime rejected it.
#[derive(Debug, Clone, Copy)]
pub(super) struct RawDuration(pub(super) Duration);

#[derive(Debug, Clone, Copy)]
pub(super) enum RawRetryCause {
    Connect,
    FirstToken,
    Status5xx,
    Status429,
    Reset,
}

/// What a `retry_on` entry may be, as its errors say.
const RETRY_CAUSES: &str = "one of \"connect\", \"first_token\", \"5xx\", \"429\", \"reset\"";

/// Hand-rolled rather than derived: a derived enum answered any entry that is no string
/// (`retry_on = ["5xx", 3]`) with toml's "wanted string or table", naming neither the
/// value nor the names accepted (audit ME 6).
impl<'de> Deserialize<'de> for RawRetryCause {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Names;
        impl serde::de::Visitor<'_> for Names {
            type Value = RawRetryCause;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str(RETRY_CAUSES)
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<RawRetryCause, E> {
                Ok(match v {
                    "connect" => RawRetryCause::Connect,
                    "first_token" => RawRetryCause::FirstToken,
                    "5xx" => RawRetryCause::Status5xx,
                    "429" => RawRetryCause::Status429,
                    "reset" => RawRetryCause::Reset,
                    other => {
                        return Err(E::custom(format_args!(
                            "unknown failure {other:?}, expected {RETRY_CAUSES}"
                        )))
                    }
                })
            }
        }
        d.deserialize_any(Names)
    }
}

impl From<RawRetryCause> for RetryCause {
    fn from(r: RawRetryCause) -> Self {
        match r {
            RawRetryCause::Connect => RetryCause::Connect,
            RawRetryCause::FirstToken => RetryCause::FirstToken,
            RawRetryCause::Status5xx => RetryCause::Status5xx,
            RawRetryCause::Status429 => RetryCause::Status429,
            RawRetryCause::Reset => RetryCause::Reset,
        }
    }
}

impl<'de> Deserialize<'de> for RawDuration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = RawDuration;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration string such as \"250ms\", \"8s\" or \"10m\"")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                // humantime would say "expected number at 0", which hides the reason.
                if v.trim_start().starts_with('-') {
                    return Err(E::custom(format!(
                        "invalid duration {v:?}: durations cannot be negative"
                    )));
                }
                let d = humantime::parse_duration(v)
                    .map_err(|e| E::custom(format!("invalid duration {v:?}: {e}")))?;
                // Deadlines are instants: an absurd duration would overflow them at run time.
                if d > MAX_DURATION {
                    return Err(E::custom(format!(
                        "invalid duration {v:?}: longer than the maximum of 1 year"
                    )));
                }
                Ok(RawDuration(d))
            }
        }
        d.deserialize_str(V)
    }
}

/// A socket address string, with an error that says what form is expected
/// (host names are not accepted: binding must not depend on DNS).
#[derive(Debug, Clone, Copy)]
pub(super) struct RawSocketAddr(pub(super) SocketAddr);

impl<'de> Deserialize<'de> for RawSocketAddr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = RawSocketAddr;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an IP:port string such as \"127.0.0.1:8080\" or \"[::1]:8080\"")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                v.parse().map(RawSocketAddr).map_err(|_| {
                    E::custom(format!(
                        "invalid socket address {v:?}: expected IP:port such as \"127.0.0.1:8080\""
                    ))
                })
            }
        }
        d.deserialize_str(V)
    }
}
