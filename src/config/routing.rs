//! Which requests a route takes: the path-prefix and model-glob rules of [`Route::matches`],
//! and [`shadows`], the check built on them that finds routes an earlier route makes
//! unreachable.

use super::Route;

impl Route {
    /// Whether a request for `path` (which may carry a `?query`) with body
    /// model `model` belongs to this route.
    ///
    /// The prefix only matches on a segment boundary, so that `/v1/chat` does
    /// not capture `/v1/chatter`: the path must equal the prefix, or continue
    /// it with `/` or `?`, or the prefix itself must end in `/`. So
    /// `/v1/chat` matches `/v1/chat`, `/v1/chat/x` and `/v1/chat?x` but not
    /// `/v1/chatter`; `/v1/chat/` matches `/v1/chat/x` but not `/v1/chat`.
    ///
    /// When [`Route::models`] is non-empty the model must be present and match
    /// at least one glob; a request without a model then never matches.
    pub fn matches(&self, path: &str, model: Option<&str>) -> bool {
        if !prefix_matches(&self.path_prefix, path) {
            return false;
        }
        if self.models.is_empty() {
            return true;
        }
        match model {
            Some(model) => self.models.iter().any(|glob| glob_match(glob, model)),
            None => false,
        }
    }

    /// Whether the path alone could select this route (its models aside): the routes the
    /// router must consider before it has read the body.
    pub fn matches_path(&self, path: &str) -> bool {
        prefix_matches(&self.path_prefix, path)
    }

    /// Whether [`Route::matches`] depends on the body's model, i.e. whether the
    /// router must read and parse the body before it can decide on this route.
    pub fn needs_model(&self) -> bool {
        !self.models.is_empty()
    }
}

fn prefix_matches(prefix: &str, path: &str) -> bool {
    match path.strip_prefix(prefix) {
        Some(rest) => prefix.ends_with('/') || rest.is_empty() || rest.starts_with(['/', '?']),
        None => false,
    }
}

/// Case-sensitive glob match of the whole of `text` against `pattern`, where
/// `*` matches any run of characters (including none), `?` exactly one
/// character, and everything else itself. There is no escaping: model names
/// do not contain `*` or `?`.
///
/// Runs in O(len(pattern) × len(text)) time without recursion or allocation,
/// because patterns come from config but text comes from clients.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    glob(pattern, text, |pc, tc| pc == '?' || pc == tc)
}

/// Whether glob `wide` matches every model glob `narrow` matches: `ft*` covers `ftx`,
/// `ft-?` and `ftfb*`; `ft?` covers `ft?` but not `ft*`. `narrow` is read as text whose `?`
/// and `*` stand for what they match: its `?` only `wide`'s `?` or `*` can take, its `*`
/// only `wide`'s `*`. Never true when some model would match `narrow` and not `wide`.
pub fn glob_covers(wide: &str, narrow: &str) -> bool {
    glob(wide, narrow, |wc, nc| nc != '*' && (wc == '?' || wc == nc))
}

/// The glob matcher of both: `one` says whether a pattern character other than `*` takes a
/// character of the text.
#[inline]
fn glob(pattern: &str, text: &str, one: impl Fn(char, char) -> bool) -> bool {
    // Byte offsets, always on char boundaries because they only ever advance
    // by `len_utf8` of the char found there.
    let (mut p, mut t) = (0usize, 0usize);
    // Where to resume after the most recent `*`: pattern offset just past it,
    // and the text offset it is currently assumed to have consumed up to.
    // Only the latest star needs remembering: whatever extra text an earlier
    // star might absorb, the later star can absorb instead, so backtracking
    // further never finds a match this misses. That is what keeps it linear
    // in the number of stars rather than exponential.
    let mut resume: Option<(usize, usize)> = None;
    while let Some(tc) = text[t..].chars().next() {
        match pattern[p..].chars().next() {
            Some('*') => {
                p += 1;
                resume = Some((p, t));
                continue;
            }
            Some(pc) if one(pc, tc) => {
                p += pc.len_utf8();
                t += tc.len_utf8();
                continue;
            }
            _ => {}
        }
        match resume {
            Some((star_p, star_t)) => {
                // Let the star swallow one more character and retry.
                let swallowed = text[star_t..].chars().next().map_or(1, char::len_utf8);
                p = star_p;
                t = star_t + swallowed;
                resume = Some((star_p, t));
            }
            None => return false,
        }
    }
    pattern[p..].chars().all(|c| c == '*')
}

/// Whether `earlier` catches every request `later` could, making `later`
/// dead under first-match routing. Conservative: only flags certain cases.
pub(super) fn shadows(earlier: &Route, later: &Route) -> bool {
    // If the earlier prefix accepts the later prefix itself, it accepts every
    // path the later one does: the boundary the later prefix needs lies past
    // the earlier prefix's end.
    if !prefix_matches(&earlier.path_prefix, &later.path_prefix) {
        return false;
    }
    if earlier.models.is_empty() {
        return true;
    }
    // A model-less later route also takes requests without a model, which a
    // model-filtered earlier route never does.
    !later.models.is_empty()
        && later
            .models
            .iter()
            .all(|g| earlier.models.iter().any(|e| glob_covers(e, g)))
}
