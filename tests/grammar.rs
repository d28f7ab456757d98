//! The option grammar, through a real server:
//! `XCLOAK.ALLOW key window limit [TIER window limit]... [COST cost] [NOW unix-ms] [DETAILS]`
//! and `XCLOAK.PEEK key window limit [TIER window limit]... [COST cost] [NOW unix-ms]`.
//!
//! Options in any order and any case, each at most once except TIER (up to 15
//! times); every mistake is an `ERR` naming the problem (and the tier), and
//! changes no data (`DEBUG DIGEST`). Replies are identical under RESP2 and RESP3.
//!
//! What would fail: an order-dependent parser, a repeat silently taking the
//! last value, an option consuming the next option as its value, DETAILS
//! accepted by PEEK, a vague error, a TIER error that does not say which tier,
//! a 17th tier accepted, a write before validation, a reply shaped differently
//! in RESP3 (a map, a boolean, a double).

use crate::common;
use common::*;

use redis::{Connection, Value};

const NOW: i64 = 1_700_000_000_000;

/// `code detail` of a failed call, e.g. `ERR syntax error, ...`.
fn error_of(conn: &mut Connection, line: &[&str]) -> String {
    let mut command = redis::cmd(line[0]);
    command.arg(&line[1..]);
    match command.query::<Value>(conn) {
        Err(e) => format!("{} {}", e.code().unwrap_or("?"), e.detail().unwrap_or("")),
        Ok(value) => panic!("{line:?} should fail, replied {value:?}"),
    }
}

fn call(conn: &mut Connection, line: &[String]) -> Value {
    let mut command = redis::cmd(&line[0]);
    command.arg(&line[1..]);
    command.query(conn).unwrap_or_else(|e| panic!("{line:?}: {e}"))
}

fn permutations(items: &[Vec<String>]) -> Vec<Vec<Vec<String>>> {
    if items.is_empty() {
        return vec![vec![]];
    }
    let mut all = Vec::new();
    for i in 0..items.len() {
        let mut rest = items.to_vec();
        let first = rest.remove(i);
        for mut tail in permutations(&rest) {
            tail.insert(0, first.clone());
            all.push(tail);
        }
    }
    all
}

fn subsets(items: &[Vec<String>]) -> Vec<Vec<Vec<String>>> {
    (0..1u32 << items.len())
        .map(|mask| {
            items
                .iter()
                .enumerate()
                .filter(|(i, _)| mask & (1 << i) != 0)
                .map(|(_, o)| o.clone())
                .collect()
        })
        .collect()
}

fn words(text: &str) -> Vec<String> {
    text.split(' ').map(str::to_string).collect()
}

/// A details reply with `TIER`: the five integers and the per-tier array.
fn five_and_tiers(reply: &Value) -> ([i64; 5], Vec<[i64; 5]>) {
    let Value::Array(items) = reply else {
        panic!("not an array: {reply:?}")
    };
    assert_eq!(items.len(), 6, "{reply:?}");
    let five: Vec<i64> = redis::from_redis_value(&Value::Array(items[..5].to_vec())).unwrap();
    let tiers: Vec<Vec<i64>> = redis::from_redis_value(&items[5]).unwrap();
    (
        five.try_into().unwrap(),
        tiers.into_iter().map(|t| t.try_into().unwrap()).collect(),
    )
}

