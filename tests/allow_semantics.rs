//! XCLOAK.ALLOW's contract, call by call, against a real server: the TTL it
//! sets and never extends, the keys it leaves (none once a window is empty),
//! the sliding edge, WRONGTYPE, strict argument errors, member uniqueness at
//! one millisecond (also across a restart), and that short windows leak nothing.
//!
//! Timing: no assertion depends on how fast the machine is. TTLs are checked
//! against the server's own `TIME` taken right before and after the call, so
//! the bounds are exact; only the leak test waits, bounded, for active expiry.
use crate::common;
use common::*;

use std::collections::BTreeSet;
use std::time::Duration;

use redis::{Connection, Value};

const DAY_MS: i64 = 86_400_000;
const MAX_EXACT_MS: i64 = 9_007_199_254_740_991;

/// PEXPIRETIME exists (7.0+). Cached: `at_least_7_0` runs the server binary.
fn has_pexpiretime() -> bool {
    static CACHED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *CACHED.get_or_init(at_least_7_0)
}

/// The server's clock in ms, as `TIME` (the clock `RedisModule_Milliseconds` reads).
fn time_ms(value: &Value) -> i64 {
    let (secs, micros): (i64, i64) = redis::from_redis_value(value).expect("TIME reply");
    secs * 1000 + micros / 1000
}

/// A reply or the server's error line ("ERR ...", "WRONGTYPE ...").
fn reply(conn: &mut Connection, args: &[&str]) -> Result<Value, String> {
    let mut cmd = redis::cmd(args[0]);
    for arg in &args[1..] {
        cmd.arg(*arg);
    }
    cmd.query::<Value>(conn)
        .map_err(|e| format!("{} {}", e.code().unwrap_or("?"), e.detail().unwrap_or("")))
}

fn error_line(conn: &mut Connection, args: &[&str]) -> String {
    match reply(conn, args) {
        Err(line) => line,
        Ok(value) => panic!("{args:?} must fail, replied {value:?}"),
    }
}

fn int(conn: &mut Connection, args: &[&str]) -> i64 {
    match reply(conn, args) {
        Ok(Value::Int(n)) => n,
        other => panic!("{args:?}: expected an integer, got {other:?}"),
    }
}

/// Runs `XCLOAK.ALLOW args..` bracketed by the server's clock, and returns
/// (reply, server ms just before, server ms just after, absolute expiry (7.0+,
/// PEXPIRETIME), PTTL, server ms after PTTL). One pipeline, NOT a MULTI/EXEC:
/// Valkey (and Redis for keys) freezes the clock inside a transaction, so
/// `TIME` there would not bracket the module's live clock. A key may thus
/// expire before it is read (a stall of a second, for a 1 ms window): the
/// expiry then reads -2 and the caller retries.
fn allow_with_clock(conn: &mut Connection, args: &[&str]) -> (i64, i64, i64, Option<i64>, i64, i64) {
    let key = args[0];
    let mut pipe = redis::pipe();
    pipe.cmd("TIME");
    pipe.cmd("XCLOAK.ALLOW").arg(args);
    pipe.cmd("TIME");
    if has_pexpiretime() {
        pipe.cmd("PEXPIRETIME").arg(key);
    }
    pipe.cmd("PTTL").arg(key).cmd("TIME");
    let values: Vec<Value> = pipe.query(conn).expect("pipeline");
    let allowed: i64 = redis::from_redis_value(&values[1]).unwrap();
    let (before, after) = (time_ms(&values[0]), time_ms(&values[2]));
    let (expire_at, pttl, last) = if has_pexpiretime() {
        (
            Some(redis::from_redis_value(&values[3]).unwrap()),
            redis::from_redis_value(&values[4]).unwrap(),
            time_ms(&values[5]),
        )
    } else {
        (None, redis::from_redis_value(&values[3]).unwrap(), time_ms(&values[4]))
    };
    (allowed, before, after, expire_at, pttl, last)
}

