//! Text that is not TOML or does not fit the schema: errors carry a `file:line:col` counted
//! in characters, and every error displays as one line.

use super::{with_route_keys, BASE};
use crate::config::locate::{key_at, line_col};
use crate::config::{Config, ConfigError};

fn syntax(text: &str) -> (usize, usize, String) {
    match Config::from_toml(text, "t.toml") {
        Err(ConfigError::Syntax {
            source_name,
            line,
            col,
            message,
        }) => {
            assert_eq!(source_name, "t.toml");
            (line, col, message)
        }
        other => panic!("expected a syntax error, got {other:?}"),
    }
}

#[test]
fn toml_syntax_error_location() {
    let text = format!("{BASE}budget = \"8s\n");
    let (line, col, message) = syntax(&text);
    assert_eq!((line, col), (12, 13), "{message}");
    assert!(
        !message.contains('\n') && !message.contains('^'),
        "{message}"
    );
    let shown = Config::from_toml(&text, "t.toml").unwrap_err().to_string();
    assert!(shown.starts_with("t.toml:12:13: "), "{shown}");
}

#[test]
fn unknown_keys_are_located() {
    let (line, col, message) = syntax(&with_route_keys("  first_token_timout = \"5s\""));
    assert_eq!((line, col), (12, 3));
    assert!(
        message.starts_with(
            "`routes[0].first_token_timout`: unknown field `first_token_timout`, expected one of"
        ),
        "{message}"
    );

    let (line, col, message) = syntax(&format!(
        "[server]\nlisten = \"127.0.0.1:1\"\nport = 1\n{BASE}"
    ));
    assert_eq!((line, col), (3, 1));
    assert!(
        message.starts_with("`server.port`: unknown field `port`"),
        "{message}"
    );

    let (line, col, _) = syntax(&format!("[defaults]\ntimeout = \"1s\"\n{BASE}"));
    assert_eq!((line, col), (2, 1));

    let (line, col, _) = syntax(&format!(
        "{BASE}[upstreams.extra]\nurl = \"http://a\"\nkey = \"k\"\n"
    ));
    assert_eq!((line, col), (14, 1));

    let (line, col, message) = syntax(&format!("routing = 1\n{BASE}"));
    assert_eq!((line, col), (1, 1));
    assert!(
        message.starts_with("`routing`: unknown field `routing`"),
        "{message}"
    );
}

#[test]
fn bad_values_are_located() {
    let (line, col, message) = syntax(&with_route_keys("budget = \"8 parsecs\""));
    assert_eq!((line, col), (12, 10));
    assert!(
        message
            .starts_with("`routes[0].budget`: invalid duration \"8 parsecs\": unknown time unit"),
        "{message}"
    );

    // Audit K4: said as such, not as humantime's "expected number at 0".
    let (_, _, message) = syntax(&with_route_keys("budget = \"-5s\""));
    assert_eq!(
        message,
        "`routes[0].budget`: invalid duration \"-5s\": durations cannot be negative"
    );

    let (line, col, message) = syntax(&with_route_keys("budget = 8"));
    assert_eq!((line, col), (12, 10));
    assert_eq!(
        message,
        "`routes[0].budget`: invalid type: integer `8`, expected a duration string such as \"250ms\", \"8s\" or \"10m\""
    );

    let (line, col, message) = syntax(&format!("[server]\nlisten = \"localhost:80\"\n{BASE}"));
    assert_eq!((line, col), (2, 10));
    assert_eq!(
        message,
        "`server.listen`: invalid socket address \"localhost:80\": expected IP:port such as \"127.0.0.1:8080\""
    );

    let text = BASE.replace("auth = \"x-api-key\"", "auth = \"basic\"");
    let (line, col, message) = syntax(&text);
    assert_eq!((line, col), (6, 8));
    assert_eq!(
        message,
        "`upstreams.anthropic.auth`: unknown variant `basic`, expected one of `bearer`, `x-api-key`, `api-key`, `x-goog-api-key`, `none`"
    );
}

#[test]
fn columns_count_characters_not_bytes() {
    assert_eq!(line_col("ab\ncé=x", 6), (2, 3));
    assert_eq!(line_col("", 0), (1, 1));
    assert_eq!(line_col("abc", 99), (1, 4));
    // Inside a multi-byte char: clamp back to its start.
    assert_eq!(line_col("é", 1), (1, 1));
}

/// Audit IB 6: a UTF-8 byte order mark (Windows editors write one) is no column, and does not
/// hide the first table's header from the key an error names.
#[test]
fn a_byte_order_mark_is_no_column_and_no_part_of_the_first_header() {
    let (line, col, message) = syntax("\u{feff}[server]\r\nmax_headers = \"x\"\r\n");
    assert_eq!((line, col), (2, 15));
    assert!(
        message.starts_with("`server.max_headers`: invalid type"),
        "{message}"
    );
    let (line, col, _) = syntax("\u{feff}[[server]]\n");
    assert_eq!((line, col), (1, 1));
}

#[test]
fn errors_display_their_shape() {
    let e = ConfigError::Syntax {
        source_name: "a.toml".into(),
        line: 3,
        col: 7,
        message: "boom".into(),
    };
    assert_eq!(e.to_string(), "a.toml:3:7: boom");
    let e = ConfigError::Invalid {
        source_name: "a.toml".into(),
        message: "bad".into(),
    };
    assert_eq!(e.to_string(), "a.toml: bad");
}