/// Every subset of the options, in every order, with mixed case, gives the
/// reply of the canonical order on an identical key.
#[test]
fn options_in_every_order_and_case() {
    let server = Server::start();
    let mut conn = server.client();
    for command in ["XCLOAK.ALLOW", "XCLOAK.PEEK"] {
        let mut options = vec![
            words("COST 2"),
            words(&format!("NOW {}", NOW + 500)),
            words("TIER 60000 10"),
        ];
        if command == "XCLOAK.ALLOW" {
            options.push(words("DETAILS"));
        }
        let mut case = 0;
        for subset in subsets(&options) {
            let mut canonical: Option<Value> = None;
            for (n, order) in permutations(&subset).into_iter().enumerate() {
                case += 1;
                let key = format!("{command}:{case}");
                // Identical history on every key: 3 entries at NOW.
                for _ in 0..3 {
                    allow_at(&mut conn, &key, 1000, 5, NOW);
                }
                let _: i64 = redis::cmd("PERSIST").arg(&key).query(&mut conn).unwrap();
                let mut line = vec![command.to_string(), key.clone(), "1000".into(), "5".into()];
                for option in &order {
                    let mut option = option.clone();
                    if n % 2 == 1 {
                        option[0] = option[0].to_lowercase(); // every option is case-insensitive
                    }
                    line.extend(option);
                }
                let reply = call(&mut conn, &line);
                match &canonical {
                    None => canonical = Some(reply.clone()),
                    Some(expected) => assert_eq!(&reply, expected, "{line:?}"),
                }
                // The options took effect. With NOW the 3 entries are live;
                // without it the server clock (long after NOW) has expired them.
                let has = |name: &str| subset.iter().any(|o| o[0] == name);
                let cost = if has("COST") { 2 } else { 1 };
                let live = if has("NOW") { 3 } else { 0 };
                // The second tier (TIER 60000 10) has more room: tier 0 binds.
                let (expected_card, expected, second) = if command == "XCLOAK.ALLOW" {
                    // ALLOW trims what expired, then records `cost` entries.
                    (
                        live + cost,
                        [1, 5, 5 - live - cost, 0, 1000],
                        [60000, 10, 10 - live - cost, 0, 60000],
                    )
                } else {
                    // PEEK keeps everything and records nothing.
                    let reset_after = |window: i64| if has("NOW") { window - 500 } else { 0 };
                    (
                        3,
                        [1, 5, 5 - live, 0, reset_after(1000)],
                        [60000, 10, 10 - live, 0, reset_after(60000)],
                    )
                };
                let card: i64 = redis::cmd("ZCARD").arg(&key).query(&mut conn).unwrap();
                assert_eq!(card, expected_card, "{line:?}");
                if has("DETAILS") || command == "XCLOAK.PEEK" {
                    if has("TIER") {
                        let (fields, tiers): ([i64; 5], Vec<[i64; 5]>) = five_and_tiers(&reply);
                        assert_eq!(fields, expected, "{line:?}");
                        let first = [1000, expected[1], expected[2], expected[3], expected[4]];
                        assert_eq!(tiers, [first, second], "{line:?}");
                    } else {
                        let fields: Vec<i64> = redis::from_redis_value(&reply).unwrap();
                        assert_eq!(fields, expected, "{line:?}");
                    }
                } else {
                    assert_eq!(reply, Value::Int(1), "{line:?}");
                }
            }
        }
        assert_eq!(case, if command == "XCLOAK.ALLOW" { 65 } else { 16 }, "orders tried");
    }
}

const COST_RANGE: &str = "ERR COST must be an integer from 1 to 1000000";
const NOW_RANGE: &str = "ERR NOW must be an integer from 0 to 9007199254740991 (unix time in milliseconds)";
const WINDOW_RANGE: &str = "ERR window must be an integer from 1 to 9007199254740991 (milliseconds)";
const LIMIT_RANGE: &str = "ERR limit must be an integer from 0 to 1000000";
const ALLOW_UNKNOWN: &str = "(expected TIER, COST, NOW, DETAILS or STAMP)";
const STAMP_RANGE: &str = "ERR stamp must be an integer from 0 to 9007199254740991 (unix time in milliseconds)";
const PEEK_UNKNOWN: &str = "(expected TIER, COST, NOW or OLDEST)";
const TIER_VALUES: &str = "ERR syntax error, TIER needs a window and a limit";