/// After an admission the TTL is window + 1000 ms from the server's clock at
/// the call: strictly more than the window, at most window + 1000. Checked for
/// a 1 ms window, a day, the largest window, and with NOW far from the server
/// clock (the TTL follows the server clock, never NOW).
/// Fails if: no TTL is set (-1), the TTL is relative to NOW, the margin is
/// missing (TTL == window would drop live entries) or larger than 1000 ms.
#[test]
fn ttl_after_admission_is_window_plus_the_margin() {
    let server = Server::start();
    let mut conn = server.client();
    let windows = [1, 2, 999, 1000, 1001, 60_000, DAY_MS, MAX_EXACT_MS];
    for (i, window) in windows.into_iter().enumerate() {
        for now in [None, Some("0"), Some("1700000000000"), Some("9000000000000000")] {
            let window_text = window.to_string();
            // Fresh key per attempt; another attempt only if it expired unread.
            let mut attempt = 0;
            let (args, (allowed, before, after, expire_at, pttl, last)) = loop {
                let key = format!("ttl:{i}:{}:{attempt}", now.unwrap_or("server"));
                let mut args = vec![key.clone(), window_text.clone(), "5".to_string()];
                if let Some(now) = now {
                    args.extend(["NOW".to_string(), now.to_string()]);
                }
                let refs: Vec<&str> = args.iter().map(String::as_str).collect();
                let result = allow_with_clock(&mut conn, &refs);
                attempt += 1;
                if (result.3 != Some(-2) && result.4 != -2) || attempt == 5 {
                    break (args, result);
                }
            };
            assert_eq!(allowed, 1, "{args:?}");
            let context =
                format!("{args:?}: before {before} after {after} expire_at {expire_at:?} pttl {pttl} last {last}");
            if let Some(expire_at) = expire_at {
                // Set at a server ms in [before, after]: TTL at the call = window + 1000.
                assert!(expire_at >= before + window + 1000, "{context}");
                assert!(expire_at <= after + window + 1000, "{context}");
            } else {
                // 6.2: PTTL = expiry - clock at PTTL, that clock in [after, last].
                assert!(pttl <= window + 1000, "{context}");
                assert!(pttl + last >= before + window + 1000, "{context}");
            }
            assert!(pttl > 0, "a key with entries has a TTL: {context}");
        }
    }
}

/// A busy key re-arms its expiry at most every 500 ms: while the expiry is
/// still more than `window + 500` ms away an admission leaves it (and the
/// replication stream) alone; once it is closer, the next admission re-arms it
/// to `window + 1000`. After every admission the TTL is in (window + 500, window + 1000].
/// Fails if: every admission re-arms (the expiry moves within 500 ms), or a key
/// is never re-armed (its TTL would fall below the window and live entries expire).
#[test]
fn a_busy_key_re_arms_its_expiry_at_most_every_500_ms() {
    let server = Server::start();
    let mut conn = server.client();
    let window: i64 = 60_000;
    let w = window.to_string();
    let (allowed, start, _, _, _, _) = allow_with_clock(&mut conn, &["busy", &w, "1000"]);
    assert_eq!(allowed, 1);
    let first = absolute_expiry(&mut conn, "busy");
    for _ in 0..20 {
        assert_eq!(int(&mut conn, &["XCLOAK.ALLOW", "busy", &w, "1000"]), 1);
    }
    let (allowed, _, end, _, pttl, _) = allow_with_clock(&mut conn, &["busy", &w, "1000"]);
    assert_eq!(allowed, 1);
    assert!(
        pttl > window + 500 && pttl <= window + 1000,
        "PTTL {pttl} after an admission"
    );
    if end - start < 450 {
        assert_no_later(first, absolute_expiry(&mut conn, "busy"), "22 admissions within 450 ms");
    } else {
        eprintln!(
            "slow machine: 22 calls took {} ms, the no-re-arm half is not checked",
            end - start
        );
    }

    // Once the expiry is within window + 400 (about 600 ms later), the next admission re-arms it.
    let closer = eventually(Duration::from_secs(10), || {
        int(&mut conn, &["PTTL", "busy"]) <= window + 400
    });
    assert!(closer, "the TTL of busy did not fall to window + 400");
    let (allowed, before, after, _, pttl, _) = allow_with_clock(&mut conn, &["busy", &w, "1000"]);
    assert_eq!(allowed, 1);
    let rearmed = absolute_expiry(&mut conn, "busy");
    assert!(
        rearmed + 1 >= before + window + 1000 && rearmed <= after + window + 1000 + 1,
        "re-armed to {rearmed}, the call ran in [{before}, {after}]"
    );
    assert!(rearmed > first, "the expiry moved on");
    assert!(
        pttl > window + 500 && pttl <= window + 1000,
        "PTTL {pttl} after the re-arming admission"
    );
}

