//! The sliding-window log decision, in plain Rust.
//!
//! A window is a log of admitted requests, one entry per unit of cost, each
//! stamped with the millisecond it was admitted. An entry is *live* at `now`
//! while its stamp is greater than `now - window`. `ALLOW` drops the entries
//! that are no longer live, then admits iff `live + cost <= limit`, recording
//! `cost` entries at `now`; `PEEK` takes the same decision without writing.
//!
//! The storage is behind [`Log`], so this file is tested against an in-memory
//! log and runs unchanged over a Redis sorted set (`zset.rs`).

use crate::args::Request;

/// The storage a window needs: an ordered multiset of millisecond stamps.
pub trait Log {
    /// Number of entries, live or not.
    fn len(&self) -> u64;
    /// Number of entries with a stamp `<= cutoff_ms` (no longer live).
    fn count_expired(&self, cutoff_ms: i64) -> u64;
    /// Removes every entry with a stamp `<= cutoff_ms`; returns how many went.
    fn trim(&mut self, cutoff_ms: i64) -> u64;
    /// Stamp of the `n`-th (1-based) oldest entry stamped `> cutoff_ms`.
    fn nth_live(&self, cutoff_ms: i64, n: u64) -> Option<i64>;
    /// Stamp of the newest entry.
    fn newest(&self) -> Option<i64>;
    /// Appends `cost` entries stamped `now_ms`.
    fn record(&mut self, now_ms: i64, cost: u64);
}

/// What a call decided, with the fields of the `DETAILS` reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    pub limit: i64,
    /// `limit` minus the live entries after this call, never below 0.
    pub remaining: i64,
    /// 0 if allowed; -1 if `cost > limit` (never admissible); otherwise the
    /// milliseconds until enough of the oldest entries leave for `cost` to fit.
    pub retry_after_ms: i64,
    /// Milliseconds until the window is empty; 0 if it already is.
    pub reset_after_ms: i64,
}

/// `XCLOAK.ALLOW`: trims, decides, and records on admission. The detail fields
/// are computed only when `details` is set (they cost extra lookups).
pub fn allow<L: Log>(log: &mut L, request: &Request, now_ms: i64, details: bool) -> Decision {
    let cutoff_ms = now_ms - request.window_ms;
    log.trim(cutoff_ms);
    let live = log.len();
    let allowed = fits(live, request);
    if allowed {
        log.record(now_ms, request.cost as u64);
    }
    let live_after = if allowed { live + request.cost as u64 } else { live };
    if details {
        describe(log, request, now_ms, allowed, live, live_after)
    } else {
        Decision { allowed, limit: request.limit, remaining: 0, retry_after_ms: 0, reset_after_ms: 0 }
    }
}

/// `XCLOAK.PEEK`: the decision `allow` would take at `now_ms`, writing nothing.
pub fn peek<L: Log>(log: &L, request: &Request, now_ms: i64) -> Decision {
    let cutoff_ms = now_ms - request.window_ms;
    let live = log.len() - log.count_expired(cutoff_ms);
    let allowed = fits(live, request);
    describe(log, request, now_ms, allowed, live, live)
}

fn fits(live: u64, request: &Request) -> bool {
    live + request.cost as u64 <= request.limit as u64
}