/// Each mistake and its exact reply, for both commands where it applies.
fn mistakes() -> Vec<(&'static str, String)> {
    let mut cases = vec![
        // Repeats, including in another case and with other options between.
        (
            "XCLOAK.ALLOW k 10 5 COST 1 COST 2",
            "ERR syntax error, COST is given more than once".into(),
        ),
        (
            "XCLOAK.ALLOW k 10 5 cost 1 NOW 5 Cost 1",
            "ERR syntax error, COST is given more than once".into(),
        ),
        (
            "XCLOAK.ALLOW k 10 5 NOW 1 DETAILS now 1",
            "ERR syntax error, NOW is given more than once".into(),
        ),
        (
            "XCLOAK.ALLOW k 10 5 DETAILS details",
            "ERR syntax error, DETAILS is given more than once".into(),
        ),
        (
            "XCLOAK.PEEK k 10 5 NOW 1 NOW 1",
            "ERR syntax error, NOW is given more than once".into(),
        ),
        (
            "XCLOAK.PEEK k 10 5 COST 1 COST 1",
            "ERR syntax error, COST is given more than once".into(),
        ),
        // Missing values.
        (
            "XCLOAK.ALLOW k 10 5 COST",
            "ERR syntax error, COST needs a value".into(),
        ),
        (
            "XCLOAK.ALLOW k 10 5 DETAILS NOW",
            "ERR syntax error, NOW needs a value".into(),
        ),
        ("XCLOAK.PEEK k 10 5 NOW", "ERR syntax error, NOW needs a value".into()),
        (
            "XCLOAK.PEEK k 10 5 NOW 5 COST",
            "ERR syntax error, COST needs a value".into(),
        ),
        // An option is not a value.
        ("XCLOAK.ALLOW k 10 5 COST NOW 5", COST_RANGE.into()),
        ("XCLOAK.ALLOW k 10 5 NOW DETAILS", NOW_RANGE.into()),
        // Unknown options.
        (
            "XCLOAK.ALLOW k 10 5 FOO",
            format!("ERR syntax error, unknown option 'FOO' {ALLOW_UNKNOWN}"),
        ),
        (
            "XCLOAK.ALLOW k 10 5 DETAILS COSTS 1",
            format!("ERR syntax error, unknown option 'COSTS' {ALLOW_UNKNOWN}"),
        ),
        (
            "XCLOAK.ALLOW k 10 5 NOW=5",
            format!("ERR syntax error, unknown option 'NOW=5' {ALLOW_UNKNOWN}"),
        ),
        (
            "XCLOAK.ALLOW k 10 5 COST 1 2",
            format!("ERR syntax error, unknown option '2' {ALLOW_UNKNOWN}"),
        ),
        (
            "XCLOAK.PEEK k 10 5 DETAILS",
            format!("ERR syntax error, unknown option 'DETAILS' {PEEK_UNKNOWN}"),
        ),
        (
            "XCLOAK.PEEK k 10 5 COST 1 BAR",
            format!("ERR syntax error, unknown option 'BAR' {PEEK_UNKNOWN}"),
        ),
    ];
    // STAMP (ALLOW only) and XCLOAK.REFUND key stamp [COST cost].
    cases.extend([
        (
            "XCLOAK.ALLOW k 10 5 STAMP stamp",
            "ERR syntax error, STAMP is given more than once".to_string(),
        ),
        (
            "XCLOAK.ALLOW k 10 5 STAMP 5",
            format!("ERR syntax error, unknown option '5' {ALLOW_UNKNOWN}"),
        ),
        (
            "XCLOAK.PEEK k 10 5 STAMP",
            format!("ERR syntax error, unknown option 'STAMP' {PEEK_UNKNOWN}"),
        ),
        // OLDEST (PEEK only).
        (
            "XCLOAK.PEEK k 10 5 OLDEST oldest",
            "ERR syntax error, OLDEST is given more than once".to_string(),
        ),
        (
            "XCLOAK.PEEK k 10 5 OLDEST 5",
            format!("ERR syntax error, unknown option '5' {PEEK_UNKNOWN}"),
        ),
        (
            "XCLOAK.ALLOW k 10 5 DETAILS OLDEST",
            format!("ERR syntax error, unknown option 'OLDEST' {ALLOW_UNKNOWN}"),
        ),
        ("XCLOAK.REFUND k -1", STAMP_RANGE.to_string()),
        ("XCLOAK.REFUND k 9007199254740992", STAMP_RANGE.to_string()),
        ("XCLOAK.REFUND k 1e3", STAMP_RANGE.to_string()),
        ("XCLOAK.REFUND k COST 2", STAMP_RANGE.to_string()),
        (
            "XCLOAK.REFUND k 5 COST",
            "ERR syntax error, COST needs a value".to_string(),
        ),
        ("XCLOAK.REFUND k 5 COST 0", COST_RANGE.to_string()),
        ("XCLOAK.REFUND k 5 COST 1000001", COST_RANGE.to_string()),
        (
            "XCLOAK.REFUND k 5 cost 1 COST 1",
            "ERR syntax error, COST is given more than once".to_string(),
        ),
        (
            "XCLOAK.REFUND k 5 NOW 1",
            "ERR syntax error, unknown option 'NOW' (expected COST)".to_string(),
        ),
        (
            "XCLOAK.REFUND k 5 COST 1 STAMP",
            "ERR syntax error, unknown option 'STAMP' (expected COST)".to_string(),
        ),
    ]);
    // TIER: its values, named with the tier's number (the first TIER is tier 1).
    for command in ["XCLOAK.ALLOW", "XCLOAK.PEEK"] {
        for (tail, error) in [
            ("10 5 TIER", TIER_VALUES.to_string()),
            ("10 5 TIER 10", TIER_VALUES.to_string()),
            ("10 5 NOW 1 TIER 10", TIER_VALUES.to_string()),
            (
                "10 5 TIER 0 5",
                "ERR window of TIER 1 must be an integer from 1 to 9007199254740991 (milliseconds)".into(),
            ),
            (
                "10 5 tier 10 1 TIER 10 1000001",
                "ERR limit of TIER 2 must be an integer from 0 to 1000000".into(),
            ),
            (
                "10 5 TIER 10 5 COST 2 TIER +10 5",
                "ERR window of TIER 2 must be an integer from 1 to 9007199254740991 (milliseconds)".into(),
            ),
            (
                "10 5 TIER 10 COST 2",
                "ERR limit of TIER 1 must be an integer from 0 to 1000000".into(),
            ),
            (
                "10 5 TIER COST 2 3",
                "ERR window of TIER 1 must be an integer from 1 to 9007199254740991 (milliseconds)".into(),
            ),
            // Tier 0 keeps the texts of a call without TIER.
            ("0 5 TIER 10 5", WINDOW_RANGE.into()),
            // 16 TIERs: one more than allowed.
            (
                Box::leak(format!("10 5{}", " TIER 10 5".repeat(16)).into_boxed_str()),
                "ERR syntax error, TIER is given more than 15 times (at most 16 tiers in all)".into(),
            ),
        ] {
            cases.push((Box::leak(format!("{command} k {tail}").into_boxed_str()), error));
        }
    }
    // Values out of range or not integers, in both commands.
    for command in ["XCLOAK.ALLOW", "XCLOAK.PEEK"] {
        for (tail, error) in [
            ("10 5 COST 0", COST_RANGE),
            ("10 5 COST 1000001", COST_RANGE),
            ("10 5 COST 1.5", COST_RANGE),
            ("10 5 COST -1", COST_RANGE),
            ("10 5 NOW -1", NOW_RANGE),
            ("10 5 NOW 9007199254740992", NOW_RANGE),
            ("10 5 NOW 1e3", NOW_RANGE),
            ("0 5", WINDOW_RANGE),
            ("+10 5", WINDOW_RANGE),
            ("10 -1", LIMIT_RANGE),
            ("10 1000001", LIMIT_RANGE),
            ("10 05", LIMIT_RANGE),
        ] {
            cases.push((
                Box::leak(format!("{command} k {tail}").into_boxed_str()),
                error.to_string(),
            ));
        }
    }
    cases
}

