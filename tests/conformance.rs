//! The client contract's vectors (`clients/conformance/vectors.json`,
//! docs/clients.md) replayed against the server, so they can never drift
//! from it: every command of every case is sent, in order, to the module on
//! sorted sets, to the module on compact keys, and to the Lua scripts on a
//! server without the module, and each reply must equal the recorded one
//! exactly (integers, nesting, error text). Each step's `command` must also be
//! the canonical command of its inputs (what every client sends).
//!
//! A mutant of the module or of a script (a retry_after off by one, a tie
//! broken the other way, a refund that removes one entry too many) changes a
//! recorded reply and fails here, on the form or the fallback it touches.
use crate::common;
use common::*;

use redis::{Connection, Value};
use serde_json::{json, Value as Json};

const VECTORS: &str = include_str!("../clients/conformance/vectors.json");
const ALLOW_SCRIPT: &str = include_str!("../src/lua/xcloak_allow.lua");
const PEEK_SCRIPT: &str = include_str!("../src/lua/xcloak_peek.lua");
const REFUND_SCRIPT: &str = include_str!("../src/lua/xcloak_refund.lua");

/// Where a replay sends its commands.
enum Target {
    Module,
    /// A server without the module: XCLOAK.* become EVALSHA of the scripts.
    Scripts {
        allow: String,
        peek: String,
        refund: String,
    },
}

impl Target {
    fn scripts(conn: &mut Connection) -> Target {
        let mut load = |script: &str| -> String { redis::cmd("SCRIPT").arg("LOAD").arg(script).query(conn).unwrap() };
        Target::Scripts {
            allow: load(ALLOW_SCRIPT),
            peek: load(PEEK_SCRIPT),
            refund: load(REFUND_SCRIPT),
        }
    }

    /// The command as this target runs it.
    fn translate(&self, command: &[String]) -> redis::Cmd {
        let name = command[0].to_ascii_uppercase();
        let sha = match (self, name.as_str()) {
            (Target::Scripts { allow, .. }, "XCLOAK.ALLOW") => Some(("EVALSHA", allow)),
            (Target::Scripts { peek, .. }, "XCLOAK.PEEK") => {
                Some((if at_least_7_0() { "EVALSHA_RO" } else { "EVALSHA" }, peek))
            }
            (Target::Scripts { refund, .. }, "XCLOAK.REFUND") => Some(("EVALSHA", refund)),
            _ => None,
        };
        match sha {
            Some((eval, sha)) => {
                let mut cmd = redis::cmd(eval);
                cmd.arg(sha).arg(1).arg(&command[1..]);
                cmd
            }
            None => {
                let mut cmd = redis::cmd(&command[0]);
                cmd.arg(&command[1..]);
                cmd
            }
        }
    }
}

/// A reply as the vectors write it: integers, strings, arrays, null, or
/// `{"error": "<code> <message>"}`.
fn to_json(value: Value) -> Json {
    match value {
        Value::Int(n) => json!(n),
        Value::Array(items) => Json::Array(items.into_iter().map(to_json).collect()),
        Value::BulkString(bytes) => json!(String::from_utf8_lossy(&bytes)),
        Value::SimpleString(text) => json!(text),
        Value::Okay => json!("OK"),
        Value::Nil => Json::Null,
        Value::ServerError(error) => json!({"error": format!("{} {}", error.code(), error.details().unwrap_or(""))}),
        other => panic!("unexpected reply {other:?}"),
    }
}

fn strings(value: &Json) -> Vec<String> {
    value
        .as_array()
        .expect("a command is an array")
        .iter()
        .map(|v| v.as_str().expect("a string").to_string())
        .collect()
}

/// The canonical command of an allow/peek step's inputs (docs/clients.md):
/// tiers, COST when not 1, NOW, then DETAILS and STAMP for ALLOW, OLDEST
/// for PEEK when asked.
fn canonical(op: &str, step: &Json, key: &str, window: &Json, limit: &Json, now: Option<&Json>) -> Vec<String> {
    let mut cmd = vec![
        if op == "peek" { "XCLOAK.PEEK" } else { "XCLOAK.ALLOW" }.to_string(),
        key.to_string(),
    ];
    cmd.push(window.to_string());
    cmd.push(limit.to_string());
    for tier in step["tiers"].as_array().into_iter().flatten() {
        cmd.extend(["TIER".to_string(), tier[0].to_string(), tier[1].to_string()]);
    }
    if let Some(cost) = step.get("cost").filter(|c| c.as_i64() != Some(1)) {
        cmd.extend(["COST".to_string(), cost.to_string()]);
    }
    if let Some(now) = now {
        cmd.extend(["NOW".to_string(), now.to_string()]);
    }
    if op != "peek" {
        cmd.push("DETAILS".into());
        if step["stamp"].as_bool() == Some(true) {
            cmd.push("STAMP".into());
        }
    } else if step["oldest"] == true {
        cmd.push("OLDEST".into());
    }
    cmd
}

