//! The portable Lua fallback (`src/lua/xcloak_allow.lua`) is proven equal to
//! XCLOAK.ALLOW, not assumed: random call sequences run through both, and
//! every reply, every member (name and score) and the TTL state are compared
//! after every call. Same members means the two can share a key: that is
//! tested too, with the limit held exactly. The fallback also runs on a
//! server without the module, and replicates effects only.
//!
//! Each call runs in MULTI with a PTTL and a PERSIST of its key: the TTL is
//! checked, then removed, so a key can never expire by the wall clock in the
//! middle of a sequence that runs on simulated `NOW` time.
use crate::common;
use common::*;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use redis::{Connection, RedisError, RedisResult, Value};
use std::cell::RefCell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

const FALLBACK: &str = include_str!("../src/lua/xcloak_allow.lua");
const REFUND_FALLBACK: &str = include_str!("../src/lua/xcloak_refund.lua");
const PEEK_FALLBACK: &str = include_str!("../src/lua/xcloak_peek.lua");
const MAX_EXACT_MS: i64 = 9_007_199_254_740_991;

/// Which implementation answers a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Via {
    Native,
    Lua,
}

/// A reply, normalised so both implementations compare field by field.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Reply {
    Int(i64),
    Fields(Vec<i64>),
    /// An array holding arrays: a details reply with `TIER` (five integers,
    /// the per-tier arrays, and with `STAMP` the stamp).
    Nested(Vec<Reply>),
    Error(String),
    Other(String),
}

fn error_text(error: &RedisError) -> String {
    format!("{} {}", error.code().unwrap_or("?"), error.detail().unwrap_or(""))
}

fn normalise(value: RedisResult<Value>) -> Reply {
    match value {
        Ok(Value::Int(n)) => Reply::Int(n),
        Ok(Value::Array(items)) if items.iter().all(|v| matches!(v, Value::Int(_))) => Reply::Fields(integers(&items)),
        Ok(Value::Array(items)) => Reply::Nested(items.into_iter().map(|item| normalise(Ok(item))).collect()),
        Ok(Value::ServerError(error)) => Reply::Error(format!("{} {}", error.code(), error.details().unwrap_or(""))),
        Ok(other) => Reply::Other(format!("{other:?}")),
        Err(error) => Reply::Error(error_text(&error)),
    }
}

fn integers(items: &[Value]) -> Vec<i64> {
    items
        .iter()
        .map(|v| if let Value::Int(n) = v { *n } else { unreachable!() })
        .collect()
}

fn load_script(conn: &mut Connection, script: &str) -> String {
    redis::cmd("SCRIPT").arg("LOAD").arg(script).query(conn).unwrap()
}

fn load_fallback(conn: &mut Connection) -> String {
    redis::cmd("SCRIPT").arg("LOAD").arg(FALLBACK).query(conn).unwrap()
}

fn call_cmd(via: Via, sha: &str, key: &str, args: &[String]) -> redis::Cmd {
    let mut cmd = match via {
        Via::Native => {
            let mut cmd = redis::cmd("XCLOAK.ALLOW");
            cmd.arg(key);
            cmd
        }
        Via::Lua => {
            let mut cmd = redis::cmd("EVALSHA");
            cmd.arg(sha).arg(1).arg(key);
            cmd
        }
    };
    cmd.arg(args);
    cmd
}

/// One call outside MULTI (for errors and clock-based calls).
fn call(conn: &mut Connection, via: Via, sha: &str, key: &str, args: &[String]) -> Reply {
    normalise(call_cmd(via, sha, key, args).query(conn))
}

/// What one call left behind: its reply, the key's entries, its PTTL.
#[derive(Debug, PartialEq)]
struct Observed {
    reply: Reply,
    entries: Vec<(String, String)>,
    pttl: i64,
}

/// `XCLOAK.REFUND key args...`, or the refund script with the same arguments.
fn refund_cmd(via: Via, sha: &str, key: &str, args: &[String]) -> redis::Cmd {
    let mut cmd = match via {
        Via::Native => redis::cmd("XCLOAK.REFUND"),
        Via::Lua => {
            let mut cmd = redis::cmd("EVALSHA");
            cmd.arg(sha).arg(1);
            cmd
        }
    };
    cmd.arg(key).arg(args);
    cmd
}

/// The call, then ZRANGE WITHSCORES, PTTL and PERSIST of the key, atomically.
fn observe(conn: &mut Connection, via: Via, sha: &str, key: &str, args: &[String]) -> Observed {
    observe_cmd(conn, call_cmd(via, sha, key, args), key)
}

fn observe_cmd(conn: &mut Connection, command: redis::Cmd, key: &str) -> Observed {
    let what = String::from_utf8_lossy(&command.get_packed_command()).replace("\r\n", " ");
    let mut pipe = redis::pipe();
    pipe.atomic()
        .add_command(command)
        .cmd("ZRANGE")
        .arg(key)
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .cmd("PTTL")
        .arg(key)
        .cmd("PERSIST")
        .arg(key)
        .ignore();
    let (reply, entries, pttl): (Value, Vec<(String, String)>, i64) =
        pipe.query(conn).unwrap_or_else(|e| panic!("{what}: {e}"));
    Observed {
        reply: normalise(Ok(reply)),
        entries,
        pttl,
    }
}

/// The TTL state a call may leave: no key (-2), untouched since the last
/// PERSIST (-1), or set by an admission. (Its exact value is checked outside
/// MULTI in `ttl_is_window_plus_margin_from_the_server_clock`: inside EXEC,
/// Redis 8 and Valkey compute PTTL against the time the EXEC started.)
fn assert_ttl(observed: &Observed, what: &str) {
    let pttl = observed.pttl;
    assert!(pttl == -2 || pttl == -1 || pttl > 0, "{what}: PTTL {pttl}");
    assert_eq!(
        pttl == -2,
        observed.entries.is_empty(),
        "{what}: a key exists iff it has entries"
    );
}

// ---------------------------------------------------------------- generator

/// A step of simulated time, relative to the window.
#[derive(Clone, Copy, Debug)]
enum Dt {
    Zero,
    One,
    WindowMinus1,
    Window,
    WindowPlus1,
    Forward(i64),
    Back(i64),
}

#[derive(Clone, Debug)]
struct Step {
    dt: Dt,
    cost: i64,
    details: bool,
    /// A new limit from this step on (the limit may change mid-sequence).
    new_limit: Option<i64>,
    /// Used by the interleaving test: which implementation makes this call.
    via: Via,
    /// `STAMP`: the reply carries the admission's stamp.
    stamp: bool,
}

