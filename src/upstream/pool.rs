//! Plain-HTTP upstreams: HTTP/1.1 connections that Hourglass pools itself and that the task of
//! the request using one drives.
//!
//! hyper-util's client runs each connection in a task of its own and passes every body chunk
//! to the request's task over a channel, so a chunk costs a wake-up of both tasks, and each
//! request spawns one more task to put its connection back in the pool. Here the request's
//! task polls the connection itself, through the response future and then through the body:
//! a chunk is read from the upstream and written to the client in the same poll. (HTTPS
//! upstreams keep hyper-util's client: ALPN may choose HTTP/2, whose connection is shared by
//! many requests and needs a task of its own.)
//!
//! A connection goes back to the pool only when its response was read to the end and hyper
//! says it can carry another request. A body dropped before its end drops its connection with
//! it, which closes the socket: that is how a request is cancelled upstream.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Request, Response, Uri};
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::time::Instant;
use tower_service::Service;

use super::{ConnectTimedOut, ExchangeError};
use crate::watchdog::BoxError;

type Connection = http1::Connection<TokioIo<TcpStream>, Full<Bytes>>;
type Sending = Pin<
    Box<
        dyn Future<
                Output = Result<
                    Response<Incoming>,
                    hyper::client::conn::TrySendError<Request<Full<Bytes>>>,
                >,
            > + Send,
    >,
>;
/// A new connection, with the request that will go out on it.
type Connecting =
    Pin<Box<dyn Future<Output = Result<(Box<Conn>, Request<Full<Bytes>>), BoxError>> + Send>>;

/// How long a connection may wait unused in the pool (hyper-util's default, kept).
const IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// How often idle connections are checked for expiry and for the upstream having closed them.
const SWEEP_EVERY: Duration = Duration::from_secs(15);

/// The idle connections of one upstream, and how to make new ones.
pub struct Pool {
    inner: Arc<Inner>,
}

struct Inner {
    connector: HttpConnector,
    builder: http1::Builder,
    /// `http://authority`, what the connector resolves and connects to.
    target: Uri,
    /// The `Host` every request carries.
    host: HeaderValue,
    connect_timeout: Duration,
    idle: Mutex<Vec<(Box<Conn>, Instant)>>,
    sweeping: AtomicBool,
}

/// One HTTP/1 connection: the handle requests go in by, and hyper's state machine for it.
/// Always boxed: it is over 700 bytes, and the futures and bodies that hold it are moved.
struct Conn {
    send: http1::SendRequest<Full<Bytes>>,
    conn: Connection,
    /// The connection future finished: the socket is closed.
    done: bool,
}

impl Conn {
    fn drive(&mut self, cx: &mut Context<'_>) {
        if !self.done && Pin::new(&mut self.conn).poll(cx).is_ready() {
            self.done = true;
        }
    }

    /// Whether the connection can carry another request. hyper notices that an exchange ended,
    /// or that the upstream closed an idle connection, only when the connection is polled: no
    /// task waits on it here, so poll it without one.
    fn reusable(&mut self) -> bool {
        let mut cx = Context::from_waker(Waker::noop());
        for _ in 0..2 {
            self.drive(&mut cx);
            if self.done {
                return false;
            }
            if self.send.is_ready() {
                return true;
            }
        }
        false
    }
}

impl Pool {
    /// A pool for `http://` upstream `url`.
    pub fn new(url: &Uri, connect_timeout: Duration) -> Result<Self, String> {
        let authority = url
            .authority()
            .ok_or_else(|| format!("url {url} has no host"))?;
        let target = Uri::builder()
            .scheme("http")
            .authority(authority.clone())
            .path_and_query("/")
            .build()
            .map_err(|e| e.to_string())?;
        // Like hyper-util's client: the port only when it is not the scheme's default.
        let host = match authority.port_u16() {
            Some(80) | None => authority.host().to_owned(),
            Some(port) => format!("{}:{port}", authority.host()),
        };
        let host = HeaderValue::from_str(&host).map_err(|e| e.to_string())?;
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_keepalive(Some(Duration::from_secs(30)));
        connector.set_connect_timeout(Some(connect_timeout));
        Ok(Self {
            inner: Arc::new(Inner {
                connector,
                builder: http1::Builder::new(),
                target,
                host,
                connect_timeout,
                idle: Mutex::new(Vec::new()),
                sweeping: AtomicBool::new(false),
            }),
        })
    }

