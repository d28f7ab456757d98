//! Every conformance vector (clients/conformance/vectors.json, docs/clients.md)
//! through this crate:
//!
//! - the pure core, without a server: each input becomes the vector's command
//!   byte for byte, each reply the vector's Decision, each Decision its
//!   headers in both styles, each acquire its sleeps and outcome, each
//!   allow_all its binding, rejection and refunds;
//! - the async `Limiter` against a live server with the module, and against
//!   one without it through the Lua fallback, with the commands sent recorded
//!   by a `Transport` wrapper and compared; the blocking `Limiter` the same way
//!   on Decisions and errors.
//!
//! A mutant caught: the tiers sent after COST, a cost of 1 sent, a later tier
//! binding on a tie, `Retry-After` rounded down, an allow_all that refunds the
//! rejecting request or sends the next one, jitter subtracted or drawn without
//! a sleep, a server error text rewritten, OLDEST not sent or a peek's last
//! element read as a stamp (the peek-oldest steps compare `oldest_ms`).
mod support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::{Cmd, Value};
use serde_json::Value as Json;
use support::Server;
use xcloak_client::{
    acquire_step, blocking, AcquireStep, Clock, Decision, Error, Fallback, Limiter, MultiDecision, Refund, Request,
    Style, TierState, Transport, Via,
};

const VECTORS: &str = include_str!("../../conformance/vectors.json");

fn cases() -> Vec<Json> {
    let vectors: Json = serde_json::from_str(VECTORS).unwrap();
    assert_eq!(vectors["schema"], 1);
    vectors["cases"].as_array().unwrap().clone()
}

fn args(cmd: &Cmd) -> Vec<String> {
    cmd.args_iter()
        .map(|a| match a {
            redis::Arg::Simple(b) => String::from_utf8_lossy(b).into_owned(),
            _ => "<cursor>".into(),
        })
        .collect()
}

fn strings(json: &Json) -> Vec<String> {
    json.as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect()
}

fn ms(json: &Json) -> Duration {
    Duration::from_millis(json.as_u64().unwrap())
}

/// A window call's inputs that a typed API can't hold: a negative window,
/// limit, cost, NOW or stamp (u64 and Duration have no negative values), so
/// the compiler refuses what the server's range check would.
fn unrepresentable(step: &Json) -> bool {
    let negative = |v: &Json| v.as_i64().is_some_and(|n| n < 0);
    ["window", "limit", "cost", "now", "stamp"]
        .iter()
        .any(|f| negative(&step[*f]))
        || step["tiers"]
            .as_array()
            .is_some_and(|t| t.iter().any(|p| negative(&p[0]) || negative(&p[1])))
}

/// The Request of an allow/peek/acquire input (or of an allow_all request).
fn request(step: &Json, now: Option<&Json>) -> Request {
    let mut request = Request::new(
        step["key"].as_str().unwrap(),
        ms(&step["window"]),
        step["limit"].as_u64().unwrap(),
    );
    for tier in step["tiers"].as_array().into_iter().flatten() {
        request = request.tier(ms(&tier[0]), tier[1].as_u64().unwrap());
    }
    if let Some(cost) = step["cost"].as_u64() {
        request = request.cost(cost);
    }
    if let Some(now) = now.and_then(Json::as_u64) {
        request = request.now(now);
    }
    if step["stamp"] == true {
        request = request.stamp();
    }
    if step["oldest"] == true {
        request = request.oldest();
    }
    request
}

/// The Refund of a refund step.
fn refund(step: &Json) -> Refund {
    Refund::new(step["key"].as_str().unwrap(), step["stamp"].as_u64().unwrap()).cost(step["cost"].as_u64().unwrap_or(1))
}

/// The peek steps that ask for the oldest entry (`OLDEST`, `oldest_ms`).
fn oldest_steps() -> usize {
    cases()
        .iter()
        .flat_map(|c| c["steps"].as_array().unwrap().clone())
        .filter(|s| s["oldest"] == true)
        .count()
}

