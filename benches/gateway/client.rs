//! The load generator's HTTP/1.1 client: raw tokio sockets, a hand-written response-head
//! parser and chunked decoder, and an SSE event tally.
//!
//! Why not hyper's client: a benchmark of a gateway needs to know exactly which bytes arrived
//! in which `read()` (two events that the gateway coalesced arrive in one read; hyper hands
//! chunked frames out one by one and hides that), and the load generator shares its core with
//! the fake provider, so it should cost as little per chunk as possible.

use std::io;
use std::net::SocketAddr;

use hourglass_fake::monotonic_ns;
use memchr::memmem;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const READ_BUF: usize = 16 * 1024;

/// Builds one HTTP/1.1 request with a JSON body.
pub fn request(host: SocketAddr, path: &str, headers: &[(&str, String)], body: &str) -> Vec<u8> {
    let mut r = format!(
        "POST {path} HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n",
        body.len()
    );
    // A Portkey gateway takes its route from request headers (peers.rs); none for the others.
    for (name, value) in headers.iter().chain(&crate::peers::extra_headers(host)) {
        r.push_str(name);
        r.push_str(": ");
        r.push_str(value);
        r.push_str("\r\n");
    }
    r.push_str("\r\n");
    r.push_str(body);
    r.into_bytes()
}

/// The response head, as far as the benchmark cares.
#[derive(Debug, Clone)]
pub struct Head {
    pub status: u16,
    pub framing: Framing,
}

#[derive(Debug, Clone)]
pub enum Framing {
    Length(usize),
    Chunked,
    UntilClose,
}

/// How a response body ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// The framing said the body is complete (last chunk, or all of content-length).
    Clean,
    /// The connection closed or failed before the body was complete.
    Truncated,
}

pub struct Conn {
    stream: TcpStream,
    /// Bytes read but not consumed yet (after the head, the start of the body).
    buf: Vec<u8>,
    scratch: Box<[u8]>,
}

impl Conn {
    pub async fn connect(addr: SocketAddr) -> io::Result<Conn> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(Conn {
            stream,
            buf: Vec::new(),
            scratch: vec![0; READ_BUF].into_boxed_slice(),
        })
    }

    pub async fn send(&mut self, request: &[u8]) -> io::Result<()> {
        self.stream.write_all(request).await
    }

    /// One `read()`; returns 0 on EOF.
    async fn read_some(&mut self) -> io::Result<usize> {
        let n = self.stream.read(&mut self.scratch).await?;
        self.buf.extend_from_slice(&self.scratch[..n]);
        Ok(n)
    }

    /// Reads the response head. Whatever followed it stays buffered for the body.
    pub async fn read_head(&mut self) -> io::Result<Head> {
        loop {
            if let Some(end) = memmem::find(&self.buf, b"\r\n\r\n") {
                let head = parse_head(&self.buf[..end])?;
                self.buf.drain(..end + 4);
                return Ok(head);
            }
            if self.buf.len() > 64 * 1024 {
                return Err(io::Error::other("response head too large"));
            }
            if self.read_some().await? == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
        }
    }

    /// A body reader for the response whose head was just read.
    pub fn body(&mut self, head: &Head) -> BodyReader<'_> {
        let state = match head.framing {
            Framing::Length(n) => Decode::Length(n),
            Framing::Chunked => Decode::ChunkSize,
            Framing::UntilClose => Decode::UntilClose,
        };
        BodyReader {
            conn: self,
            state,
            first: true,
        }
    }

    /// Reads and discards whatever is already in the socket buffer without waiting, so that
    /// the close that follows sends a FIN rather than a RST (as a client that stops reading
    /// and closes politely would).
    pub fn drain_nonblocking(&mut self) {
        loop {
            match self.stream.try_read(&mut self.scratch) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    }
}

fn parse_head(head: &[u8]) -> io::Result<Head> {
    let text = std::str::from_utf8(head).map_err(|_| io::Error::other("head is not UTF-8"))?;
    let mut lines = text.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| io::Error::other(format!("bad status line {status_line:?}")))?;
    let mut framing = Framing::UntilClose;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            if !matches!(framing, Framing::Chunked) {
                let n = value
                    .parse()
                    .map_err(|_| io::Error::other("bad content-length"))?;
                framing = Framing::Length(n);
            }
        } else if name.eq_ignore_ascii_case("transfer-encoding")
            && value.to_ascii_lowercase().contains("chunked")
        {
            framing = Framing::Chunked;
        }
    }
    Ok(Head { status, framing })
}

#[derive(Debug)]
enum Decode {
    Length(usize),
    UntilClose,
    ChunkSize,
    ChunkData(usize),
    ChunkDataEnd,
    Trailers,
    Done,
}

pub struct BodyReader<'a> {
    conn: &'a mut Conn,
    state: Decode,
    /// The first step decodes what arrived with the head before reading again.
    first: bool,
}

/// What one [`BodyReader::step`] produced.
pub enum Step {
    /// One read's worth of payload was appended (possibly none, if the read held only
    /// framing); `recv_ns` is when the read returned.
    Data { recv_ns: u64 },
    /// The body ended; any payload decoded in this step was appended first.
    End { end: End, recv_ns: u64 },
}

