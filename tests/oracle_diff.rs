//! Differential oracle: random call sequences with NOW run against the
//! article's script (tests/oracle/article.lua, the reference semantics) and
//! XCLOAK.ALLOW on separate keys of one real server; every reply and the
//! window size (ZCARD) after every call must be equal.
//!
//! Real time is kept out of the comparison. Both implementations set a TTL on
//! the server's clock (the script ceil(window/1000)+1 s, the module window +
//! 1000 ms), so a 1 ms window key could otherwise expire in real time between
//! two calls on one side only. Each call therefore runs in its own MULTI/EXEC
//! as `call; PTTL; PERSIST; ZCARD`: the key never carries a TTL between calls,
//! and nothing expires inside the transaction (Redis 7.0+ freezes the clock
//! there; on 6.2 it would take a one-second stall inside one EXEC). Nothing in
//! either decision depends on the TTL. The PTTL read in the same transaction
//! checks the module's TTL handling explicitly: after an admission the key has
//! a TTL above the window; after a rejection the TTL is untouched (-1: we had
//! removed it; -2: no key).
//!
//! Seed: random per run and printed; `XCLOAK_ORACLE_SEED=<u64>` replays one,
//! `XCLOAK_ORACLE_CASES=<n>` changes the number of cases (default 250).
use crate::common;
use common::*;

use std::cell::RefCell;
use std::collections::BTreeMap;

use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestError, TestRng, TestRunner};
use redis::{Connection, Value};

const DAY_MS: i64 = 86_400_000;
const MAX_EXACT_MS: i64 = 9_007_199_254_740_991;
/// zset-max-listpack-entries (zset-max-ziplist-entries on 6.2): 128.
const LISTPACK_ENTRIES: i64 = 128;

/// How NOW moves before a call (or a change of limit, which calls at the same NOW).
#[derive(Clone, Debug)]
enum Step {
    Same,
    PlusOne,
    WindowMinusOne,
    Window,
    WindowPlusOne,
    /// Forward by `r % (3 * window + 2)`.
    Random(u64),
    /// Backward by `1 + r % (2 * window + 1)` (a client clock stepping back).
    Back(u64),
    /// `n` calls, each 0 or 1 ms after the previous.
    Burst(u16, bool),
    /// The caller changes its limit; one call at the same NOW.
    SetLimit(i64),
}

#[derive(Clone, Debug)]
struct Case {
    window: i64,
    limit: i64,
    start: i64,
    steps: Vec<Step>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Call {
    now: i64,
    limit: i64,
}

impl Case {
    /// The calls the steps describe, NOW kept in 0..=2^53-1 (the command's range).
    fn calls(&self) -> Vec<Call> {
        let w = self.window;
        let (mut now, mut limit) = (self.start, self.limit);
        let mut calls = Vec::new();
        let mut push = |now: i64, limit: i64| {
            calls.push(Call {
                now: now.clamp(0, MAX_EXACT_MS),
                limit,
            })
        };
        for step in &self.steps {
            match *step {
                Step::Same => {}
                Step::PlusOne => now += 1,
                Step::WindowMinusOne => now += w - 1,
                Step::Window => now += w,
                Step::WindowPlusOne => now += w + 1,
                Step::Random(r) => now += (r % (3 * w as u64 + 2)) as i64,
                Step::Back(r) => now -= 1 + (r % (2 * w as u64 + 1)) as i64,
                Step::SetLimit(new_limit) => limit = new_limit,
                Step::Burst(n, spread) => {
                    for _ in 0..n {
                        now = (now + spread as i64).clamp(0, MAX_EXACT_MS);
                        push(now, limit);
                    }
                    continue;
                }
            }
            now = now.clamp(0, MAX_EXACT_MS);
            push(now, limit);
        }
        calls
    }
}

fn limits() -> impl Strategy<Value = i64> {
    prop_oneof![
        Just(0i64),
        Just(1),
        Just(LISTPACK_ENTRIES - 1),
        Just(LISTPACK_ENTRIES),
        Just(LISTPACK_ENTRIES + 1),
        Just(300),
        0..=300i64,
        0..=300i64,
    ]
}

fn case_strategy() -> impl Strategy<Value = Case> {
    let window = prop_oneof![Just(1i64), Just(2), Just(1000), Just(DAY_MS), 1..=1000i64, 1..=DAY_MS,];
    let start = prop_oneof![
        3 => 1_600_000_000_000..=1_900_000_000_000i64,
        1 => 0..=2 * DAY_MS,
        1 => (MAX_EXACT_MS - 3 * DAY_MS)..=MAX_EXACT_MS,
    ];
    let step = prop_oneof![
        6 => Just(Step::Same),
        4 => Just(Step::PlusOne),
        2 => Just(Step::WindowMinusOne),
        2 => Just(Step::Window),
        2 => Just(Step::WindowPlusOne),
        2 => any::<u64>().prop_map(Step::Random),
        2 => any::<u64>().prop_map(Step::Back),
        1 => (prop_oneof![1..=20u16, 120..=300u16], any::<bool>()).prop_map(|(n, spread)| Step::Burst(n, spread)),
        1 => limits().prop_map(Step::SetLimit),
    ];
    (window, limits(), start, prop::collection::vec(step, 1..=60)).prop_map(|(window, limit, start, steps)| Case {
        window,
        limit,
        start,
        steps,
    })
}

/// Who answers the calls of a case. The mutant exists to prove the comparison
/// bites: it is the article's script with one more unit of limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Implementation {
    Module,
    Article,
    ArticleAdmittingOneExtra,
}

