//! The admin listener: `/metrics` (Prometheus text format), `/healthz` (the process is up),
//! `/readyz` (it accepts traffic: false while starting and once shutdown has begun) and
//! `/runs/{id}` (what a run has used and has left) and `/upstreams` (each upstream's health
//! and learned first-token estimates). It is a separate listener so the client port never
//! exposes them.

use std::convert::Infallible;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::SystemTime;

use arc_swap::ArcSwap;
use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode, Version};
use http_body_util::Full;

use crate::config::redacted_url;
use crate::error::GatewayError;
use crate::gateway::Gateway;
use crate::http::date;
use crate::http::headers::{check_framing, host_not_authority};
use crate::runs::id::check_id;
use crate::runs::{RunKey, RunState, Runs};
use crate::server::tls::Validity;
use crate::telemetry::metrics::Metrics;

/// What the admin listener serves from.
pub struct Admin {
    pub metrics: Arc<Metrics>,
    pub health: Arc<Health>,
    pub runs: Arc<Runs>,
    /// The routing table being served, whichever reload put it there.
    pub gateway: Arc<ArcSwap<Gateway>>,
    pub scrape: Scrape,
}

/// The last `/metrics` text and when its encoding began. One encoding at a time, off the
/// runtime's workers, and scrapes that came while one ran share the next: with many client
/// series (50,000 named keys: 27 MB, a second to encode) 20 scrapes at once each encoded
/// their own, 3.9 GB together (audit CE). A scrape is never answered with figures older
/// than its own arrival.
#[derive(Default)]
pub struct Scrape(tokio::sync::Mutex<Option<(tokio::time::Instant, Bytes)>>);

impl Scrape {
    async fn text(&self, metrics: &Arc<Metrics>) -> Bytes {
        let asked = tokio::time::Instant::now();
        // Held across the encoding: the scrapes queued on it are what it bounds.
        let mut last = self.0.lock().await;
        if let Some((began, text)) = &*last {
            if *began >= asked {
                return text.clone();
            }
        }
        let began = tokio::time::Instant::now();
        let text = Bytes::from(encode_apart(metrics).await);
        *last = Some((began, text.clone()));
        text
    }
}

/// Encodes the metrics on a thread kept for it, not on tokio's blocking pool: that pool is
/// shared with name lookups, and a DNS outage that filled it stalled scrapes for seconds
/// (audit GG 1). Scrapes take turns on `Scrape`, so one thread is enough.
async fn encode_apart(metrics: &Arc<Metrics>) -> String {
    type Job = (Arc<Metrics>, tokio::sync::oneshot::Sender<String>);
    static ENCODER: std::sync::OnceLock<Option<std::sync::mpsc::Sender<Job>>> =
        std::sync::OnceLock::new();
    let encoder = ENCODER.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("metrics-encode".into())
            .spawn(move || {
                for (metrics, answer) in rx {
                    let _ = answer.send(metrics.encode());
                }
            })
            .ok()
            .map(|_| tx)
    });
    let (answer, text) = tokio::sync::oneshot::channel();
    match encoder {
        Some(encoder) if encoder.send((Arc::clone(metrics), answer)).is_ok() => {
            text.await.expect("encoding the metrics does not panic")
        }
        // No thread could be had when the first scrape came: on this worker, then.
        _ => metrics.encode(),
    }
}

#[derive(Default)]
pub struct Health {
    ready: AtomicBool,
    /// Which config is served and how the last reload went, shown by /readyz.
    detail: std::sync::Mutex<String>,
    /// The served certificate's file and dates. Audit NB 5: a certificate the watcher took
    /// outside its dates (a renewal not valid yet, once the one served ran out) left
    /// /readyz saying plain `ready`; it says so, at each asking, while that lasts.
    certificate: std::sync::Mutex<Option<(String, Validity)>>,
}

impl Health {
    pub fn set_detail(&self, detail: String) {
        *self.detail.lock().unwrap_or_else(|e| e.into_inner()) = detail;
    }

