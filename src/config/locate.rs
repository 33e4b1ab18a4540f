//! Where in the config text a problem is: `file:line:col` counted in characters (past a
//! leading BOM), and the dotted key the offset falls under, so that a TOML error names the
//! key as the schema errors do.

use super::secrets::scrub;
use super::ConfigError;

pub(super) fn syntax_error(text: &str, source: &str, err: &toml::de::Error) -> ConfigError {
    // `message()` is already free of the snippet and caret that Display adds.
    // Some parser messages span lines ("invalid array\nexpected `]`"); keep
    // the Display to one line so it reads well in logs.
    let message = err
        .message()
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(", ");
    let message = scrub(&message);
    match err.span() {
        Some(span) => {
            let (line, col) = line_col(text, span.start);
            // A value of the wrong type is located by its value: say whose it is.
            let message = match key_at(text, span.start).or_else(|| key_named_at(text, span.start))
            {
                Some(key) => format!("`{key}`: {message}"),
                None => message,
            };
            ConfigError::Syntax {
                source_name: source.to_owned(),
                line,
                col,
                message,
            }
        }
        // Without a span there is no honest location to print.
        None => ConfigError::Invalid {
            source_name: source.to_owned(),
            message,
        },
    }
}

/// The dotted key whose value holds byte `offset` of `text`, when the offset lies after the
/// `=` of a `key = value` line: the table header above it (`routes[1]` for the second
/// `[[routes]]`), any inline tables the value sits in (`server = { max_headers = "x" }` is
/// `server.max_headers`), and the key. None elsewhere (a header, a key itself, the later
/// lines of a multi-line value). Audit ME 6: `routes.budget` did not say which route, and an
/// inline table named only its own key.
pub(super) fn key_at(text: &str, offset: usize) -> Option<String> {
    let (text, offset) = past_bom(text, offset);
    let mut end = offset.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let line_start = text[..end].rfind('\n').map_or(0, |i| i + 1);
    let mut path = inline_keys(&text[line_start..end])?;
    if path[0].is_empty() || path[0].starts_with(['#', '[']) {
        return None;
    }
    let above = || text[..line_start].lines().rev().map(str::trim);
    let table = above().find(|l| l.starts_with('[')).and_then(|header| {
        let name = header.trim_start_matches('[').split(']').next()?.trim();
        if name.is_empty() {
            return None;
        }
        if !header.starts_with("[[") {
            return Some(name.to_owned());
        }
        // An array of tables: which one, by the headers of its name above.
        let count = above()
            .filter(|l| {
                l.strip_prefix("[[")
                    .and_then(|l| l.split("]]").next())
                    .is_some_and(|n| n.trim() == name)
            })
            .count();
        Some(format!("{name}[{}]", count.saturating_sub(1)))
    });
    if let Some(t) = table {
        path.insert(0, t);
    }
    Some(path.join("."))
}

/// The dotted key of the key that starts at byte `offset` (an unknown key is located by
/// the key itself, before its `=`): the path its value would have. Audit NB 7:
/// `unknown field `budegt`` did not say which `[[routes]]` entry, nor which inline table.
fn key_named_at(text: &str, offset: usize) -> Option<String> {
    let line = text.get(offset..)?.lines().next()?;
    let eq = line.find('=')?;
    key_at(text, offset + eq + 1)
}

/// The keys of a line's text up to a value: the line's own key, then the key of each
/// inline table still open, innermost last. None without an `=`.
fn inline_keys(line: &str) -> Option<Vec<String>> {
    let mut open: Vec<String> = Vec::new();
    let mut key: Option<String> = None;
    let mut from = 0;
    let mut quote: Option<char> = None;
    let mut escaped = false;
    let mut arrays = 0usize;
    for (i, c) in line.char_indices() {
        if let Some(q) = quote {
            if c == q && !escaped {
                quote = None;
            }
            escaped = q == '"' && c == '\\' && !escaped;
            continue;
        }
        match c {
            '"' | '\'' => quote = Some(c),
            '[' => arrays += 1,
            ']' => arrays = arrays.saturating_sub(1),
            _ if arrays > 0 => {}
            '=' => key = Some(line[from..i].trim().to_owned()),
            '{' => {
                open.push(key.take()?);
                from = i + 1;
            }
            '}' => {
                open.pop();
                key = None;
            }
            ',' => {
                key = None;
                from = i + 1;
            }
            _ => {}
        }
    }
    open.push(key?);
    Some(open)
}

/// `text` after a UTF-8 byte order mark, and `offset` moved with it: the mark is no column,
/// and hid the first header from `key_at` (audit IB 6; Windows editors write one).
fn past_bom(text: &str, offset: usize) -> (&str, usize) {
    match text.strip_prefix('\u{feff}') {
        Some(rest) => (rest, offset.saturating_sub('\u{feff}'.len_utf8())),
        None => (text, offset),
    }
}

/// 1-based line and character column of byte `offset` in `text`.
pub(super) fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let (text, offset) = past_bom(text, offset);
    let mut end = offset.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let before = &text[..end];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let col = before[line_start..].chars().count() + 1;
    (line, col)
}
