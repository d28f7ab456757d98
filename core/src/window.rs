//! The sliding-window log decision, in plain Rust.
//!
//! A window is a log of admitted requests, one entry per unit of cost, each
//! stamped with the millisecond it was admitted. An entry is *live* in a tier
//! `(window, limit)` at `now` while its stamp is greater than `now - window`.
//! One log serves every tier of a call: `ALLOW` drops the entries that are no
//! longer live in the longest window, then admits iff `live_i + cost <= limit_i`
//! in every tier `i`, recording `cost` entries at `now` once; `PEEK` takes the
//! same decision without writing. A call without `TIER` is the one-tier case.
//!
//! The storage is behind [`Log`], so this file is tested against an in-memory
//! log and runs unchanged over a Redis sorted set (`zset.rs`).

use crate::args::{Request, Tier, MAX_TIERS};

/// The storage a window needs: an ordered multiset of millisecond stamps.
pub trait Log {
    /// Number of entries, live or not.
    fn len(&self) -> u64;
    /// Whether the log holds no entry.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
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
    /// Removes up to `count` entries stamped exactly `stamp_ms` (the newest
    /// of them first where entries are told apart); returns how many went.
    fn remove_at(&mut self, stamp_ms: i64, count: u64) -> u64;
}

/// One tier's fields of the `DETAILS` reply.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TierFields {
    pub window_ms: i64,
    pub limit: i64,
    /// `limit` minus the tier's live entries after this call, never below 0.
    pub remaining: i64,
    /// 0 if this tier does not stand in the way (or the call is admitted);
    /// -1 if `cost > limit` (never admissible); otherwise the milliseconds
    /// until enough of the tier's oldest entries leave for `cost` to fit.
    pub retry_after_ms: i64,
    /// Milliseconds until the tier's window is empty; 0 if it already is.
    pub reset_after_ms: i64,
}

/// What a call decided: the verdict, every tier's fields, and which tier binds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    /// The tier the first five reply fields come from: on admission the one
    /// with the fewest `remaining`, on rejection the violated one with the
    /// longest wait (-1 counting as infinite); ties go to the earliest given.
    /// Its `retry_after_ms` is then the wait until the request fits in every
    /// tier, if nothing else is admitted meanwhile.
    pub binding: usize,
    fields: [TierFields; MAX_TIERS],
    len: usize,
}

impl Decision {
    /// The fields of every tier, in the order given.
    pub fn tiers(&self) -> &[TierFields] {
        &self.fields[..self.len]
    }

    /// The binding tier's fields.
    pub fn binding(&self) -> &TierFields {
        &self.fields[self.binding]
    }
}

/// `XCLOAK.REFUND`: gives back up to `cost` units of the admission stamped
/// `stamp_ms`; returns how many entries it removed. Nothing else changes: no
/// trim (a refund of an expired stamp finds what is still stored, or
/// nothing), no new entry, and the expiry stays as it is.
pub fn refund<L: Log>(log: &mut L, stamp_ms: i64, cost: i64) -> u64 {
    log.remove_at(stamp_ms, cost as u64)
}

/// Live entries per tier, indexed like the request's tiers.
type LiveCounts = [u64; MAX_TIERS];

/// `XCLOAK.ALLOW`: trims, decides, and records on admission. The detail fields
/// are computed only when `details` is set (they cost extra lookups).
pub fn allow<L: Log>(log: &mut L, request: &Request, now_ms: i64, details: bool) -> Decision {
    if !details {
        return bare(request, admit(log, request, now_ms));
    }
    let (allowed, live) = decide(log, request, now_ms, true);
    describe(log, request, now_ms, allowed, allowed, &live)
}

/// `XCLOAK.ALLOW` without `DETAILS`: the same trim, verdict and record as
/// [`allow`], with no detail fields to build (the hot path of a plain call).
pub fn admit<L: Log>(log: &mut L, request: &Request, now_ms: i64) -> bool {
    decide(log, request, now_ms, false).0
}