    /// The certificate served from now on (`None`: no TLS), its file and dates.
    pub fn set_certificate(&self, served: Option<(String, Validity)>) {
        *self.certificate.lock().unwrap_or_else(|e| e.into_inner()) = served;
    }

    fn detail(&self) -> String {
        self.detail_at(SystemTime::now())
    }

    /// The detail, and a note when the certificate served is outside its dates at `now`.
    fn detail_at(&self, now: SystemTime) -> String {
        let mut detail = self
            .detail
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let served = self
            .certificate
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if let Some((path, v)) = served.filter(|(_, v)| !v.holds_at(now)) {
            let at = |t: SystemTime| humantime::format_rfc3339_seconds(t).to_string();
            let _ = match (v.from.filter(|from| *from > now), v.until) {
                (Some(from), _) => write!(
                    detail,
                    "; the certificate served ({path}) is not valid until {} (its notBefore): \
                     clients refuse it",
                    at(from)
                ),
                (None, until) => write!(
                    detail,
                    "; the certificate served ({path}) expired at {}: clients refuse it",
                    until.map_or_else(|| "?".to_owned(), at)
                ),
            };
        }
        detail
    }

    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::SeqCst);
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
    }
}

pub async fn handle<B>(
    req: Request<B>,
    admin: Arc<Admin>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let head = req.method() == Method::HEAD;
    let mut resp = answer(req, admin).await;
    if head {
        // RFC 9110 9.3.2: GET's fields, its length among them, and no content. hyper's
        // HTTP/1 codec leaves a HEAD answer's body unsent, but its HTTP/2 server sends it, as
        // DATA that h2 clients fail as a PROTOCOL_ERROR (audit QB 1): the body goes here.
        let length = http_body::Body::size_hint(resp.body()).exact().unwrap_or(0);
        resp.headers_mut()
            .entry(header::CONTENT_LENGTH)
            .or_insert_with(|| length.into());
        *resp.body_mut() = Full::default();
    }
    Ok(resp)
}

/// The answer to `req`, a HEAD answered as a GET.
async fn answer<B>(req: Request<B>, admin: Arc<Admin>) -> Response<Full<Bytes>> {
    let (metrics, health) = (&admin.metrics, &admin.health);
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let mut resp = text(StatusCode::METHOD_NOT_ALLOWED, "only GET and HEAD\n");
        // RFC 9110 15.5.6: a 405 says what is allowed.
        resp.headers_mut()
            .insert(header::ALLOW, header::HeaderValue::from_static("GET, HEAD"));
        // Its body (or a CONNECT's tunnel bytes) goes unread: the next bytes are not read as
        // a request, as on the client listener.
        resp.headers_mut().insert(
            header::CONNECTION,
            header::HeaderValue::from_static("close"),
        );
        return resp;
    }
    // RFC 9112 3.2: an HTTP/1.1 request without Host, or with two, is answered 400, as
    // the client listener answers it; a scraper or probe sending such heads is broken, and
    // a proxy in front may read them differently (audit OB 4).
    // RFC 9113 8.3.1: an HTTP/2 request whose Host names another server than its
    // `:authority` is malformed, and the client listener answers it 400 (audit QB 5).
    let framing =
        check_framing(req.version(), req.headers(), false).and_then(|()| match host_not_authority(
            req.uri(),
            req.headers(),
        ) {
            Some((host, authority)) if req.version() == Version::HTTP_2 => {
                Err(GatewayError::BadRequest {
                    message: format!(
                        "Host {host:?} names another server than :authority {authority:?}: \
                         an HTTP/2 request names one (RFC 9113 8.3.1)"
                    ),
                })
            }
            _ => Ok(()),
        });
    if let Err(e) = framing {
        let mut resp = e.response().map(Full::new);
        date::insert_if_missing(resp.headers_mut());
        return resp;
    }
    if let Some(raw) = req.uri().path().strip_prefix("/runs/") {
        // A run id may hold `?`, `#` or `%`: asked for percent-encoded, as a path must.
        let id = percent_encoding::percent_decode_str(raw).decode_utf8_lossy();
        return run(&admin.runs, &id).await;
    }
    match req.uri().path() {
        "/metrics" => {
            // Off the runtime's workers: with many client series (a key file of thousands of
            // named keys) a scrape takes a second, which would stall the streams beside it.
            let mut resp = text(StatusCode::OK, admin.scrape.text(metrics).await);
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                header::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
            );
            resp
        }
        "/upstreams" => json(StatusCode::OK, &upstreams(&admin.gateway.load())),
        "/healthz" => text(StatusCode::OK, "ok\n"),
        "/readyz" if health.is_ready() => text(
            StatusCode::OK,
            format!("ready: {}; {}\n", health.detail(), admin.runs.describe()),
        ),
        "/readyz" => text(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "not ready (starting or draining): {}; {}\n",
                health.detail(),
                admin.runs.describe()
            ),
        ),
        _ => text(
            StatusCode::NOT_FOUND,
            "not found: try /metrics, /healthz, /readyz, /runs/{id} or /upstreams\n",
        ),
    }
}