/// A rejection leaves the TTL exactly where the last admission put it, also
/// when the same call trims old entries. A trim that empties the key deletes it.
/// Fails if: a rejection re-arms the TTL (keys of a client hammering a closed
/// window would then live forever), or an emptied window leaves an empty key.
#[test]
fn rejection_keeps_the_ttl_and_an_empty_window_leaves_no_key() {
    let server = Server::start();
    let mut conn = server.client();

    // Server clock: admit, wait a little so a re-armed TTL would differ, reject.
    let (allowed, ..) = allow_with_clock(&mut conn, &["rej:clock", "60000", "1"]);
    assert_eq!(allowed, 1);
    let expiry_before = absolute_expiry(&mut conn, "rej:clock");
    wait_server_clock(&mut conn, 30);
    for _ in 0..3 {
        assert_eq!(int(&mut conn, &["XCLOAK.ALLOW", "rej:clock", "60000", "1"]), 0);
    }
    let expiry_after = absolute_expiry(&mut conn, "rej:clock");
    assert_no_later(expiry_before, expiry_after, "rejection at the server clock");

    // NOW: entries at 1000 and 1600 (window 1000). At 2100 the one from 1000
    // leaves (1000 <= 2100 - 1000); with limit 1 the call is rejected.
    assert_eq!(
        int(&mut conn, &["XCLOAK.ALLOW", "rej:now", "1000", "2", "NOW", "1000"]),
        1
    );
    assert_eq!(
        int(&mut conn, &["XCLOAK.ALLOW", "rej:now", "1000", "2", "NOW", "1600"]),
        1
    );
    let expiry_before = absolute_expiry(&mut conn, "rej:now");
    wait_server_clock(&mut conn, 30);
    assert_eq!(
        int(&mut conn, &["XCLOAK.ALLOW", "rej:now", "1000", "1", "NOW", "2100"]),
        0
    );
    assert_eq!(
        entries(&mut conn, "rej:now").iter().map(|e| e.1).collect::<Vec<_>>(),
        [1600.0],
        "trimmed on rejection"
    );
    let expiry_after = absolute_expiry(&mut conn, "rej:now");
    assert_no_later(expiry_before, expiry_after, "rejection that trims");

    // Trimmed to empty by a rejecting call (limit 0): no key at all.
    assert_eq!(
        int(&mut conn, &["XCLOAK.ALLOW", "rej:now", "1000", "0", "NOW", "2600"]),
        0
    );
    assert_eq!(
        int(&mut conn, &["EXISTS", "rej:now"]),
        0,
        "a window trimmed to empty leaves no key"
    );

    // Trimmed to empty, then admitted in the same call: only the new entry.
    for now in ["5000", "5001", "5002"] {
        assert_eq!(int(&mut conn, &["XCLOAK.ALLOW", "reuse", "100", "3", "NOW", now]), 1);
    }
    assert_eq!(int(&mut conn, &["XCLOAK.ALLOW", "reuse", "100", "3", "NOW", "5102"]), 1);
    assert_eq!(
        entries(&mut conn, "reuse").iter().map(|e| e.1).collect::<Vec<_>>(),
        [5102.0]
    );

    // Limit 0 on a missing key: rejected, nothing created, nothing else changed.
    let before = digest(&mut conn);
    assert_eq!(int(&mut conn, &["XCLOAK.ALLOW", "never", "1000", "0"]), 0);
    assert_eq!(int(&mut conn, &["XCLOAK.ALLOW", "never", "1000", "0", "NOW", "123"]), 0);
    assert_eq!(int(&mut conn, &["EXISTS", "never"]), 0);
    assert_eq!(digest(&mut conn), before);
}