#[test]
fn every_mistake_is_a_named_error_and_changes_nothing() {
    let server = Server::start();
    let mut conn = server.client();
    allow_at(&mut conn, "k", 10_000, 5, NOW);
    let _: () = redis::cmd("SET").arg("other").arg("v").query(&mut conn).unwrap();
    let before = digest(&mut conn);
    for (line, expected) in mistakes() {
        let line: Vec<&str> = line.split(' ').collect();
        assert_eq!(error_of(&mut conn, &line), expected, "{line:?}");
        assert_eq!(digest(&mut conn), before, "{line:?} changed data");
    }
    // The standard arity error, whether the server (7.0+, from the arity in
    // the command info) or the module (6.2) answers it.
    for line in [
        &["XCLOAK.ALLOW", "k", "10"][..],
        &["XCLOAK.PEEK", "k"],
        &["XCLOAK.ALLOW"],
        &["XCLOAK.REFUND", "k"],
    ] {
        let text = error_of(&mut conn, line).to_lowercase();
        let expected = format!("err wrong number of arguments for '{}' command", line[0].to_lowercase());
        assert_eq!(text, expected, "{line:?}");
    }
    assert_eq!(digest(&mut conn), before);
}

/// An echoed token cannot break the protocol or flood the reply.
#[test]
fn echoed_tokens_are_sanitized_and_short() {
    let server = Server::start();
    let mut conn = server.client();
    let long = "X".repeat(100);
    let text = error_of(&mut conn, &["XCLOAK.ALLOW", "k", "10", "5", &long]);
    assert_eq!(
        text,
        format!(
            "ERR syntax error, unknown option '{}...' {ALLOW_UNKNOWN}",
            "X".repeat(32)
        )
    );
    let text = error_of(&mut conn, &["XCLOAK.ALLOW", "k", "10", "5", "a\r\nb'c"]);
    assert_eq!(
        text,
        format!("ERR syntax error, unknown option 'a??b?c' {ALLOW_UNKNOWN}")
    );
}

