//! Fuzz target: the window decision (`window::allow` / `window::peek`) against
//! an in-memory `Log`, over sequences of calls with monotone and non-monotone
//! clocks.
//!
//! Input layout: byte 0 = flags (bit 0: clock may step backwards), byte 1 =
//! window choice, byte 2 = limit; then 3 bytes per call: operation+cost,
//! clock step kind, step size.
//!
//! Invariants checked after every call:
//! - decision fields: `limit` echoed, `remaining` in 0..=limit,
//!   `retry_after_ms >= -1` (-1 exactly when cost > limit), `reset_after_ms >= 0`;
//!   a rejected admissible call waits at least 1 ms;
//! - `allowed` implies live-before + cost <= limit, all or nothing (exactly
//!   `cost` entries at `now` are added, nothing on rejection);
//! - the trim removes only entries that left the window (no live entry lost);
//! - PEEK writes nothing and agrees with what ALLOW decides;
//! - retry/reset are exact: a PEEK `retry_after_ms` later fits, one ms earlier
//!   does not; `reset_after_ms` later the window is empty;
//! - after an admission, the live entries (including ones stamped in the
//!   future after a clock step back) never exceed the limit;
//! - with a monotone clock, over every admitted stamp ever (not only those
//!   still stored), no sliding window `(s - window, s]` holds more than `limit`.
#![no_main]

#[allow(dead_code)]
#[path = "../../src/args.rs"]
mod args;
#[allow(dead_code)]
#[path = "../../src/window.rs"]
mod window;

use args::{Request, MAX_EXACT_MS};
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
        self.0.splice(at..at, std::iter::repeat(now_ms).take(cost as usize));
    }
}

const WINDOWS: [i64; 8] = [1, 2, 3, 10, 100, 1000, 86_400_000, MAX_EXACT_MS];
const MAX_CALLS: usize = 256;

fuzz_target!(|data: &[u8]| {
    if data.len() < 3 {
        return;
    }
    let may_step_back = data[0] & 1 == 1;
    let window_ms = if data[1] < 0x80 { WINDOWS[usize::from(data[1]) % WINDOWS.len()] } else { i64::from(data[1] & 0x7f) + 1 };
    let limit = i64::from(data[2] % 41);
    let mut now: i64 = if data[0] & 2 == 2 { 0 } else { 1_700_000_000_000 };
    let mut log = VecLog::default();
    let mut admitted: Vec<i64> = Vec::new(); // every stamp ever admitted, in order

    for call in data[3..].chunks_exact(3).take(MAX_CALLS) {
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

        let cost = i64::from(op >> 2) % (limit + 3) + 1;
        let request = Request { window_ms, limit, cost, now_ms: Some(now), details: op & 1 == 1 };
        let cutoff = now - window_ms;
        let live_before = log.0.iter().filter(|&&s| s > cutoff).count() as i64;
        let before = log.clone();

        if op & 2 == 2 {
            let d = window::peek(&log, &request, now);
            assert_eq!(log, before, "PEEK wrote");
            check_fields(&d, &request, live_before, live_before);
            let mut copy = log.clone();
            let a = window::allow(&mut copy, &request, now, true);
            assert_eq!((a.allowed, a.retry_after_ms), (d.allowed, d.retry_after_ms), "PEEK disagrees with ALLOW");
            check_waits(&log, &request, now, &d);
            continue;
        }

        let d = window::allow(&mut log, &request, now, request.details);
        // No live entry lost; exactly `cost` entries at `now` on admission.
        let mut expected: Vec<i64> = before.0.iter().copied().filter(|&s| s > cutoff).collect();
        if d.allowed {
            expected.extend(std::iter::repeat(now).take(cost as usize));
            expected.sort_unstable();
            admitted.extend(std::iter::repeat(now).take(cost as usize));
        }
        assert_eq!(log.0, expected, "log after ALLOW at {now} (cutoff {cutoff})");
        assert_eq!(d.allowed, live_before + cost <= limit, "decision");
        let live_after = if d.allowed { live_before + cost } else { live_before };
        assert!(live_after <= limit || !d.allowed && live_before <= limit || !d.allowed, "over the limit");
        if d.allowed {
            assert!(live_after <= limit, "admitted past the limit: {live_after} > {limit}");
        }
        if request.details {
            check_fields(&d, &request, live_before, live_after);
            check_waits(&log, &request, now, &d);
        } else {
            assert_eq!(d.limit, limit);
        }
        if !may_step_back && d.allowed {
            let inside = admitted.iter().filter(|&&s| s > cutoff && s <= now).count() as i64;
            assert!(inside <= limit, "{inside} admitted in ({cutoff}, {now}] with limit {limit}");
        }
    }
});

fn check_fields(d: &Decision, r: &Request, live_before: i64, live_after: i64) {
    assert_eq!(d.limit, r.limit);
    assert!((0..=r.limit).contains(&d.remaining), "{d:?}");
    assert_eq!(d.remaining, (r.limit - live_after).max(0), "{d:?}");
    assert!(d.retry_after_ms >= -1, "{d:?}");
    assert!(d.reset_after_ms >= 0, "{d:?}");
    assert_eq!(d.retry_after_ms == -1, !d.allowed && r.cost > r.limit, "{d:?}");
    if d.allowed {
        assert_eq!(d.retry_after_ms, 0);
        assert!(live_before + r.cost <= r.limit);
    } else if r.cost <= r.limit {
        assert!(d.retry_after_ms >= 1, "a rejected call must wait: {d:?}");
    }
    assert_eq!(d.reset_after_ms == 0, live_after == 0, "{d:?} live_after {live_after}");
}

/// Waiting exactly `retry_after_ms` makes the call fit, one ms less does not;
/// waiting `reset_after_ms` empties the window.
fn check_waits(log: &VecLog, r: &Request, now: i64, d: &Decision) {
    if d.retry_after_ms > 0 {
        let later = window::peek(log, r, now + d.retry_after_ms);
        assert!(later.allowed, "not admitted after retry_after_ms: {d:?} then {later:?}");
        let early = window::peek(log, r, now + d.retry_after_ms - 1);
        assert!(!early.allowed, "retry_after_ms not minimal: {d:?}");
    }
    if d.reset_after_ms > 0 {
        let reset = window::peek(log, r, now + d.reset_after_ms);
        assert_eq!(reset.remaining, r.limit, "window not empty after reset_after_ms: {d:?}");
        let early = window::peek(log, r, now + d.reset_after_ms - 1);
        assert!(early.remaining < r.limit, "reset_after_ms not minimal: {d:?}");
    }
}