/// A reply as the vectors write it, as the `redis` crate reads it.
fn value(json: &Json) -> Value {
    match json {
        Json::Number(n) => Value::Int(n.as_i64().unwrap()),
        Json::Array(items) => Value::Array(items.iter().map(value).collect()),
        Json::String(s) => Value::BulkString(s.as_bytes().to_vec()),
        Json::Null => Value::Nil,
        Json::Object(o) => {
            redis::parse_redis_value(format!("-{}\r\n", o["error"].as_str().unwrap()).as_bytes()).unwrap()
        }
        other => panic!("reply {other}"),
    }
}

/// A plain command's reply as the vectors write it.
fn to_json(value: Value) -> Json {
    match value {
        Value::Int(n) => Json::from(n),
        Value::Array(items) => Json::Array(items.into_iter().map(to_json).collect()),
        Value::BulkString(bytes) => Json::from(String::from_utf8_lossy(&bytes).into_owned()),
        Value::SimpleString(text) => Json::from(text),
        Value::Okay => Json::from("OK"),
        Value::Nil => Json::Null,
        other => panic!("unexpected reply {other:?}"),
    }
}

fn decision(json: &Json, via: Via) -> Decision {
    let retry = |v: &Json| u64::try_from(v.as_i64().unwrap()).ok().map(Duration::from_millis);
    Decision {
        allowed: json["allowed"].as_bool().unwrap(),
        limit: json["limit"].as_u64().unwrap(),
        remaining: json["remaining"].as_u64().unwrap(),
        retry_after: retry(&json["retry_after_ms"]),
        reset_after: ms(&json["reset_after_ms"]),
        cost_exceeds_limit: json["cost_exceeds_limit"].as_bool().unwrap(),
        window: ms(&json["window_ms"]),
        tier: json["tier"].as_u64().unwrap() as usize,
        tiers: json["tiers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| TierState {
                window: ms(&t["window_ms"]),
                limit: t["limit"].as_u64().unwrap(),
                remaining: t["remaining"].as_u64().unwrap(),
                retry_after: retry(&t["retry_after_ms"]),
                reset_after: ms(&t["reset_after_ms"]),
            })
            .collect(),
        stamp: json["stamp"].as_u64(),
        oldest: None,
        via,
        error: None,
    }
}

/// A step's Decision: its `decision`, and a peek's `oldest_ms` beside it.
fn expected(step: &Json, via: Via) -> Decision {
    Decision {
        oldest: step["oldest_ms"].as_u64(),
        ..decision(&step["decision"], via)
    }
}

fn header_map(map: &http::HeaderMap) -> BTreeMap<String, String> {
    map.iter()
        .map(|(k, v)| (k.as_str().to_string(), v.to_str().unwrap().to_string()))
        .collect()
}

fn expected_headers(json: &Json) -> BTreeMap<String, String> {
    json.as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.to_ascii_lowercase(), v.as_str().unwrap().to_string()))
        .collect()
}

fn names(step: &Json) -> Vec<String> {
    step["names"]
        .as_array()
        .map(|n| n.iter().map(|s| s.as_str().unwrap().to_string()).collect())
        .unwrap_or_default()
}

fn check_headers(what: &str, d: &Decision, step: &Json) {
    let names = names(step);
    for (style, field) in [(Style::Ietf, "ietf"), (Style::Legacy, "legacy")] {
        assert_eq!(
            header_map(&d.headers_named(style, &names)),
            expected_headers(&step["headers"][field]),
            "{what}: {field} headers"
        );
    }
    let mut both = expected_headers(&step["headers"]["ietf"]);
    both.extend(expected_headers(&step["headers"]["legacy"]));
    assert_eq!(header_map(&d.headers_named(Style::Both, &names)), both, "{what}: both");
}

fn check_multi_headers(what: &str, m: &MultiDecision, step: &Json) {
    let names: Vec<Vec<String>> = step["names"]
        .as_array()
        .map(|per| {
            per.iter()
                .map(|n| {
                    n.as_array()
                        .unwrap()
                        .iter()
                        .map(|s| s.as_str().unwrap().to_string())
                        .collect()
                })
                .collect()
        })
        .unwrap_or_default();
    for (style, field) in [(Style::Ietf, "ietf"), (Style::Legacy, "legacy")] {
        assert_eq!(
            header_map(&m.headers_named(style, &names)),
            expected_headers(&step["headers"][field]),
            "{what}: {field} headers"
        );
    }
}