    /// Sends `req` (its URI in origin form) on an idle connection, or on a new one.
    pub fn send(&self, mut req: Request<Full<Bytes>>) -> Exchange {
        req.headers_mut()
            .insert(http::header::HOST, self.inner.host.clone());
        let state = match self.inner.take_idle() {
            Some(conn) => State::Sending(sending(conn, req, true)),
            None => State::Connecting(self.inner.connect(req)),
        };
        Exchange {
            inner: self.inner.clone(),
            state,
        }
    }

    /// Connections waiting in the pool.
    pub fn idle_count(&self) -> usize {
        self.inner
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

impl Inner {
    fn take_idle(&self) -> Option<Box<Conn>> {
        let now = Instant::now();
        loop {
            // Popped under the lock, checked (which may read the socket) after it.
            let (mut conn, since) = self
                .idle
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .pop()?;
            if now.duration_since(since) < IDLE_TIMEOUT && conn.reusable() {
                return Some(conn);
            }
        }
    }

    fn connect(&self, req: Request<Full<Bytes>>) -> Connecting {
        let mut connector = self.connector.clone();
        let target = self.target.clone();
        let builder = self.builder.clone();
        let timeout = self.connect_timeout;
        Box::pin(async move {
            let io = match tokio::time::timeout(timeout, connector.call(target)).await {
                Ok(io) => io?,
                Err(_) => return Err(Box::new(ConnectTimedOut(timeout)) as BoxError),
            };
            let (send, conn) = builder.handshake(io).await?;
            let conn = Box::new(Conn {
                send,
                conn,
                done: false,
            });
            Ok((conn, req))
        })
    }

    fn put_back(self: &Arc<Self>, mut conn: Box<Conn>) {
        if !conn.reusable() {
            return;
        }
        self.idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((conn, Instant::now()));
        if !self.sweeping.swap(true, Ordering::Relaxed) {
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(sweep(Arc::downgrade(self)));
            }
        }
    }
}

/// Closes idle connections that expired or that the upstream closed, until the pool is gone.
async fn sweep(pool: Weak<Inner>) {
    loop {
        tokio::time::sleep(SWEEP_EVERY).await;
        let Some(pool) = pool.upgrade() else { return };
        let idle = std::mem::take(&mut *pool.idle.lock().unwrap_or_else(PoisonError::into_inner));
        let now = Instant::now();
        let kept: Vec<_> = idle
            .into_iter()
            .filter_map(|(mut conn, since)| {
                (now.duration_since(since) < IDLE_TIMEOUT && conn.reusable())
                    .then_some((conn, since))
            })
            .collect();
        let mut idle = pool.idle.lock().unwrap_or_else(PoisonError::into_inner);
        // Those returned meanwhile are newer: keep the newest at the end, where `pop` looks.
        let newer = std::mem::replace(&mut *idle, kept);
        idle.extend(newer);
    }
}

fn sending(
    mut conn: Box<Conn>,
    req: Request<Full<Bytes>>,
    reused: bool,
) -> (Box<Conn>, Sending, bool) {
    let fut = Box::pin(conn.send.try_send_request(req));
    (conn, fut, reused)
}

enum State {
    Connecting(Connecting),
    Sending((Box<Conn>, Sending, bool)),
    Done,
}

/// A request on its way: connecting (or taken from the pool), then waiting for the head.
/// Dropping it closes the connection it was using.
pub struct Exchange {
    inner: Arc<Inner>,
    state: State,
}

impl Exchange {
    /// Whether the request has a connection: from then on the first-token clock runs.
    pub fn is_connected(&self) -> bool {
        matches!(self.state, State::Sending(_))
    }
}

impl Future for Exchange {
    type Output = Result<Response<PooledBody>, ExchangeError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        loop {
            match &mut this.state {
                State::Connecting(connecting) => {
                    let (conn, req) = match connecting.as_mut().poll(cx) {
                        Poll::Pending => return Poll::Pending,
                        Poll::Ready(Ok(connected)) => connected,
                        Poll::Ready(Err(e)) => {
                            this.state = State::Done;
                            return Poll::Ready(Err(ExchangeError::Connect(e)));
                        }
                    };
                    this.state = State::Sending(sending(conn, req, false));
                }
                State::Sending((conn, fut, reused)) => {
                    conn.drive(cx);
                    // Only the connection, polled just above, can complete the response
                    // future: a waker of its own would only wake this task a second time.
                    let noop = &mut Context::from_waker(Waker::noop());
                    let polled = fut.as_mut().poll(if conn.done { cx } else { noop });
                    match polled {
                        Poll::Pending => return Poll::Pending,
                        Poll::Ready(Ok(response)) => {
                            let State::Sending((conn, _, _)) =
                                std::mem::replace(&mut this.state, State::Done)
                            else {
                                unreachable!()
                            };
                            let (parts, incoming) = response.into_parts();
                            let body = PooledBody {
                                incoming,
                                conn: Some(conn),
                                ended: false,
                                failed: None,
                                pool: this.inner.clone(),
                            };
                            return Poll::Ready(Ok(Response::from_parts(parts, body)));
                        }
                        Poll::Ready(Err(mut e)) => match e.take_message() {
                            // A pooled connection the upstream had closed before the request
                            // went out: nothing was sent, so it goes out on a new connection.
                            Some(req) if *reused => {
                                this.state = State::Connecting(this.inner.connect(req));
                            }
                            _ => {
                                this.state = State::Done;
                                return Poll::Ready(Err(ExchangeError::Exchange(e.into_error())));
                            }
                        },
                    }
                }
                State::Done => panic!("Exchange polled after it completed"),
            }
        }
    }
}

