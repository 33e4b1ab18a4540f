//! The log's own thread. Whoever logs (a request's line is formatted on the runtime) appends
//! the line to a buffer and goes on; this thread writes the buffer out. A reader that stops
//! reading stdout (a full pipe, a stalled log shipper) then stalls this thread only, never
//! the streams, and a busy gateway's lines leave in a few large writes.
//!
//! Not tracing-appender's non-blocking writer: it hands each line to a channel whose receiver
//! is woken for every line (a futex wake, then `sched_yield`s while it spins), which cost 10%
//! of the non-streaming throughput on one core. Here the writer is woken only when it waits
//! on an empty buffer, and after each write lingers a moment so that lines gather.

use std::io::{self, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

/// Bytes that may wait for a slow reader before lines are dropped (about 128k request lines).
pub const QUEUE_LIMIT: usize = 64 << 20;

/// Buffer capacity kept between batches (the two buffers otherwise keep their largest size).
const KEEP: usize = 1 << 20;

/// How long the writer lets lines gather after a write: a few hundred lines at full load.
const LINGER: Duration = Duration::from_millis(2);

/// How long the process waits at exit for the lines still queued to be written: an output
/// nobody reads (a stalled log shipper) must not keep a gateway that was told to stop from
/// stopping.
pub const FLUSH_LIMIT: Duration = Duration::from_secs(5);

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    wake: Condvar,
    dropped: AtomicU64,
}

#[derive(Default)]
struct State {
    lines: Vec<u8>,
    /// The writer waits on `wake` for a line.
    waiting: bool,
    closed: bool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves whole lines behind: carry on with them.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The appending end, given to `tracing` as its writer.
#[derive(Clone)]
pub struct LogWriter {
    shared: Arc<Shared>,
    limit: usize,
}

/// Ends the writer thread when dropped, after it has written every line queued.
pub struct LogGuard {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    flush_limit: Duration,
}

/// Starts the thread that writes to `out`.
pub fn spawn(out: impl Write + Send + 'static) -> io::Result<(LogWriter, LogGuard)> {
    spawn_with_limit(out, QUEUE_LIMIT)
}

fn spawn_with_limit(
    mut sink: impl Write + Send + 'static,
    limit: usize,
) -> io::Result<(LogWriter, LogGuard)> {
    let shared = Arc::new(Shared::default());
    let theirs = shared.clone();
    let thread = std::thread::Builder::new()
        .name("hourglass-log".into())
        .spawn(move || {
            let mut batch = Vec::new();
            let mut out = Output {
                broken_line: false,
                failing: false,
            };
            loop {
                {
                    let mut state = theirs.lock();
                    while state.lines.is_empty() && !state.closed {
                        state.waiting = true;
                        state = theirs
                            .wake
                            .wait(state)
                            .unwrap_or_else(PoisonError::into_inner);
                    }
                    state.waiting = false;
                    if state.lines.is_empty() {
                        return;
                    }
                    std::mem::swap(&mut state.lines, &mut batch);
                }
                out.write_batch(&mut sink, &batch, &theirs.dropped);
                batch.clear();
                // After a reader's stall the batch may have grown to the limit: keep what a
                // busy gateway's lines need, not the stall's high-water mark.
                batch.shrink_to(KEEP);
                std::thread::sleep(LINGER);
            }
        })?;
    let writer = LogWriter {
        shared: shared.clone(),
        limit,
    };
    let guard = LogGuard {
        shared,
        thread: Some(thread),
        flush_limit: FLUSH_LIMIT,
    };
    Ok((writer, guard))
}

/// How the writes to the output have gone.
struct Output {
    /// A failed write left a line half written: the next write ends it first, so that the
    /// next line does not run on from it.
    broken_line: bool,
    /// The last batch failed; said once on stderr per run of failures.
    failing: bool,
}

impl Output {
    /// Writes the whole batch, however many writes it takes. An output that is not ready (a
    /// non-blocking pipe a supervisor handed over, `EAGAIN`) is waited for as a blocking one
    /// is; lines meanwhile queue up to the limit. An output that fails (a closed pipe) loses
    /// the batch's lines, which are counted as dropped.
    fn write_batch(&mut self, sink: &mut impl Write, batch: &[u8], dropped: &AtomicU64) {
        if self.broken_line {
            if let Err((_, e)) = write_fully(sink, b"\n") {
                self.lost(batch, e, dropped);
                return;
            }
            self.broken_line = false;
        }
        match write_fully(sink, batch).and_then(|()| sink.flush().map_err(|e| (batch.len(), e))) {
            Ok(()) => self.failing = false,
            Err((written, e)) => {
                let written = written.min(batch.len());
                // A line whose start went out and whose end did not: ended by the next write.
                self.broken_line = written > 0 && batch[written - 1] != b'\n';
                self.lost(&batch[written..], e, dropped);
            }
        }
    }

