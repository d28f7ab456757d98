//! Differential test of the two storage forms: the same random call sequences
//! run against a server creating sorted-set windows and one creating compact
//! windows (`STORAGE compact`); every reply, the key's existence, its TTL class
//! and the stored entries must be equal after every call.
//!
//! The sequences (tests/common/sequences.rs, the model test's) cover ALLOW
//! with and without DETAILS and STAMP, PEEK, REFUND (of earlier, expired,
//! doubled and unknown stamps), 1 to 4 tiers, COST up to the limit and
//! beyond, NOW moving by 0, 1, around a tier's window, randomly and
//! backwards, tiers changing mid-sequence (windows up to 2^53 - 1), and limit
//! 0. Each call runs as `MULTI call; PTTL; PERSIST; EXISTS EXEC`, so real time
//! never expires a key between calls (as in tests/oracle_diff.rs).
//!
//! What would fail: any difference between `store/zset.rs` and
//! `store/compact.rs` in trim, count, nth_live, newest or record (an
//! off-by-one at the cutoff, a run's count lost when a stamp repeats, an
//! entry inserted at the wrong place after a step back, a refund removing
//! another count), a compact key left behind empty, or a TTL set (or not)
//! differently (a refund must set none).
use crate::common;
use common::*;

use common::sequences::*;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use redis::{Connection, Value};

/// What one call left behind: its reply, then `PTTL` (as a class: -2 no key,
/// -1 no expiry, 1 an expiry) and `EXISTS`.
fn run(
    conn: &mut Connection,
    command: &redis::Cmd,
    key: &str,
    window: i64,
) -> Result<(Value, i64, i64), TestCaseError> {
    let (reply, ttl, exists): (Value, i64, i64) = redis::pipe()
        .atomic()
        .add_command(command.clone())
        .cmd("PTTL")
        .arg(key)
        .cmd("PERSIST")
        .arg(key)
        .ignore()
        .cmd("EXISTS")
        .arg(key)
        .query(conn)
        .map_err(|e| TestCaseError::fail(format!("{e}")))?;
    if ttl >= 0 {
        // After an admission the TTL is window + 1000 on the server clock, or
        // longer than window + 500 if it was left alone (never shortened).
        prop_assert!(ttl > window + 500, "PTTL {} not above window + 500 ({})", ttl, window);
    }
    Ok((reply, ttl.signum(), exists))
}

fn check(zset: &mut Connection, compact: &mut Connection, key: &str, sequence: &Sequence) -> Result<(), TestCaseError> {
    for (i, call, tiers, now, refund_stamp) in walk(sequence) {
        let command = command_of(call, key, &tiers, now, refund_stamp);
        let longest = tiers.iter().map(|&(window, _)| window).max().unwrap_or(1);
        let context = format!("call {i} {call:?} tiers={tiers:?} now={now} refund_stamp={refund_stamp:?}");
        let on_zset = run(zset, &command, key, longest)?;
        let on_compact = run(compact, &command, key, longest)?;
        prop_assert_eq!(&on_compact, &on_zset, "reply, TTL class, EXISTS after {}", context);
        if refund_stamp.is_some() {
            // The previous call's PERSIST left no expiry: a refund sets none.
            prop_assert!(on_zset.1 != 1, "a refund set an expiry: {}", context);
        }
        if on_compact.2 == 1 {
            prop_assert_eq!(key_type(compact, key), "xcloaklog");
        }
        prop_assert_eq!(
            stored_stamps(compact, key),
            stored_stamps(zset, key),
            "stored entries after {}",
            context
        );
    }
    Ok(())
}

#[test]
fn compact_and_sorted_set_windows_answer_every_call_alike() {
    let zset_server = Server::start();
    let compact_server = ServerConfig::compact().start();
    let zset = std::cell::RefCell::new(zset_server.client());
    let compact = std::cell::RefCell::new(compact_server.client());
    let cases = std::env::var("XCLOAK_DIFF_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(128);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let case = std::cell::Cell::new(0u64);
    let result = runner.run(&sequence(), |sequence| {
        case.set(case.get() + 1);
        check(
            &mut zset.borrow_mut(),
            &mut compact.borrow_mut(),
            &format!("diff:{}", case.get()),
            &sequence,
        )
    });
    if let Err(failure) = result {
        panic!("{failure}");
    }
}

/// Wrong types and an emptied window: the same errors and no key left, on both forms.
#[test]
fn wrongtype_and_emptied_windows_alike() {
    for server in [Server::start(), ServerConfig::compact().start()] {
        let mut conn = server.client();
        let _: () = redis::cmd("SET").arg("s").arg("x").query(&mut conn).unwrap();
        for command in ["XCLOAK.ALLOW", "XCLOAK.PEEK"] {
            let err = redis::cmd(command)
                .arg("s")
                .arg(1000)
                .arg(5)
                .query::<i64>(&mut conn)
                .unwrap_err();
            assert_eq!(err.code(), Some("WRONGTYPE"), "{command}: {err}");
        }
        assert_eq!(allow_at(&mut conn, "w", 100, 5, 1_000), 1);
        // Everything expired: the trim empties the window, and a rejected call
        // (limit 0) leaves no key behind.
        assert_eq!(allow_at(&mut conn, "w", 100, 0, 5_000), 0);
        let exists: i64 = redis::cmd("EXISTS").arg("w").query(&mut conn).unwrap();
        assert_eq!(exists, 0, "an emptied window leaves no key");
    }
}