/// Per call: (reply, PTTL right after, ZCARD right after). One round trip;
/// each call in its own MULTI/EXEC with PERSIST (see the file comment).
fn run(conn: &mut Connection, who: Implementation, key: &str, window: i64, calls: &[Call]) -> Vec<(i64, i64, i64)> {
    let sha = redis::Script::new(ARTICLE_SCRIPT).get_hash().to_string();
    let mut pipe = redis::pipe();
    pipe.cmd("SCRIPT").arg("LOAD").arg(ARTICLE_SCRIPT).ignore();
    for call in calls {
        pipe.cmd("MULTI");
        match who {
            Implementation::Module => {
                pipe.cmd("XCLOAK.ALLOW")
                    .arg(key)
                    .arg(window)
                    .arg(call.limit)
                    .arg("NOW")
                    .arg(call.now);
            }
            Implementation::Article | Implementation::ArticleAdmittingOneExtra => {
                let limit = call.limit + (who == Implementation::ArticleAdmittingOneExtra) as i64;
                pipe.cmd("EVALSHA")
                    .arg(&sha)
                    .arg(1)
                    .arg(key)
                    .arg(call.now)
                    .arg(window)
                    .arg(limit);
            }
        }
        pipe.cmd("PTTL")
            .arg(key)
            .cmd("PERSIST")
            .arg(key)
            .cmd("ZCARD")
            .arg(key)
            .cmd("EXEC");
    }
    let values: Vec<Value> = pipe.query(conn).expect("pipeline of MULTI/EXEC");
    assert_eq!(values.len(), calls.len() * 6);
    values
        .chunks(6)
        .map(|group| {
            let exec: Vec<i64> =
                redis::from_redis_value(&group[5]).unwrap_or_else(|e| panic!("EXEC reply {:?}: {e}", group[5]));
            (exec[0], exec[1], exec[3])
        })
        .collect()
}

/// What a case reached, to prove the generator covers what it must.
#[derive(Default, Debug)]
struct Reach {
    cases: u64,
    calls: u64,
    admitted: u64,
    rejected: u64,
    window_1ms: u64,
    window_day: u64,
    above_listpack: u64,
    limit_changed: u64,
    backwards: u64,
    steps: BTreeMap<&'static str, u64>,
}

fn step_name(step: &Step) -> &'static str {
    match step {
        Step::Same => "0",
        Step::PlusOne => "+1",
        Step::WindowMinusOne => "window-1",
        Step::Window => "window",
        Step::WindowPlusOne => "window+1",
        Step::Random(_) => "random",
        Step::Back(_) => "back",
        Step::Burst(..) => "burst",
        Step::SetLimit(_) => "limit change",
    }
}