#[derive(Clone, Debug)]
struct Sequence {
    start: i64,
    window: i64,
    limit: i64,
    /// `TIER window limit` of every call, after the positional pair (often none).
    more_tiers: Vec<(i64, i64)>,
    steps: Vec<Step>,
}

fn limit_strategy() -> impl Strategy<Value = i64> {
    prop_oneof![
        3 => 0..=5i64,
        3 => 0..=300i64,
        1 => Just(1000i64),
        2 => 1000..=2600i64,
    ]
}

fn step_strategy() -> impl Strategy<Value = Step> {
    let dt = prop_oneof![
        4 => Just(Dt::Zero),
        2 => Just(Dt::One),
        1 => Just(Dt::WindowMinus1),
        1 => Just(Dt::Window),
        1 => Just(Dt::WindowPlus1),
        2 => (0..5_000i64).prop_map(Dt::Forward),
        1 => (1..1_000_000i64).prop_map(Dt::Back),
    ];
    let cost = prop_oneof![
        6 => Just(1i64),
        3 => 1..=10i64,
        2 => 200..=1500i64,
    ];
    (
        dt,
        cost,
        any::<bool>(),
        prop::option::weighted(0.1, limit_strategy()),
        any::<bool>(),
        prop::bool::weighted(0.3),
    )
        .prop_map(|(dt, cost, details, new_limit, lua, stamp)| Step {
            dt,
            cost,
            details,
            new_limit,
            via: if lua { Via::Lua } else { Via::Native },
            stamp,
        })
}

fn sequence_strategy() -> impl Strategy<Value = Sequence> {
    let window = prop_oneof![
        Just(1i64),
        Just(2i64),
        1..=100i64,
        Just(1000i64),
        Just(60_000i64),
        Just(86_400_000i64),
        Just(1i64 << 52),
        Just(MAX_EXACT_MS),
    ];
    let start = prop_oneof![
        Just(0i64),
        0..1_000_000i64,
        Just(1_732_941_234_567i64),
        Just(MAX_EXACT_MS - 1_000_000_000),
    ];
    let more_tiers = prop_oneof![
        1 => Just(Vec::new()),
        1 => prop::collection::vec((window.clone(), limit_strategy()), 1..=3),
    ];
    (
        start,
        window,
        limit_strategy(),
        more_tiers,
        prop::collection::vec(step_strategy(), 1..30),
    )
        .prop_map(|(start, window, limit, more_tiers, steps)| Sequence {
            start,
            window,
            limit,
            more_tiers,
            steps,
        })
}

impl Sequence {
    /// The argument lists of the calls, in order (always with NOW: both
    /// implementations must see the same clock).
    fn calls(&self) -> Vec<(Via, Vec<String>, i64)> {
        let (mut now, mut limit) = (self.start, self.limit);
        let w = self.window;
        let longest = self.more_tiers.iter().map(|&(window, _)| window).fold(w, i64::max);
        self.steps
            .iter()
            .map(|step| {
                let delta = match step.dt {
                    Dt::Zero => 0,
                    Dt::One => 1,
                    Dt::WindowMinus1 => w - 1,
                    Dt::Window => w,
                    Dt::WindowPlus1 => w.saturating_add(1),
                    Dt::Forward(d) => d,
                    // A Lua reply is a double: with a window near 2^53, an entry
                    // stamped after NOW makes retry/reset exceed 2^53 - 1, which
                    // the script rounds (its one documented difference).
                    Dt::Back(_) if longest > 1 << 52 => 0,
                    Dt::Back(d) => -d,
                };
                now = now.saturating_add(delta).clamp(0, MAX_EXACT_MS);
                if let Some(new_limit) = step.new_limit {
                    limit = new_limit;
                }
                let mut args = vec![w.to_string(), limit.to_string()];
                for (window, limit) in &self.more_tiers {
                    args.extend(["TIER".into(), window.to_string(), limit.to_string()]);
                }
                args.extend(["NOW".into(), now.to_string()]);
                if step.cost != 1 || step.details {
                    args.extend(["COST".into(), step.cost.to_string()]);
                }
                if step.details {
                    args.push("DETAILS".into());
                }
                if step.stamp {
                    args.push("STAMP".into());
                }
                (step.via, args, w)
            })
            .collect()
    }
}

fn runner(cases: u32) -> TestRunner {
    TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    })
}

static KEYS: AtomicUsize = AtomicUsize::new(0);

fn fresh_key(prefix: &str) -> String {
    format!("{prefix}:{}", KEYS.fetch_add(1, Ordering::SeqCst))
}

// -------------------------------------------------------------------- tests

/// Same server, two keys: the fallback and the command agree on every reply,
/// every member and score, and the TTL state, after every call.
#[test]
fn fallback_equals_the_command_on_random_sequences() {
    let server = Server::start();
    let mut conn = server.client();
    let sha = load_fallback(&mut conn);
    let conn = RefCell::new(conn);
    runner(64)
        .run(&sequence_strategy(), |sequence| {
            let mut conn = conn.borrow_mut();
            let (lua_key, native_key) = (fresh_key("lua"), fresh_key("native"));
            for (i, (_, args, _)) in sequence.calls().into_iter().enumerate() {
                let lua = observe(&mut conn, Via::Lua, &sha, &lua_key, &args);
                let native = observe(&mut conn, Via::Native, &sha, &native_key, &args);
                let what = format!("call {i} {args:?}");
                prop_assert!(
                    matches!(native.reply, Reply::Int(_) | Reply::Fields(_) | Reply::Nested(_)),
                    "{what}: native replied {:?}",
                    native.reply
                );
                prop_assert_eq!(&lua.reply, &native.reply, "{}: replies", what);
                prop_assert_eq!(&lua.entries, &native.entries, "{}: members and scores", what);
                assert_ttl(&lua, &format!("{what} (script)"));
                assert_ttl(&native, &format!("{what} (command)"));
                prop_assert_eq!(lua.pttl == -1, native.pttl == -1, "{}: TTL touched by one only", what);
            }
            let _: () = redis::cmd("DEL")
                .arg(&lua_key)
                .arg(&native_key)
                .query(&mut conn)
                .unwrap();
            Ok(())
        })
        .unwrap();
}