fn describe<L: Log>(
    log: &L,
    request: &Request,
    now_ms: i64,
    allowed: bool,
    live_before: u64,
    live_after: u64,
) -> Decision {
    let cutoff_ms = now_ms - request.window_ms;
    let limit = request.limit;
    let remaining = (limit - live_after as i64).max(0);
    let retry_after_ms = if allowed {
        0
    } else if request.cost > limit {
        -1
    } else {
        // The entry whose departure makes room: with live entries sorted oldest
        // first, the (live + cost - limit)-th. It is live, so its stamp is above
        // the cutoff and the wait is at least 1 ms, even after a clock step back.
        let blocking = live_before + request.cost as u64 - limit as u64;
        log.nth_live(cutoff_ms, blocking)
            .map_or(0, |stamp| stamp + request.window_ms - now_ms)
    };
    let reset_after_ms = if live_after == 0 {
        0
    } else {
        log.newest().map_or(0, |stamp| (stamp + request.window_ms - now_ms).max(0))
    };
    Decision { allowed, limit, remaining, retry_after_ms, reset_after_ms }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The in-memory log: stamps kept sorted, as in a sorted set.
    #[derive(Default, Debug)]
    pub struct VecLog(pub Vec<i64>);

    impl Log for VecLog {
        fn len(&self) -> u64 {
            self.0.len() as u64
        }
        fn count_expired(&self, cutoff_ms: i64) -> u64 {
            self.0.iter().filter(|&&s| s <= cutoff_ms).count() as u64
        }
        fn trim(&mut self, cutoff_ms: i64) -> u64 {
            let before = self.0.len();
            self.0.retain(|&s| s > cutoff_ms);
            (before - self.0.len()) as u64
        }
        fn nth_live(&self, cutoff_ms: i64, n: u64) -> Option<i64> {
            self.0.iter().copied().filter(|&s| s > cutoff_ms).nth(n as usize - 1)
        }
        fn newest(&self) -> Option<i64> {
            self.0.last().copied()
        }
        fn record(&mut self, now_ms: i64, cost: u64) {
            let at = self.0.partition_point(|&s| s <= now_ms);
            self.0.splice(at..at, std::iter::repeat_n(now_ms, cost as usize));
        }
    }

    fn request(window_ms: i64, limit: i64, cost: i64) -> Request {
        Request { window_ms, limit, cost, now_ms: None, details: true }
    }

    #[test]
    fn admits_up_to_the_limit_then_rejects() {
        let mut log = VecLog::default();
        let r = request(1000, 3, 1);
        let allowed: Vec<bool> = (0..5).map(|i| allow(&mut log, &r, 100 + i, true).allowed).collect();
        assert_eq!(allowed, [true, true, true, false, false]);
        assert_eq!(log.0, [100, 101, 102]);
    }

    #[test]
    fn window_slides_entry_by_entry() {
        let mut log = VecLog::default();
        let r = request(1000, 2, 1);
        assert!(allow(&mut log, &r, 0, false).allowed);
        assert!(allow(&mut log, &r, 500, false).allowed);
        // At 999 the entry from 0 is still live (0 > 999 - 1000).
        assert!(!allow(&mut log, &r, 999, false).allowed);
        // At 1000 it leaves (0 <= 1000 - 1000), the one from 500 stays.
        assert!(allow(&mut log, &r, 1000, false).allowed);
        assert_eq!(log.0, [500, 1000]);
        assert!(!allow(&mut log, &r, 1499, false).allowed);
    }

    #[test]
    fn details_fields() {
        let mut log = VecLog::default();
        let r = request(1000, 3, 1);
        let first = allow(&mut log, &r, 100, true);
        assert_eq!(first, Decision { allowed: true, limit: 3, remaining: 2, retry_after_ms: 0, reset_after_ms: 1000 });
        allow(&mut log, &r, 200, true);
        allow(&mut log, &r, 300, true);
        let rejected = allow(&mut log, &r, 400, true);
        // The entry from 100 must leave: at 1100, 700 ms from now; empty at 1300.
        assert_eq!(rejected, Decision { allowed: false, limit: 3, remaining: 0, retry_after_ms: 700, reset_after_ms: 900 });
        // A cost of 2 needs the two oldest gone: the one from 200 leaves at 1200.
        let heavy = peek(&log, &request(1000, 3, 2), 400);
        assert_eq!(heavy.retry_after_ms, 800);
        assert_eq!(peek(&log, &request(1000, 3, 4), 400).retry_after_ms, -1);
    }

    #[test]
    fn cost_is_all_or_nothing() {
        let mut log = VecLog::default();
        assert!(allow(&mut log, &request(10, 5, 3), 0, false).allowed);
        assert!(!allow(&mut log, &request(10, 5, 3), 1, false).allowed);
        assert_eq!(log.len(), 3);
        assert!(allow(&mut log, &request(10, 5, 2), 1, false).allowed);
        assert_eq!(log.0, [0, 0, 0, 1, 1]);
    }

    #[test]
    fn peek_matches_allow_and_writes_nothing() {
        let mut log = VecLog(vec![0, 5, 9]);
        let r = request(10, 3, 1);
        let looked = peek(&log, &r, 12);
        assert_eq!(log.0, [0, 5, 9]);
        let done = allow(&mut log, &r, 12, true);
        assert_eq!(looked.allowed, done.allowed);
        assert_eq!(looked.retry_after_ms, done.retry_after_ms);
        assert_eq!(looked.remaining, done.remaining + 1, "allow consumed one");
    }

    #[test]
    fn limit_zero_rejects_and_empty_window_resets_to_zero() {
        let mut log = VecLog::default();
        let d = allow(&mut log, &request(10, 0, 1), 5, true);
        assert_eq!(d, Decision { allowed: false, limit: 0, remaining: 0, retry_after_ms: -1, reset_after_ms: 0 });
        assert_eq!(log.len(), 0);
    }

    #[test]
    fn clock_stepping_back_never_gives_negative_waits() {
        let mut log = VecLog::default();
        let r = request(100, 2, 1);
        allow(&mut log, &r, 1000, true);
        allow(&mut log, &r, 1050, true);
        // The clock steps back 500 ms: both entries are still live (in the future).
        let d = allow(&mut log, &r, 500, true);
        assert!(!d.allowed);
        assert!(d.retry_after_ms > 0 && d.reset_after_ms > 0, "{d:?}");
        assert_eq!(log.0, [1000, 1050], "nothing lost");
    }
}
