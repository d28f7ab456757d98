//! Hostile input: every malformed call is an error that names the problem,
//! changes nothing (`DEBUG DIGEST`), and leaves the server up.
use crate::common;
use common::*;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use redis::{Connection, Value};

const ALLOW: &[u8] = b"XCLOAK.ALLOW";
const PEEK: &[u8] = b"XCLOAK.PEEK";
const DAY: i64 = 86_400_000;

/// A dataset with xcloak windows (long TTLs, so nothing expires during the
/// test) and one key of every other type.
fn populate(conn: &mut Connection) {
    for (i, key) in ["rl:a", "rl:b", "k", "\0\r\n"].iter().enumerate() {
        for n in 0..3 {
            let _: i64 = redis::cmd("XCLOAK.ALLOW")
                .arg(*key)
                .arg(DAY)
                .arg(10)
                .arg("NOW")
                .arg(1_700_000_000_000i64 + n + i as i64)
                .query(conn)
                .unwrap();
        }
    }
    let _: () = redis::cmd("SET").arg("string").arg("v").query(conn).unwrap();
    let _: () = redis::cmd("RPUSH").arg("list").arg("a").arg("b").query(conn).unwrap();
    let _: () = redis::cmd("HSET").arg("hash").arg("f").arg("v").query(conn).unwrap();
    let _: () = redis::cmd("SADD").arg("set").arg("m").query(conn).unwrap();
    let _: () = redis::cmd("ZADD")
        .arg("zforeign")
        .arg(1)
        .arg("alice")
        .arg(2)
        .arg("bob")
        .query(conn)
        .unwrap();
    let _: String = redis::cmd("XADD")
        .arg("stream")
        .arg("*")
        .arg("f")
        .arg("v")
        .query(conn)
        .unwrap();
}

/// The error text of a call that must fail, as "CODE detail".
fn error_of(conn: &mut Connection, argv: &[Vec<u8>]) -> Result<String, Value> {
    let mut cmd = redis::cmd(std::str::from_utf8(&argv[0]).unwrap());
    for arg in &argv[1..] {
        cmd.arg(arg.as_slice());
    }
    match cmd.query::<Value>(conn) {
        Ok(value) => Err(value),
        Err(e) => Ok(format!("{} {}", e.code().unwrap_or("?"), e.detail().unwrap_or(""))),
    }
}

fn line(command: &[u8], words: &[&[u8]]) -> Vec<Vec<u8>> {
    std::iter::once(command)
        .chain(words.iter().copied())
        .map(<[u8]>::to_vec)
        .collect()
}

/// (command, arguments after the name, text the error must contain)
/// A command, its arguments and the error text it must get.
type Case<'a> = (&'a [u8], &'a [&'a [u8]], &'a str);