/// `XCLOAK.PEEK key args...`, or the peek script with the same arguments
/// (through EVALSHA_RO where the server has it, as a client reading a replica
/// sends it).
fn peek_cmd(via: Via, sha: &str, key: &str, args: &[String]) -> redis::Cmd {
    let mut cmd = match via {
        Via::Native => redis::cmd("XCLOAK.PEEK"),
        Via::Lua => {
            let mut cmd = redis::cmd(if at_least_7_0() { "EVALSHA_RO" } else { "EVALSHA" });
            cmd.arg(sha).arg(1);
            cmd
        }
    };
    cmd.arg(key).arg(args);
    cmd
}

/// The peek arguments of an ALLOW argument list: the same, without DETAILS
/// and STAMP (PEEK always replies the details and records nothing).
fn peek_args(args: &[String]) -> Vec<String> {
    args.iter()
        .filter(|a| *a != "DETAILS" && *a != "STAMP")
        .cloned()
        .collect()
}

/// The peek script answers what XCLOAK.PEEK answers, after every call of a
/// random sequence (on the key the command drives), and writes nothing: the
/// members, the TTL and the dataset's digest are the same before and after.
#[test]
fn peek_fallback_equals_the_command_on_random_sequences() {
    let server = Server::start();
    let mut conn = server.client();
    let sha = load_fallback(&mut conn);
    let peek_sha = load_script(&mut conn, PEEK_FALLBACK);
    let conn = RefCell::new(conn);
    runner(48)
        .run(&sequence_strategy(), |sequence| {
            let mut conn = conn.borrow_mut();
            let key = fresh_key("peek");
            for (i, (_, args, _)) in sequence.calls().into_iter().enumerate() {
                let before = observe(&mut conn, Via::Native, &sha, &key, &args);
                let mut peek = peek_args(&args);
                if i % 2 == 1 {
                    // Where the binding tier's window starts: the same entry from both.
                    peek.push("OLDEST".into());
                }
                let native = observe_cmd(&mut conn, peek_cmd(Via::Native, &peek_sha, &key, &peek), &key);
                let lua = observe_cmd(&mut conn, peek_cmd(Via::Lua, &peek_sha, &key, &peek), &key);
                let what = format!("peek after call {i} {peek:?}");
                prop_assert!(
                    matches!(native.reply, Reply::Fields(_) | Reply::Nested(_)),
                    "{what}: native replied {:?}",
                    native.reply
                );
                prop_assert_eq!(&lua.reply, &native.reply, "{}: replies", what);
                prop_assert_eq!(
                    &lua.entries,
                    &before.entries,
                    "{}: the script changed the members",
                    what
                );
                prop_assert_eq!(lua.pttl, native.pttl, "{}: the script touched the TTL", what);
            }
            let _: () = redis::cmd("DEL").arg(&key).query(&mut conn).unwrap();
            Ok(())
        })
        .unwrap();
    // Nothing for a missing key, and no key created.
    let mut conn = conn.borrow_mut();
    let args: Vec<String> = ["60000", "5", "NOW", "1700000000000"].map(String::from).to_vec();
    let lua = normalise(peek_cmd(Via::Lua, &peek_sha, "peek:missing", &args).query(&mut *conn));
    assert_eq!(lua, Reply::Fields(vec![1, 5, 5, 0, 0]));
    assert_eq!(
        lua,
        normalise(peek_cmd(Via::Native, &peek_sha, "peek:missing", &args).query(&mut *conn))
    );
    let oldest: Vec<String> = args.iter().cloned().chain(["OLDEST".to_string()]).collect();
    let lua = normalise(peek_cmd(Via::Lua, &peek_sha, "peek:missing", &oldest).query(&mut *conn));
    assert_eq!(
        lua,
        Reply::Fields(vec![1, 5, 5, 0, 0, -1]),
        "OLDEST of an empty window is -1"
    );
    assert_eq!(
        lua,
        normalise(peek_cmd(Via::Native, &peek_sha, "peek:missing", &oldest).query(&mut *conn))
    );
    assert_eq!(key_type(&mut conn, "peek:missing"), "none");
}

/// Every bad peek is an error from both, with the same text (PEEK's grammar:
/// no DETAILS, no STAMP), and changes nothing; another type gets WRONGTYPE.
#[test]
fn peek_errors_match_the_command() {
    let server = Server::start();
    let mut conn = server.client();
    let sha = load_script(&mut conn, PEEK_FALLBACK);
    let _: i64 = redis::cmd("ZADD").arg("z").arg(5).arg("5000").query(&mut conn).unwrap();
    let _: () = redis::cmd("SET").arg("s").arg("text").query(&mut conn).unwrap();
    let bad: &[&[&str]] = &[
        &["10"],
        &["0", "1"],
        &["9007199254740992", "1"],
        &["1.5", "1"],
        &["10", "-1"],
        &["10", "1000001"],
        &["10", "1", "COST"],
        &["10", "1", "COST", "0"],
        &["10", "1", "COST", "1", "COST", "1"],
        &["10", "1", "NOW", "-1"],
        &["10", "1", "NOW", "1", "now", "1"],
        &["10", "1", "DETAILS"],
        &["10", "1", "STAMP"],
        &["10", "1", "OLDEST", "OLDEST"],
        &["10", "1", "OLDEST", "1"],
        &["10", "1", "TIER", "5", "1", "OLDEST", "TIER", "5"],
        &["10", "1", "it's-a-long-and-weird-\u{1}-token-of-more-than-32-bytes"],
        &["10", "1", "TIER", "5"],
        &["10", "1", "TIER", "0", "1"],
        &["10", "1", "TIER", "5", "1", "TIER", "5", "1000001"],
    ];
    let too_many: Vec<String> = ["10", "1"]
        .into_iter()
        .chain(["TIER", "5", "1"].repeat(16))
        .map(String::from)
        .collect();
    let bad: Vec<Vec<String>> = bad
        .iter()
        .map(|args| args.iter().map(|s| s.to_string()).collect())
        .chain([too_many])
        .collect();
    let before = entries(&mut conn, "z");
    for args in bad {
        let lua = normalise(peek_cmd(Via::Lua, &sha, "z", &args).query(&mut conn));
        let native = normalise(peek_cmd(Via::Native, &sha, "z", &args).query(&mut conn));
        assert!(matches!(native, Reply::Error(_)), "{args:?}: native replied {native:?}");
        let native = match native {
            Reply::Error(text) if !at_least_7_0() && text.contains("wrong number of arguments") => {
                Reply::Error(text.replace("'XCLOAK.PEEK'", "'xcloak.peek'"))
            }
            other => other,
        };
        assert_eq!(lua, native, "{args:?}");
        assert_eq!(entries(&mut conn, "z"), before, "{args:?} changed the key");
    }
    let args: Vec<String> = vec!["10".into(), "1".into()];
    let lua = normalise(peek_cmd(Via::Lua, &sha, "s", &args).query(&mut conn));
    assert_eq!(
        lua,
        Reply::Error("WRONGTYPE Operation against a key holding the wrong kind of value".into())
    );
    assert_eq!(lua, normalise(peek_cmd(Via::Native, &sha, "s", &args).query(&mut conn)));
}