#[test]
fn a_value_of_the_wrong_type_names_its_key() {
    let (_, _, message) = syntax(&format!("[defaults]\nbudget = 5\n{BASE}"));
    assert!(
        message.starts_with("`defaults.budget`: invalid type: integer `5`"),
        "{message}"
    );
    let (line, _, message) = syntax(&with_route_keys("  retries = \"two\""));
    assert_eq!(line, 12);
    assert!(
        message.starts_with("`routes[0].retries`: invalid type"),
        "{message}"
    );
    // Audit ME 6: which route, and the key inside an inline table.
    let (line, _, message) = syntax(&format!(
        "{BASE}\n[[routes]]\nname = \"b\"\npath_prefix = \"/b\"\nupstream = \"openai\"\nbudget = 8\n"
    ));
    assert_eq!(line, 17);
    assert!(
        message.starts_with("`routes[1].budget`: invalid type"),
        "{message}"
    );
    let (_, _, message) = syntax(&format!("server = {{ max_headers = \"x\" }}\n{BASE}"));
    assert!(
        message.starts_with("`server.max_headers`: invalid type"),
        "{message}"
    );
    assert_eq!(
        key_at("a = { b = 1, c = { d = [1, 2], e = x } }\n", 36).as_deref(),
        Some("a.c.e")
    );
    assert_eq!(
        key_at("a = { b = \"{,=\", c = x }\n", 21).as_deref(),
        Some("a.c")
    );
    // A key itself, a header, or a line without `=` name nothing more.
    assert_eq!(key_at("[a]\nb = 1\n", 4), None);
    assert_eq!(key_at("[a]\nb = 1\n", 1), None);
    assert_eq!(key_at("x = [\n  1,\n]\n", 9), None);
    assert_eq!(key_at("x = 1\n", 4).as_deref(), Some("x"));
    assert_eq!(
        key_at("[[routes]]\n# c\nname = 1\n", 22).as_deref(),
        Some("routes[0].name")
    );
    assert_eq!(
        key_at("[u.\"a b\"]\nk = é\n", 16).as_deref(),
        Some("u.\"a b\".k")
    );
}

/// Audit K2: a table written as an array of tables (or `[routes]` for `[[routes]]`) is said
/// to be that, naming the table; a derived struct took the sequence and reported its first
/// field's type ("expected an IP:port string"), naming no key.
#[test]
fn a_table_written_as_an_array_of_tables_says_so() {
    let array =
        |h: &str| format!("`{h}` must be a table ([{h}]), not an array of tables ([[{h}]])");
    for (text, at, want) in [
        (
            format!("[[server]]\nlisten = \"127.0.0.1:1\"\n{BASE}"),
            (1, 1),
            array("server"),
        ),
        (
            format!("[[defaults]]\nbudget = \"8s\"\n{BASE}"),
            (1, 1),
            array("defaults"),
        ),
        (
            format!("[[runs]]\nttl = \"1m\"\n{BASE}"),
            (1, 1),
            array("runs"),
        ),
        (
            format!("[server]\n[[server.tls]]\ncert = \"c.pem\"\nkey = \"k.pem\"\n{BASE}"),
            (2, 1),
            array("server.tls"),
        ),
        (
            BASE.replace("[upstreams.openai]", "[[upstreams.openai]]"),
            (1, 1),
            array("upstreams.openai"),
        ),
        (
            BASE.replace("[[routes]]", "[routes]"),
            (8, 1),
            "`routes` must be an array of tables ([[routes]], one per route), not a table \
             ([routes])"
                .to_owned(),
        ),
    ] {
        let (line, col, message) = syntax(&text);
        assert_eq!(message, want, "{text}");
        assert_eq!((line, col), at, "{message}");
    }
    // Another type than a table still says what is expected.
    let (_, _, message) = syntax(&format!("server = 5\n{BASE}"));
    assert_eq!(
        message,
        "`server`: invalid type: integer `5`, expected a table ([server])"
    );
}

/// Audit ME 6: a `retry_on` entry that is no failure's name says which value it was and
/// which names are accepted; it was "wanted string or table", naming neither.
#[test]
fn a_bad_retry_on_entry_names_itself_and_the_accepted_ones() {
    let accepted = "expected one of \"connect\", \"first_token\", \"5xx\", \"429\", \"reset\"";
    for (entry, said) in [
        ("3", "invalid type: integer `3`"),
        ("429", "invalid type: integer `429`"),
        ("\"5XX\"", "unknown failure \"5XX\""),
    ] {
        let (line, _, message) =
            syntax(&with_route_keys(&format!("retry_on = [\"5xx\", {entry}]")));
        assert_eq!(line, 12);
        assert_eq!(
            message,
            format!("`routes[0].retry_on`: {said}, {accepted}"),
            "{entry}"
        );
    }
}

/// Audit NB 7: an unknown key is located by the key itself, before its `=`, where the path
/// of a value was not looked for: `unknown field `budegt`` did not say which route, nor an
/// inline table's key which table.
#[test]
fn unknown_keys_name_their_table() {
    let (_, _, message) = syntax(&format!(
        "{BASE}\n[[routes]]\nname = \"b\"\npath_prefix = \"/b\"\nupstream = \"openai\"\nbudegt = \"5s\"\n"
    ));
    assert!(
        message.starts_with("`routes[1].budegt`: unknown field `budegt`, expected one of"),
        "{message}"
    );
    let (_, _, message) = syntax(
        "upstreams = { e = { url = \"http://a\", retries = \"3\" } }\n\
         [[routes]]\nname = \"r\"\npath_prefix = \"/\"\nupstream = \"e\"\n",
    );
    assert!(
        message.starts_with("`upstreams.e.retries`: unknown field `retries`"),
        "{message}"
    );
    let (_, _, message) = syntax(&format!("routing = 1\n{BASE}"));
    assert!(
        message.starts_with("`routing`: unknown field `routing`"),
        "{message}"
    );
}