/// The error a server refusal becomes: its text verbatim.
fn server_error(text: &str) -> Error {
    Error::Server {
        code: text.split(' ').next().unwrap().to_string(),
        message: text.to_string(),
    }
}

// ---- the pure core, no server

#[test]
fn every_vector_through_the_pure_core() {
    let (mut checked, mut skipped, mut oldest) = (0, 0, 0);
    for case in cases() {
        let name = case["name"].as_str().unwrap();
        for (i, step) in case["steps"].as_array().unwrap().iter().enumerate() {
            let what = format!("{name} step {i}");
            match step["op"].as_str().unwrap() {
                "allow" | "peek" if unrepresentable(step) => {
                    assert!(step["error"].is_string(), "{what}: only errors have negative inputs");
                    skipped += 1;
                }
                op @ ("allow" | "peek") => {
                    let request = request(step, step.get("now"));
                    let cmd = if op == "allow" {
                        request.allow_command()
                    } else {
                        request.peek_command()
                    }
                    .unwrap();
                    assert_eq!(args(&cmd), strings(&step["command"]), "{what}: command");
                    if let Some(text) = step["error"].as_str() {
                        // The refusal as the redis crate reports it, sorted into Error::Server.
                        let error = value(&step["reply"]).extract_error().unwrap_err();
                        assert_eq!(
                            error.code().map(|c| format!("{c} {}", error.detail().unwrap())),
                            Some(text.to_string()),
                            "{what}"
                        );
                    } else {
                        let reply = value(&step["reply"]);
                        let d = if op == "allow" {
                            Decision::from_reply(&reply, &request, Via::Command)
                        } else {
                            Decision::from_peek_reply(&reply, &request, Via::Command)
                        }
                        .unwrap();
                        assert_eq!(d, expected(step, Via::Command), "{what}");
                        oldest += usize::from(step["oldest"] == true);
                        check_headers(&what, &d, step);
                    }
                }
                "refund" if unrepresentable(step) => skipped += 1,
                "refund" => {
                    let cmd =
                        xcloak_client::Refund::new(step["key"].as_str().unwrap(), step["stamp"].as_u64().unwrap())
                            .cost(step["cost"].as_u64().unwrap_or(1))
                            .command();
                    assert_eq!(args(&cmd), strings(&step["command"]), "{what}");
                }
                "acquire" => {
                    let request = request(step, None);
                    let mut now = step["start"].as_u64().unwrap();
                    let deadline = now + step["max_wait_ms"].as_u64().unwrap();
                    let mut draws = step["random"].as_array().unwrap().iter().map(|r| r.as_f64().unwrap());
                    let calls = step["calls"].as_array().unwrap();
                    let mut last = None;
                    for (j, call) in calls.iter().enumerate() {
                        assert_eq!(call["now"].as_u64(), Some(now), "{what} call {j}: the virtual clock");
                        let at = request.clone().now(now);
                        assert_eq!(
                            args(&at.allow_command().unwrap()),
                            strings(&call["command"]),
                            "{what} call {j}"
                        );
                        let d = Decision::from_reply(&value(&call["reply"]), &at, Via::Command).unwrap();
                        let left = Duration::from_millis(deadline.saturating_sub(now));
                        let next = acquire_step(&d, left, step["jitter_fraction"].as_f64().unwrap(), || {
                            draws.next().expect("a draw")
                        });
                        match (next, call["sleep_ms"].as_u64()) {
                            (AcquireStep::Sleep(sleep), Some(expected)) => {
                                assert_eq!(sleep.as_millis() as u64, expected, "{what} call {j}: sleep");
                                now += expected;
                            }
                            (step_, None) => assert_eq!(j, calls.len() - 1, "{what}: stopped early with {step_:?}"),
                            (other, expected) => panic!("{what} call {j}: {other:?}, expected a sleep of {expected:?}"),
                        }
                        last = Some((next, d));
                    }
                    assert!(draws.next().is_none(), "{what}: every draw used");
                    let (next, d) = last.unwrap();
                    let outcome = match next {
                        AcquireStep::Done => "admitted",
                        AcquireStep::Deadline => "deadline",
                        AcquireStep::Never => "never",
                        AcquireStep::Sleep(_) => unreachable!(),
                    };
                    assert_eq!(outcome, step["outcome"], "{what}: outcome");
                    assert_eq!(d, decision(&step["decision"], Via::Command), "{what}: last decision");
                }
                "allow_all" => {
                    let calls = step["calls"].as_array().unwrap();
                    let mut decisions = Vec::new();
                    for (j, req) in step["requests"].as_array().unwrap().iter().enumerate() {
                        let request = request(req, step.get("now")).stamp();
                        assert_eq!(
                            args(&request.allow_command().unwrap()),
                            strings(&calls[j]["command"]),
                            "{what} request {j}"
                        );
                        let d = Decision::from_reply(&value(&calls[j]["reply"]), &request, Via::Command).unwrap();
                        let rejected = !d.allowed;
                        decisions.push((request, d));
                        if rejected {
                            break;
                        }
                    }
                    let m = MultiDecision::from_decisions(decisions.iter().map(|(_, d)| d.clone()).collect());
                    assert_eq!(
                        m.decisions.len(),
                        step["decisions"].as_array().unwrap().len(),
                        "{what}: requests sent"
                    );
                    for (d, expected) in m.decisions.iter().zip(step["decisions"].as_array().unwrap()) {
                        assert_eq!(d, &decision(expected, Via::Command), "{what}");
                    }
                    assert_eq!(
                        (m.allowed, m.rejected.map(|r| r as u64), m.binding_index as u64),
                        (
                            step["allowed"].as_bool().unwrap(),
                            step["rejected"].as_u64(),
                            step["binding"].as_u64().unwrap()
                        ),
                        "{what}"
                    );
                    // Then the refunds of the earlier admissions, in order.
                    let refunds: Vec<Vec<String>> = if m.allowed {
                        Vec::new()
                    } else {
                        decisions
                            .iter()
                            .filter(|(_, d)| d.allowed)
                            .map(|(r, d)| {
                                args(
                                    &xcloak_client::Refund::new(&r.key, d.stamp.unwrap())
                                        .cost(r.cost)
                                        .command(),
                                )
                            })
                            .collect()
                    };
                    let sent: Vec<Vec<String>> = calls[m.decisions.len()..]
                        .iter()
                        .map(|c| strings(&c["command"]))
                        .collect();
                    assert_eq!(refunds, sent, "{what}: refunds");
                    check_multi_headers(&what, &m, step);
                }
                "reset" | "raw" | "setup" => {}
                other => panic!("{what}: unknown op {other}"),
            }
            checked += 1;
        }
    }
    println!("{checked} steps through the pure core ({oldest} with OLDEST), {skipped} with inputs a u64 or Duration can't hold");
    assert!(checked > 200, "{checked}");
    assert_eq!(oldest, oldest_steps(), "every OLDEST peek compared");
    assert!(oldest >= 5, "{oldest}");
}