/// One key, calls alternating at random between the command and the fallback,
/// against a key driven by the command alone: same replies and same members,
/// so a deployment can switch either way on live keys.
#[test]
fn command_and_fallback_share_a_key() {
    let server = Server::start();
    let mut conn = server.client();
    let sha = load_fallback(&mut conn);
    let conn = RefCell::new(conn);
    runner(48)
        .run(&sequence_strategy(), |sequence| {
            let mut conn = conn.borrow_mut();
            let (mixed_key, native_key) = (fresh_key("mixed"), fresh_key("reference"));
            for (i, (via, args, _)) in sequence.calls().into_iter().enumerate() {
                let mixed = observe(&mut conn, via, &sha, &mixed_key, &args);
                let reference = observe(&mut conn, Via::Native, &sha, &native_key, &args);
                let what = format!("call {i} via {via:?} {args:?}");
                prop_assert_eq!(&mixed.reply, &reference.reply, "{}: replies", what);
                prop_assert_eq!(&mixed.entries, &reference.entries, "{}: members and scores", what);
            }
            let _: () = redis::cmd("DEL")
                .arg(&mixed_key)
                .arg(&native_key)
                .query(&mut conn)
                .unwrap();
            Ok(())
        })
        .unwrap();
}

/// One step of a refund sequence: an `ALLOW ... STAMP`, or a refund of an
/// earlier stamp (admitted or not, maybe refunded already) or of an unknown one.
#[derive(Clone, Debug)]
enum RefundStep {
    Allow {
        forward_ms: i64,
        cost: i64,
        details: bool,
    },
    Refund {
        target: usize,
        unknown: bool,
        cost: Option<i64>,
    },
}

fn refund_step_strategy() -> impl Strategy<Value = RefundStep> {
    let forward = prop_oneof![3 => Just(0i64), 1 => Just(1i64), 2 => 0..3_000i64];
    let allow_cost = prop_oneof![6 => 1..=3i64, 1 => 900..=1200i64];
    let refund_cost = prop::option::weighted(0.7, prop_oneof![4 => 1..=3i64, 1 => 1..=2_000i64]);
    prop_oneof![
        3 => (forward, allow_cost, any::<bool>()).prop_map(|(forward_ms, cost, details)| RefundStep::Allow { forward_ms, cost, details }),
        2 => (any::<usize>(), prop::bool::weighted(0.15), refund_cost).prop_map(|(target, unknown, cost)| RefundStep::Refund { target, unknown, cost }),
    ]
}

/// ALLOW ... STAMP and refunds through the scripts and through the commands,
/// on two keys: every reply (stamps and counts), every member and score, and
/// the TTL state agree after every call. Refunds take the last members at
/// their score in both, so later admissions reuse the same slots.
#[test]
fn refunds_and_stamps_equal_the_commands() {
    let server = Server::start();
    let mut conn = server.client();
    let (allow_sha, refund_sha) = (load_fallback(&mut conn), load_script(&mut conn, REFUND_FALLBACK));
    let conn = RefCell::new(conn);
    let strategy = (
        1..=3_000i64,
        0..=2_500i64,
        prop::collection::vec(refund_step_strategy(), 1..40),
    );
    runner(64)
        .run(&strategy, |(window, limit, steps)| {
            let mut conn = conn.borrow_mut();
            let (lua_key, native_key) = (fresh_key("lua-refund"), fresh_key("native-refund"));
            let mut now = 1_732_941_234_567i64;
            let mut stamps: Vec<i64> = Vec::new();
            for (i, step) in steps.iter().enumerate() {
                let (args, is_refund) = match step {
                    RefundStep::Allow {
                        forward_ms,
                        cost,
                        details,
                    } => {
                        now += forward_ms;
                        stamps.push(now);
                        let mut args = vec![window.to_string(), limit.to_string(), "NOW".into(), now.to_string()];
                        args.extend(["COST".into(), cost.to_string(), "STAMP".into()]);
                        if *details {
                            args.push("DETAILS".into());
                        }
                        (args, false)
                    }
                    RefundStep::Refund { target, unknown, cost } => {
                        let stamp = if *unknown || stamps.is_empty() {
                            now - 1 - (*target % 100) as i64
                        } else {
                            stamps[target % stamps.len()]
                        };
                        let mut args = vec![stamp.to_string()];
                        if let Some(cost) = cost {
                            args.extend(["COST".into(), cost.to_string()]);
                        }
                        (args, true)
                    }
                };
                let command = |via: Via, key: &str| {
                    if is_refund {
                        refund_cmd(via, &refund_sha, key, &args)
                    } else {
                        call_cmd(via, &allow_sha, key, &args)
                    }
                };
                let lua = observe_cmd(&mut conn, command(Via::Lua, &lua_key), &lua_key);
                let native = observe_cmd(&mut conn, command(Via::Native, &native_key), &native_key);
                let what = format!("call {i} {} {args:?}", if is_refund { "REFUND" } else { "ALLOW" });
                prop_assert!(
                    !matches!(native.reply, Reply::Error(_) | Reply::Other(_)),
                    "{what}: native replied {:?}",
                    native.reply
                );
                prop_assert_eq!(&lua.reply, &native.reply, "{}: replies", what);
                prop_assert_eq!(&lua.entries, &native.entries, "{}: members and scores", what);
                prop_assert_eq!(lua.pttl == -1, native.pttl == -1, "{}: TTL touched by one only", what);
                if is_refund {
                    prop_assert!(
                        native.pttl == -1 || native.pttl == -2,
                        "{}: a refund set a TTL ({})",
                        what,
                        native.pttl
                    );
                }
            }
            let _: () = redis::cmd("DEL")
                .arg(&lua_key)
                .arg(&native_key)
                .query(&mut conn)
                .unwrap();
            Ok(())
        })
        .unwrap();
}