/// Trims by the longest window, counts each tier's live entries (all of them
/// when `count_all`, else until one tier says no), records on admission.
fn decide<L: Log>(log: &mut L, request: &Request, now_ms: i64, count_all: bool) -> (bool, LiveCounts) {
    let longest_ms = request.tiers.longest_window_ms();
    log.trim(now_ms - longest_ms);
    let len = log.len();
    let mut live: LiveCounts = [0; MAX_TIERS];
    let mut allowed = true;
    for (count, tier) in live.iter_mut().zip(request.tiers.iter()) {
        // After the trim every entry is live in the longest window.
        *count = if tier.window_ms == longest_ms {
            len
        } else {
            len - log.count_expired(now_ms - tier.window_ms)
        };
        allowed &= fits(*count, tier, request.cost);
        if !allowed && !count_all {
            break; // the verdict is known; the counts are for DETAILS only
        }
    }
    if allowed {
        log.record(now_ms, request.cost as u64);
    }
    (allowed, live)
}

/// `XCLOAK.PEEK`: the decision `allow` would take at `now_ms`, writing nothing.
pub fn peek<L: Log>(log: &L, request: &Request, now_ms: i64) -> Decision {
    let len = log.len();
    let mut live: LiveCounts = [0; MAX_TIERS];
    for (count, tier) in live.iter_mut().zip(request.tiers.iter()) {
        *count = len - log.count_expired(now_ms - tier.window_ms);
    }
    let allowed = request
        .tiers
        .iter()
        .zip(live)
        .all(|(tier, count)| fits(count, tier, request.cost));
    describe(log, request, now_ms, allowed, false, &live)
}

/// `XCLOAK.PEEK ... OLDEST`: the stamp of the oldest entry live in a window
/// of `window_ms` at `now_ms` (what a moving window's start is), if any.
pub fn oldest_live<L: Log>(log: &L, window_ms: i64, now_ms: i64) -> Option<i64> {
    log.nth_live(now_ms - window_ms, 1)
}

fn fits(live: u64, tier: &Tier, cost: i64) -> bool {
    live + cost as u64 <= tier.limit as u64
}

/// The decision without the detail fields: what a plain ALLOW replies from.
fn bare(request: &Request, allowed: bool) -> Decision {
    let mut fields = [TierFields::default(); MAX_TIERS];
    for (field, tier) in fields.iter_mut().zip(request.tiers.iter()) {
        *field = TierFields {
            window_ms: tier.window_ms,
            limit: tier.limit,
            ..TierFields::default()
        };
    }
    Decision {
        allowed,
        binding: 0,
        fields,
        len: request.tiers.len(),
    }
}

/// Every tier's fields, `live_before[i]` being tier `i`'s live entries before
/// this call recorded anything, and `recorded` whether it did (an admitting
/// ALLOW; PEEK never does).
fn describe<L: Log>(
    log: &L,
    request: &Request,
    now_ms: i64,
    allowed: bool,
    recorded: bool,
    live_before: &LiveCounts,
) -> Decision {
    let cost = request.cost;
    let added = if recorded { cost as u64 } else { 0 };
    // The newest entry is live in every tier where anything is live.
    let newest = if live_before
        .iter()
        .take(request.tiers.len())
        .any(|&live| live + added > 0)
    {
        log.newest()
    } else {
        None
    };
    let mut decision = bare(request, allowed);
    let mut violated = [false; MAX_TIERS];
    let tiers = request.tiers.iter().zip(live_before).zip(&mut violated);
    for (field, ((tier, &live), violated)) in decision.fields.iter_mut().zip(tiers) {
        let cutoff_ms = now_ms - tier.window_ms;
        let live_after = live + added;
        *violated = !allowed && !fits(live, tier, cost);
        field.remaining = (tier.limit - live_after as i64).max(0);
        field.retry_after_ms = if !*violated {
            0
        } else if cost > tier.limit {
            -1
        } else {
            // The entry whose departure makes room: with the tier's live
            // entries sorted oldest first, the (live + cost - limit)-th. It is
            // live, so its stamp is above the cutoff and the wait is at least
            // 1 ms, even after a clock step back.
            let blocking = live + cost as u64 - tier.limit as u64;
            log.nth_live(cutoff_ms, blocking)
                .map_or(0, |stamp| stamp + tier.window_ms - now_ms)
        };
        field.reset_after_ms = match newest {
            Some(stamp) if live_after > 0 => (stamp + tier.window_ms - now_ms).max(0),
            _ => 0,
        };
    }
    decision.binding = binding(decision.tiers(), allowed, &violated);
    decision
}