/// The key's expiry in absolute server ms (PEXPIRETIME, or TIME + PTTL on 6.2).
fn absolute_expiry(conn: &mut Connection, key: &str) -> i64 {
    if has_pexpiretime() {
        return int(conn, &["PEXPIRETIME", key]);
    }
    let (time, pttl): (Value, i64) = redis::pipe()
        .atomic()
        .cmd("TIME")
        .cmd("PTTL")
        .arg(key)
        .query(conn)
        .unwrap();
    assert!(pttl > 0, "{key} has a TTL");
    time_ms(&time) + pttl
}

fn assert_no_later(before: i64, after: i64, what: &str) {
    if has_pexpiretime() {
        assert_eq!(after, before, "{what}: the TTL must not move");
    } else {
        // TIME + PTTL is exact to the millisecond it straddles.
        assert!(
            after <= before + 1,
            "{what}: the TTL was extended ({before} -> {after})"
        );
    }
}

/// Sliding, not fixed: with limit 3 and window 100, entries admitted at
/// t, t+10, t+20 leave one by one at exactly t+100, t+110, t+120, each
/// freeing one slot; 1 ms earlier each is still live.
/// Fails if: an entry leaves early or late (off-by-one in `score <= now -
/// window`), or a window edge frees all slots at once (fixed window).
#[test]
fn window_slides_one_entry_at_a_time_at_score_plus_window() {
    let server = Server::start();
    let mut conn = server.client();
    let t: i64 = 1_700_000_000_000;
    let at = |conn: &mut Connection, now: i64| allow_at(conn, "slide", 100, 3, now);
    for now in [t, t + 10, t + 20] {
        assert_eq!(at(&mut conn, now), 1);
    }
    for (edge, oldest) in [(t + 100, t), (t + 110, t + 10), (t + 120, t + 20)] {
        assert_eq!(
            at(&mut conn, edge - 1),
            0,
            "at {} the entry from {oldest} is live",
            edge - 1 - t
        );
        assert_eq!(
            at(&mut conn, edge),
            1,
            "at {} the entry from {oldest} has left",
            edge - t
        );
        assert_eq!(at(&mut conn, edge), 0, "only one slot opened at {}", edge - t);
        let scores: Vec<f64> = entries(&mut conn, "slide").iter().map(|e| e.1).collect();
        assert_eq!(scores.len(), 3);
        assert!(scores[0] > oldest as f64, "the entry from {oldest} is gone: {scores:?}");
    }
    let scores: Vec<i64> = entries(&mut conn, "slide").iter().map(|e| e.1 as i64 - t).collect();
    assert_eq!(scores, [100, 110, 120]);
}

/// COST admits all of its units or none.
/// Fails if: a call that does not fit records part of its cost, or `count +
/// cost <= limit` is off by one.
#[test]
fn cost_is_all_or_nothing() {
    let server = Server::start();
    let mut conn = server.client();
    let call = |conn: &mut Connection, cost: &str| {
        int(conn, &["XCLOAK.ALLOW", "cost", "1000", "5", "COST", cost, "NOW", "10"])
    };
    assert_eq!(call(&mut conn, "3"), 1);
    assert_eq!(call(&mut conn, "3"), 0);
    assert_eq!(int(&mut conn, &["ZCARD", "cost"]), 3);
    assert_eq!(call(&mut conn, "2"), 1);
    assert_eq!(int(&mut conn, &["ZCARD", "cost"]), 5);
    assert_eq!(call(&mut conn, "1"), 0);
    assert_eq!(int(&mut conn, &["XCLOAK.ALLOW", "cost6", "1000", "5", "COST", "6"]), 0);
    assert_eq!(int(&mut conn, &["EXISTS", "cost6"]), 0);
}