// ---- live: the async Limiter, commands recorded

/// A transport that records what it sends, around the real one.
#[derive(Clone)]
struct Recording {
    conn: redis::aio::MultiplexedConnection,
    log: Arc<Mutex<Vec<Vec<String>>>>,
}

impl Transport for Recording {
    fn send<'a>(
        &'a self,
        key: &'a [u8],
        read: bool,
        cmds: &'a [Cmd],
    ) -> impl std::future::Future<Output = redis::RedisResult<Vec<Value>>> + Send + 'a {
        self.log.lock().unwrap().extend(cmds.iter().map(args));
        self.conn.send(key, read, cmds)
    }
}

impl Recording {
    fn take(&self) -> Vec<Vec<String>> {
        std::mem::take(&mut *self.log.lock().unwrap())
    }
}

/// A virtual clock: `now` advances by each sleep, which returns at once.
#[derive(Clone)]
struct VirtualClock(Arc<(AtomicU64, Mutex<Vec<u64>>)>);

impl VirtualClock {
    fn starting_at(now: u64) -> VirtualClock {
        VirtualClock(Arc::new((AtomicU64::new(now), Mutex::default())))
    }
    fn sleeps(&self) -> Vec<u64> {
        self.0 .1.lock().unwrap().clone()
    }
}