fn text(status: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(body.into()));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    // Dated now, not by hyper's cache, which a step back of the wall clock freezes.
    date::insert_if_missing(resp.headers_mut());
    resp
}

/// `GET /runs/{id}`: every run with that id (one per client key scope), as JSON.
async fn run(runs: &Runs, id: &str) -> Response<Full<Bytes>> {
    if let Err(why) = check_id(id.as_bytes()) {
        // Bounded, as the request path may be long.
        let shown: String = id.chars().take(64).collect();
        let body = serde_json::json!({"error": {"code": "invalid_run_id", "message": format!(
            "{shown:?} is no run id: a run id is 1 to 128 visible ASCII bytes ({why})"
        ), "type": "invalid_request_error"}, "type": "error"});
        return json(StatusCode::BAD_REQUEST, &body);
    }
    let found = match runs.find(id).await {
        Ok(found) => found,
        Err(e) => {
            let body = serde_json::json!({"error": {"code": "run_store_unavailable", "message": e, "type": "overloaded_error"}, "type": "error"});
            return json(StatusCode::SERVICE_UNAVAILABLE, &body);
        }
    };
    if found.is_empty() {
        // The shape of every error body ([`GatewayError::json_body`]).
        let body = serde_json::json!({"error": {"code": "no_run", "message": format!("no run {id:?} is held (it may have expired)"), "type": "not_found_error"}, "type": "error"});
        return json(StatusCode::NOT_FOUND, &body);
    }
    let now = tokio::time::Instant::now();
    let wall = SystemTime::now();
    let body = serde_json::json!({
        "id": id,
        "runs": found.iter().map(|(k, r)| describe(k, r, now, wall)).collect::<Vec<_>>(),
    });
    json(StatusCode::OK, &body)
}