fn cases() -> Vec<(Vec<Vec<u8>>, &'static str)> {
    let arity = "wrong number of arguments";
    let w = "window must be an integer from 1 to 9007199254740991";
    let l = "limit must be an integer from 0 to 1000000";
    let c = "COST must be an integer from 1 to 1000000";
    let n = "NOW must be an integer from 0 to 9007199254740991";
    let t: &[Case] = &[
        // Arity, both commands.
        (ALLOW, &[], arity),
        (ALLOW, &[b"k"], arity),
        (ALLOW, &[b"k", b"1000"], arity),
        (PEEK, &[], arity),
        (PEEK, &[b"k", b"1000"], arity),
        // window: non-integers, signs, spaces, decimals, hex, exponents, empty, edges, overflow.
        (ALLOW, &[b"k", b"abc", b"10"], w),
        (ALLOW, &[b"k", b"", b"10"], w),
        (ALLOW, &[b"k", b" 1000", b"10"], w),
        (ALLOW, &[b"k", b"1000 ", b"10"], w),
        (ALLOW, &[b"k", b"+1000", b"10"], w),
        (ALLOW, &[b"k", b"1000.0", b"10"], w),
        (ALLOW, &[b"k", b"1e3", b"10"], w),
        (ALLOW, &[b"k", b"0x3e8", b"10"], w),
        (ALLOW, &[b"k", b"0", b"10"], w),
        (ALLOW, &[b"k", b"-1", b"10"], w),
        (ALLOW, &[b"k", b"01000", b"10"], w),
        (ALLOW, &[b"k", b"9007199254740992", b"10"], w),
        (ALLOW, &[b"k", b"9223372036854775808", b"10"], w),
        (ALLOW, &[b"k", b"18446744073709551616", b"10"], w),
        (ALLOW, &[b"k", b"-9223372036854775809", b"10"], w),
        (ALLOW, &[b"k", b"1000\0", b"10"], w),
        (PEEK, &[b"k", b"1 000", b"10"], w),
        (PEEK, &[b"k", b"-0", b"10"], w),
        // limit.
        (ALLOW, &[b"k", b"1000", b"-1"], l),
        (ALLOW, &[b"k", b"1000", b"1000001"], l),
        (ALLOW, &[b"k", b"1000", b"ten"], l),
        (ALLOW, &[b"k", b"1000", b""], l),
        (ALLOW, &[b"k", b"1000", b"1.5"], l),
        (ALLOW, &[b"k", b"1000", b"18446744073709551615"], l),
        (ALLOW, &[b"k", b"1000", b"-0"], l),
        (PEEK, &[b"k", b"1000", b"1000001"], l),
        (PEEK, &[b"k", b"1000", b"1E2"], l),
        // COST.
        (ALLOW, &[b"k", b"1000", b"10", b"COST", b"0"], c),
        (ALLOW, &[b"k", b"1000", b"10", b"COST", b"1000001"], c),
        (ALLOW, &[b"k", b"1000", b"10", b"COST", b"-1"], c),
        (ALLOW, &[b"k", b"1000", b"10", b"COST", b""], c),
        (ALLOW, &[b"k", b"1000", b"10", b"COST", b"1e2"], c),
        (ALLOW, &[b"k", b"1000", b"10", b"COST", b"1\r\n"], c),
        (ALLOW, &[b"k", b"1000", b"10", b"COST", b"COST"], c),
        (ALLOW, &[b"k", b"1000", b"10", b"COST"], "COST needs a value"),
        (
            ALLOW,
            &[b"k", b"1000", b"10", b"COST", b"1", b"cost", b"2"],
            "COST is given more than once",
        ),
        (PEEK, &[b"k", b"1000", b"10", b"COST", b"0"], c),
        (
            PEEK,
            &[b"k", b"1000", b"10", b"COST", b"1", b"COST", b"1"],
            "COST is given more than once",
        ),
        // NOW.
        (ALLOW, &[b"k", b"1000", b"10", b"NOW", b"-1"], n),
        (ALLOW, &[b"k", b"1000", b"10", b"NOW", b"9007199254740992"], n),
        (ALLOW, &[b"k", b"1000", b"10", b"NOW", b"1700000000000.5"], n),
        (ALLOW, &[b"k", b"1000", b"10", b"NOW", b"0x10"], n),
        (ALLOW, &[b"k", b"1000", b"10", b"NOW", b"9223372036854775807"], n),
        (ALLOW, &[b"k", b"1000", b"10", b"NOW", b"\0"], n),
        (ALLOW, &[b"k", b"1000", b"10", b"NOW"], "NOW needs a value"),
        (
            ALLOW,
            &[b"k", b"1000", b"10", b"NOW", b"1", b"NOW", b"1"],
            "NOW is given more than once",
        ),
        (PEEK, &[b"k", b"1000", b"10", b"NOW", b"-1"], n),
        (PEEK, &[b"k", b"1000", b"10", b"now"], "NOW needs a value"),
        // DETAILS and unknown options.
        (
            ALLOW,
            &[b"k", b"1000", b"10", b"DETAILS", b"details"],
            "DETAILS is given more than once",
        ),
        (ALLOW, &[b"k", b"1000", b"10", b"FOO"], "unknown option 'FOO'"),
        (ALLOW, &[b"k", b"1000", b"10", b""], "unknown option ''"),
        (
            ALLOW,
            &[b"k", b"1000", b"10", b"NOW", b"1", b"DETAILS", b"extra"],
            "unknown option 'extra'",
        ),
        (ALLOW, &[b"k", b"1000", b"10", b"\0\r\nX"], "unknown option '???X'"),
        (
            PEEK,
            &[b"k", b"1000", b"10", b"DETAILS"],
            "unknown option 'DETAILS' (expected TIER, COST, NOW or OLDEST)",
        ),
        (PEEK, &[b"k", b"1000", b"10", b"NOWX"], "unknown option 'NOWX'"),
        // Binary and empty keys with a bad argument: the argument is named, the key untouched.
        (ALLOW, &[b"\0\r\n", b"0", b"10"], w),
        (ALLOW, &[b"k\0\r\nk", b"1000", b"-5"], l),
        (PEEK, &[b"", b"1000", b"10", b"COST", b"x"], c),
        // Keys of every other type.
        (ALLOW, &[b"string", b"1000", b"10"], "WRONGTYPE"),
        (ALLOW, &[b"list", b"1000", b"10", b"DETAILS"], "WRONGTYPE"),
        (ALLOW, &[b"hash", b"1000", b"10", b"COST", b"2"], "WRONGTYPE"),
        (ALLOW, &[b"set", b"1000", b"10", b"NOW", b"5"], "WRONGTYPE"),
        (ALLOW, &[b"stream", b"1000", b"10"], "WRONGTYPE"),
        (PEEK, &[b"string", b"1000", b"10"], "WRONGTYPE"),
        (PEEK, &[b"list", b"1000", b"10"], "WRONGTYPE"),
        (PEEK, &[b"hash", b"1000", b"10"], "WRONGTYPE"),
        (PEEK, &[b"set", b"1000", b"10"], "WRONGTYPE"),
        (PEEK, &[b"stream", b"1000", b"10", b"COST", b"3"], "WRONGTYPE"),
    ];
    t.iter().map(|(cmd, words, want)| (line(cmd, words), *want)).collect()
}

