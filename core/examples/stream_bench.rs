//! Micro-bench (not a test of behaviour) of the compact log alone, no server:
//! admissions / rejections on windows held at SIZE entries, as
//! scripts/bench/compare.py's streams hold them, or refunds of middle stamps. Run
//! under callgrind by `scripts/callgrind_log.sh`, which counts the
//! instructions of `measure` / `refund_measure` per call.
//!
//! Usage: `stream_bench admit|refund` with SIZE (default 1000), CALLS (default
//! 2000) and, for admit, REJECT (set: the window is full, every call rejected).
use xcloak_core::args::{Request, Tier, Tiers};
use xcloak_core::log::RunLog;
use xcloak_core::window::{self, Log};

const BASE_MS: i64 = 1_732_941_234_567;

fn request(window_ms: i64, limit: i64) -> Request {
    Request {
        tiers: Tiers::one(Tier { window_ms, limit }),
        cost: 1,
        now_ms: None,
        details: false,
        stamp: false,
        oldest: false,
    }
}

fn env(name: &str, default: i64) -> i64 {
    std::env::var(name).map_or(default, |value| value.parse().expect("an integer"))
}

#[inline(never)]
fn measure(logs: &mut [RunLog], req: &Request, from: i64, rounds: i64, reject: bool) -> u64 {
    let mut admitted = 0;
    for r in from..from + rounds {
        let now = BASE_MS + (if reject { from - 1 } else { r }) * 1000;
        for log in logs.iter_mut() {
            admitted += window::admit(log, req, now) as u64;
        }
    }
    admitted
}

/// Two windows of SIZE entries 1,000 ms apart, at their limit; then CALLS
/// rounds of one call on each: one entry trimmed and one added (or, with
/// REJECT, the window found full).
fn admit(size: i64, calls: i64, reject: bool) {
    let req = request(size * 1000, size);
    let mut logs: Vec<RunLog> = (0..2).map(|_| RunLog::default()).collect();
    for r in 0..size {
        for log in logs.iter_mut() {
            assert!(window::admit(log, &req, BASE_MS + r * 1000));
        }
    }
    let got = measure(&mut logs, &req, size, calls, reject);
    assert_eq!(got, if reject { 0 } else { 2 * calls as u64 });
    eprintln!("calls {}", 2 * calls);
}

#[inline(never)]
fn refund_measure(log: &mut RunLog, stamp_ms: i64) -> u64 {
    log.remove_at(stamp_ms, 1)
}

/// REFUND of stamps near the middle of a window of SIZE lone entries 1,000 ms
/// apart, each put back by an admission at its stamp (a step back), as
/// scripts/bench/callgrind_refund.py does on a server.
fn refund(size: i64, calls: i64) {
    let mut log = RunLog::default();
    for i in 0..size {
        log.record(BASE_MS + i * 1000, 1);
    }
    for j in 0..calls {
        // As callgrind_refund.py: consecutive stamps about the middle, each once.
        let at = if size > calls {
            size / 2 + j - calls / 2
        } else {
            j % size
        };
        let stamp = BASE_MS + at * 1000;
        assert_eq!(refund_measure(&mut log, stamp), 1);
        log.record(stamp, 1);
    }
    assert_eq!(log.len(), size as u64);
    eprintln!("calls {calls}");
}

fn main() {
    let (size, calls) = (env("SIZE", 1000), env("CALLS", 2000));
    match std::env::args().nth(1).as_deref() {
        Some("admit") => admit(size, calls, std::env::var_os("REJECT").is_some()),
        Some("refund") => refund(size, calls),
        _ => {
            eprintln!("usage: stream_bench admit|refund (SIZE, CALLS, REJECT in the environment)");
            std::process::exit(2);
        }
    }
}
