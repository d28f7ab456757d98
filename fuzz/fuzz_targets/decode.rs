//! Fuzz target: the compact form's decoders (`xcloak_core::log`, core/src/log/):
//! `RunLog::decode` (encoding version 2, what RDB and DUMP carry) and
//! `RunLog::decode_runs` (version 1: 0.1.0's RDB encoding, and every
//! `XCLOAK.APPLY key L` and AOF rewrite), which run on bytes the module does
//! not control; then the log they return under every `Log` operation, across
//! the inline and large forms.
//!
//! Input layout: the whole input is decoded once as it is, by both decoders;
//! then byte 0 picks the starting log's encoding (bit 0: version 1), byte 1 is
//! a length `n`, bytes `2..2+n` are decoded as the starting log (an empty one
//! when they are not a window), and the rest drives operations, 4 bytes each:
//! kind, run pick, a signed 16-bit offset. A stamp is an existing run's stamp
//! (or 0, or 2^53-1) plus the offset, so operations land on, just before and
//! just after runs. One kind appends up to 2,000 runs at once, so that logs
//! grow past one block (1,024 runs or 1,024 bytes) and come back.
//!
//! Invariants:
//! - neither decoder panics, whatever the bytes;
//! - an accepted input is canonical: its runs have strictly increasing stamps
//!   in 0..=2^53-1, counts >= 1, 1..=1e9 entries in all, and re-encoding it in
//!   its version gives back exactly the input bytes;
//! - after every trim / record / remove_at, the log holds exactly the runs of
//!   a reference model (a BTreeMap of stamp -> count), `len`, `newest`,
//!   `count_expired` and `nth_live` agree with the model, and its canonical
//!   bytes (both versions) decode back to the same runs (an emptied log
//!   encodes to nothing, which both decoders refuse as `Empty`).
#![no_main]

use xcloak_core::{args, log as encoding, window};

use args::MAX_EXACT_MS;
use encoding::{DecodeError, RunLog, MAX_ENTRIES};
use libfuzzer_sys::fuzz_target;
use window::Log;

/// The reference: runs `(stamp, count)`, stamps strictly increasing.
type Model = Vec<(i64, u64)>;

const MAX_OPS: usize = 128;
/// Runs the bulk operation may add over one input.
const MAX_BULK_RUNS: u64 = 3000;
/// Above this many runs, the full checks run on every eighth operation only
/// (each is O(runs)); `len` and `newest` are checked after every one.
const FULL_CHECK_RUNS: usize = 200;

#[derive(Clone, Copy)]
enum Version {
    Groups,
    Runs,
}

fn decode(version: Version, bytes: &[u8]) -> Result<RunLog, DecodeError> {
    match version {
        Version::Groups => RunLog::decode(bytes),
        Version::Runs => RunLog::decode_runs(bytes),
    }
}

fn encode(version: Version, log: &RunLog) -> Vec<u8> {
    let mut bytes = Vec::new();
    match version {
        Version::Groups => log.encode(&mut bytes),
        Version::Runs => log.encode_runs(&mut bytes),
    }
    bytes
}

/// Adds `count` entries at `stamp` to the model.
fn model_add(model: &mut Model, stamp: i64, count: u64) {
    match model.binary_search_by_key(&stamp, |&(s, _)| s) {
        Ok(i) => model[i].1 += count,
        Err(i) => model.insert(i, (stamp, count)),
    }
}