    fn lost(&mut self, unwritten: &[u8], e: io::Error, dropped: &AtomicU64) {
        let lines = unwritten.iter().filter(|&&b| b == b'\n').count() as u64;
        dropped.fetch_add(lines, Ordering::Relaxed);
        if !std::mem::replace(&mut self.failing, true) {
            // Where else: the output itself is what fails (on stderr's own writer, this
            // fails too, and nothing is lost by trying).
            let _ = writeln!(
                io::stderr(),
                "hourglass: writing the log failed ({e}); its lines are dropped and counted \
                 in hourglass_log_lines_dropped_total"
            );
        }
    }
}

/// Writes all of `bytes`; on failure, how many went out and why not. `Interrupted` is tried
/// again at once, `WouldBlock` after a pause of up to 10 ms (this thread has nothing else
/// to do, and a reader that is slow is no reason to drop its lines).
fn write_fully(sink: &mut impl Write, bytes: &[u8]) -> Result<(), (usize, io::Error)> {
    let mut written = 0;
    let mut pause = Duration::from_micros(100);
    while written < bytes.len() {
        match sink.write(&bytes[written..]) {
            Ok(0) => return Err((written, io::ErrorKind::WriteZero.into())),
            Ok(n) => {
                written += n;
                pause = Duration::from_micros(100);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(10));
            }
            Err(e) => return Err((written, e)),
        }
    }
    Ok(())
}