/// Thousands of admissions in one millisecond, alternating implementations
/// across the member format switch (k = 1000): no collision, exact limit.
#[test]
fn same_millisecond_admissions_alternating_hold_the_limit_exactly() {
    let server = Server::start();
    let mut conn = server.client();
    let sha = load_fallback(&mut conn);
    let now = 1_732_941_234_567i64;
    let args = |cost: i64| -> Vec<String> {
        ["60000", "2500", "NOW", &now.to_string(), "COST", &cost.to_string()]
            .map(String::from)
            .to_vec()
    };
    let mut admitted = 0;
    for (i, via) in [Via::Native, Via::Lua].iter().cycle().take(9).enumerate() {
        let reply = call(&mut conn, *via, &sha, "k", &args(300));
        let expected = if i < 8 { 1 } else { 0 };
        assert_eq!(reply, Reply::Int(expected), "call {i} via {via:?}");
        admitted += expected * 300;
    }
    assert_eq!(
        call(&mut conn, Via::Lua, &sha, "k", &args(101)),
        Reply::Int(0),
        "2400 + 101 > 2500"
    );
    assert_eq!(call(&mut conn, Via::Lua, &sha, "k", &args(100)), Reply::Int(1));
    admitted += 100;
    assert_eq!(
        call(&mut conn, Via::Native, &sha, "k", &args(1)),
        Reply::Int(0),
        "the window is full"
    );
    let members = entries(&mut conn, "k");
    assert_eq!(members.len() as i64, admitted, "every admission has its own member");
    assert_eq!(admitted, 2500);
    let stamp = now % 100_000_000_000;
    assert_eq!(members[999].0, format!("{stamp}999"));
    assert_eq!(members[1000].0, format!("{stamp}:0000001000"));
    assert_eq!(members[2499].0, format!("{stamp}:0000002499"));
}

/// Entries written by the article's script (members "now-seq") share a key with
/// the fallback and the command: both count them and never collide with them.
#[test]
fn article_entries_are_counted_and_never_collide() {
    let server = Server::start();
    let mut conn = server.client();
    let sha = load_fallback(&mut conn);
    for key in ["via-lua", "via-native"] {
        for _ in 0..3 {
            assert_eq!(article_at(&mut conn, key, 1000, 5, 7000), 1);
        }
    }
    let args: Vec<String> = ["1000", "5", "NOW", "7000", "COST", "2", "DETAILS"]
        .map(String::from)
        .to_vec();
    let lua = call(&mut conn, Via::Lua, &sha, "via-lua", &args);
    let native = call(&mut conn, Via::Native, &sha, "via-native", &args);
    assert_eq!(lua, Reply::Fields(vec![1, 5, 0, 0, 1000]));
    assert_eq!(lua, native);
    assert_eq!(entries(&mut conn, "via-lua"), entries(&mut conn, "via-native"));
    let members: Vec<String> = entries(&mut conn, "via-lua").into_iter().map(|(m, _)| m).collect();
    assert_eq!(members, ["7000-1", "7000-2", "7000-3", "7000000", "7000001"]);

    // Rolling back: the article's script counts our entries as its own (the
    // window is full), and writes next to them once they leave.
    for key in ["via-lua", "via-native"] {
        assert_eq!(article_at(&mut conn, key, 1000, 5, 7999), 0, "{key}: 5 live entries");
        let _: () = redis::cmd("DEL").arg(format!("{key}:seq")).query(&mut conn).unwrap();
        assert_eq!(
            article_at(&mut conn, key, 1000, 5, 8000),
            1,
            "{key}: the window moved on"
        );
        assert_eq!(entries(&mut conn, key), [("8000-1".to_string(), 8000.0)], "{key}");
    }
}

/// The usual shape, `window limit [DETAILS] [STAMP]` without NOW (what the
/// packages send, and what the script parses on a shorter path than the rest):
/// the script and the command give the same replies and members, admissions
/// in a new millisecond and in the same one, and rejections with their
/// details. Each step pipelines two calls through each between two TIMEs; a
/// step that straddles a millisecond ends its sequence (the two keys'
/// histories differ from then on) and the next starts on fresh keys.
#[test]
fn the_usual_shape_without_now_equals_the_command() {
    let server = Server::start();
    let mut conn = server.client();
    let sha = load_fallback(&mut conn);
    let shapes: [&[&str]; 5] = [
        &[],
        &["DETAILS"],
        &["STAMP"],
        &["DETAILS", "STAMP"],
        &["STAMP", "DETAILS"],
    ];
    let ms = |v: &Value| -> i64 {
        let (sec, usec): (i64, i64) = redis::from_redis_value(v).unwrap();
        sec * 1000 + usec / 1000
    };
    let (mut compared, mut rejections) = (0, 0);
    for sequence in 0..2000usize {
        if compared >= 200 && rejections >= 40 {
            break;
        }
        let shape = shapes[sequence % shapes.len()];
        let limit = [0, 1, 2, 3, 5][sequence / shapes.len() % 5];
        let mut args = vec!["60000".to_string(), limit.to_string()];
        args.extend(shape.iter().map(|s| s.to_string()));
        let (lua_key, native_key) = (fresh_key("usual-lua"), fresh_key("usual-native"));
        for step in 0..4 {
            // TIME brackets the calls from outside any MULTI: inside one, Redis 7.2+
            // and Valkey answer commands on the time the transaction started, so two
            // TIMEs there can agree while the calls straddle a millisecond.
            let mut pipe = redis::pipe();
            pipe.cmd("TIME");
            for _ in 0..2 {
                pipe.add_command(call_cmd(Via::Lua, &sha, &lua_key, &args));
            }
            for _ in 0..2 {
                pipe.add_command(call_cmd(Via::Native, &sha, &native_key, &args));
            }
            pipe.cmd("TIME");
            for key in [&lua_key, &native_key] {
                pipe.cmd("ZRANGE").arg(key).arg(0).arg(-1).arg("WITHSCORES");
            }
            let values: Vec<Value> = pipe.query(&mut conn).unwrap();
            if ms(&values[0]) != ms(&values[5]) {
                break;
            }
            let what = format!("sequence {sequence} step {step} {args:?}");
            for i in 0..2 {
                let (lua, native) = (
                    normalise(Ok(values[1 + i].clone())),
                    normalise(Ok(values[3 + i].clone())),
                );
                assert!(
                    matches!(native, Reply::Int(_) | Reply::Fields(_)),
                    "{what}: native replied {native:?}"
                );
                assert_eq!(lua, native, "{what}: call {i}");
                if matches!(&native, Reply::Int(0) | Reply::Int(-1)) || matches!(&native, Reply::Fields(f) if f[0] == 0)
                {
                    rejections += 1;
                }
            }
            assert_eq!(values[6], values[7], "{what}: members and scores");
            compared += 1;
        }
        let _: () = redis::cmd("DEL")
            .arg(&lua_key)
            .arg(&native_key)
            .query(&mut conn)
            .unwrap();
    }
    assert!(
        compared >= 200 && rejections >= 40,
        "only {compared} steps ({rejections} rejections) within one millisecond"
    );
}