/// The same calls over RESP2 and RESP3 give the same values (integers and
/// arrays of integers, no maps, booleans or doubles) and the same errors.
#[test]
fn replies_are_identical_under_resp2_and_resp3() {
    let server = Server::start();
    let mut resp2 = server.client();
    let mut resp3 = redis::Client::open(format!("{}?protocol=resp3", server.url()))
        .unwrap()
        .get_connection()
        .unwrap();
    // The second connection really speaks RESP3: HGETALL replies a map there.
    let _: () = redis::cmd("HSET").arg("h").arg("f").arg("v").query(&mut resp2).unwrap();
    let map: Value = redis::cmd("HGETALL").arg("h").query(&mut resp3).unwrap();
    assert!(matches!(map, Value::Map(_)), "not RESP3: {map:?}");
    let array: Value = redis::cmd("HGETALL").arg("h").query(&mut resp2).unwrap();
    assert!(matches!(array, Value::Array(_)), "not RESP2: {array:?}");

    let script = [
        "XCLOAK.ALLOW {k} 1000 3 NOW 1000",
        "XCLOAK.ALLOW {k} 1000 3 NOW 1001 DETAILS",
        "XCLOAK.ALLOW {k} 1000 3 NOW 1002 COST 1 DETAILS",
        "XCLOAK.ALLOW {k} 1000 3 NOW 1003 DETAILS",
        "XCLOAK.ALLOW {k} 1000 3 NOW 1004",
        "XCLOAK.PEEK {k} 1000 3 NOW 1500",
        "XCLOAK.PEEK {k} 1000 3 NOW 1500 COST 4",
        "XCLOAK.PEEK {k} 1000 3 NOW 5000",
        "XCLOAK.ALLOW {k} 1000 0 NOW 5000 DETAILS",
        "XCLOAK.ALLOW {k} 1000 3 NOW 5000 COST 9",
        "XCLOAK.ALLOW {k} 1000 3 BAD",
        "XCLOAK.PEEK {k} 0 3",
        "XCLOAK.ALLOW {k} 1000",
        "XCLOAK.ALLOW {k} 1000 3 TIER 60000 4 NOW 5001 DETAILS",
        "XCLOAK.ALLOW {k} 1000 3 TIER 60000 4 TIER 10 1 NOW 5002 DETAILS",
        "XCLOAK.PEEK {k} 1000 3 TIER 60000 4 NOW 5002",
        "XCLOAK.ALLOW {k} 1000 3 TIER 60000 4 NOW 5003",
        "XCLOAK.ALLOW {k} 1000 9 NOW 6000 STAMP",
        "XCLOAK.ALLOW {k} 1000 9 NOW 6001 COST 2 DETAILS STAMP",
        "XCLOAK.ALLOW {k} 1000 9 TIER 60000 9 NOW 6002 STAMP DETAILS",
        "XCLOAK.ALLOW {k} 1000 0 NOW 6003 STAMP",
        "XCLOAK.REFUND {k} 6001 COST 5",
        "XCLOAK.REFUND {k} 1",
        "XCLOAK.REFUND {k} -1",
    ];
    for (index, line) in script.iter().enumerate() {
        let reply = |conn: &mut Connection, key: &str| -> Result<Value, (String, String)> {
            let words: Vec<String> = line.replace("{k}", key).split(' ').map(str::to_string).collect();
            let mut command = redis::cmd(&words[0]);
            command.arg(&words[1..]);
            command.query::<Value>(conn).map_err(|e| {
                (
                    e.code().unwrap_or("").to_string(),
                    e.detail().unwrap_or("").to_lowercase(),
                )
            })
        };
        let two = reply(&mut resp2, "two");
        let three = reply(&mut resp3, "three");
        assert_eq!(two, three, "{line}");
        if let Ok(value) = &two {
            let all_integers = |items: &[Value]| items.iter().all(|i| matches!(i, Value::Int(_)));
            let is_integers = match value {
                Value::Int(_) => true,
                Value::Array(items) if items.len() == 5 => all_integers(items),
                Value::Array(items) if items.len() == 6 && line.contains("STAMP") && !line.contains("TIER") => {
                    all_integers(items)
                }
                // With TIER: five integers, then an array of five-integer arrays.
                Value::Array(items) if items.len() == 6 + line.contains("STAMP") as usize && line.contains("TIER") => {
                    all_integers(&items[..5])
                        && (!line.contains("STAMP") || matches!(items[6], Value::Int(6002)))
                        && matches!(&items[5], Value::Array(tiers) if !tiers.is_empty() && tiers.iter().all(|t| {
                            matches!(t, Value::Array(f) if f.len() == 5 && all_integers(f))
                        }))
                }
                _ => false,
            };
            assert!(is_integers, "call {index} {line}: {value:?}");
        }
    }
    assert_eq!(entries(&mut resp2, "two").len(), entries(&mut resp2, "three").len());
}