/// Every (command, recorded reply) of a step, in the order a client sends them.
fn exchanges(step: &Json) -> Vec<(Vec<String>, Json)> {
    let op = step["op"].as_str().unwrap();
    match op {
        "acquire" | "allow_all" => step["calls"]
            .as_array()
            .unwrap()
            .iter()
            .map(|call| (strings(&call["command"]), call["reply"].clone()))
            .collect(),
        _ => vec![(strings(&step["command"]), step["reply"].clone())],
    }
}

/// Checks that each step's commands are the canonical commands of its inputs.
fn check_canonical(case: &str, step: &Json) {
    let op = step["op"].as_str().unwrap();
    let key = |s: &Json| s["key"].as_str().unwrap().to_string();
    match op {
        "allow" | "peek" => {
            let expected = canonical(op, step, &key(step), &step["window"], &step["limit"], step.get("now"));
            assert_eq!(strings(&step["command"]), expected, "{case}: the command of {step}");
        }
        "acquire" => {
            for call in step["calls"].as_array().unwrap() {
                let expected = canonical(
                    "allow",
                    step,
                    &key(step),
                    &step["window"],
                    &step["limit"],
                    call.get("now"),
                );
                assert_eq!(strings(&call["command"]), expected, "{case}: an acquire call of {step}");
            }
        }
        "allow_all" => {
            let requests = step["requests"].as_array().unwrap();
            let calls = step["calls"].as_array().unwrap();
            let sent = step["decisions"].as_array().unwrap().len();
            for (request, call) in requests.iter().zip(&calls[..sent]) {
                let mut with_stamp = request.clone();
                with_stamp["stamp"] = json!(true);
                let expected = canonical(
                    "allow",
                    &with_stamp,
                    &key(request),
                    &request["window"],
                    &request["limit"],
                    step.get("now"),
                );
                assert_eq!(
                    strings(&call["command"]),
                    expected,
                    "{case}: an allow_all call of {step}"
                );
            }
            // Then one REFUND per earlier admission, in order, by its stamp and cost.
            for ((request, decision), call) in requests
                .iter()
                .zip(step["decisions"].as_array().unwrap())
                .zip(&calls[sent..])
            {
                let mut expected = vec!["XCLOAK.REFUND".to_string(), key(request), decision["stamp"].to_string()];
                if let Some(cost) = request.get("cost").filter(|c| c.as_i64() != Some(1)) {
                    expected.extend(["COST".to_string(), cost.to_string()]);
                }
                assert_eq!(strings(&call["command"]), expected, "{case}: a refund of {step}");
            }
            let refunds = step["rejected"].as_u64().unwrap_or(0) as usize;
            assert_eq!(
                calls.len(),
                sent + refunds,
                "{case}: allow_all sends one refund per earlier admission"
            );
        }
        _ => {}
    }
}

/// Replays every case on `server`; returns how many replies were compared.
fn replay(server: &Server, what: &str) -> usize {
    let mut conn = server.client();
    let target = if server.config.module {
        Target::Module
    } else {
        Target::scripts(&mut conn)
    };
    let vectors: Json = serde_json::from_str(VECTORS).expect("vectors.json parses");
    assert_eq!(vectors["schema"], 1);
    let mut compared = 0;
    for case in vectors["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let _: () = redis::cmd("FLUSHALL").query(&mut conn).unwrap();
        for (i, step) in case["steps"].as_array().unwrap().iter().enumerate() {
            check_canonical(name, step);
            for (command, expected) in exchanges(step) {
                let is_window_call = command[0].to_ascii_uppercase().starts_with("XCLOAK.");
                let got = match target.translate(&command).query::<Value>(&mut conn) {
                    Ok(value) => to_json(value),
                    Err(error) if error.code().is_some() => {
                        json!({"error": format!("{} {}", error.code().unwrap(), error.detail().unwrap_or(""))})
                    }
                    Err(error) => panic!("{what} {name} step {i}: {error}"),
                };
                // The vectors run on NOW time, and a key must not expire by the
                // wall clock mid-case (its TTL is about the window + 1 s of real time).
                if is_window_call {
                    let _: i64 = redis::cmd("PERSIST").arg(&command[1]).query(&mut conn).unwrap();
                }
                assert_eq!(got, expected, "{what}: case {name:?}, step {i}: {command:?}");
                compared += 1;
            }
        }
    }
    compared
}

#[test]
fn vectors_replay_on_the_module_with_sorted_sets() {
    let server = Server::start();
    let compared = replay(&server, "module (zset)");
    assert!(compared > 200, "only {compared} replies compared");
}

#[test]
fn vectors_replay_on_the_module_with_compact_keys() {
    let server = ServerConfig::compact().start();
    let mut conn = server.client();
    // The compact form is really in use: a window made here is an xcloaklog.
    let _: i64 = redis::cmd("XCLOAK.ALLOW")
        .arg("probe")
        .arg(60000)
        .arg(1)
        .query(&mut conn)
        .unwrap();
    assert_eq!(key_type(&mut conn, "probe"), "xcloaklog");
    let compared = replay(&server, "module (compact)");
    assert!(compared > 200, "only {compared} replies compared");
}

