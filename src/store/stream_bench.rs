//! Micro-bench (not a test of behaviour): admissions / rejections on RunLog
//! windows held at N entries, as scripts/compare.py's streams do. Run under
//! callgrind by `scripts/callgrind_log.sh`, which prints instructions per call.
use crate::args::{Request, Tier, Tiers};
use crate::store::encoding::RunLog;
use crate::window::{self, Log};

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

#[test]
#[ignore]
fn stream_bench() {
    let size: i64 = std::env::var("SIZE").map(|s| s.parse().unwrap()).unwrap_or(1000);
    let calls: i64 = std::env::var("CALLS").map(|s| s.parse().unwrap()).unwrap_or(2000);
    let reject = std::env::var("REJECT").is_ok();
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
/// scripts/callgrind_refund.py does on a server: the `refund_measure` calls
/// are what `scripts/callgrind_log.sh refund` counts.
#[test]
#[ignore]
fn refund_bench() {
    let size: i64 = std::env::var("SIZE").map(|s| s.parse().unwrap()).unwrap_or(1000);
    let calls: i64 = std::env::var("CALLS").map(|s| s.parse().unwrap()).unwrap_or(2000);
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
}