/// Keys of every other type: WRONGTYPE, and the key (value, TTL) and the
/// whole dataset (DEBUG DIGEST) are untouched.
/// Fails if: the command overwrites or deletes a foreign key, or answers 0/1.
#[test]
fn other_types_get_wrongtype_and_stay_untouched() {
    let server = Server::start();
    let mut conn = server.client();
    int(&mut conn, &["RPUSH", "list", "a", "b"]);
    int(&mut conn, &["HSET", "hash", "f", "v"]);
    int(&mut conn, &["SADD", "set", "m"]);
    reply(&mut conn, &["SET", "string", "1700000000000"]).unwrap();
    reply(&mut conn, &["XADD", "stream", "*", "f", "v"]).unwrap();
    int(&mut conn, &["PEXPIRE", "hash", "600000"]);
    let before = digest(&mut conn);
    for key in ["string", "list", "hash", "set", "stream"] {
        let key_type: String = redis::cmd("TYPE").arg(key).query(&mut conn).unwrap();
        let pttl_before = int(&mut conn, &["PTTL", key]);
        for args in [
            vec!["XCLOAK.ALLOW", key, "1000", "10"],
            vec!["XCLOAK.ALLOW", key, "1", "0", "NOW", "9007199254740991"],
            vec!["XCLOAK.ALLOW", key, "1000", "10", "COST", "2", "NOW", "5", "DETAILS"],
        ] {
            let line = error_line(&mut conn, &args);
            assert!(line.starts_with("WRONGTYPE"), "{args:?}: {line}");
        }
        let type_after: String = redis::cmd("TYPE").arg(key).query(&mut conn).unwrap();
        assert_eq!(type_after, key_type);
        let pttl_after = int(&mut conn, &["PTTL", key]);
        assert!(
            pttl_after <= pttl_before && (pttl_before < 0) == (pttl_after < 0),
            "{key}: TTL untouched"
        );
    }
    assert_eq!(digest(&mut conn), before, "no data changed");
}