/// Every bad call is an error from both, with the same text, and changes nothing.
#[test]
fn errors_match_the_command() {
    let server = Server::start();
    let mut conn = server.client();
    let sha = load_fallback(&mut conn);
    let _: i64 = redis::cmd("ZADD").arg("z").arg(5).arg("5000").query(&mut conn).unwrap();
    let _: () = redis::cmd("SET").arg("s").arg("text").query(&mut conn).unwrap();
    let bad: &[&[&str]] = &[
        &[],
        &["10"],
        &["0", "1"],
        &["-1", "1"],
        &["9007199254740992", "1"],
        &["99999999999999999999999", "1"],
        &["1.5", "1"],
        &["+1", "1"],
        &[" 1", "1"],
        &["01", "1"],
        &["0x10", "1"],
        &["1e3", "1"],
        &["", "1"],
        &["10", "-1"],
        &["10", "1000001"],
        &["10", "abc"],
        &["10", "1", "COST"],
        &["10", "1", "COST", "0"],
        &["10", "1", "COST", "1000001"],
        &["10", "1", "COST", "1", "cost", "2"],
        &["10", "1", "NOW"],
        &["10", "1", "NOW", "-1"],
        &["10", "1", "NOW", "9007199254740992"],
        &["10", "1", "NOW", "1", "NOW", "1"],
        &["10", "1", "DETAILS", "details"],
        &["10", "1", "FOO"],
        &["10", "1", "it's\r\nlong-and-weird-\u{1}-token-of-more-than-32-bytes"],
        &["10", "1", "DETAILS", "NOW", "5", "EXTRA"],
        &["10", "1", "TIER"],
        &["10", "1", "TIER", "5"],
        &["10", "1", "tier", "0", "1"],
        &["10", "1", "TIER", "5", "-1"],
        &["10", "1", "TIER", "5", "1000001"],
        &["10", "1", "TIER", "5", "1", "TIER", "9007199254740992", "1"],
        &["10", "1", "TIER", "5", "COST", "2"],
        &["10", "1", "TIER", "5", "1", "TIER"],
        &["10", "1", "TIER", "5", "1", "FOO"],
        &["10", "1", "STAMP", "stamp"],
        &["10", "1", "STAMP", "DETAILS", "STAMPS"],
        // The usual shape's shorter parse leaves every doubt to the full parser.
        &["10", "01"],
        &["10", "-0"],
        &["10", " 1"],
        &["10", "1", "DETAILS", "DETAILS"],
        &["10", "1", "STAMP", "STAMP"],
        &["10", "1", "DETAILS", "STAMP", "DETAILS"],
        &["10", "1", "DETAILS", "FOO"],
        &["10", "1", "FOO", "DETAILS"],
    ];
    // 16 TIERs: one too many (and 15 with a bad 16th, whose range error comes first).
    let too_many: Vec<String> = ["10", "1"]
        .into_iter()
        .chain(["TIER", "5", "1"].repeat(16))
        .map(String::from)
        .collect();
    let mut bad_sixteenth = too_many.clone();
    bad_sixteenth.pop();
    bad_sixteenth.push("x".into());
    let bad: Vec<Vec<String>> = bad
        .iter()
        .map(|args| args.iter().map(|s| s.to_string()).collect())
        .chain([too_many, bad_sixteenth])
        .collect();
    let before = entries(&mut conn, "z");
    for args in bad {
        let lua = call(&mut conn, Via::Lua, &sha, "z", &args);
        let native = call(&mut conn, Via::Native, &sha, "z", &args);
        assert!(matches!(native, Reply::Error(_)), "{args:?}: native replied {native:?}");
        // Before 7.0 the server's arity error echoes the command name as typed
        // (`XCLOAK.ALLOW` here); the script cannot know it and says `xcloak.allow`.
        let native = match native {
            Reply::Error(text) if !at_least_7_0() && text.contains("wrong number of arguments") => {
                Reply::Error(text.replace("'XCLOAK.ALLOW'", "'xcloak.allow'"))
            }
            other => other,
        };
        assert_eq!(lua, native, "{args:?}");
        assert_eq!(entries(&mut conn, "z"), before, "{args:?} changed the key");
    }
    // Another type: WRONGTYPE from both, value untouched.
    let args: Vec<String> = vec!["10".into(), "1".into()];
    let lua = call(&mut conn, Via::Lua, &sha, "s", &args);
    assert_eq!(
        lua,
        Reply::Error("WRONGTYPE Operation against a key holding the wrong kind of value".into())
    );
    assert_eq!(lua, call(&mut conn, Via::Native, &sha, "s", &args));
    let text: String = redis::cmd("GET").arg("s").query(&mut conn).unwrap();
    assert_eq!(text, "text");
    // The script takes exactly one key (the command has no way to get this wrong).
    for keys in [0, 2] {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(&sha).arg(keys);
        for k in 0..keys {
            cmd.arg(format!("k{k}"));
        }
        cmd.arg("10").arg("1");
        match normalise(cmd.query(&mut conn)) {
            Reply::Error(text) => assert!(text.contains("exactly one key"), "{text}"),
            other => panic!("{keys} keys: {other:?}"),
        }
    }
}