fuzz_target!(|data: &[u8]| {
    // 1. The raw input, as a payload of either version would arrive.
    for version in [Version::Groups, Version::Runs] {
        if let Ok(log) = decode(version, data) {
            check_canonical(&log, data, version);
        }
    }

    // 2. A structured run: a log, then operations on it.
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let Some((&n, rest)) = rest.split_first() else { return };
    let version = if flags & 1 == 1 { Version::Runs } else { Version::Groups };
    let (log_bytes, ops) = rest.split_at(usize::from(n).min(rest.len()));
    let (mut log, mut model) = match decode(version, log_bytes) {
        Ok(log) => {
            let model = check_canonical(&log, log_bytes, version);
            (log, model)
        }
        Err(_) => (RunLog::default(), Model::new()),
    };
    let mut total: u64 = model.iter().map(|r| r.1).sum();
    let mut bulk_left = MAX_BULK_RUNS;
    for (i, op) in ops.chunks_exact(4).take(MAX_OPS).enumerate() {
        let (kind, pick, offset) = (op[0], op[1], i64::from(i16::from_le_bytes([op[2], op[3]])));
        let anchor = match usize::from(pick) % (model.len() + 2) {
            i if i < model.len() => model[i].0,
            i if i == model.len() => 0,
            _ => MAX_EXACT_MS,
        };
        let stamp = (anchor + offset).clamp(0, MAX_EXACT_MS);
        match kind % 5 {
            0 => {
                // A cutoff as window.rs computes one: now - window, possibly negative.
                let cutoff = (anchor + offset).clamp(-MAX_EXACT_MS, MAX_EXACT_MS);
                let gone = model.partition_point(|&(s, _)| s <= cutoff);
                let expected: u64 = model[..gone].iter().map(|r| r.1).sum();
                assert_eq!(log.trim(cutoff), expected, "trim({cutoff})");
                model.drain(..gone);
                total -= expected;
            }
            1 | 2 => {
                // Costs as callers send them: small, or up to what the window can still hold.
                let cost = if kind & 0x80 != 0 {
                    u64::from(pick) * 4_000_000 + 1
                } else {
                    u64::from(kind >> 3) + 1
                };
                if total + cost > MAX_ENTRIES {
                    continue; // XCLOAK.APPLY and window.rs never record past MAX_ENTRIES
                }
                log.record(stamp, cost);
                model_add(&mut model, stamp, cost);
                total += cost;
            }
            3 => {
                let count = u64::from(kind >> 3) + 1;
                let (held, at) = match model.binary_search_by_key(&stamp, |&(s, _)| s) {
                    Ok(i) => (model[i].1, Some(i)),
                    Err(_) => (0, None),
                };
                let expected = held.min(count);
                assert_eq!(log.remove_at(stamp, count), expected, "remove_at({stamp}, {count})");
                if let Some(i) = at {
                    if held > expected {
                        model[i].1 -= expected;
                    } else {
                        model.remove(i);
                    }
                }
                total -= expected;
            }
            _ => {
                // Many admissions after the newest: `runs` lone entries (every
                // fourth one a run of 2), `gap` ms apart.
                let runs = (u64::from(pick) * 8 + 1).min(bulk_left);
                bulk_left -= runs;
                let gap = (offset.unsigned_abs() % 4096).max(1) as i64;
                let mut at = model.last().map_or(stamp, |&(newest, _)| newest + gap);
                for j in 0..runs {
                    let count = 1 + u64::from(j % 4 == 3);
                    if at > MAX_EXACT_MS || total + count > MAX_ENTRIES {
                        break;
                    }
                    log.record(at, count);
                    model.push((at, count));
                    total += count;
                    at += gap;
                }
            }
        }
        assert_eq!(log.len(), total);
        assert_eq!(log.newest(), model.last().map(|r| r.0));
        if model.len() >= FULL_CHECK_RUNS && i % 8 != 0 {
            continue;
        }
        check_against(&log, &model, stamp);
        for version in [Version::Groups, Version::Runs] {
            let bytes = encode(version, &log);
            match decode(version, &bytes) {
                Ok(decoded) => {
                    assert!(!model.is_empty());
                    assert_eq!(
                        check_canonical(&decoded, &bytes, version),
                        model,
                        "canonical bytes of {} runs",
                        model.len()
                    );
                }
                Err(e) => {
                    assert!(
                        model.is_empty(),
                        "the canonical bytes of {} runs do not decode: {e}",
                        model.len()
                    );
                    assert_eq!(e, DecodeError::Empty);
                }
            }
        }
    }
});

/// An accepted input: well-formed runs, and exactly the bytes it came from.
fn check_canonical(log: &RunLog, input: &[u8], version: Version) -> Model {
    let model: Model = log.runs().collect();
    for (i, &(stamp, count)) in model.iter().enumerate() {
        assert!((0..=MAX_EXACT_MS).contains(&stamp), "stamp {stamp}");
        assert!(count >= 1, "count {count}");
        assert!(i == 0 || stamp > model[i - 1].0, "stamps not increasing");
    }
    let total: u64 = model.iter().map(|r| r.1).sum();
    assert!((1..=MAX_ENTRIES).contains(&total), "{total} entries");
    assert_eq!(log.len(), total);
    assert_eq!(encode(version, log), input, "decode accepted a non-canonical form");
    check_against(log, &model, model.last().map_or(0, |r| r.0));
    model
}

/// Every `Log` query agrees with the model, at cutoffs around `stamp`.
fn check_against(log: &RunLog, model: &Model, stamp: i64) {
    assert!(log.runs().eq(model.iter().copied()), "runs differ from the model's");
    // Entries before each run, and in all.
    let mut before = Vec::with_capacity(model.len() + 1);
    let mut sum = 0u64;
    for &(_, count) in model {
        before.push(sum);
        sum += count;
    }
    before.push(sum);
    assert_eq!(log.len(), sum);
    assert_eq!(log.is_empty(), model.is_empty());
    assert_eq!(log.newest(), model.last().map(|r| r.0));
    for cutoff in [stamp - 1, stamp, stamp + 1, -1, MAX_EXACT_MS] {
        let first_live = model.partition_point(|&(s, _)| s <= cutoff);
        let expired = before[first_live];
        assert_eq!(log.count_expired(cutoff), expired, "count_expired({cutoff})");
        let live = sum - expired;
        for n in [0, 1, 2, live, live + 1] {
            // The run holding entry number `expired + n` (1-based).
            let expected = (n > 0 && n <= live).then(|| {
                let target = expired + n;
                model[before.partition_point(|&b| b < target) - 1].0
            });
            assert_eq!(log.nth_live(cutoff, n), expected, "nth_live({cutoff}, {n})");
        }
    }
}