/// Runs `case` on `reference` and `candidate` (fresh keys), compares call by
/// call; Err describes the first difference.
fn compare(
    conn: &mut Connection,
    id: u64,
    case: &Case,
    reference: Implementation,
    candidate: Implementation,
    reach: Option<&mut Reach>,
) -> Result<(), String> {
    let calls = case.calls();
    let (ref_key, cand_key) = (format!("oracle:{id}:ref"), format!("oracle:{id}:cand"));
    let expected = run(conn, reference, &ref_key, case.window, &calls);
    let actual = run(conn, candidate, &cand_key, case.window, &calls);
    let _: () = redis::cmd("DEL")
        .arg(&ref_key)
        .arg(&cand_key)
        .arg(format!("{ref_key}:seq"))
        .arg(format!("{cand_key}:seq"))
        .query(conn)
        .unwrap();

    for (i, (call, (want, got))) in calls.iter().zip(expected.iter().zip(&actual)).enumerate() {
        let context = || format!("call {i} of {} ({call:?}, window {}): ", calls.len(), case.window);
        if want.0 != got.0 {
            return Err(format!(
                "{}reply {} (reference) vs {} ({candidate:?})",
                context(),
                want.0,
                got.0
            ));
        }
        if want.2 != got.2 {
            return Err(format!(
                "{}ZCARD {} (reference) vs {} ({candidate:?})",
                context(),
                want.2,
                got.2
            ));
        }
        if candidate == Implementation::Module {
            let pttl = got.1;
            if got.0 == 1 && pttl <= case.window {
                return Err(format!("{}admitted but PTTL {pttl} is not above the window", context()));
            }
            if got.0 == 0 && pttl != -1 && pttl != -2 {
                return Err(format!("{}a rejection set a TTL (PTTL {pttl})", context()));
            }
        }
    }

    if let Some(reach) = reach {
        reach.cases += 1;
        reach.calls += calls.len() as u64;
        reach.admitted += expected.iter().filter(|r| r.0 == 1).count() as u64;
        reach.rejected += expected.iter().filter(|r| r.0 == 0).count() as u64;
        reach.window_1ms += (case.window == 1) as u64;
        reach.window_day += (case.window == DAY_MS) as u64;
        reach.above_listpack += expected.iter().any(|r| r.2 > LISTPACK_ENTRIES) as u64;
        reach.limit_changed += calls.windows(2).any(|pair| pair[0].limit != pair[1].limit) as u64;
        reach.backwards += calls.windows(2).any(|pair| pair[1].now < pair[0].now) as u64;
        for step in &case.steps {
            *reach.steps.entry(step_name(step)).or_default() += 1;
        }
    }
    Ok(())
}

fn seed() -> u64 {
    match std::env::var("XCLOAK_ORACLE_SEED") {
        Ok(text) => text.parse().expect("XCLOAK_ORACLE_SEED is a u64"),
        Err(_) => {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos();
            (nanos as u64) ^ ((std::process::id() as u64) << 32)
        }
    }
}

/// A runner with a fixed seed. On failure it shrinks for at most
/// `shrink_iters` iterations or two minutes, whichever ends first.
fn runner(seed: u64, cases: u32, shrink_iters: u32) -> TestRunner {
    let mut bytes = [0u8; 32];
    for (i, chunk) in bytes.chunks_mut(8).enumerate() {
        chunk.copy_from_slice(&seed.rotate_left(i as u32 * 16).to_le_bytes());
    }
    let config = Config {
        cases,
        failure_persistence: None,
        max_shrink_iters: shrink_iters,
        max_shrink_time: 120_000,
        ..Config::default()
    };
    TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &bytes))
}