impl Clock for VirtualClock {
    fn now_ms(&self) -> u64 {
        self.0 .0.load(Ordering::SeqCst)
    }
    fn sleep(&self, duration: Duration) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + '_>> {
        self.0 .0.fetch_add(duration.as_millis() as u64, Ordering::SeqCst);
        self.0 .1.lock().unwrap().push(duration.as_millis() as u64);
        Box::pin(async {})
    }
}

/// How the fallback rewrites a vector's command: `EVALSHA <sha> 1` (a peek:
/// `EVALSHA_RO`, Redis 7.0+) before the same arguments.
fn through_script(command: &[String]) -> Vec<String> {
    let (op, sha) = match command[0].as_str() {
        "XCLOAK.ALLOW" => ("EVALSHA", sha(xcloak_client::ALLOW_SCRIPT)),
        "XCLOAK.PEEK" => (
            if support::server_version() >= (7, 0) {
                "EVALSHA_RO"
            } else {
                "EVALSHA"
            },
            sha(xcloak_client::PEEK_SCRIPT),
        ),
        "XCLOAK.REFUND" => ("EVALSHA", sha(xcloak_client::REFUND_SCRIPT)),
        _ => return command.to_vec(),
    };
    let mut out = vec![op.to_string(), sha, "1".to_string()];
    out.extend(command[1..].iter().cloned());
    out
}

fn sha(script: &str) -> String {
    redis::Script::new(script).get_hash().to_string()
}

/// Whether `result` is what `step` recorded: its Decision, or its error verbatim.
fn check_result(what: &str, result: Result<Decision, Error>, step: &Json, via: Via) {
    match step["error"].as_str() {
        Some(text) => assert_eq!(result.unwrap_err(), server_error(text), "{what}"),
        None => {
            let d = result.unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(d, expected(step, via), "{what}");
            check_headers(what, &d, step);
        }
    }
}

