//! The admin listener: `/metrics` (Prometheus text format), `/healthz` (the process is up) and
//! `/readyz` (it accepts traffic: false while starting and once shutdown has begun). It is a
//! separate listener so the client port never exposes metrics.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::Full;

use crate::metrics::Metrics;

#[derive(Default)]
pub struct Health {
    ready: AtomicBool,
    /// Which config is served and how the last reload went, shown by /readyz.
    detail: std::sync::Mutex<String>,
}

impl Health {
    pub fn set_detail(&self, detail: String) {
        *self.detail.lock().unwrap_or_else(|e| e.into_inner()) = detail;
    }

    fn detail(&self) -> String {
        self.detail
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
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
    metrics: Arc<Metrics>,
    health: Arc<Health>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return Ok(text(StatusCode::METHOD_NOT_ALLOWED, "only GET\n"));
    }
    Ok(match req.uri().path() {
        "/metrics" => {
            let mut resp = text(StatusCode::OK, metrics.encode());
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                header::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
            );
            resp
        }
        "/healthz" => text(StatusCode::OK, "ok\n"),
        "/readyz" if health.is_ready() => {
            text(StatusCode::OK, format!("ready: {}\n", health.detail()))
        }
        "/readyz" => text(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready (starting or draining): {}\n", health.detail()),
        ),
        _ => text(
            StatusCode::NOT_FOUND,
            "not found: try /metrics, /healthz or /readyz\n",
        ),
    })
}

fn text(status: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(body.into()));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}
