//! Fuzz target: the window decision (`window::allow` / `window::peek`) against
//! an in-memory `Log`, over sequences of calls with monotone and non-monotone
//! clocks, with one to four tiers.
//!
//! Input layout: byte 0 = flags (bit 0: clock may step backwards; bit 1: start
//! at 0; bits 2-3: extra tiers, 0 to 3), byte 1 = window choice, byte 2 =
//! limit; then 2 bytes (window choice, limit) per extra tier; then 3 bytes per
//! call: operation+cost, clock step kind, step size.
//!
//! Invariants checked after every call:
//! - per tier: `window` and `limit` echoed, `remaining` in 0..=limit,
//!   `retry_after_ms >= -1` (-1 exactly when the tier is violated and cost >
//!   limit, 0 when it is not violated), `reset_after_ms >= 0`; a violated
//!   admissible tier waits at least 1 ms;
//! - the binding tier is the one the rule names (fewest remaining on
//!   admission, longest wait among violated tiers on rejection, ties to the
//!   earliest);
//! - `allowed` iff live + cost <= limit in every tier, all or nothing (exactly
//!   `cost` entries at `now` are added once, nothing on rejection);
//! - the trim removes only entries that left the longest window (no live entry lost);
//! - PEEK writes nothing and agrees with what ALLOW decides;
//! - retry/reset are exact: a PEEK the binding `retry_after_ms` later fits in
//!   every tier, one ms earlier does not; each tier's `reset_after_ms` later
//!   that tier is empty, one ms earlier it is not;
//! - after an admission, the live entries of every tier (including ones
//!   stamped in the future after a clock step back) never exceed its limit;
//! - with a monotone clock, over every admitted stamp ever (not only those
//!   still stored), no sliding window `(s - window, s]` of any tier holds more
//!   than its limit.
#![no_main]

use xcloak_core::{args, window};

use args::{Request, Tier, Tiers, MAX_EXACT_MS};
use libfuzzer_sys::fuzz_target;
use window::{Decision, Log};

/// The in-memory log: stamps kept sorted, as in a sorted set.
#[derive(Clone, Default, Debug, PartialEq)]
struct VecLog(Vec<i64>);

