//! A [`Decision`] becomes HTTP header fields (docs/clients.md, "Headers"):
//! the IETF draft's `RateLimit-Policy` / `RateLimit` (one policy per tier), the
//! draft-06 `RateLimit-Limit` / `-Remaining` / `-Reset`, or both; and
//! `Retry-After` on a rejection that can fit later. Seconds always round up.

use std::time::Duration;

use http::header::{HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};

use crate::decision::{Decision, MultiDecision, Via};

/// Which header fields to write.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Style {
    /// draft-ietf-httpapi-ratelimit-headers-09/10: `RateLimit-Policy` and
    /// `RateLimit`, one policy per tier, in order (the default).
    #[default]
    Ietf,
    /// The draft-06 fields of the binding tier: `RateLimit-Limit`,
    /// `RateLimit-Remaining`, `RateLimit-Reset`.
    Legacy,
    /// Both sets.
    Both,
}

pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
pub const RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("ratelimit-limit");
pub const RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("ratelimit-remaining");
pub const RATELIMIT_RESET: HeaderName = HeaderName::from_static("ratelimit-reset");

/// Whole seconds, rounded up: rounding down tells a client to come back
/// before its request can fit.
pub fn ceil_seconds(duration: Duration) -> u64 {
    let ms = u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
    ms / 1000 + u64::from(ms % 1000 != 0)
}

/// A policy's default name: `<limit>-in-<s>s` when the window is a whole
/// number of seconds, else `<limit>-in-<ms>ms` (`"5-in-60s"`, `"3-in-1500ms"`).
pub fn policy_name(limit: u64, window: Duration) -> String {
    let ms = window.as_millis();
    if ms.is_multiple_of(1000) {
        format!("{limit}-in-{}s", ms / 1000)
    } else {
        format!("{limit}-in-{ms}ms")
    }
}

impl Decision {
    /// The header fields of this decision, policies named by default.
    pub fn headers(&self, style: Style) -> HeaderMap {
        self.headers_named::<&str>(style, &[])
    }

    /// The same, with one name per tier (missing ones take the default name).
    /// Two tiers with the same limit and window get the same default name:
    /// pass names to tell them apart.
    pub fn headers_named<S: AsRef<str>>(&self, style: Style, names: &[S]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        if self.via == Via::Error {
            return headers;
        }
        write_headers(&mut headers, style, &[(self, names_of(names))], self);
        headers
    }
}

impl MultiDecision {
    /// Every sent decision's policies in request order; the legacy fields and
    /// `Retry-After` are the binding decision's.
    pub fn headers(&self, style: Style) -> HeaderMap {
        self.headers_named::<&[&str], &str>(style, &[])
    }

    /// The same, with `names[j]` naming request *j*'s tiers.
    pub fn headers_named<N: AsRef<[S]>, S: AsRef<str>>(&self, style: Style, names: &[N]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        if self.decisions.is_empty() || self.decisions.iter().any(|d| d.via == Via::Error) {
            return headers;
        }
        let parts: Vec<(&Decision, Vec<&str>)> = self
            .decisions
            .iter()
            .enumerate()
            .map(|(j, d)| (d, names.get(j).map(|n| names_of(n.as_ref())).unwrap_or_default()))
            .collect();
        write_headers(&mut headers, style, &parts, self.binding());
        headers
    }
}

fn names_of<S: AsRef<str>>(names: &[S]) -> Vec<&str> {
    names.iter().map(AsRef::as_ref).collect()
}

fn write_headers(headers: &mut HeaderMap, style: Style, parts: &[(&Decision, Vec<&str>)], binding: &Decision) {
    if matches!(style, Style::Ietf | Style::Both) {
        let (mut policy, mut state) = (Vec::new(), Vec::new());
        for (decision, names) in parts {
            for (i, (window, limit, remaining, reset_after)) in decision.policies().into_iter().enumerate() {
                let name = names
                    .get(i)
                    .map_or_else(|| policy_name(limit, window), |n| n.to_string());
                let name = quoted(&name);
                policy.push(format!("{name};q={limit};w={}", ceil_seconds(window)));
                state.push(format!("{name};r={remaining};t={}", ceil_seconds(reset_after)));
            }
        }
        headers.insert(RATELIMIT_POLICY, value(policy.join(", ")));
        headers.insert(RATELIMIT, value(state.join(", ")));
    }
    if matches!(style, Style::Legacy | Style::Both) {
        headers.insert(RATELIMIT_LIMIT, HeaderValue::from(binding.limit));
        headers.insert(RATELIMIT_REMAINING, HeaderValue::from(binding.remaining));
        headers.insert(RATELIMIT_RESET, HeaderValue::from(ceil_seconds(binding.reset_after)));
    }
    if let (false, Some(retry_after)) = (binding.allowed, binding.retry_after) {
        if !retry_after.is_zero() {
            headers.insert(RETRY_AFTER, HeaderValue::from(ceil_seconds(retry_after).max(1)));
        }
    }
}

/// A structured-field string: `"` and `\` escaped, and anything a header
/// value can't carry (controls, non-ASCII) replaced by `?`.
fn quoted(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 2);
    out.push('"');
    for c in name.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => out.push('?'),
        }
    }
    out.push('"');
    out
}

fn value(text: String) -> HeaderValue {
    // Only printable ASCII is written above.
    HeaderValue::from_str(&text).expect("printable ASCII header value")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_round_up_and_names_follow_the_window() {
        assert_eq!(
            [0, 1, 999, 1000, 1001, 60_200].map(|ms| ceil_seconds(Duration::from_millis(ms))),
            [0, 1, 1, 1, 2, 61]
        );
        assert_eq!(policy_name(5, Duration::from_secs(60)), "5-in-60s");
        assert_eq!(policy_name(3, Duration::from_millis(1500)), "3-in-1500ms");
        assert_eq!(quoted("a \"b\" \\ é"), r#""a \"b\" \\ ?""#);
    }
}