/// Every malformed call is refused with an ERR naming the argument and its
/// range (or the standard arity error), on a missing key, a live window and a
/// key of another type alike, and the dataset (DEBUG DIGEST) is unchanged.
/// Fails if: a value Redis would not parse as an integer is accepted (" 1",
/// "+1", "1.5", "0x10", "1e3", ""), a range edge is off by one, or an error
/// is generic ("ERR syntax error") where it must name the argument.
#[test]
fn bad_arguments_are_refused_by_name_and_change_nothing() {
    let server = Server::start();
    let mut conn = server.client();
    allow_at(&mut conn, "live", 60_000, 10, 1_700_000_000_000);
    int(&mut conn, &["SADD", "aset", "m"]);
    let before = digest(&mut conn);

    let window_range = "window must be an integer from 1 to 9007199254740991";
    let limit_range = "limit must be an integer from 0 to 1000000";
    let now_range = "NOW must be an integer from 0 to 9007199254740991";
    let cost_range = "COST must be an integer from 1 to 1000000";
    let mut cases: Vec<(Vec<&str>, &str)> = Vec::new();
    for bad in [
        "0",
        "9007199254740992",
        "-1",
        "1.5",
        " 1",
        "1 ",
        "+1",
        "0x10",
        "1e3",
        "",
        "01",
        "-0",
        "abc",
        "99999999999999999999",
    ] {
        cases.push((vec![bad, "10"], window_range));
        if bad != "0" {
            cases.push((vec!["1000", bad], limit_range));
        }
        if !matches!(bad, "0" | "9007199254740992") {
            cases.push((vec!["1000", "10", "NOW", bad], now_range));
        }
        if bad != "9007199254740992" {
            cases.push((vec!["1000", "10", "COST", bad], cost_range));
        }
    }
    cases.extend([
        (vec!["1000", "-1"], limit_range),
        (vec!["1000", "1000001"], limit_range),
        (vec!["1000", "10", "NOW", "-1"], now_range),
        (vec!["1000", "10", "NOW", "9007199254740992"], now_range),
        (vec!["1000", "10", "COST", "1000001"], cost_range),
        (vec!["1000", "10", "NOW"], "NOW needs a value"),
        (vec!["1000", "10", "COST"], "COST needs a value"),
        (
            vec!["1000", "10", "NOW", "5", "NOW", "6"],
            "NOW is given more than once",
        ),
        (vec!["1000", "10", "FOO"], "unknown option 'FOO'"),
        (vec!["1000", "10", "NOW", "5", "extra"], "unknown option 'extra'"),
        (vec!["1000", "10", "5"], "unknown option '5'"),
    ]);
    for key in ["missing", "live", "aset"] {
        for (tail, expected) in &cases {
            let mut args = vec!["XCLOAK.ALLOW", key];
            args.extend(tail.iter().copied());
            let line = error_line(&mut conn, &args);
            assert!(line.starts_with("ERR "), "{args:?}: {line}");
            assert!(line.contains(expected), "{args:?}: {line:?} must contain {expected:?}");
        }
        for short in [
            vec!["XCLOAK.ALLOW"],
            vec!["XCLOAK.ALLOW", key],
            vec!["XCLOAK.ALLOW", key, "1000"],
        ] {
            let line = error_line(&mut conn, &short).to_ascii_lowercase();
            assert!(
                line.contains("wrong number of arguments") && line.contains("xcloak.allow"),
                "{short:?}: {line}"
            );
        }
    }
    assert_eq!(digest(&mut conn), before, "no bad call changed data");
    assert_eq!(int(&mut conn, &["EXISTS", "missing"]), 0);
}

/// 1,200 admissions at one NOW, then a COST 300 call: all members distinct
/// (ZCARD counts every admission), the first 1,000 in the compact integer form
/// `s*1000+k` (s = now mod 10^11), then `s:kkkkkkkkkk`. After a restart (AOF) at the same NOW,
/// 500 more admissions add 500 new members and keep every old one.
/// Fails if: a member repeats (ZADD would overwrite it and ZCARD fall short,
/// i.e. one request too many let through later), the slot counter restarts at
/// 0 after a restart (it is derived from the data, not from memory), or the
/// switch at k = 1000 collides.
#[test]
fn same_millisecond_members_stay_distinct_across_a_restart() {
    let mut server = ServerConfig::default()
        .arg("appendonly", "yes")
        .arg("appendfsync", "always")
        .start();
    let mut conn = server.client();
    let now: i64 = 1_700_000_000_123;
    let admit = |conn: &mut Connection, n: usize| {
        let mut pipe = redis::pipe();
        for _ in 0..n {
            pipe.cmd("XCLOAK.ALLOW")
                .arg("burst")
                .arg(DAY_MS)
                .arg(1_000_000)
                .arg("NOW")
                .arg(now);
        }
        let replies: Vec<i64> = pipe.query(conn).unwrap();
        assert!(replies.iter().all(|&r| r == 1), "all admitted");
    };
    admit(&mut conn, 1200);
    assert_eq!(int(&mut conn, &["ZCARD", "burst"]), 1200);
    assert_eq!(
        int(
            &mut conn,
            &[
                "XCLOAK.ALLOW",
                "burst",
                &DAY_MS.to_string(),
                "1000000",
                "COST",
                "300",
                "NOW",
                &now.to_string()
            ]
        ),
        1
    );
    assert_eq!(int(&mut conn, &["ZCARD", "burst"]), 1500);

    let first = entries(&mut conn, "burst");
    assert!(first.iter().all(|e| e.1 == now as f64));
    let members: BTreeSet<String> = first.iter().map(|e| e.0.clone()).collect();
    assert_eq!(members.len(), 1500);
    let stamp = now % 100_000_000_000;
    for k in [0, 1, 999] {
        assert!(members.contains(&(stamp * 1000 + k).to_string()), "compact member {k}");
    }
    for k in [1000, 1001, 1499] {
        assert!(members.contains(&format!("{stamp}:{k:010}")), "long member {k}");
    }

    server.restart();
    let mut conn = server.client();
    assert_eq!(entries(&mut conn, "burst"), first, "the AOF restores every entry");
    assert!(int(&mut conn, &["PTTL", "burst"]) > 0);
    admit(&mut conn, 500);
    let second = entries(&mut conn, "burst");
    assert_eq!(second.len(), 2000, "500 new members, none overwritten");
    let after: BTreeSet<String> = second.iter().map(|e| e.0.clone()).collect();
    assert!(members.is_subset(&after), "every old member is still there");
    assert!(after.contains(&format!("{stamp}:{:010}", 1999)));
}