/// Index of the binding tier (see [`Decision::binding`]).
fn binding(tiers: &[TierFields], allowed: bool, violated: &[bool; MAX_TIERS]) -> usize {
    let wait = |field: &TierFields| {
        if field.retry_after_ms < 0 {
            i64::MAX
        } else {
            field.retry_after_ms
        }
    };
    let mut best: Option<usize> = None;
    for (i, field) in tiers.iter().enumerate() {
        let better = match best {
            None => allowed || violated[i],
            Some(b) if allowed => field.remaining < tiers[b].remaining,
            Some(b) => violated[i] && wait(field) > wait(&tiers[b]),
        };
        if better {
            best = Some(i);
        }
    }
    best.unwrap_or(0)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::args::Tiers;

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
        fn remove_at(&mut self, stamp_ms: i64, count: u64) -> u64 {
            let end = self.0.partition_point(|&s| s <= stamp_ms);
            let start = self.0[..end]
                .partition_point(|&s| s < stamp_ms)
                .max(end.saturating_sub(count as usize));
            self.0.drain(start..end);
            (end - start) as u64
        }
    }

    fn request(window_ms: i64, limit: i64, cost: i64) -> Request {
        tiered(&[(window_ms, limit)], cost)
    }

    fn tiered(tiers: &[(i64, i64)], cost: i64) -> Request {
        let mut list = Tiers::one(Tier {
            window_ms: tiers[0].0,
            limit: tiers[0].1,
        });
        for &(window_ms, limit) in &tiers[1..] {
            assert!(list.push(Tier { window_ms, limit }));
        }
        Request {
            tiers: list,
            cost,
            now_ms: None,
            details: true,
            stamp: false,
            oldest: false,
        }
    }

    /// `[allowed, limit, remaining, retry_after_ms, reset_after_ms]`: the reply's first five.
    fn five(d: &Decision) -> [i64; 5] {
        let b = d.binding();
        [
            d.allowed as i64,
            b.limit,
            b.remaining,
            b.retry_after_ms,
            b.reset_after_ms,
        ]
    }

    /// `[window, limit, remaining, retry_after_ms, reset_after_ms]` per tier.
    fn per_tier(d: &Decision) -> Vec<[i64; 5]> {
        d.tiers()
            .iter()
            .map(|t| [t.window_ms, t.limit, t.remaining, t.retry_after_ms, t.reset_after_ms])
            .collect()
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
        assert_eq!(five(&first), [1, 3, 2, 0, 1000]);
        allow(&mut log, &r, 200, true);
        allow(&mut log, &r, 300, true);
        let rejected = allow(&mut log, &r, 400, true);
        // The entry from 100 must leave: at 1100, 700 ms from now; empty at 1300.
        assert_eq!(five(&rejected), [0, 3, 0, 700, 900]);
        // A cost of 2 needs the two oldest gone: the one from 200 leaves at 1200.
        let heavy = peek(&log, &request(1000, 3, 2), 400);
        assert_eq!(heavy.binding().retry_after_ms, 800);
        assert_eq!(peek(&log, &request(1000, 3, 4), 400).binding().retry_after_ms, -1);
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
        assert_eq!(looked.binding().retry_after_ms, done.binding().retry_after_ms);
        assert_eq!(
            looked.binding().remaining,
            done.binding().remaining + 1,
            "allow consumed one"
        );
    }

    #[test]
    fn limit_zero_rejects_and_empty_window_resets_to_zero() {
        let mut log = VecLog::default();
        let d = allow(&mut log, &request(10, 0, 1), 5, true);
        assert_eq!(five(&d), [0, 0, 0, -1, 0]);
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
        assert!(
            d.binding().retry_after_ms > 0 && d.binding().reset_after_ms > 0,
            "{d:?}"
        );
        assert_eq!(log.0, [1000, 1050], "nothing lost");
    }

    #[test]
    fn tiers_admit_all_or_nothing_from_one_log() {
        // 2 per 100 ms and 3 per 1000 ms.
        let mut log = VecLog::default();
        let r = tiered(&[(100, 2), (1000, 3)], 1);
        assert!(allow(&mut log, &r, 0, false).allowed);
        assert!(allow(&mut log, &r, 10, false).allowed);
        // The short tier is full: rejected, and nothing recorded in any tier.
        let d = allow(&mut log, &r, 20, true);
        assert_eq!(per_tier(&d), [[100, 2, 0, 80, 90], [1000, 3, 1, 0, 990]]);
        assert_eq!((d.allowed, d.binding), (false, 0));
        assert_eq!(log.0, [0, 10]);
        // At 100 the short tier has room again; one log entry serves both.
        let d = allow(&mut log, &r, 100, true);
        assert_eq!(per_tier(&d), [[100, 2, 0, 0, 100], [1000, 3, 0, 0, 1000]]);
        assert_eq!(five(&d), [1, 2, 0, 0, 100], "admitted, both full: the earliest binds");
        assert_eq!(log.0, [0, 10, 100]);
        // Now the long tier is full, the short one is not.
        let d = allow(&mut log, &r, 150, true);
        assert_eq!(per_tier(&d), [[100, 2, 1, 0, 50], [1000, 3, 0, 850, 950]]);
        assert_eq!(five(&d), [0, 3, 0, 850, 950]);
        // The trim follows the longest window: 0 and 10 stay while live there.
        assert_eq!(log.0, [0, 10, 100]);
        allow(&mut log, &r, 1005, false);
        assert_eq!(log.0, [10, 100, 1005]);
    }

    #[test]
    fn a_rejection_is_bound_by_the_longest_wait() {
        let log = VecLog(vec![0, 500, 900]);
        // Both tiers violated at 999: 3 per 1000 ms waits 1 ms (0 leaves at
        // 1000), 1 per 200 ms waits 101 ms (900 leaves at 1100): the latter binds.
        let r = tiered(&[(1000, 3), (200, 1)], 1);
        let d = peek(&log, &r, 999);
        assert_eq!(per_tier(&d), [[1000, 3, 0, 1, 901], [200, 1, 0, 101, 101]]);
        assert_eq!((d.binding, five(&d)), (1, [0, 1, 0, 101, 101]));
        // A tier that can never fit (-1) binds over any finite wait.
        let r = tiered(&[(200, 1), (1000, 3), (10, 0)], 1);
        let d = peek(&log, &r, 999);
        assert_eq!(d.binding, 2);
        assert_eq!(five(&d), [0, 0, 0, -1, 0]);
        // Ties go to the earliest given; a tier that is not violated never binds a rejection.
        let r = tiered(&[(5000, 100), (200, 1), (200, 1)], 1);
        let d = peek(&log, &r, 999);
        assert_eq!(d.tiers()[0].retry_after_ms, 0);
        assert_eq!(d.binding, 1);
    }

    #[test]
    fn an_admission_is_bound_by_the_fewest_remaining() {
        let mut log = VecLog::default();
        let r = tiered(&[(1000, 10), (60_000, 5), (60_000, 5)], 2);
        let d = allow(&mut log, &r, 0, true);
        assert_eq!(
            per_tier(&d),
            [
                [1000, 10, 8, 0, 1000],
                [60_000, 5, 3, 0, 60_000],
                [60_000, 5, 3, 0, 60_000]
            ]
        );
        assert_eq!(d.binding, 1, "ties: the earliest");
        assert_eq!(five(&d), [1, 5, 3, 0, 60_000]);
    }

    #[test]
    fn the_binding_wait_lets_every_tier_fit() {
        // Entries spread over time; every (window, limit) pair from a grid.
        let log = VecLog(vec![0, 0, 40, 90, 300, 310, 700, 960, 990, 999]);
        let windows = [50, 100, 400, 1000];
        // Under Miri (some 10,000 times slower; no `unsafe` here), a coarser grid.
        let (costs, limits): (&[i64], &[i64]) = if cfg!(miri) {
            (&[1, 3], &[0, 1, 3, 6])
        } else {
            (&[1, 2, 3, 4], &[0, 1, 2, 3, 4, 5, 6])
        };
        for &cost in costs {
            for &w1 in &windows {
                for &w2 in &windows {
                    for &l1 in limits {
                        for &l2 in limits {
                            let r = tiered(&[(w1, l1), (w2, l2)], cost);
                            let d = peek(&log, &r, 1000);
                            let retry = d.binding().retry_after_ms;
                            if d.allowed {
                                assert_eq!(retry, 0);
                            } else if retry > 0 {
                                assert!(peek(&log, &r, 1000 + retry).allowed, "{r:?}: {d:?}");
                                assert!(!peek(&log, &r, 1000 + retry - 1).allowed, "{r:?}: {d:?}");
                            } else {
                                assert_eq!(retry, -1);
                                assert!(cost > l1.min(l2), "{r:?}: {d:?}");
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn without_details_the_verdict_is_the_same() {
        let r = tiered(&[(100, 2), (1000, 3), (30, 1)], 1);
        let (mut plain, mut detailed) = (VecLog::default(), VecLog::default());
        for now in [0, 5, 10, 40, 80, 120, 200, 260, 900, 1100, 1101, 1150] {
            let a = allow(&mut plain, &r, now, false);
            let b = allow(&mut detailed, &r, now, true);
            assert_eq!(a.allowed, b.allowed, "at {now}");
            assert_eq!(plain.0, detailed.0, "at {now}");
        }
    }

    #[test]
    fn the_oldest_live_entry_is_the_first_above_the_cutoff() {
        let log = VecLog(vec![100, 100, 400, 900]);
        assert_eq!(oldest_live(&log, 1000, 1000), Some(100));
        // At 1100 the entries from 100 have left (100 <= 1100 - 1000).
        assert_eq!(oldest_live(&log, 1000, 1100), Some(400));
        assert_eq!(oldest_live(&log, 200, 1000), Some(900));
        assert_eq!(oldest_live(&log, 100, 1000), None, "900 <= 1000 - 100: nothing live");
        // A clock step back: every entry is live, the oldest first.
        assert_eq!(oldest_live(&log, 10, 50), Some(100));
        assert_eq!(oldest_live(&VecLog::default(), 1000, 1000), None);
    }

    #[test]
    fn a_refund_removes_only_its_stamp_and_at_most_its_cost() {
        let mut log = VecLog::default();
        let r = request(1000, 5, 2);
        assert!(admit(&mut log, &r, 100));
        assert!(admit(&mut log, &r, 200));
        assert!(!admit(&mut log, &request(1000, 5, 2), 300), "4 + 2 > 5");
        assert_eq!(refund(&mut log, 100, 1), 1, "a partial refund");
        assert_eq!(log.0, [100, 200, 200]);
        assert!(admit(&mut log, &r, 300), "the refunded unit is free again");
        assert_eq!(refund(&mut log, 200, 5), 2, "never more than the stamp holds");
        assert_eq!(refund(&mut log, 250, 1), 0, "an unknown stamp removes nothing");
        assert_eq!(log.0, [100, 300, 300]);
        // No trim: a refund at a time the entry from 100 has expired still finds it.
        assert_eq!(refund(&mut log, 100, 1), 1);
        assert_eq!(
            refund(&mut log, 100, 1),
            0,
            "refunding twice finds nothing the second time"
        );
        assert_eq!(log.0, [300, 300]);
    }
}