#[test]
fn every_malformed_call_is_a_named_error_that_changes_nothing() {
    let server = Server::start();
    let mut conn = server.client();
    populate(&mut conn);
    let before = digest(&mut conn);
    let errors_before: i64 = info_field(&mut conn, "xcloak", "xcloak_errors")
        .unwrap()
        .parse()
        .unwrap();
    let cases = cases();
    assert!(cases.len() >= 40, "the table has {} cases", cases.len());

    let mut failures = Vec::new();
    for (argv, want) in &cases {
        match error_of(&mut conn, argv) {
            Ok(text) => {
                let code = if *want == "WRONGTYPE" { "WRONGTYPE " } else { "ERR " };
                if !text.starts_with(code) || !text.contains(want) {
                    failures.push(format!("{argv:?}: got {text:?}, want {code}... {want:?}"));
                }
            }
            Err(value) => failures.push(format!("{argv:?}: not an error: {value:?}")),
        }
        let pong: String = redis::cmd("PING").query(&mut conn).unwrap();
        assert_eq!(pong, "PONG");
        let now = digest(&mut conn);
        if now != before {
            failures.push(format!("{argv:?}: DEBUG DIGEST changed"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
    let errors_after: i64 = info_field(&mut conn, "xcloak", "xcloak_errors")
        .unwrap()
        .parse()
        .unwrap();
    // Short calls may be refused by the server itself (Redis 7 checks argc
    // against the key position before calling the module): those are not counted.
    let arity = cases
        .iter()
        .filter(|(_, want)| want.starts_with("wrong number"))
        .count() as i64;
    let counted = errors_after - errors_before;
    assert!(
        (cases.len() as i64 - arity..=cases.len() as i64).contains(&counted),
        "every error the module answers is counted in INFO xcloak: {counted} of {} ({arity} arity)",
        cases.len()
    );

    // The foreign sorted set is a valid window (its scores are stamps): untouched by PEEK.
    let foreign = entries(&mut conn, "zforeign");
    let peek: Vec<i64> = redis::cmd("XCLOAK.PEEK")
        .arg("zforeign")
        .arg(10)
        .arg(5)
        .arg("NOW")
        .arg(5)
        .query(&mut conn)
        .unwrap();
    assert_eq!(
        peek,
        [1, 5, 3, 0, 7],
        "alice@1 and bob@2 are live at 5 in a 10 ms window"
    );
    assert_eq!(entries(&mut conn, "zforeign"), foreign);
}

#[test]
fn binary_keys_work_and_stay_distinct() {
    let server = Server::start();
    let mut conn = server.client();
    let keys: [&[u8]; 4] = [b"a\0b", b"a\0c", b"\r\n", b"a"];
    for key in keys {
        for expected in [1, 1, 0] {
            let got: i64 = redis::cmd("XCLOAK.ALLOW")
                .arg(key)
                .arg(DAY)
                .arg(2)
                .query(&mut conn)
                .unwrap();
            assert_eq!(got, expected, "key {key:?}");
        }
    }
    for key in keys {
        let card: i64 = redis::cmd("ZCARD").arg(key).query(&mut conn).unwrap();
        assert_eq!(card, 2, "key {key:?}");
    }
    let dbsize: i64 = redis::cmd("DBSIZE").query(&mut conn).unwrap();
    assert_eq!(dbsize, 4);
}

/// Tokens that are almost valid, to reach deep into the grammar.
fn near_valid() -> impl Strategy<Value = Vec<u8>> {
    let words: Vec<&'static str> = vec![
        "COST",
        "NOW",
        "DETAILS",
        "cost",
        "now",
        "details",
        "",
        "0",
        "1",
        "2",
        "10",
        "1000",
        "-1",
        "-0",
        "01",
        "+1",
        " 1",
        "1 ",
        "1.0",
        "1e3",
        "0x10",
        "1000000",
        "1000001",
        "9007199254740991",
        "9007199254740992",
        "9223372036854775807",
        "9223372036854775808",
        "-9223372036854775808",
        "18446744073709551616",
        "1700000000000",
        "\0",
        "\r\n",
        "COST\0",
        "NOW ",
    ];
    prop_oneof![
        4 => proptest::sample::select(words).prop_map(|w| w.as_bytes().to_vec()),
        2 => (0i64..2_000_000).prop_map(|n| n.to_string().into_bytes()),
        1 => any::<i64>().prop_map(|n| n.to_string().into_bytes()),
        2 => proptest::collection::vec(any::<u8>(), 0..12),
    ]
}

fn option() -> impl Strategy<Value = Vec<Vec<u8>>> {
    let valid_cost = (1i64..5).prop_map(|n| n.to_string().into_bytes());
    let valid_now = (1_700_000_000_000i64..1_700_000_100_000).prop_map(|n| n.to_string().into_bytes());
    prop_oneof![
        3 => (prop_oneof![3 => valid_cost, 1 => near_valid()]).prop_map(|v| vec![b"COST".to_vec(), v]),
        3 => (prop_oneof![3 => valid_now, 1 => near_valid()]).prop_map(|v| vec![b"NOW".to_vec(), v]),
        2 => Just(vec![b"DETAILS".to_vec()]),
        1 => Just(vec![b"STAMP".to_vec()]),
        2 => ((1i64..100_000).prop_map(|n| n.to_string().into_bytes()), prop_oneof![3 => (0i64..20).prop_map(|n| n.to_string().into_bytes()), 1 => near_valid()])
            .prop_map(|(w, l)| vec![b"TIER".to_vec(), w, l]),
        1 => near_valid().prop_map(|t| vec![t]),
    ]
}

/// (command, key, arguments after the key); the command is XCLOAK.ALLOW,
/// XCLOAK.PEEK or XCLOAK.REFUND (whose stamp is the window word, and which
/// usually drops the limit word).
fn argument_vector() -> impl Strategy<Value = (&'static str, Vec<u8>, Vec<Vec<u8>>)> {
    let key = prop_oneof![
        4 => proptest::sample::select(vec!["rl:a", "rl:b", "k", "string", "list", "hash", "set", "stream", "zforeign", "fresh", "\0\r\n"])
            .prop_map(|k| k.as_bytes().to_vec()),
        1 => proptest::collection::vec(any::<u8>(), 0..6),
    ];
    let window = prop_oneof![3 => (1i64..200_000).prop_map(|n| n.to_string().into_bytes()), 1 => near_valid()];
    let limit = prop_oneof![3 => (0i64..20).prop_map(|n| n.to_string().into_bytes()), 1 => near_valid()];
    let structured = (window, limit, proptest::collection::vec(option(), 0..4)).prop_map(|(w, l, options)| {
        let mut words = vec![w, l];
        words.extend(options.into_iter().flatten());
        words
    });
    let words = prop_oneof![3 => structured, 1 => proptest::collection::vec(near_valid(), 0..9)];
    let command = proptest::sample::select(vec!["XCLOAK.ALLOW", "XCLOAK.ALLOW", "XCLOAK.PEEK", "XCLOAK.REFUND"]);
    (command, key, words, prop::bool::weighted(0.8)).prop_map(|(command, key, mut words, drop_limit)| {
        if command == "XCLOAK.REFUND" && drop_limit && words.len() >= 2 {
            words.remove(1);
        }
        (command, key, words)
    })
}

/// Random argument vectors against a live server: it never dies, and a call
/// answered with an error changes nothing.
#[test]
fn random_argument_vectors_never_kill_the_server_nor_write_on_error() {
    let mut server = Server::start();
    let mut conn = server.client();
    populate(&mut conn);
    // Windows created by valid random calls may expire mid-test: keep expiry
    // lazy so that only a command can remove a key, and errors must not.
    let _: () = redis::cmd("DEBUG")
        .arg("SET-ACTIVE-EXPIRE")
        .arg(0)
        .query(&mut conn)
        .unwrap();

    let conn = std::cell::RefCell::new(conn);
    let (errors, replies) = (std::cell::Cell::new(0u32), std::cell::Cell::new(0u32));
    let mut runner = TestRunner::new(Config {
        cases: 600,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&argument_vector(), |(command, key, words)| {
        let conn = &mut *conn.borrow_mut();
        let mut cmd = redis::cmd(command);
        cmd.arg(key.as_slice());
        for word in &words {
            cmd.arg(word.as_slice());
        }
        let before = digest(conn);
        let reply: redis::RedisResult<Value> = cmd.query(conn);
        let pong: redis::RedisResult<String> = redis::cmd("PING").query(conn);
        prop_assert!(pong.is_ok(), "server gone after {:?} {:?}: {:?}", key, words, pong);
        match reply {
            Err(e) => {
                prop_assert!(e.code().is_some(), "not a server error: {}", e);
                prop_assert_eq!(digest(conn), before, "error {} changed data: {:?} {:?}", e, key, words);
                errors.set(errors.get() + 1);
            }
            Ok(_) => replies.set(replies.get() + 1),
        }
        Ok::<(), TestCaseError>(())
    });
    let (errors, replies) = (errors.get(), replies.get());
    assert!(server.alive(), "server died:\n{}", server.log());
    result.unwrap();
    eprintln!("random vectors: {errors} errors, {replies} replies");
    assert!(
        errors > 100 && replies > 10,
        "the generator reaches both: {errors} errors, {replies} replies"
    );
}

/// A clock that steps backwards (simulated with NOW; the server's own clock
/// cannot be stepped from a test): `retry_after_ms` is never negative except
/// the documented -1 (cost > limit), `reset_after_ms` never negative, and no
/// entry that is still inside the window at `now` is ever removed.
#[test]
fn a_clock_stepping_backwards_never_gives_negative_waits_nor_loses_entries() {
    let server = Server::start();
    let conn = std::cell::RefCell::new(server.client());
    let steps = prop_oneof![
        Just(0i64),
        Just(1),
        Just(-1),
        (-3000i64..3000),
        (-200_000i64..-1000),
        Just(-1_000_000),
    ];
    let sequence = (
        1i64..2000,
        0i64..12,
        proptest::collection::vec((steps, 1i64..4, any::<bool>()), 1..40),
    );
    let case = std::cell::Cell::new(0u32);
    let mut runner = TestRunner::new(Config {
        cases: 60,
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(&sequence, |(window, limit, calls)| {
            let conn = &mut *conn.borrow_mut();
            case.set(case.get() + 1);
            let key = format!("clock:{}", case.get());
            let mut now = 1_700_000_000_000i64;
            for (step, cost, is_peek) in calls {
                now += step;
                let before = entries(conn, &key);
                let mut cmd = redis::cmd(if is_peek { "XCLOAK.PEEK" } else { "XCLOAK.ALLOW" });
                cmd.arg(&key)
                    .arg(window)
                    .arg(limit)
                    .arg("COST")
                    .arg(cost)
                    .arg("NOW")
                    .arg(now);
                if !is_peek {
                    cmd.arg("DETAILS");
                }
                // PERSIST in the same MULTI: the key's real TTL follows the
                // server clock (>= 1 s here), so a stall between two calls on
                // a loaded machine would expire it (as in tests/model.rs).
                let (d,): (Vec<i64>,) = redis::pipe()
                    .atomic()
                    .add_command(cmd)
                    .cmd("PERSIST")
                    .arg(&key)
                    .ignore()
                    .query(conn)
                    .unwrap();
                let after = entries(conn, &key);
                prop_assert!(
                    d[3] >= 0 || (d[3] == -1 && cost > limit),
                    "retry_after_ms {} at now {}: {:?}",
                    d[3],
                    now,
                    d
                );
                prop_assert!(d[4] >= 0, "reset_after_ms {} at now {}: {:?}", d[4], now, d);
                if d[0] == 0 && cost <= limit {
                    prop_assert!(d[3] >= 1, "a rejected call must wait: {:?}", d);
                }
                let live_before: Vec<&(String, f64)> =
                    before.iter().filter(|(_, s)| *s as i64 > now - window).collect();
                for entry in &live_before {
                    prop_assert!(after.contains(entry), "entry {:?} live at {} was lost", entry, now);
                }
                let expected_len = if is_peek {
                    before.len()
                } else {
                    live_before.len() + if d[0] == 1 { cost as usize } else { 0 }
                };
                prop_assert_eq!(after.len(), expected_len, "window size after the call at {}", now);
                if is_peek {
                    prop_assert_eq!(&after, &before, "PEEK wrote");
                }
            }
            Ok(())
        })
        .unwrap();
}