#[test]
fn vectors_replay_on_the_lua_scripts_without_the_module() {
    let server = ServerConfig::without_module().start();
    let compared = replay(&server, "Lua scripts");
    assert!(compared > 200, "only {compared} replies compared");
}

/// The vectors cover what docs/clients.md says they cover.
#[test]
fn vectors_cover_the_contract() {
    let vectors: Json = serde_json::from_str(VECTORS).unwrap();
    let steps: Vec<&Json> = vectors["cases"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|c| c["steps"].as_array().unwrap())
        .collect();
    let count = |pred: &dyn Fn(&Json) -> bool| steps.iter().filter(|s| pred(s)).count();
    for op in [
        "allow",
        "peek",
        "refund",
        "reset",
        "acquire",
        "allow_all",
        "raw",
        "setup",
    ] {
        assert!(count(&|s| s["op"] == op) > 0, "no {op} step");
    }
    for outcome in ["admitted", "deadline", "never"] {
        assert!(count(&|s| s["outcome"] == outcome) > 0, "no acquire ending {outcome}");
    }
    assert!(
        count(&|s| s["op"] == "acquire" && s["calls"].as_array().unwrap().iter().any(|c| c["sleep_ms"].is_number()))
            > 0
    );
    assert!(
        count(&|s| s["op"] == "allow_all" && s["rejected"].as_u64().is_some_and(|r| r > 0)) > 0,
        "no rejection in the middle"
    );
    for tiers in 1..=3 {
        assert!(
            count(&|s| s["tiers"].as_array().is_some_and(|t| t.len() == tiers)) > 0,
            "no call with {} tiers",
            tiers + 1
        );
    }
    assert!(count(&|s| s["decision"]["cost_exceeds_limit"] == true) > 0);
    assert!(
        count(&|s| s["decision"]["tier"].as_u64().is_some_and(|t| t > 0)) > 0,
        "no later tier binding"
    );
    assert!(count(&|s| s["decision"]["stamp"].is_number()) > 0);
    // PEEK ... OLDEST: a window's start, and -1 (null) for an empty one.
    assert!(count(&|s| s["op"] == "peek" && s["oldest"] == true && s["oldest_ms"].is_number()) > 0);
    assert!(
        count(&|s| s["op"] == "peek" && s["oldest"] == true && s["oldest_ms"].is_null() && s["decision"].is_object())
            > 0
    );
    assert!(count(&|s| s["op"] == "refund" && s["removed"] == 0) > 0);
    assert!(count(&|s| s["op"] == "refund" && s["removed"].as_i64().is_some_and(|n| n > 1)) > 0);
    assert!(count(&|s| s["window"] == 9_007_199_254_740_991i64) > 0);
    for argument in [
        "window",
        "limit",
        "COST",
        "NOW",
        "window of TIER",
        "limit of TIER",
        "stamp",
        "WRONGTYPE",
        "more than 15 times",
    ] {
        assert!(
            count(&|s| s["error"].as_str().is_some_and(|e| e.contains(argument))) > 0,
            "no error about {argument}"
        );
    }
}

/// Every copy of a bundled script that a client package carries (tracked by
/// git under clients/) is byte-identical to its one source in src/lua/, and
/// every package that carries copies carries all of them
/// (`scripts/sync-lua.sh --check`; `scripts/sync-lua.sh` refreshes them).
#[test]
fn lua_copies_in_the_client_packages_are_byte_identical() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let sources: Vec<(String, String)> = std::fs::read_dir(root.join("src/lua"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "lua"))
        .map(|path| {
            (
                path.file_name().unwrap().to_string_lossy().into_owned(),
                std::fs::read_to_string(&path).unwrap(),
            )
        })
        .collect();
    assert_eq!(sources.len(), 3, "src/lua holds the allow, peek and refund scripts");
    let tracked = std::process::Command::new("git")
        .args(["ls-files", "clients"])
        .current_dir(root)
        .output();
    let tracked = match tracked {
        Ok(out) if out.status.success() => String::from_utf8(out.stdout).unwrap(),
        _ => {
            println!("not a git checkout: only scripts/sync-lua.sh --check runs");
            String::new()
        }
    };
    let mut copies = 0;
    for path in tracked.lines() {
        let name = path.rsplit('/').next().unwrap();
        if let Some((_, source)) = sources.iter().find(|(source_name, _)| source_name == name) {
            let copy = std::fs::read_to_string(root.join(path)).unwrap();
            assert!(
                copy == *source,
                "{path} differs from src/lua/{name}: run scripts/sync-lua.sh"
            );
            copies += 1;
        }
    }
    println!("{copies} tracked copies of the scripts match src/lua/");
    let check = std::process::Command::new("bash")
        .arg("scripts/sync-lua.sh")
        .arg("--check")
        .current_dir(root)
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "scripts/sync-lua.sh --check:\n{}",
        String::from_utf8_lossy(&check.stderr)
    );
}