/// `wall` is the wall clock at `now`: the run's deadline, an instant, is given as the time of
/// day it falls at (DESIGN §10: "limits, used, left, deadline"), which an operator can read
/// beside logs and compare across replicas, where `remaining_ms` is stale once read.
fn describe(
    key: &RunKey,
    r: &RunState,
    now: tokio::time::Instant,
    wall: SystemTime,
) -> serde_json::Value {
    let l = &r.limits;
    let ms = |d: std::time::Duration| d.as_millis() as u64;
    let view = r.view();
    // This replica's wall clock plus the time left: a store's runs follow its clock (Redis's)
    // only as time left, so replicas whose clocks differ show one run's deadline as far apart,
    // and agree on `remaining_ms` (audit QB 3; docs/metrics.md says so).
    let deadline = view.deadline.map(|d| {
        let at = if d >= now {
            wall + (d - now)
        } else {
            wall - (now - d)
        };
        humantime::format_rfc3339_millis(at).to_string()
    });
    serde_json::json!({
        "scope": key.scope.map(|_| key.to_string().split('/').next().unwrap_or_default().to_owned()),
        "route": &*r.route,
        "limits": {
            "budget_ms": r.budget.map(ms),
            "max_calls": l.max_calls,
            "max_tokens": l.max_tokens,
            "max_repeats": l.max_repeats,
            "token_estimate": l.token_estimate,
        },
        "used": {
            "calls": r.calls,
            "tokens": r.tokens_used,
            "in_flight": r.in_flight,
            "tokens_reserved": r.tokens_reserved,
        },
        "left": {
            "remaining_ms": view.deadline.map(|d| ms(d.saturating_duration_since(now))),
            "calls": view.calls_left,
            "tokens": view.tokens_left,
        },
        "deadline": deadline,
        "repeats": {
            "answer": r.answer.as_ref().map(|a| serde_json::json!({"tool": a.tool, "count": a.count})),
            "request": r.request.as_ref().map(|a| a.count),
        },
        "age_ms": ms(now.saturating_duration_since(r.started)),
        "idle_ms": ms(now.saturating_duration_since(r.last_call)),
        "ended": r.ended.map(|e| e.as_str()),
    })
}

/// `GET /upstreams`: what decides where and whether attempts are made. Model names are the
/// clients' own (at most 64 an upstream), which is why they are here and not in a label.
fn upstreams(gateway: &Gateway) -> serde_json::Value {
    let now = tokio::time::Instant::now();
    let ms = |d: std::time::Duration| d.as_millis() as u64;
    let list: Vec<serde_json::Value> = gateway
        .upstreams()
        .into_iter()
        .map(|(u, routes, in_flight)| {
            let health = u.health.view(now);
            let (models, other) = u.ttft.snapshot();
            let ejection = u.config.ejection;
            serde_json::json!({
                "name": &*u.name,
                "url": redacted_url(&u.config.url_text()),
                // The egress proxy its connections go through (password masked), or null:
                // a proxy's failures count against the upstream (audit QC 6).
                "proxy": u.proxy_shown(),
                "routes": routes,
                "in_flight": in_flight.get(),
                "in_rotation": health.in_rotation,
                "failures_in_a_row": health.failures_in_a_row,
                // How the last of them failed, in the words of the request log's `attempts`
                // (`status_429`, `connect_timeout`, ...): a rate limit is no outage (audit SC
                // 5). Null without failures in a row.
                "last_failure": health.last_failure,
                "ejected_for_ms": health.ejected_for.map(ms),
                "probing": health.probing,
                "eject_after": ejection.after,
                "eject_for_ms": ms(ejection.duration),
                "expected_first_token_ms": {
                    "models": models
                        .into_iter()
                        .map(|(m, d)| (m, serde_json::Value::from(ms(d))))
                        .collect::<serde_json::Map<_, _>>(),
                    "other": ms(other),
                },
            })
        })
        .collect();
    serde_json::json!({ "upstreams": list })
}