/// The bad calls of the snapshot `tests/fixtures/grammar_errors.txt`: each
/// argument out of range at both ends and not an integer, each option
/// unknown, repeated, without its value, or given to the wrong command, the
/// 16th TIER, each tier's values, a bad CONVERT target, a bad REFUND stamp,
/// and the arity errors the server answers from the declared arity.
const SNAPSHOT_CALLS: &[&str] = &[
    "XCLOAK.ALLOW k 0 5",
    "XCLOAK.ALLOW k 9007199254740992 5",
    "XCLOAK.ALLOW k ten 5",
    "XCLOAK.ALLOW k 10 -1",
    "XCLOAK.ALLOW k 10 1000001",
    "XCLOAK.ALLOW k 10 5 COST 0",
    "XCLOAK.ALLOW k 10 5 COST 1000001",
    "XCLOAK.ALLOW k 10 5 COST",
    "XCLOAK.ALLOW k 10 5 COST 1 cost 1",
    "XCLOAK.ALLOW k 10 5 NOW -1",
    "XCLOAK.ALLOW k 10 5 NOW 9007199254740992",
    "XCLOAK.ALLOW k 10 5 NOW",
    "XCLOAK.ALLOW k 10 5 NOW 1 NOW 1",
    "XCLOAK.ALLOW k 10 5 DETAILS DETAILS",
    "XCLOAK.ALLOW k 10 5 STAMP STAMP",
    "XCLOAK.ALLOW k 10 5 OLDEST",
    "XCLOAK.ALLOW k 10 5 FOO",
    "XCLOAK.ALLOW k 10 5 TIER",
    "XCLOAK.ALLOW k 10 5 TIER 10",
    "XCLOAK.ALLOW k 10 5 TIER 0 5",
    "XCLOAK.ALLOW k 10 5 TIER 10 5 TIER 10 1000001",
    "XCLOAK.ALLOW k 10 5 TIER 10 5 TIER 10 5 TIER 10 5 TIER 10 5 TIER 10 5 TIER 10 5 TIER 10 5 TIER 10 5 \
     TIER 10 5 TIER 10 5 TIER 10 5 TIER 10 5 TIER 10 5 TIER 10 5 TIER 10 5 TIER 10 5",
    "XCLOAK.ALLOW k 10",
    "XCLOAK.PEEK k 0 5",
    "XCLOAK.PEEK k 10 1000001",
    "XCLOAK.PEEK k 10 5 COST 0",
    "XCLOAK.PEEK k 10 5 NOW -1",
    "XCLOAK.PEEK k 10 5 DETAILS",
    "XCLOAK.PEEK k 10 5 STAMP",
    "XCLOAK.PEEK k 10 5 OLDEST OLDEST",
    "XCLOAK.PEEK k 10 5 TIER 10 -1",
    "XCLOAK.PEEK k 10 5 BAR",
    "XCLOAK.PEEK k 10",
    "XCLOAK.REFUND k -1",
    "XCLOAK.REFUND k 9007199254740992",
    "XCLOAK.REFUND k 1.5",
    "XCLOAK.REFUND k 5 COST 0",
    "XCLOAK.REFUND k 5 COST 1000001",
    "XCLOAK.REFUND k 5 COST",
    "XCLOAK.REFUND k 5 COST 1 COST 1",
    "XCLOAK.REFUND k 5 NOW 1",
    "XCLOAK.REFUND k",
    "XCLOAK.CONVERT k list",
    "XCLOAK.CONVERT k",
    "XCLOAK.CONVERT k zset x",
    "XCLOAK.APPLY",
];