/// Every bad refund is an error from both, with the same text, and changes
/// nothing; another type gets WRONGTYPE; a missing key replies 0.
#[test]
fn refund_errors_match_the_command() {
    let server = Server::start();
    let mut conn = server.client();
    let sha = load_script(&mut conn, REFUND_FALLBACK);
    assert_eq!(allow_at(&mut conn, "z", 60_000, 5, 5000), 1);
    let _: () = redis::cmd("SET").arg("s").arg("text").query(&mut conn).unwrap();
    let bad: &[&[&str]] = &[
        &[],
        &["-1"],
        &["9007199254740992"],
        &["1.5"],
        &["+5000"],
        &["05000"],
        &["x"],
        &["5000", "COST"],
        &["5000", "COST", "0"],
        &["5000", "COST", "1000001"],
        &["5000", "COST", "1", "cost", "2"],
        &["5000", "COST", "1", "COST"],
        &["5000", "NOW", "5"],
        &["5000", "1"],
        &["5000", "it's\r\nlong-and-weird-\u{1}-token-of-more-than-32-bytes"],
    ];
    let before = entries(&mut conn, "z");
    for args in bad {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let lua = normalise(refund_cmd(Via::Lua, &sha, "z", &args).query(&mut conn));
        let native = normalise(refund_cmd(Via::Native, &sha, "z", &args).query(&mut conn));
        assert!(matches!(native, Reply::Error(_)), "{args:?}: native replied {native:?}");
        // Before 7.0 the server's arity error names the command as typed.
        let native = match native {
            Reply::Error(text) if !at_least_7_0() && text.contains("wrong number of arguments") => {
                Reply::Error(text.replace("'XCLOAK.REFUND'", "'xcloak.refund'"))
            }
            other => other,
        };
        assert_eq!(lua, native, "{args:?}");
        assert_eq!(entries(&mut conn, "z"), before, "{args:?} changed the key");
    }
    let args = vec!["5000".to_string()];
    let lua = normalise(refund_cmd(Via::Lua, &sha, "s", &args).query(&mut conn));
    assert_eq!(
        lua,
        Reply::Error("WRONGTYPE Operation against a key holding the wrong kind of value".into())
    );
    assert_eq!(
        lua,
        normalise(refund_cmd(Via::Native, &sha, "s", &args).query(&mut conn))
    );
    for via in [Via::Lua, Via::Native] {
        assert_eq!(
            normalise(refund_cmd(via, &sha, "missing", &args).query(&mut conn)),
            Reply::Int(0),
            "{via:?}"
        );
        let exists: i64 = redis::cmd("EXISTS").arg("missing").query(&mut conn).unwrap();
        assert_eq!(exists, 0, "{via:?}: a refund created the key");
    }
}

/// Without NOW the fallback stamps entries with the server's TIME, in ms.
#[test]
fn without_now_the_server_clock_is_used() {
    let server = Server::start();
    let mut conn = server.client();
    let sha = load_fallback(&mut conn);
    let server_ms = |conn: &mut Connection| -> i64 {
        let (sec, usec): (i64, i64) = redis::cmd("TIME").query(conn).unwrap();
        sec * 1000 + usec / 1000
    };
    let args: Vec<String> = ["60000", "3", "DETAILS"].map(String::from).to_vec();
    let before = server_ms(&mut conn);
    for remaining in [2, 1, 0] {
        // Admitted: the newest entry is this call's, so the reset is the window.
        assert_eq!(
            call(&mut conn, Via::Lua, &sha, "clock", &args),
            Reply::Fields(vec![1, 3, remaining, 0, 60_000])
        );
    }
    let after = server_ms(&mut conn);
    match call(&mut conn, Via::Lua, &sha, "clock", &args) {
        Reply::Fields(f) => {
            assert_eq!(&f[..3], &[0, 3, 0]);
            assert!((1..=60_000).contains(&f[3]) && (f[3]..=60_000).contains(&f[4]), "{f:?}");
        }
        other => panic!("{other:?}"),
    }
    for (_, score) in entries(&mut conn, "clock") {
        assert!(
            (before as f64..=after as f64).contains(&score),
            "{score} outside [{before}, {after}]"
        );
    }
    let pttl: i64 = redis::cmd("PTTL").arg("clock").query(&mut conn).unwrap();
    assert!((1..=61_000).contains(&pttl), "{pttl}");
}

/// A server without the module: the fallback alone gives the command's replies
/// and members (the command runs on a second server with the module).
#[test]
fn fallback_works_without_the_module() {
    let plain = ServerConfig::without_module().start();
    let with_module = Server::start();
    let (mut plain_conn, module_conn) = (plain.client(), with_module.client());
    let unknown = call(&mut plain_conn, Via::Native, "", "k", &["10".into(), "1".into()]);
    match unknown {
        Reply::Error(text) => assert!(text.starts_with("ERR unknown command"), "{text}"),
        other => panic!("the plain server knows XCLOAK.ALLOW? {other:?}"),
    }
    let sha = load_fallback(&mut plain_conn);
    let conns = RefCell::new((plain_conn, module_conn));
    runner(24)
        .run(&sequence_strategy(), |sequence| {
            let mut conns = conns.borrow_mut();
            let (plain_conn, module_conn) = &mut *conns;
            let key = fresh_key("plain");
            for (i, (_, args, _)) in sequence.calls().into_iter().enumerate() {
                let lua = observe(plain_conn, Via::Lua, &sha, &key, &args);
                let native = observe(module_conn, Via::Native, "", &key, &args);
                let what = format!("call {i} {args:?}");
                prop_assert_eq!(&lua.reply, &native.reply, "{}: replies", what);
                prop_assert_eq!(&lua.entries, &native.entries, "{}: members and scores", what);
                assert_ttl(&lua, &format!("{what} (script)"));
                prop_assert_eq!(lua.pttl == -1, native.pttl == -1, "{}: TTL touched by one only", what);
            }
            Ok(())
        })
        .unwrap();
}