fn json(status: StatusCode, body: &serde_json::Value) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from(body.to_string())));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    // Dated now, not by hyper's cache, which a step back of the wall clock freezes.
    date::insert_if_missing(resp.headers_mut());
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Audit NB 5: once the watcher took a certificate not valid yet (the one served had run
    /// out), `/readyz` said plain `ready`. It says so while the served certificate is outside
    /// its dates, and no more once it is inside them.
    #[test]
    fn readyz_says_while_the_served_certificate_is_outside_its_dates() {
        use std::time::{Duration, SystemTime};
        let at = |secs: u64| SystemTime::UNIX_EPOCH + Duration::from_secs(secs);
        let health = Health::default();
        health.set_detail("config abc".into());
        health.set_certificate(Some((
            "/etc/tls.pem".into(),
            crate::server::tls::Validity {
                from: Some(at(1_800_000_000)),
                until: Some(at(1_900_000_000)),
            },
        )));
        assert_eq!(
            health.detail_at(at(1_799_999_999)),
            "config abc; the certificate served (/etc/tls.pem) is not valid until \
             2027-01-15T08:00:00Z (its notBefore): clients refuse it"
        );
        assert_eq!(health.detail_at(at(1_850_000_000)), "config abc");
        assert_eq!(
            health.detail_at(at(1_900_000_001)),
            "config abc; the certificate served (/etc/tls.pem) expired at \
             2030-03-17T17:46:40Z: clients refuse it"
        );
        health.set_certificate(None);
        assert_eq!(health.detail_at(at(1_799_999_999)), "config abc");
    }

    /// The admin listener's answers are dated by the wall clock of their making, not by
    /// hyper's per-thread cache, which a step back of the clock froze (audit KD 2).
    #[test]
    fn an_admin_answer_is_dated_now() {
        let before = std::time::SystemTime::now() - std::time::Duration::from_secs(1);
        let answers = [
            text(StatusCode::OK, "ok\n"),
            json(StatusCode::OK, &serde_json::json!({})),
        ];
        let after = std::time::SystemTime::now();
        for resp in answers {
            let date = resp.headers().get(header::DATE).expect("dated");
            let at = httpdate::parse_http_date(date.to_str().unwrap()).unwrap();
            assert!(before <= at && at <= after, "{date:?}");
        }
    }

    /// Audit CE: twenty scrapes at once each encoded the whole text (3.9 GB with 50,000
    /// named keys). Those that came while an encoding ran share the next one; none gets
    /// figures from before it came.
    #[tokio::test]
    async fn scrapes_at_once_share_one_encoding() {
        let metrics = Arc::new(Metrics::new());
        let scrape = Arc::new(Scrape::default());
        // All twenty are in line before any encoding starts: an encoding that ended before
        // the scheduler first polled the last of them would make those late ones owed a
        // new one (a warm encoder thread is that fast; the test failed 1 run in 5).
        let turn = scrape.0.lock().await;
        let scrapes: Vec<_> = (0..20)
            .map(|_| {
                let (scrape, metrics) = (scrape.clone(), metrics.clone());
                tokio::spawn(async move { scrape.text(&metrics).await })
            })
            .collect();
        for _ in 0..5 {
            tokio::task::yield_now().await;
        }
        drop(turn);
        let mut texts = Vec::new();
        for s in scrapes {
            texts.push(s.await.unwrap());
        }
        let mut encodings: Vec<_> = texts.iter().map(|t| t.as_ptr()).collect();
        encodings.sort();
        encodings.dedup();
        // The first scrape's, and one for all that came while it ran.
        assert!(encodings.len() <= 2, "{} encodings", encodings.len());
        assert!(texts.iter().all(|t| t.starts_with(b"# HELP")));
        // A scrape after them all gets a new one.
        let later = scrape.text(&metrics).await;
        assert!(!encodings.contains(&later.as_ptr()));
    }

    /// Audit GG 1: a DNS outage held every thread of tokio's blocking pool, and a scrape
    /// queued behind the lookups for seconds. With the pool held whole, a scrape is still
    /// answered (the bound is only there so that a failure ends).
    #[test]
    fn a_scrape_is_answered_while_the_blocking_pool_is_held() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .max_blocking_threads(1)
            .build()
            .unwrap();
        let (release, held) = std::sync::mpsc::channel::<()>();
        rt.block_on(async {
            let hold = tokio::task::spawn_blocking(move || held.recv());
            let metrics = Arc::new(Metrics::new());
            let text = tokio::time::timeout(
                std::time::Duration::from_secs(20),
                Scrape::default().text(&metrics),
            )
            .await
            .expect("the scrape waited for the blocking pool");
            assert!(text.starts_with(b"# HELP"));
            release.send(()).unwrap();
            hold.await.unwrap().unwrap();
        });
    }
}
