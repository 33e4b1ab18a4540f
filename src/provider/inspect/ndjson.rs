//! The end of an NDJSON answer (`application/x-ndjson`: Ollama's `/api/chat` and
//! `/api/generate`), read as its lines pass: the line whose top-level `done` is `true` is its
//! last, and the answer is whole once that line has ended.
//!
//! Only that is read. A line is followed just far enough to tell a top-level member from a
//! nested one (a tool call's `arguments` may well hold a `done`) and a key from a string's
//! content: nesting depth, strings and their escapes, and the one key. Strings that are no
//! top-level key are skipped to their next quote or backslash at once; a line end outside a
//! string ends the line, whatever came before it (NDJSON has no line breaks inside a record),
//! so a garbled line never spoils the next. Nothing is allocated, and only NDJSON answers
//! are read so (decided once, from their head).

use memchr::memchr2;

/// Whether a request to `path` (its query allowed) is one of Ollama's calls whose NDJSON
/// answer ends at its `"done": true` line (`/api/chat`, `/api/generate`). Any other NDJSON
/// body (a file's content, Ollama's `/api/pull` progress) may well hold such a line before
/// its end: read so, its rest was dropped from a clean 200 once the upstream paused after it
/// (break audit ZC 1: 20 of 61 bytes of a file passed, logged `ok`).
pub fn ends_at_done(path: &str) -> bool {
    let path = path.split('?').next().unwrap_or_default();
    let path = path.trim_end_matches('/');
    path.ends_with("/api/chat") || path.ends_with("/api/generate")
}

const DONE: &[u8] = b"done";
const TRUE: &[u8] = b"true";

/// Where a top-level member's value stands, as far as `done` goes.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Member {
    /// Not the `done` key, or its value is something else.
    #[default]
    Other,
    /// The key `"done"` was read; its colon comes next.
    Key,
    /// After `"done":`: its value comes next.
    Value,
    /// This many bytes of `true` matched.
    True(u8),
}

/// The reader of one NDJSON answer: whether its `"done": true` line has ended.
#[derive(Debug, Default, Clone)]
pub struct NdjsonEnd {
    depth: u32,
    in_str: bool,
    escaped: bool,
    /// At depth 1, the next string is a key.
    expect_key: bool,
    /// In a top-level key: how many of its bytes matched `done` so far, `None` once one
    /// differed (or it grew longer).
    key: Option<u8>,
    member: Member,
    /// The line being read has `"done": true`.
    line_done: bool,
    /// That line ended: the answer is whole. Nothing after it is read.
    over: bool,
}

impl NdjsonEnd {
    pub fn new() -> Self {
        Self::default()
    }

    /// The line with `"done": true` has ended: the answer is whole.
    pub fn over(&self) -> bool {
        self.over
    }

    /// Reads the next piece of the body. Pieces may split it anywhere.
    pub fn read(&mut self, chunk: &[u8]) {
        let mut i = 0;
        while i < chunk.len() && !self.over {
            if self.in_str {
                i += self.string(&chunk[i..]);
                continue;
            }
            let b = chunk[i];
            i += 1;
            match b {
                b'\n' => {
                    self.over = self.line_done;
                    *self = Self {
                        over: self.over,
                        ..Self::default()
                    };
                }
                b'"' => {
                    self.in_str = true;
                    self.key = (self.depth == 1 && self.expect_key).then_some(0);
                }
                b'{' | b'[' => {
                    self.depth = self.depth.saturating_add(1);
                    self.expect_key = self.depth == 1 && b == b'{';
                    self.member = Member::Other;
                }
                b'}' | b']' => self.depth = self.depth.saturating_sub(1),
                b' ' | b'\t' | b'\r' => {}
                _ if self.depth != 1 => {}
                b',' => {
                    self.expect_key = true;
                    self.member = Member::Other;
                }
                b':' => {
                    self.expect_key = false;
                    self.member = match self.member {
                        Member::Key => Member::Value,
                        _ => Member::Other,
                    };
                }
                _ => {
                    self.member = match self.member {
                        Member::Value if b == TRUE[0] => Member::True(1),
                        Member::True(n) if TRUE.get(usize::from(n)) == Some(&b) => {
                            if usize::from(n) + 1 == TRUE.len() {
                                self.line_done = true;
                            }
                            Member::True(n + 1)
                        }
                        // `truex` is no `true`, though JSON that says so is not Ollama's.
                        Member::True(_) => {
                            self.line_done = false;
                            Member::Other
                        }
                        _ => Member::Other,
                    };
                }
            }
        }
    }

    /// Reads on in the open string from the start of `s`; returns how much it took.
    fn string(&mut self, s: &[u8]) -> usize {
        if self.escaped {
            self.escaped = false;
            // An escape in a key: it is no `done`.
            self.key = None;
            return 1;
        }
        let Some(j) = memchr2(b'"', b'\\', s) else {
            self.key_bytes(s);
            return s.len();
        };
        self.key_bytes(&s[..j]);
        if s[j] == b'\\' {
            self.escaped = true;
        } else {
            self.in_str = false;
            if let Some(n) = self.key.take() {
                self.member = if usize::from(n) == DONE.len() {
                    Member::Key
                } else {
                    Member::Other
                };
            }
        }
        j + 1
    }

    /// More bytes of the open top-level key.
    fn key_bytes(&mut self, bytes: &[u8]) {
        if let Some(n) = self.key {
            let from = usize::from(n);
            let fits = DONE.get(from..from + bytes.len()) == Some(bytes);
            // At most four: `fits` holds only within `done`.
            self.key = fits.then(|| n + bytes.len() as u8);
        }
    }
}

#[cfg(test)]
mod tests;