/// A response body read through the connection it arrives on.
pub struct PooledBody {
    incoming: Incoming,
    /// `None` once the connection went back to the pool or closed.
    conn: Option<Box<Conn>>,
    /// The body's end was read.
    ended: bool,
    /// An error read, handed over at the next poll (see `poll_frame`).
    failed: Option<hyper::Error>,
    pool: Arc<Inner>,
}

impl Body for PooledBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        if let Some(e) = this.failed.take() {
            return Poll::Ready(Some(Err(e)));
        }
        let noop = &mut Context::from_waker(Waker::noop());
        // As in `Exchange`: what the body yields comes from driving the connection here, so
        // the body needs no waker of its own while the connection is alive.
        let mut polled = Pin::new(&mut this.incoming).poll_frame(noop);
        if polled.is_pending() {
            let alive = this.conn.as_mut().is_some_and(|conn| {
                conn.drive(cx);
                !conn.done
            });
            polled = Pin::new(&mut this.incoming).poll_frame(if alive { noop } else { &mut *cx });
        }
        match polled {
            Poll::Ready(None) => {
                this.ended = true;
                this.release();
            }
            // The frames before an error often come in the same poll as the error itself.
            // hyper's server buffers what a body yields until the body waits, and aborts the
            // connection on an error without writing that buffer out: the client would lose the
            // head and the last bytes that did arrive. Waiting one poll lets them go out first.
            Poll::Ready(Some(Err(e))) => {
                this.failed = Some(e);
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.ended || self.incoming.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.incoming.size_hint()
    }
}

impl std::fmt::Debug for PooledBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PooledBody")
            .field("ended", &self.ended)
            .field("pooled", &self.conn.is_some())
            .finish_non_exhaustive()
    }
}

impl PooledBody {
    fn release(&mut self) {
        if let Some(conn) = self.conn.take() {
            self.pool.put_back(conn);
        }
    }
}

