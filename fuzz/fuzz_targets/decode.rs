//! Fuzz target: the compact form's decoder (`RunLog::decode`, src/store/encoding.rs),
//! which every RDB load, RESTORE and `XCLOAK.APPLY LOAD` runs on bytes it
//! does not control, then the log it returns under every `Log` operation.
//!
//! Input layout: the whole input is decoded once as it is; then byte 0 is a
//! length `n`, bytes `1..=n` are decoded as the starting log (an empty one
//! when they are not a window), and the rest drives operations, 4 bytes each: kind, run pick, a signed
//! 16-bit offset. A stamp is an existing run's stamp (or 0, or 2^53-1) plus
//! the offset, so operations land on, just before and just after runs.
//!
//! Invariants:
//! - decode never panics, whatever the bytes;
//! - an accepted input is canonical: its runs have strictly increasing stamps
//!   in 0..=2^53-1, counts >= 1, 1..=1e9 entries in all, and re-encoding it
//!   gives back exactly the input bytes;
//! - after every trim / record / remove_at, the log holds exactly the runs of
//!   a reference model (a BTreeMap of stamp -> count), `len`, `newest`,
//!   `count_expired` and `nth_live` agree with the model, and its canonical
//!   bytes decode back to the same runs (an emptied log encodes to nothing,
//!   which decode refuses as `Empty`).
#![no_main]

#[allow(dead_code)]
#[path = "../../src/args.rs"]
mod args;
#[allow(dead_code)]
#[path = "../../src/window.rs"]
mod window;
#[allow(dead_code)]
#[path = "../../src/store/encoding.rs"]
mod encoding;

use std::collections::BTreeMap;

use args::MAX_EXACT_MS;
use encoding::{DecodeError, RunLog, MAX_ENTRIES};
use libfuzzer_sys::fuzz_target;
use window::Log;

type Model = BTreeMap<i64, u64>;

const MAX_OPS: usize = 128;

fuzz_target!(|data: &[u8]| {
    // 1. The raw input, as a payload would arrive.
    if let Ok(log) = RunLog::decode(data) {
        check_canonical(&log, data);
    }

    // 2. A structured run: a log, then operations on it.
    let Some((&n, rest)) = data.split_first() else { return };
    let (log_bytes, ops) = rest.split_at(usize::from(n).min(rest.len()));
    let (mut log, mut model) = match RunLog::decode(log_bytes) {
        Ok(log) => {
            let model = check_canonical(&log, log_bytes);
            (log, model)
        }
        Err(_) => (RunLog::default(), Model::new()),
    };
    for op in ops.chunks_exact(4).take(MAX_OPS) {
        let (kind, pick, offset) = (op[0], op[1], i64::from(i16::from_le_bytes([op[2], op[3]])));
        let anchor = {
            let stamps: Vec<i64> = model.keys().copied().collect();
            match usize::from(pick) % (stamps.len() + 2) {
                i if i < stamps.len() => stamps[i],
                i if i == stamps.len() => 0,
                _ => MAX_EXACT_MS,
            }
        };
        let stamp = (anchor + offset).clamp(0, MAX_EXACT_MS);
        let total: u64 = model.values().sum();
        match kind % 4 {
            0 => {
                // A cutoff as window.rs computes one: now - window, possibly negative.
                let cutoff = (anchor + offset).clamp(-MAX_EXACT_MS, MAX_EXACT_MS);
                let expected: u64 = model.range(..=cutoff).map(|(_, &c)| c).sum();
                assert_eq!(log.trim(cutoff), expected, "trim({cutoff})");
                model.retain(|&s, _| s > cutoff);
            }
            1 | 2 => {
                // Costs as callers send them: small, or up to what the window can still hold.
                let cost = if kind & 0x80 != 0 { u64::from(pick) * 4_000_000 + 1 } else { u64::from(kind >> 2) + 1 };
                if total + cost > MAX_ENTRIES {
                    continue; // XCLOAK.APPLY and window.rs never record past MAX_ENTRIES
                }
                log.record(stamp, cost);
                *model.entry(stamp).or_default() += cost;
            }
            _ => {
                let count = u64::from(kind >> 2) + 1;
                let held = model.get(&stamp).copied().unwrap_or(0);
                let expected = held.min(count);
                assert_eq!(log.remove_at(stamp, count), expected, "remove_at({stamp}, {count})");
                if held > expected {
                    model.insert(stamp, held - expected);
                } else {
                    model.remove(&stamp);
                }
            }
        }
        check_against(&log, &model, stamp);
        let mut bytes = Vec::new();
        log.encode(&mut bytes);
        match RunLog::decode(&bytes) {
            Ok(decoded) => {
                assert!(!model.is_empty());
                assert_eq!(check_canonical(&decoded, &bytes), model, "canonical bytes of {model:?}");
            }
            Err(e) => {
                assert!(model.is_empty(), "the canonical bytes of {model:?} do not decode: {e}");
                assert_eq!(e, DecodeError::Empty);
            }
        }
    }
});

/// An accepted input: well-formed runs, and exactly the bytes it came from.
fn check_canonical(log: &RunLog, input: &[u8]) -> Model {
    let mut model = Model::new();
    let mut previous: Option<i64> = None;
    for (stamp, count) in log.runs() {
        assert!((0..=MAX_EXACT_MS).contains(&stamp), "stamp {stamp}");
        assert!(count >= 1, "count {count}");
        assert!(previous.is_none_or(|p| stamp > p), "stamps not increasing");
        previous = Some(stamp);
        model.insert(stamp, count);
    }
    let total: u64 = model.values().sum();
    assert!((1..=MAX_ENTRIES).contains(&total), "{total} entries");
    assert_eq!(log.len(), total);
    let mut bytes = Vec::new();
    log.encode(&mut bytes);
    assert_eq!(bytes, input, "decode accepted a non-canonical form");
    check_against(log, &model, previous.unwrap_or(0));
    model
}

/// Every `Log` query agrees with the model, at cutoffs around `stamp`.
fn check_against(log: &RunLog, model: &Model, stamp: i64) {
    assert_eq!(log.runs().collect::<Vec<_>>(), model.iter().map(|(&s, &c)| (s, c)).collect::<Vec<_>>());
    assert_eq!(log.len(), model.values().sum::<u64>());
    assert_eq!(log.is_empty(), model.is_empty());
    assert_eq!(log.newest(), model.keys().next_back().copied());
    for cutoff in [stamp - 1, stamp, stamp + 1, -1, MAX_EXACT_MS] {
        let expired: u64 = model.range(..=cutoff).map(|(_, &c)| c).sum();
        assert_eq!(log.count_expired(cutoff), expired, "count_expired({cutoff})");
        let live = log.len() - expired;
        for n in [0, 1, 2, live, live + 1] {
            let mut seen = 0;
            let expected = model.range(cutoff + 1..).find_map(|(&s, &c)| {
                seen += c;
                (n > 0 && seen >= n).then_some(s)
            });
            assert_eq!(log.nth_live(cutoff, n), expected, "nth_live({cutoff}, {n})");
        }
    }
}
