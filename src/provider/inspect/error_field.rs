//! llama.cpp's error event: a block with an `error` field and no `data` line, which its server
//! writes inside a 200 stream (`error: {"code":400,"message":"...","type":
//! "exceed_context_size_error"}`, a blank line). The WHATWG reading ignores a field it does not
//! know, as every SDK does, and the reason was lost (audit WB 2): the scanner hands the field's
//! value here (`EventSink::error_field`), and a block without data is read as the provider's
//! error. Gathered only when such a line comes: a stream without one costs nothing here.

use serde_json::Value;

use crate::provider::{error_type_of, ErrorType};

/// The most of a value kept. llama.cpp's is a line of a few hundred bytes; one past this is
/// read by its first bytes, as text (cut, it is no JSON), so an upstream cannot make the
/// gateway hold an error line of any size.
pub const MAX_ERROR_FIELD: usize = 16 << 10;

/// The value of the `error` lines of the open block, as they came (lines joined by `\n`).
#[derive(Debug, Clone, Default)]
pub struct ErrorField {
    value: Vec<u8>,
    /// Bytes past `MAX_ERROR_FIELD` were dropped.
    cut: bool,
}

/// What a block of an `error` field and no data says.
#[derive(Debug, Clone, PartialEq)]
pub struct FieldError {
    /// The error as the provider's data-only error event would carry it, `{"error":VALUE}`:
    /// a JSON object as it came, any other value as its text, so that the document rebuilt
    /// for a client that did not stream answers with its message and (a `code` that is an
    /// HTTP error status) its status.
    pub event: Value,
    /// The type it is counted by: named by its `type`, or its `code` as the HTTP status it
    /// is, as any provider error is (see `inspect::Reader::end_event`).
    pub kind: ErrorType,
    /// The provider's message: the object's `message`, else the value itself as text.
    pub message: String,
}

impl ErrorField {
    /// The next piece of the value (a line's end as `\n`).
    pub fn push(&mut self, piece: &[u8]) {
        let room = MAX_ERROR_FIELD - self.value.len();
        if piece.len() > room {
            self.cut = true;
        }
        self.value
            .extend_from_slice(&piece[..piece.len().min(room)]);
    }

    /// Reads the value. The space after the colon, and the line end, are trimmed with any
    /// other whitespace around it: JSON ignores them, and a message does not need them.
    pub fn read(self) -> FieldError {
        let text = String::from_utf8_lossy(&self.value);
        let text = text.trim();
        let parsed = if self.cut {
            None
        } else {
            serde_json::from_str::<Value>(text).ok()
        };
        match parsed {
            Some(Value::Object(object)) => {
                let message = match object.get("message") {
                    Some(Value::String(m)) => m.clone(),
                    _ => text.to_owned(),
                };
                let typed = object
                    .get("type")
                    .and_then(Value::as_str)
                    .and_then(|t| ErrorType::parse(t.as_bytes()));
                let code = object.get("code");
                let status = code.and_then(Value::as_u64);
                let named_code = code
                    .and_then(Value::as_str)
                    .and_then(|c| ErrorType::parse(c.as_bytes()));
                let kind = error_type_of(typed, status, named_code).unwrap_or(ErrorType::Other);
                FieldError {
                    event: serde_json::json!({ "error": object }),
                    kind,
                    message,
                }
            }
            Some(Value::String(message)) => FieldError {
                event: serde_json::json!({ "error": message }),
                kind: ErrorType::Other,
                message,
            },
            // Plain text, another JSON value, or a value cut: its text is the message.
            _ => {
                let message = if self.cut {
                    format!("{text}... (cut at {MAX_ERROR_FIELD} bytes)")
                } else {
                    text.to_owned()
                };
                FieldError {
                    event: serde_json::json!({ "error": message }),
                    kind: ErrorType::Other,
                    message,
                }
            }
        }
    }
}