impl Drop for PooledBody {
    fn drop(&mut self) {
        // Read to its end, the connection can serve again; anything else drops it mid-body,
        // which closes it (never back in the pool with a response half read).
        if self.is_end_stream() {
            self.release();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use http_body_util::BodyExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;
    use tokio::sync::mpsc;

    use super::*;

    const OK: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";

    /// What the upstream saw: connections accepted, and each connection's end (EOF or error).
    struct Upstream {
        uri: Uri,
        accepted: Arc<AtomicUsize>,
        closed: mpsc::UnboundedReceiver<()>,
    }

    /// Answers each request head with `answer`; after `per_conn` answers it closes the
    /// connection (0: never), without saying so in the answer.
    async fn upstream(answer: &'static [u8], per_conn: usize) -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let uri: Uri = format!("http://{}", listener.local_addr().unwrap())
            .parse()
            .unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let (closed_tx, closed) = mpsc::unbounded_channel();
        let count = accepted.clone();
        tokio::spawn(async move {
            loop {
                let (mut s, _) = listener.accept().await.unwrap();
                count.fetch_add(1, Ordering::SeqCst);
                let closed_tx = closed_tx.clone();
                tokio::spawn(async move {
                    let (mut buf, mut answered) = (Vec::new(), 0);
                    let mut chunk = [0u8; 1024];
                    loop {
                        let n = s.read(&mut chunk).await.unwrap_or(0);
                        if n == 0 {
                            break;
                        }
                        buf.extend_from_slice(&chunk[..n]);
                        while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            buf.drain(..end + 4);
                            s.write_all(answer).await.unwrap();
                            answered += 1;
                        }
                        if per_conn > 0 && answered >= per_conn {
                            break;
                        }
                    }
                    drop(s);
                    let _ = closed_tx.send(());
                });
            }
        });
        Upstream {
            uri,
            accepted,
            closed,
        }
    }

    fn get() -> Request<Full<Bytes>> {
        Request::get("/v1/models").body(Full::default()).unwrap()
    }

    async fn fetch(pool: &Pool) -> Bytes {
        let response = pool.send(get()).await.unwrap();
        assert_eq!(response.status(), 200);
        response.into_body().collect().await.unwrap().to_bytes()
    }

    fn pool(up: &Upstream) -> Pool {
        Pool::new(&up.uri, Duration::from_secs(1)).unwrap()
    }

    #[tokio::test]
    async fn answers_read_to_their_end_leave_the_connection_for_the_next_request() {
        let up = upstream(OK, 0).await;
        let pool = pool(&up);
        for _ in 0..5 {
            assert_eq!(fetch(&pool).await, "ok");
        }
        assert_eq!(up.accepted.load(Ordering::SeqCst), 1);
        assert_eq!(pool.idle_count(), 1);
    }

    #[tokio::test]
    async fn a_body_dropped_after_its_last_byte_but_before_its_end_still_returns_the_connection() {
        let up = upstream(OK, 0).await;
        let pool = pool(&up);
        let mut body = pool.send(get()).await.unwrap().into_body();
        let frame = body.frame().await.unwrap().unwrap();
        assert_eq!(frame.into_data().unwrap(), "ok");
        // hyper's server stops polling a body once `is_end_stream` says it is complete.
        assert!(body.is_end_stream());
        drop(body);
        assert_eq!(pool.idle_count(), 1);
        assert_eq!(fetch(&pool).await, "ok");
        assert_eq!(up.accepted.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_connection_the_upstream_closed_while_idle_is_not_used_again() {
        let mut up = upstream(OK, 1).await;
        let pool = pool(&up);
        assert_eq!(fetch(&pool).await, "ok");
        // The upstream closed it after answering; let its FIN reach this side's poller.
        up.closed.recv().await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(fetch(&pool).await, "ok");
        assert_eq!(up.accepted.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn an_answer_that_closes_its_connection_is_not_pooled() {
        let up = upstream(
            b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nok",
            0,
        )
        .await;
        let pool = pool(&up);
        assert_eq!(fetch(&pool).await, "ok");
        assert_eq!(pool.idle_count(), 0);
        assert_eq!(fetch(&pool).await, "ok");
        assert_eq!(up.accepted.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_body_dropped_mid_stream_closes_its_connection_at_once() {
        let mut up = upstream(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n",
            0,
        )
        .await;
        let pool = pool(&up);
        let mut body = pool.send(get()).await.unwrap().into_body();
        let frame = body.frame().await.unwrap().unwrap();
        assert_eq!(frame.into_data().unwrap(), "hello");
        drop(body);
        // The upstream, silent since, reads EOF: the socket was closed, not parked.
        tokio::time::timeout(Duration::from_secs(5), up.closed.recv())
            .await
            .expect("the upstream connection was not closed")
            .unwrap();
        assert_eq!(pool.idle_count(), 0);
    }

    #[tokio::test]
    async fn an_exchange_dropped_while_waiting_for_the_head_closes_its_connection() {
        let mut up = upstream(b"", 0).await;
        let pool = pool(&up);
        let mut exchange = Box::pin(pool.send(get()));
        // Until the upstream has the request (it never answers).
        while up.accepted.load(Ordering::SeqCst) == 0 || !exchange.is_connected() {
            assert!(
                tokio::time::timeout(Duration::from_millis(10), exchange.as_mut())
                    .await
                    .is_err(),
                "an upstream that never answers"
            );
        }
        drop(exchange);
        tokio::time::timeout(Duration::from_secs(5), up.closed.recv())
            .await
            .expect("the upstream connection was not closed")
            .unwrap();
        assert_eq!(pool.idle_count(), 0);
    }

    #[tokio::test]
    async fn a_refused_connect_is_a_connect_error() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let uri: Uri = format!("http://{}", listener.local_addr().unwrap())
            .parse()
            .unwrap();
        drop(listener);
        let pool = Pool::new(&uri, Duration::from_secs(1)).unwrap();
        let err = pool.send(get()).await.unwrap_err();
        assert!(err.is_connect(), "{err}");
    }

    #[test]
    fn the_host_header_leaves_out_the_default_port() {
        for (url, host) in [
            ("http://example.com", "example.com"),
            ("http://example.com:80/v1", "example.com"),
            ("http://127.0.0.1:8080", "127.0.0.1:8080"),
        ] {
            let pool = Pool::new(&url.parse().unwrap(), Duration::from_secs(1)).unwrap();
            assert_eq!(pool.inner.host, host, "{url}");
        }
    }
}