/// Every error of `SNAPSHOT_CALLS`, and those of the configured bound
/// (`MAX-LIMIT 50`), against the committed snapshot
/// `tests/fixtures/grammar_errors.txt`, byte for byte: the Lua fallback and
/// every client's conformance vectors repeat these texts. What would fail:
/// any change of a word, a range or a unit in an error, or a bad call that
/// succeeds.
#[test]
fn errors_match_the_snapshot() {
    let mut live = String::new();
    for (load_arguments, calls) in [
        (&[][..], SNAPSHOT_CALLS),
        (
            &["MAX-LIMIT", "50"][..],
            &["XCLOAK.ALLOW k 10 51", "XCLOAK.PEEK k 10 5 TIER 10 51"][..],
        ),
    ] {
        let server = ServerConfig::default().module_args(load_arguments).start();
        let mut conn = server.client();
        live.push_str(&format!("module loaded with [{}]\n", load_arguments.join(" ")));
        for line in calls {
            let words: Vec<&str> = line.split_whitespace().collect();
            live.push_str(&format!("> {}\n{}\n", words.join(" "), error_of(&mut conn, &words)));
        }
    }
    common::snapshot::check("grammar_errors.txt", &live);
}

/// docs/commands.md states the ranges of the grammar's table
/// (`xcloak_core::grammar`, which the parser and COMMAND DOCS read): its
/// Arguments table and its Errors table. What would fail: a range changed in
/// the grammar and not in the docs, or the other way round.
#[test]
fn the_commands_doc_states_the_grammars_ranges() {
    use xcloak_core::grammar::{self, DEFAULT_MAX_LIMIT, MAX_TIERS};
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/commands.md")).unwrap();
    let row = |label: &str| -> String {
        let start = format!("| {label} |");
        let line = doc.lines().find(|line| line.starts_with(&start));
        line.unwrap_or_else(|| panic!("docs/commands.md has no row {start}"))
            .replace('`', "")
    };
    for (label, arg) in [
        ("`window`", grammar::WINDOW),
        ("`limit`", grammar::LIMIT),
        ("`COST cost`", grammar::COST),
        ("`NOW unix-ms`", grammar::NOW),
    ] {
        let range = arg.range().unwrap();
        assert!(
            row(label).contains(&range.text()),
            "{label}: {} in {}",
            range.text(),
            row(label)
        );
        let error = format!("`ERR {}`", range.error(arg.label(), DEFAULT_MAX_LIMIT));
        assert!(doc.contains(&error), "docs/commands.md does not quote {error}");
    }
    assert!(row("`limit`").contains(&format!("(default {DEFAULT_MAX_LIMIT})")));
    let tiers = format!("up to {} times ({MAX_TIERS} tiers in all)", grammar::TIER.times);
    assert!(row("`TIER window limit`").contains(&tiers), "{tiers}");
    let stamp = grammar::REFUND_STAMP.range().unwrap().error("stamp", DEFAULT_MAX_LIMIT);
    assert!(doc.contains(&format!("`ERR {stamp}`")), "{stamp}");
}