async fn replay(server: &Server, via: Via) -> usize {
    let conn = server.client().get_multiplexed_async_connection().await.unwrap();
    let recording = Recording {
        conn,
        log: Arc::default(),
    };
    let fallback = if via == Via::Script {
        Fallback::Always
    } else {
        Fallback::Never
    };
    let limiter = Limiter::builder(recording.clone()).fallback(fallback).build().unwrap();
    let mut check = server.conn();
    if via == Via::Script {
        // Cached first: one EVALSHA per call, no NOSCRIPT round (tests/fallback.rs covers that).
        for script in [
            xcloak_client::ALLOW_SCRIPT,
            xcloak_client::PEEK_SCRIPT,
            xcloak_client::REFUND_SCRIPT,
        ] {
            let _: String = redis::cmd("SCRIPT").arg("LOAD").arg(script).query(&mut check).unwrap();
        }
    }
    let (mut compared, mut oldest) = (0, 0);
    for case in cases() {
        let name = case["name"].as_str().unwrap();
        let _: () = redis::cmd("FLUSHALL").query(&mut check).unwrap();
        for (i, step) in case["steps"].as_array().unwrap().iter().enumerate() {
            let what = format!("{via:?}: {name} step {i}");
            let op = step["op"].as_str().unwrap();
            if matches!(op, "allow" | "peek" | "refund") && unrepresentable(step) || op == "raw" {
                continue;
            }
            let expected: Vec<Vec<String>> = match op {
                "acquire" | "allow_all" => step["calls"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|c| through(&c["command"], via))
                    .collect(),
                "setup" => Vec::new(),
                _ => vec![through(&step["command"], via)],
            };
            match op {
                "allow" => check_result(&what, limiter.allow(&request(step, step.get("now"))).await, step, via),
                "peek" => check_result(&what, limiter.peek(&request(step, step.get("now"))).await, step, via),
                "refund" => {
                    let result = limiter.refund(&refund(step)).await;
                    match step["error"].as_str() {
                        Some(text) => assert_eq!(result.unwrap_err(), server_error(text), "{what}"),
                        None => assert_eq!(result.unwrap(), step["removed"].as_u64().unwrap(), "{what}"),
                    }
                }
                "reset" => assert_eq!(
                    limiter.reset(step["key"].as_str().unwrap()).await.unwrap(),
                    step["existed"].as_bool().unwrap(),
                    "{what}"
                ),
                "setup" => {
                    let mut cmd = redis::cmd(step["command"][0].as_str().unwrap());
                    cmd.arg(&strings(&step["command"])[1..]);
                    let got: Value = cmd.query(&mut check).unwrap();
                    assert_eq!(to_json(got), step["reply"], "{what}");
                }
                "acquire" => {
                    let clock = VirtualClock::starting_at(step["start"].as_u64().unwrap());
                    let draws: Vec<f64> = step["random"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|r| r.as_f64().unwrap())
                        .collect();
                    let next = AtomicU64::new(0);
                    let acquirer = Limiter::builder(recording.clone())
                        .fallback(fallback)
                        .clock(clock.clone())
                        .jitter_fraction(step["jitter_fraction"].as_f64().unwrap())
                        .random(move || draws[next.fetch_add(1, Ordering::SeqCst) as usize])
                        .build()
                        .unwrap();
                    let d = acquirer
                        .acquire(&request(step, None), ms(&step["max_wait_ms"]))
                        .await
                        .unwrap();
                    assert_eq!(d, decision(&step["decision"], via), "{what}");
                    let sleeps: Vec<u64> = step["calls"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .filter_map(|c| c["sleep_ms"].as_u64())
                        .collect();
                    assert_eq!(clock.sleeps(), sleeps, "{what}: sleeps");
                }
                "allow_all" => {
                    let requests: Vec<Request> = step["requests"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|r| request(r, step.get("now")))
                        .collect();
                    let m = limiter.allow_all(&requests).await.unwrap();
                    assert_eq!(
                        (m.allowed, m.rejected.map(|r| r as u64), m.binding_index as u64),
                        (
                            step["allowed"].as_bool().unwrap(),
                            step["rejected"].as_u64(),
                            step["binding"].as_u64().unwrap()
                        ),
                        "{what}"
                    );
                    let expected_decisions: Vec<Decision> = step["decisions"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|d| decision(d, via))
                        .collect();
                    assert_eq!(m.decisions, expected_decisions, "{what}");
                    check_multi_headers(&what, &m, step);
                }
                other => panic!("{what}: {other}"),
            }
            assert_eq!(recording.take(), expected, "{what}: the commands sent");
            // Vectors run on NOW time: no key may expire by the wall clock mid-case.
            if let Some(key) = step["key"].as_str() {
                let _: i64 = redis::cmd("PERSIST").arg(key).query(&mut check).unwrap();
            }
            compared += 1;
            oldest += usize::from(step["oldest"] == true);
        }
    }
    assert_eq!(
        oldest,
        oldest_steps(),
        "{via:?}: every OLDEST peek compared, its oldest_ms too"
    );
    compared
}

fn through(command: &Json, via: Via) -> Vec<String> {
    let command = strings(command);
    if via == Via::Script {
        through_script(&command)
    } else {
        command
    }
}

#[tokio::test]
async fn every_vector_through_the_command() {
    let server = Server::start();
    let compared = replay(&server, Via::Command).await;
    println!("{compared} steps through XCLOAK.* on a server with the module");
    assert!(compared > 180, "{compared}");
    assert_eq!(
        server.calls("evalsha") + server.calls("evalsha_ro"),
        0,
        "the module answered every call"
    );
}

#[tokio::test]
async fn every_vector_through_the_fallback() {
    let server = Server::without_module();
    let compared = replay(&server, Via::Script).await;
    println!("{compared} steps through the Lua scripts on a server without the module");
    assert!(compared > 180, "{compared}");
}

// ---- live: the blocking Limiter, Decisions and errors

fn replay_blocking(server: &Server, via: Via) -> usize {
    let fallback = if via == Via::Script {
        Fallback::Always
    } else {
        Fallback::Never
    };
    let limiter = blocking::Limiter::builder(server.client())
        .fallback(fallback)
        .build_blocking()
        .unwrap();
    let mut check = server.conn();
    let (mut compared, mut oldest) = (0, 0);
    for case in cases() {
        let _: () = redis::cmd("FLUSHALL").query(&mut check).unwrap();
        for (i, step) in case["steps"].as_array().unwrap().iter().enumerate() {
            let what = format!("blocking {via:?}: {} step {i}", case["name"]);
            match step["op"].as_str().unwrap() {
                "allow" | "peek" | "refund" if unrepresentable(step) => continue,
                "allow" => check_result(&what, limiter.allow(&request(step, step.get("now"))), step, via),
                "peek" => check_result(&what, limiter.peek(&request(step, step.get("now"))), step, via),
                "refund" => {
                    let result = limiter.refund(&refund(step));
                    match step["error"].as_str() {
                        Some(text) => assert_eq!(result.unwrap_err(), server_error(text), "{what}"),
                        None => assert_eq!(result.unwrap(), step["removed"].as_u64().unwrap(), "{what}"),
                    }
                }
                "reset" => assert_eq!(
                    limiter.reset(step["key"].as_str().unwrap()).unwrap(),
                    step["existed"].as_bool().unwrap(),
                    "{what}"
                ),
                "setup" => {
                    let mut cmd = redis::cmd(step["command"][0].as_str().unwrap());
                    cmd.arg(&strings(&step["command"])[1..]);
                    assert_eq!(
                        to_json(cmd.query::<Value>(&mut check).unwrap()),
                        step["reply"],
                        "{what}"
                    );
                }
                "acquire" => {
                    let clock = VirtualClock::starting_at(step["start"].as_u64().unwrap());
                    let draws: Vec<f64> = step["random"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|r| r.as_f64().unwrap())
                        .collect();
                    let next = AtomicU64::new(0);
                    let acquirer = blocking::Limiter::builder(server.client())
                        .fallback(fallback)
                        .clock(clock.clone())
                        .jitter_fraction(step["jitter_fraction"].as_f64().unwrap())
                        .random(move || draws[next.fetch_add(1, Ordering::SeqCst) as usize])
                        .build_blocking()
                        .unwrap();
                    let d = acquirer
                        .acquire(&request(step, None), ms(&step["max_wait_ms"]))
                        .unwrap();
                    assert_eq!(d, decision(&step["decision"], via), "{what}");
                    let sleeps: Vec<u64> = step["calls"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .filter_map(|c| c["sleep_ms"].as_u64())
                        .collect();
                    assert_eq!(clock.sleeps(), sleeps, "{what}: sleeps");
                }
                "allow_all" => {
                    let requests: Vec<Request> = step["requests"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|r| request(r, step.get("now")))
                        .collect();
                    let m = limiter.allow_all(&requests).unwrap();
                    let expected: Vec<Decision> = step["decisions"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|d| decision(d, via))
                        .collect();
                    assert_eq!(
                        (m.allowed, m.decisions),
                        (step["allowed"].as_bool().unwrap(), expected),
                        "{what}"
                    );
                }
                _ => continue,
            }
            if let Some(key) = step["key"].as_str() {
                let _: i64 = redis::cmd("PERSIST").arg(key).query(&mut check).unwrap();
            }
            compared += 1;
            oldest += usize::from(step["oldest"] == true);
        }
    }
    assert_eq!(
        oldest,
        oldest_steps(),
        "{via:?}: every OLDEST peek compared, its oldest_ms too"
    );
    compared
}

#[test]
fn every_vector_through_the_blocking_limiter() {
    let with = Server::start();
    let without = Server::without_module();
    let on_module = replay_blocking(&with, Via::Command);
    let on_script = replay_blocking(&without, Via::Script);
    println!("blocking: {on_module} steps through the command, {on_script} through the scripts");
    assert!(on_module > 180 && on_script > 180);
    assert!(without.calls("evalsha") > 0 && with.calls("evalsha") == 0);
}