impl Log for VecLog {
    fn len(&self) -> u64 {
        self.0.len() as u64
    }
    fn count_expired(&self, cutoff_ms: i64) -> u64 {
        self.0.partition_point(|&s| s <= cutoff_ms) as u64
    }
    fn trim(&mut self, cutoff_ms: i64) -> u64 {
        let gone = self.0.partition_point(|&s| s <= cutoff_ms);
        self.0.drain(..gone);
        gone as u64
    }
    fn nth_live(&self, cutoff_ms: i64, n: u64) -> Option<i64> {
        let first = self.0.partition_point(|&s| s <= cutoff_ms);
        self.0.get(first + n as usize - 1).copied()
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

const WINDOWS: [i64; 8] = [1, 2, 3, 10, 100, 1000, 86_400_000, MAX_EXACT_MS];
const MAX_CALLS: usize = 256;

fn tier_of(window_choice: u8, limit: u8) -> Tier {
    let window_ms = if window_choice < 0x80 {
        WINDOWS[usize::from(window_choice) % WINDOWS.len()]
    } else {
        i64::from(window_choice & 0x7f) + 1
    };
    Tier {
        window_ms,
        limit: i64::from(limit % 41),
    }
}

fn live(log: &VecLog, tier: &Tier, now: i64) -> i64 {
    log.0.iter().filter(|&&s| s > now - tier.window_ms).count() as i64
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 3 {
        return;
    }
    let may_step_back = data[0] & 1 == 1;
    let extra = usize::from((data[0] >> 2) & 3);
    if data.len() < 3 + 2 * extra {
        return;
    }
    let mut tiers = Tiers::one(tier_of(data[1], data[2]));
    for pair in data[3..3 + 2 * extra].chunks_exact(2) {
        assert!(tiers.push(tier_of(pair[0], pair[1])));
    }
    let window_ms = tiers[0].window_ms;
    let longest_ms = tiers.longest_window_ms();
    let smallest_limit = tiers.iter().map(|t| t.limit).min().unwrap();
    let mut now: i64 = if data[0] & 2 == 2 { 0 } else { 1_700_000_000_000 };
    let mut log = VecLog::default();
    let mut admitted: Vec<i64> = Vec::new(); // every stamp ever admitted, in order

    for call in data[3 + 2 * extra..].chunks_exact(3).take(MAX_CALLS) {
        let (op, kind, size) = (call[0], call[1], i64::from(call[2]));
        let step = match kind & 7 {
            0 => 0,
            1 => 1,
            2 => window_ms - 1,
            3 => window_ms,
            4 => window_ms + 1,
            5 => size,
            6 => size * (window_ms / 64 + 1),
            _ => size * 7919,
        };
        let step = if may_step_back && kind & 0x80 != 0 { -step } else { step };
        now = (now.saturating_add(step)).clamp(0, MAX_EXACT_MS);

        let cost = i64::from(op >> 2) % (smallest_limit + 3) + 1;
        let request = Request {
            tiers,
            cost,
            now_ms: Some(now),
            details: op & 1 == 1,
            stamp: false,
            oldest: false,
        };
        let live_before: Vec<i64> = tiers.iter().map(|t| live(&log, t, now)).collect();
        let fits = tiers.iter().zip(&live_before).all(|(t, &l)| l + cost <= t.limit);
        let before = log.clone();

        if op & 2 == 2 {
            let d = window::peek(&log, &request, now);
            assert_eq!(log, before, "PEEK wrote");
            check_fields(&d, &request, &live_before, &live_before);
            let mut copy = log.clone();
            let a = window::allow(&mut copy, &request, now, true);
            assert_eq!(
                (a.allowed, a.binding().retry_after_ms),
                (d.allowed, d.binding().retry_after_ms),
                "PEEK disagrees with ALLOW"
            );
            check_waits(&log, &request, now, &d);
            continue;
        }

        let (allowed, d) = if request.details {
            let d = window::allow(&mut log, &request, now, true);
            (d.allowed, Some(d))
        } else {
            (window::admit(&mut log, &request, now), None)
        };
        // No live entry lost; exactly `cost` entries at `now` on admission.
        let mut expected: Vec<i64> = before.0.iter().copied().filter(|&s| s > now - longest_ms).collect();
        if allowed {
            expected.extend(std::iter::repeat_n(now, cost as usize));
            expected.sort_unstable();
            admitted.extend(std::iter::repeat_n(now, cost as usize));
        }
        assert_eq!(
            log.0, expected,
            "log after ALLOW at {now} (longest window {longest_ms})"
        );
        assert_eq!(allowed, fits, "decision");
        let added = if allowed { cost } else { 0 };
        let live_after: Vec<i64> = live_before.iter().map(|l| l + added).collect();
        if allowed {
            for (tier, &l) in tiers.iter().zip(&live_after) {
                assert!(l <= tier.limit, "admitted past the limit: {l} > {}", tier.limit);
            }
        }
        if let Some(d) = &d {
            check_fields(d, &request, &live_before, &live_after);
            check_waits(&log, &request, now, d);
        }
        if !may_step_back && allowed {
            for tier in tiers.iter() {
                let inside = admitted
                    .iter()
                    .filter(|&&s| s > now - tier.window_ms && s <= now)
                    .count() as i64;
                assert!(
                    inside <= tier.limit,
                    "{inside} admitted in ({}, {now}] with limit {}",
                    now - tier.window_ms,
                    tier.limit
                );
            }
        }
    }
});

fn check_fields(d: &Decision, r: &Request, live_before: &[i64], live_after: &[i64]) {
    assert_eq!(d.tiers().len(), r.tiers.len());
    let mut violated = Vec::new();
    for (i, (f, tier)) in d.tiers().iter().zip(r.tiers.iter()).enumerate() {
        let is_violated = !d.allowed && live_before[i] + r.cost > tier.limit;
        violated.push(is_violated);
        assert_eq!((f.window_ms, f.limit), (tier.window_ms, tier.limit));
        assert!((0..=tier.limit).contains(&f.remaining), "{d:?}");
        assert_eq!(f.remaining, (tier.limit - live_after[i]).max(0), "{d:?}");
        assert!(f.retry_after_ms >= -1, "{d:?}");
        assert!(f.reset_after_ms >= 0, "{d:?}");
        assert_eq!(f.retry_after_ms == -1, is_violated && r.cost > tier.limit, "{d:?}");
        if !is_violated {
            assert_eq!(f.retry_after_ms, 0, "{d:?}");
        } else if r.cost <= tier.limit {
            assert!(f.retry_after_ms >= 1, "a violated tier must wait: {d:?}");
        }
        assert_eq!(
            f.reset_after_ms == 0,
            live_after[i] == 0,
            "{d:?} live_after {live_after:?}"
        );
    }
    assert_eq!(d.allowed, !violated.contains(&true), "{d:?}");
    // The binding tier, by its rule.
    let fields = d.tiers();
    let expected = if d.allowed {
        (0..fields.len()).min_by_key(|&i| (fields[i].remaining, i)).unwrap()
    } else {
        let wait = |i: usize| {
            if fields[i].retry_after_ms < 0 {
                i64::MAX
            } else {
                fields[i].retry_after_ms
            }
        };
        (0..fields.len())
            .filter(|&i| violated[i])
            .max_by_key(|&i| (wait(i), std::cmp::Reverse(i)))
            .unwrap()
    };
    assert_eq!(d.binding, expected, "{d:?}");
}

/// Waiting exactly the binding `retry_after_ms` makes the call fit in every
/// tier, one ms less does not; waiting a tier's `reset_after_ms` empties it.
fn check_waits(log: &VecLog, r: &Request, now: i64, d: &Decision) {
    let retry = d.binding().retry_after_ms;
    if retry > 0 {
        let later = window::peek(log, r, now + retry);
        assert!(later.allowed, "not admitted after retry_after_ms: {d:?} then {later:?}");
        let early = window::peek(log, r, now + retry - 1);
        assert!(!early.allowed, "retry_after_ms not minimal: {d:?}");
    }
    for (f, tier) in d.tiers().iter().zip(r.tiers.iter()) {
        if f.reset_after_ms > 0 {
            assert_eq!(
                live(log, tier, now + f.reset_after_ms),
                0,
                "tier not empty after reset_after_ms: {d:?}"
            );
            assert!(
                live(log, tier, now + f.reset_after_ms - 1) > 0,
                "reset_after_ms not minimal: {d:?}"
            );
        }
    }
}