/// The fallback replicates effects: a replica without the module (and without
/// the script) ends with the same members, scores and an absolute expiry, and
/// never runs the script itself.
#[test]
fn fallback_replicates_effects_only() {
    let primary = ServerConfig::without_module().start();
    let replica = ServerConfig::without_module().start();
    let (mut conn, mut replica_conn) = (primary.client(), replica.client());
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(primary.port)
        .query(&mut replica_conn)
        .unwrap();
    assert!(
        eventually(Duration::from_secs(20), || info_field(
            &mut replica_conn,
            "replication",
            "master_link_status"
        )
        .as_deref()
            == Some("up")),
        "replica never linked"
    );
    let sha = load_fallback(&mut conn);
    for i in 0..300 {
        let key = format!("r{}", i % 7);
        let mut args: Vec<String> = vec!["60000".into(), "40".into(), "COST".into(), (1 + i % 3).to_string()];
        if i % 5 == 0 {
            args.extend(["NOW".to_string(), (1_732_941_234_567i64 + i as i64).to_string()]);
        }
        assert!(matches!(call(&mut conn, Via::Lua, &sha, &key, &args), Reply::Int(_)));
    }
    // Admissions with STAMP, then refunds of half of them: replicated as
    // ZREMs of the exact members; the last refunds empty the key.
    let refund_sha = load_script(&mut conn, REFUND_FALLBACK);
    let mut stamps = Vec::new();
    for i in 0..20 {
        let args: Vec<String> = ["60000", "100", "COST", "3", "STAMP"].map(String::from).to_vec();
        match call(&mut conn, Via::Lua, &sha, "r-refund", &args) {
            Reply::Int(stamp) if stamp > 0 => stamps.push(stamp),
            other => panic!("admission {i}: {other:?}"),
        }
    }
    for (i, stamp) in stamps.iter().enumerate() {
        let args = vec![
            stamp.to_string(),
            "COST".into(),
            if i % 2 == 0 { "2" } else { "3" }.to_string(),
        ];
        assert!(matches!(
            normalise(refund_cmd(Via::Lua, &refund_sha, "r-refund", &args).query(&mut conn)),
            Reply::Int(1..)
        ));
    }
    // 20 x 3 entries, refunds of 10 x 2 + 10 x 3 (each stamp holds at least what its refunds ask).
    assert_eq!(entries(&mut conn, "r-refund").len(), 10);
    wait_replicated(&primary, &replica);
    assert_eq!(entries(&mut conn, "r-refund"), entries(&mut replica_conn, "r-refund"));
    for i in 0..7 {
        let key = format!("r{i}");
        assert_eq!(entries(&mut conn, &key), entries(&mut replica_conn, &key), "{key}");
        let expire_at = |c: &mut Connection| -> i64 {
            // PEXPIRETIME is 7.0+; on 6.2 compare PTTL within the time the check takes.
            redis::cmd("PTTL").arg(&key).query(c).unwrap()
        };
        let (on_primary, on_replica) = (expire_at(&mut conn), expire_at(&mut replica_conn));
        assert!(
            on_primary > 0 && on_replica > 0 && on_replica <= 61_000,
            "{key}: {on_primary} / {on_replica}"
        );
        if at_least_7_0() {
            let exact = |c: &mut Connection| -> i64 { redis::cmd("PEXPIRETIME").arg(&key).query(c).unwrap() };
            assert_eq!(
                exact(&mut conn),
                exact(&mut replica_conn),
                "{key}: same absolute expiry"
            );
        }
    }
    let stats: String = redis::cmd("INFO").arg("commandstats").query(&mut replica_conn).unwrap();
    assert!(
        !stats.contains("cmdstat_evalsha") && !stats.contains("cmdstat_eval:"),
        "the replica ran the script:\n{stats}"
    );
    assert!(stats.contains("cmdstat_zadd"), "the replica got no ZADD:\n{stats}");
    assert!(stats.contains("cmdstat_zrem:"), "the replica got no ZREM:\n{stats}");
}

/// After an admission both set the key's expiry to server time + window +
/// 1000 ms, absolute; a rejection leaves it alone. Bounded by TIME read
/// before and after each call, so no assumption about speed is made.
#[test]
fn ttl_is_window_plus_margin_from_the_server_clock() {
    let server = Server::start();
    let mut conn = server.client();
    let sha = load_fallback(&mut conn);
    let time = |conn: &mut Connection| -> i64 {
        let (sec, usec): (i64, i64) = redis::cmd("TIME").query(conn).unwrap();
        sec * 1000 + usec / 1000
    };
    let window = 60_000;
    for via in [Via::Lua, Via::Native] {
        let key = format!("ttl-{via:?}");
        let args: Vec<String> = vec![window.to_string(), "1".into(), "NOW".into(), "5".into()];
        let t0 = time(&mut conn);
        assert_eq!(call(&mut conn, via, &sha, &key, &args), Reply::Int(1));
        let t1 = time(&mut conn);
        let pttl: i64 = redis::cmd("PTTL").arg(&key).query(&mut conn).unwrap();
        let t2 = time(&mut conn);
        assert!(
            pttl <= window + 1000 && pttl >= t0 + window + 1000 - t2,
            "{via:?}: PTTL {pttl} (t0 {t0}, t1 {t1}, t2 {t2})"
        );
        // A rejection (the NOW is ignored by the TTL, which follows the server clock).
        let _: () = redis::cmd("PEXPIRE").arg(&key).arg(5_000_000).query(&mut conn).unwrap();
        assert_eq!(call(&mut conn, via, &sha, &key, &args), Reply::Int(0));
        let pttl: i64 = redis::cmd("PTTL").arg(&key).query(&mut conn).unwrap();
        assert!(pttl > window + 1000, "{via:?}: a rejection changed the TTL to {pttl}");
    }
}

/// An admission that outlasts its own window + 1 s (a COST of 10^6 entries,
/// with the server stopped for 1.5 s mid-call) answers its details like the
/// command, and leaves the key as the command does. The script used to arm
/// the expiry before reading the window for its reply: the deadline, counted
/// from the call's start, was already past, PEXPIREAT deleted the window, and
/// the reply failed on the missing key (`bad argument #1 to 'ceil'`) although
/// the admission had been applied.
#[test]
fn an_admission_slower_than_its_window_replies_like_the_command() {
    let server = Server::start();
    let sha = load_fallback(&mut server.client());
    let pid = server.pid().expect("running").to_string();
    let mut outcomes = Vec::new();
    for via in [Via::Lua, Via::Native] {
        let key = format!("slow-{via:?}");
        let args: Vec<String> = ["1", "1000000", "NOW", "1700000000000", "COST", "1000000", "DETAILS"]
            .map(String::from)
            .to_vec();
        let mut conn = server.client();
        let (sha, key2, args2) = (sha.clone(), key.clone(), args.clone());
        let idle_cpu = server.cpu_ms();
        let call_thread = std::thread::spawn(move || call(&mut conn, via, &sha, &key2, &args2));
        // Stop the server once it is inside the call: it has spent CPU on it
        // (an idle server spends next to none) and the call has not answered.
        let busy = eventually(Duration::from_secs(30), || {
            server.cpu_ms() >= idle_cpu + 50 || call_thread.is_finished()
        });
        assert!(
            busy && !call_thread.is_finished(),
            "{via:?}: the call ended before the server was stopped"
        );
        let stop = std::process::Command::new("kill")
            .args(["-STOP", &pid])
            .status()
            .unwrap();
        // The fault itself: the server stays stopped for 1.5 s mid-call.
        std::thread::sleep(Duration::from_millis(1500));
        let cont = std::process::Command::new("kill")
            .args(["-CONT", &pid])
            .status()
            .unwrap();
        assert!(stop.success() && cont.success());
        let reply = call_thread.join().unwrap();
        let exists: i64 = redis::cmd("EXISTS").arg(&key).query(&mut server.client()).unwrap();
        outcomes.push((reply, exists));
    }
    assert_eq!(
        outcomes[0].0,
        Reply::Fields(vec![1, 1_000_000, 0, 0, 1]),
        "the script's reply"
    );
    assert_eq!(outcomes[0], outcomes[1], "script and command differ");
}