/// The property: on random sequences (windows 1 ms .. 1 day, limits 0..=300,
/// every kind of time step, limits changing mid-sequence) XCLOAK.ALLOW
/// answers every call as the article's script does and leaves the same number
/// of entries. One server for all cases.
/// Fails if: any admission decision, trim boundary (`<= now - window`), limit
/// comparison, encoding change (listpack -> skiplist at 129 entries) or
/// backwards-clock handling differs from the script by a single call or entry;
/// or the module's TTL is missing after an admission or set by a rejection.
#[test]
fn module_matches_the_article_script_on_random_sequences() {
    let server = Server::start();
    let conn = RefCell::new(server.client());
    let seed = seed();
    let cases: u32 = std::env::var("XCLOAK_ORACLE_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(250);
    eprintln!("oracle_diff: seed {seed} ({cases} cases); replay with XCLOAK_ORACLE_SEED={seed}");
    let reach = RefCell::new(Reach::default());
    let next_id = RefCell::new(0u64);
    let result = runner(seed, cases, 2000).run(&case_strategy(), |case| {
        let id = {
            let mut id = next_id.borrow_mut();
            *id += 1;
            *id
        };
        compare(
            &mut conn.borrow_mut(),
            id,
            &case,
            Implementation::Article,
            Implementation::Module,
            Some(&mut reach.borrow_mut()),
        )
        .map_err(TestCaseError::fail)
    });
    if let Err(error) = result {
        match error {
            TestError::Fail(reason, case) => {
                panic!(
                    "seed {seed}: {reason}\nminimal case: {case:?}\ncalls: {:?}",
                    case.calls()
                )
            }
            TestError::Abort(reason) => panic!("seed {seed}: aborted: {reason}"),
        }
    }

    // The generator must have reached everything the issue lists (checked at
    // the default size; a run of a handful of cases may legitimately miss some).
    let reach = reach.into_inner();
    eprintln!("oracle_diff: reached {reach:?}");
    assert!(reach.cases >= cases as u64);
    if cases < 200 {
        return;
    }
    assert!(reach.admitted > 0 && reach.rejected > 0, "{reach:?}");
    assert!(
        reach.window_1ms > 0 && reach.window_day > 0,
        "windows of 1 ms and a day: {reach:?}"
    );
    assert!(
        reach.above_listpack > 0,
        "windows above {LISTPACK_ENTRIES} entries: {reach:?}"
    );
    assert!(reach.limit_changed > 0 && reach.backwards > 0, "{reach:?}");
    for name in [
        "0",
        "+1",
        "window-1",
        "window",
        "window+1",
        "random",
        "back",
        "burst",
        "limit change",
    ] {
        assert!(
            reach.steps.get(name).copied().unwrap_or(0) > 0,
            "step {name} never generated: {reach:?}"
        );
    }
}

/// Fixed sequences at the edges, run on every seed: a 1 ms window with 300
/// same-millisecond calls then +1 ms; a day window filled past 128 entries
/// with the limit lowered and raised across it; window-1 / window / window+1
/// steps; a backwards jump over a full window.
/// Fails if: as above, deterministically.
#[test]
fn module_matches_the_article_script_on_edge_sequences() {
    let server = Server::start();
    let mut conn = server.client();
    let t = 1_700_000_000_000;
    let cases = [
        Case {
            window: 1,
            limit: 300,
            start: t,
            steps: vec![
                Step::Burst(301, false),
                Step::PlusOne,
                Step::Same,
                Step::Burst(300, false),
            ],
        },
        Case {
            window: DAY_MS,
            limit: 300,
            start: t,
            steps: vec![
                Step::Burst(200, true),
                Step::SetLimit(129),
                Step::SetLimit(300),
                Step::Burst(120, false),
                Step::SetLimit(0),
                Step::WindowMinusOne,
                Step::Window,
                Step::SetLimit(300),
                Step::Burst(5, true),
            ],
        },
        Case {
            window: 1000,
            limit: 2,
            start: t,
            steps: vec![
                Step::Same,
                Step::Same,
                Step::WindowMinusOne,
                Step::PlusOne,
                Step::Same,
                Step::WindowPlusOne,
                Step::Back(3000),
                Step::Same,
                Step::Window,
                Step::Window,
            ],
        },
        Case {
            window: 1,
            limit: 0,
            start: 0,
            steps: vec![Step::Same, Step::SetLimit(1), Step::Back(5), Step::Same],
        },
        Case {
            window: 5,
            limit: 129,
            start: MAX_EXACT_MS - 200,
            steps: vec![Step::Burst(150, false), Step::Random(1_000_000)],
        },
    ];
    for (id, case) in cases.iter().enumerate() {
        if let Err(reason) = compare(
            &mut conn,
            id as u64,
            case,
            Implementation::Article,
            Implementation::Module,
            None,
        ) {
            panic!("edge case {id}: {reason}\n{case:?}");
        }
    }
}

/// Mutation check of the comparison itself: a candidate that admits one
/// extra (the script with limit + 1) must be caught, both on a fixed sequence
/// and by the random generator within a few cases; the script compared with
/// itself must pass.
/// Fails if: the comparison stopped comparing replies or ZCARD exactly.
#[test]
fn comparison_catches_one_extra_admission() {
    let server = Server::start();
    let mut conn = server.client();
    let case = Case {
        window: 1000,
        limit: 3,
        start: 1_700_000_000_000,
        steps: vec![Step::Burst(5, false)],
    };
    let caught = compare(
        &mut conn,
        1,
        &case,
        Implementation::Article,
        Implementation::ArticleAdmittingOneExtra,
        None,
    );
    let reason = caught.expect_err("one extra admission must be caught");
    assert!(
        reason.contains("call 3") && reason.contains("reply 0 (reference) vs 1"),
        "{reason}"
    );
    compare(
        &mut conn,
        2,
        &case,
        Implementation::Article,
        Implementation::Article,
        None,
    )
    .expect("the script agrees with itself");

    let conn = RefCell::new(conn);
    let next_id = RefCell::new(100u64);
    let result = runner(seed(), 60, 1).run(&case_strategy(), |case| {
        let id = {
            let mut id = next_id.borrow_mut();
            *id += 1;
            *id
        };
        compare(
            &mut conn.borrow_mut(),
            id,
            &case,
            Implementation::Article,
            Implementation::ArticleAdmittingOneExtra,
            None,
        )
        .map_err(TestCaseError::fail)
    });
    assert!(
        matches!(result, Err(TestError::Fail(..))),
        "the generator must expose the mutant: {result:?}"
    );
}