impl BodyReader<'_> {
    /// Reads once from the socket (unless bytes are already buffered) and appends the
    /// decoded payload to `out`.
    pub async fn step(&mut self, out: &mut Vec<u8>) -> io::Result<Step> {
        // The first step decodes what came with the head; a finished body reads no more.
        let buffered = std::mem::take(&mut self.first) && !self.conn.buf.is_empty();
        let eof = if buffered || matches!(self.state, Decode::Done) {
            false
        } else {
            match self.conn.read_some().await {
                Ok(n) => n == 0,
                Err(e) if is_reset(&e) => true,
                Err(e) => return Err(e),
            }
        };
        let recv_ns = monotonic_ns();
        self.decode(out);
        if matches!(self.state, Decode::Done) {
            return Ok(Step::End {
                end: End::Clean,
                recv_ns,
            });
        }
        if eof {
            let end = if matches!(self.state, Decode::UntilClose) {
                End::Clean
            } else {
                End::Truncated
            };
            self.state = Decode::Done;
            return Ok(Step::End { end, recv_ns });
        }
        Ok(Step::Data { recv_ns })
    }

    fn decode(&mut self, out: &mut Vec<u8>) {
        let buf = &mut self.conn.buf;
        let mut pos = 0;
        loop {
            let rest = &buf[pos..];
            match self.state {
                Decode::Done => break,
                Decode::UntilClose => {
                    out.extend_from_slice(rest);
                    pos = buf.len();
                    break;
                }
                Decode::Length(n) => {
                    let take = n.min(rest.len());
                    out.extend_from_slice(&rest[..take]);
                    pos += take;
                    self.state = if take == n {
                        Decode::Done
                    } else {
                        Decode::Length(n - take)
                    };
                    break;
                }
                Decode::ChunkSize => {
                    let Some(eol) = memmem::find(rest, b"\r\n") else {
                        break;
                    };
                    let line = &rest[..eol];
                    let hex = line.split(|&b| b == b';').next().unwrap_or_default();
                    let size = std::str::from_utf8(hex)
                        .ok()
                        .and_then(|h| usize::from_str_radix(h.trim(), 16).ok())
                        .unwrap_or(0);
                    pos += eol + 2;
                    self.state = if size == 0 {
                        Decode::Trailers
                    } else {
                        Decode::ChunkData(size)
                    };
                }
                Decode::ChunkData(n) => {
                    if rest.is_empty() {
                        break;
                    }
                    let take = n.min(rest.len());
                    out.extend_from_slice(&rest[..take]);
                    pos += take;
                    self.state = if take == n {
                        Decode::ChunkDataEnd
                    } else {
                        Decode::ChunkData(n - take)
                    };
                }
                Decode::ChunkDataEnd => {
                    if rest.len() < 2 {
                        break;
                    }
                    pos += 2;
                    self.state = Decode::ChunkSize;
                }
                Decode::Trailers => {
                    let Some(eol) = memmem::find(rest, b"\r\n") else {
                        break;
                    };
                    pos += eol + 2;
                    if eol == 0 {
                        self.state = Decode::Done;
                    }
                }
            }
        }
        buf.drain(..pos);
    }
}

fn is_reset(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe
    )
}

/// What the client learned from one SSE body, event by event.
#[derive(Debug, Default)]
pub struct EventTally {
    pending: Vec<u8>,
    /// (sent, received) monotonic ns of every content event (`x_fake_sent_ns` stamped).
    pub content: Vec<(u64, u64)>,
    /// Content events that arrived in the same read as the content event before them although
    /// the fake sent them at least half an interval apart: coalesced on the way.
    pub coalesced: u32,
    /// All complete events, of any kind.
    pub events: u32,
    /// The `code` of an `event: error` (or of a `data: {"error": ...}` event), and when it
    /// arrived.
    pub error: Option<(String, u64)>,
}

const SENT_KEY: &[u8] = b"\"x_fake_sent_ns\":";

impl EventTally {
    /// Feeds the payload of one read that returned at `recv_ns`.
    pub fn feed(&mut self, payload: &[u8], recv_ns: u64, min_gap_ns: u64) {
        self.pending.extend_from_slice(payload);
        let mut start = 0;
        let mut prev_sent_in_read: Option<u64> = None;
        while let Some(i) = memmem::find(&self.pending[start..], b"\n\n") {
            let event = &self.pending[start..start + i];
            start += i + 2;
            self.events += 1;
            if let Some(at) = memmem::find(event, SENT_KEY) {
                let digits = &event[at + SENT_KEY.len()..];
                let end = digits
                    .iter()
                    .position(|b| !b.is_ascii_digit())
                    .unwrap_or(digits.len());
                let sent: u64 = std::str::from_utf8(&digits[..end])
                    .ok()
                    .and_then(|d| d.parse().ok())
                    .unwrap_or(0);
                if prev_sent_in_read.is_some_and(|p| sent.saturating_sub(p) >= min_gap_ns) {
                    self.coalesced += 1;
                }
                prev_sent_in_read = Some(sent);
                self.content.push((sent, recv_ns));
            } else if event.starts_with(b"event: error") || event.starts_with(b"data: {\"error\"") {
                // The second shape is OpenAI's (a data object with a top-level `error`, on
                // which the OpenAI SDKs raise): what LiteLLM sends when a stream fails.
                let code = memmem::find(event, b"\"code\":\"")
                    .map(|at| {
                        let rest = &event[at + 8..];
                        let end = rest.iter().position(|&b| b == b'"').unwrap_or(0);
                        String::from_utf8_lossy(&rest[..end]).into_owned()
                    })
                    .unwrap_or_else(|| "?".into());
                self.error.get_or_insert((code, recv_ns));
            }
        }
        self.pending.drain(..start);
    }
}