impl LogWriter {
    /// Lines dropped so far because `QUEUE_LIMIT` bytes were already waiting.
    pub fn dropped(&self) -> u64 {
        self.shared.dropped.load(Ordering::Relaxed)
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogWriter {
    type Writer = &'a LogWriter;

    fn make_writer(&'a self) -> Self::Writer {
        self
    }
}

impl Write for &LogWriter {
    /// Takes one whole line (`tracing` writes each event with one call), or drops it whole.
    fn write(&mut self, line: &[u8]) -> io::Result<usize> {
        let mut state = self.shared.lock();
        if state.lines.len() + line.len() > self.limit {
            drop(state);
            self.shared.dropped.fetch_add(1, Ordering::Relaxed);
            return Ok(line.len());
        }
        state.lines.extend_from_slice(line);
        let wake = std::mem::take(&mut state.waiting);
        drop(state);
        if wake {
            self.shared.wake.notify_one();
        }
        Ok(line.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Drop for LogGuard {
    /// Waits for the queued lines to be written, for at most `flush_limit`; past it the
    /// writer is left blocked on its output and the process exits without them.
    fn drop(&mut self) {
        self.shared.lock().closed = true;
        self.shared.wake.notify_one();
        let Some(thread) = self.thread.take() else {
            return;
        };
        let until = std::time::Instant::now() + self.flush_limit;
        while !thread.is_finished() {
            if std::time::Instant::now() >= until {
                let left = self.shared.lock().lines.len();
                let _ = writeln!(
                    io::stderr(),
                    "hourglass: the log's output took nothing for {:?}; exiting with {left} \
                     bytes of lines (and the batch being written) unwritten",
                    self.flush_limit
                );
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = thread.join();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    /// A reader that takes nothing until told to, like a pipe nobody reads.
    struct Stalled {
        open: mpsc::Receiver<()>,
        got: Arc<Mutex<Vec<u8>>>,
    }

    impl Write for Stalled {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            let _ = self.open.recv();
            self.got.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// A log whose reader is stalled; each send on the sender lets one write through.
    fn stalled_log(limit: usize) -> (LogWriter, LogGuard, mpsc::Sender<()>, Arc<Mutex<Vec<u8>>>) {
        let (open, gate) = mpsc::channel();
        let got = Arc::new(Mutex::new(Vec::new()));
        let stalled = Stalled {
            open: gate,
            got: got.clone(),
        };
        let (writer, guard) = spawn_with_limit(stalled, limit).unwrap();
        (writer, guard, open, got)
    }

    /// An output as a non-blocking pipe is (`EAGAIN` when full, short writes), then one
    /// that fails (a closed pipe) once `fail_at` bytes went out, until `mend` is set.
    struct Flaky {
        got: Arc<Mutex<Vec<u8>>>,
        calls: u64,
        fail_at: Option<usize>,
        mend: Arc<std::sync::atomic::AtomicBool>,
    }

    impl Write for Flaky {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.calls += 1;
            if self.calls.is_multiple_of(3) {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            let mut got = self.got.lock().unwrap();
            let mut n = buf.len().min(7);
            if let Some(at) = self.fail_at {
                if !self.mend.load(Ordering::SeqCst) {
                    if got.len() >= at {
                        return Err(io::ErrorKind::BrokenPipe.into());
                    }
                    n = n.min(at - got.len());
                }
            }
            got.extend_from_slice(&buf[..n]);
            Ok(n)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn flaky(
        fail_at: Option<usize>,
    ) -> (
        Flaky,
        Arc<Mutex<Vec<u8>>>,
        Arc<std::sync::atomic::AtomicBool>,
    ) {
        let got = Arc::new(Mutex::new(Vec::new()));
        let mend = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let out = Flaky {
            got: got.clone(),
            calls: 0,
            fail_at,
            mend: mend.clone(),
        };
        (out, got, mend)
    }

    /// Short writes and `EAGAIN` (a non-blocking stdout) lose nothing: every line comes out
    /// whole, in order. Before, a batch met with `EAGAIN` was thrown away uncounted, and the
    /// part of a line already written ran on into the next batch's first line.
    #[test]
    fn a_non_blocking_output_gets_every_line_whole() {
        let (out, got, _) = flaky(None);
        let (writer, guard) = spawn_with_limit(out, 1 << 20).unwrap();
        let lines: Vec<String> = (0..500).map(|i| format!("{{\"line\":{i}}}\n")).collect();
        for line in &lines {
            (&writer).write_all(line.as_bytes()).unwrap();
        }
        drop(guard);
        assert_eq!(writer.dropped(), 0);
        assert_eq!(
            String::from_utf8(got.lock().unwrap().clone()).unwrap(),
            lines.concat()
        );
    }

    /// An output that fails counts every line it loses, the half-written one too, and once
    /// it works again the next line starts on a line of its own.
    #[test]
    fn lines_lost_to_a_failing_output_are_counted_and_none_runs_on() {
        let (out, got, mend) = flaky(Some(15));
        let (writer, guard) = spawn_with_limit(out, 1 << 20).unwrap();
        // Ten-byte lines: one whole, half of the second, then the pipe fails.
        (&writer)
            .write_all(b"line 0000\nline 0001\nline 0002\n")
            .unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while writer.dropped() < 2 {
            assert!(std::time::Instant::now() < deadline, "nothing counted");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(writer.dropped(), 2);
        mend.store(true, Ordering::SeqCst);
        (&writer).write_all(b"line 0003\n").unwrap();
        drop(guard);
        assert_eq!(
            String::from_utf8(got.lock().unwrap().clone()).unwrap(),
            "line 0000\nline \nline 0003\n"
        );
    }

    #[test]
    fn lines_wait_for_a_stalled_reader_then_all_come_out_in_order() {
        let (writer, guard, open, got) = stalled_log(1 << 20);
        // Every write returns while the reader takes nothing.
        let lines: Vec<String> = (0..1000).map(|i| format!("line {i}\n")).collect();
        for line in &lines {
            (&writer).write_all(line.as_bytes()).unwrap();
        }
        assert_eq!(writer.dropped(), 0);
        // The reader comes back: open the gate for every write the thread may make.
        for _ in 0..lines.len() {
            let _ = open.send(());
        }
        drop(guard);
        assert_eq!(
            String::from_utf8(got.lock().unwrap().clone()).unwrap(),
            lines.concat()
        );
    }

    /// An output that never takes a byte does not hold the process at exit past the limit
    /// (it held SIGTERM and Ctrl-C off for as long as nobody read stdout).
    #[test]
    fn exit_waits_for_an_output_that_takes_nothing_only_so_long() {
        let (writer, mut guard, _open, got) = stalled_log(1 << 20);
        guard.flush_limit = Duration::from_millis(200);
        (&writer).write_all(b"line 1\n").unwrap();
        let start = std::time::Instant::now();
        drop(guard);
        let took = start.elapsed();
        assert!(took >= Duration::from_millis(200), "{took:?}");
        assert!(took < Duration::from_secs(4), "{took:?}");
        assert!(got.lock().unwrap().is_empty());
    }

    #[test]
    fn beyond_the_limit_whole_lines_are_dropped_and_counted() {
        let (writer, guard, open, got) = stalled_log(100);
        // The first line may already be in the writer's hands, the rest wait: ten lines of 10
        // bytes fill the 100 allowed, and of 30 more at least 20 cannot wait.
        for i in 0..40 {
            (&writer)
                .write_all(format!("line {i:04}\n").as_bytes())
                .unwrap();
        }
        let dropped = writer.dropped();
        assert!((20..=30).contains(&dropped), "{dropped} dropped");
        for _ in 0..40 {
            let _ = open.send(());
        }
        drop(guard);
        let out = String::from_utf8(got.lock().unwrap().clone()).unwrap();
        // Whole lines, in order, none twice, and every line not counted as dropped.
        let kept: Vec<&str> = out.lines().collect();
        assert_eq!(kept.len() as u64, 40 - dropped);
        assert!(kept.windows(2).all(|w| w[0] < w[1]), "{out}");
        assert!(
            kept.iter().all(|l| l.len() == 9 && l.starts_with("line ")),
            "{out}"
        );
    }
}