/// Thousands of keys with a 50 ms window on the server clock: each carries a
/// TTL of at most 1,050 ms, and all of them disappear by themselves (active
/// expiry): DBSIZE returns to 0. Keys emptied by a later call vanish at once.
/// Fails if: an admission leaves a key without TTL, or with a TTL far beyond
/// window + 1000 (one leaked key per client identity).
#[test]
fn short_windows_leave_no_keys_behind() {
    let server = Server::start();
    let mut conn = server.client();
    const KEYS: usize = 3000;
    let mut pipe = redis::pipe();
    for i in 0..KEYS {
        pipe.cmd("XCLOAK.ALLOW").arg(format!("leak:{i}")).arg(50).arg(3);
    }
    let replies: Vec<i64> = pipe.query(&mut conn).unwrap();
    assert!(replies.iter().all(|&r| r == 1));
    let mut pipe = redis::pipe();
    for i in 0..KEYS {
        pipe.cmd("PTTL").arg(format!("leak:{i}"));
    }
    let ttls: Vec<i64> = pipe.query(&mut conn).unwrap();
    for (i, ttl) in ttls.iter().enumerate() {
        // -2: already expired (a slow machine); -1 would be a leak.
        assert!(*ttl == -2 || (1..=1050).contains(ttl), "leak:{i} has PTTL {ttl}");
    }

    // Emptied by a call after the window (NOW-driven): gone immediately.
    let mut pipe = redis::pipe();
    for i in 0..500 {
        pipe.cmd("XCLOAK.ALLOW")
            .arg(format!("trim:{i}"))
            .arg(50)
            .arg(3)
            .arg("NOW")
            .arg(1_000);
        pipe.cmd("XCLOAK.ALLOW")
            .arg(format!("trim:{i}"))
            .arg(50)
            .arg(0)
            .arg("NOW")
            .arg(1_050);
    }
    let replies: Vec<i64> = pipe.query(&mut conn).unwrap();
    assert_eq!(replies.iter().sum::<i64>(), 500);
    let mut pipe = redis::pipe();
    for i in 0..500 {
        pipe.cmd("EXISTS").arg(format!("trim:{i}"));
    }
    let exists: Vec<i64> = pipe.query(&mut conn).unwrap();
    assert_eq!(exists.iter().sum::<i64>(), 0, "emptied windows leave no key");

    let gone = eventually(Duration::from_secs(30), || {
        redis::cmd("DBSIZE").query::<i64>(&mut conn).unwrap() == 0
    });
    let left: i64 = redis::cmd("DBSIZE").query(&mut conn).unwrap();
    assert!(gone, "{left} keys still there 30 s after their TTL");
}
