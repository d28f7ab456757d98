//! XCLOAK.ALLOW inside MULTI/EXEC, EVAL and FCALL, on both storage forms:
//! allowed, with its effects (docs/commands.md, "Transactions and scripts").
//!
//! - Inside MULTI/EXEC each call decides on the window as the calls before it
//!   in the transaction left it, and the replies are those of the same calls
//!   sent one by one; nothing runs between them.
//! - From EVAL and FCALL (`redis.call`) the replies are the same Lua values
//!   (an integer, or a table of integers); a bad argument raises the module's
//!   own error, which `redis.pcall` returns as a value.
//! - A script that fails after an admission keeps the admission (scripts
//!   have no rollback); the replica gets the same (tests/replication_stream.rs
//!   pins the stream).
//! - Where a script may not write, the server refuses ALLOW before the module
//!   runs, and PEEK answers: EVAL_RO / FCALL_RO, and a script declared
//!   `#!lua flags=no-writes` (7.0+).
use crate::common;
use common::resp::{Raw, Resp};
use common::*;

use redis::{Connection, Value};

const T: i64 = 1_700_000_000_000;

fn ints(value: &Value) -> Vec<i64> {
    match value {
        Value::Int(i) => vec![*i],
        Value::Array(items) => items.iter().flat_map(ints).collect(),
        other => panic!("not integers: {other:?}"),
    }
}

/// The calls of every case: (name, command words).
fn calls(key: &str) -> Vec<Vec<String>> {
    let t = T.to_string();
    let t1 = (T + 1).to_string();
    let late = (T + 70_000).to_string();
    [
        vec!["XCLOAK.ALLOW", key, "60000", "3", "NOW", &t],
        vec!["XCLOAK.ALLOW", key, "60000", "3", "NOW", &t, "COST", "2", "DETAILS"],
        vec!["XCLOAK.ALLOW", key, "60000", "3", "NOW", &t1, "DETAILS"],
        vec!["XCLOAK.PEEK", key, "60000", "3", "NOW", &t1],
        vec!["XCLOAK.REFUND", key, &t, "COST", "1"],
        vec![
            "XCLOAK.ALLOW",
            key,
            "60000",
            "3",
            "TIER",
            "1000",
            "3",
            "NOW",
            &t1,
            "STAMP",
        ],
        vec!["XCLOAK.ALLOW", key, "60000", "3", "NOW", &late, "DETAILS", "STAMP"],
    ]
    .into_iter()
    .map(|c| c.into_iter().map(String::from).collect())
    .collect()
}

fn command(words: &[String]) -> redis::Cmd {
    let mut cmd = redis::cmd(&words[0]);
    for word in &words[1..] {
        cmd.arg(word.as_str());
    }
    cmd
}

/// The replies of the calls sent one by one, and what they left stored.
fn one_by_one(conn: &mut Connection, key: &str) -> (Vec<Vec<i64>>, Vec<i64>) {
    let replies = calls(key)
        .iter()
        .map(|c| ints(&command(c).query::<Value>(conn).unwrap()))
        .collect();
    (replies, stored_stamps(conn, key))
}

fn in_multi(conn: &mut Connection, key: &str) -> (Vec<Vec<i64>>, Vec<i64>) {
    let mut pipe = redis::pipe();
    pipe.atomic();
    for c in calls(key) {
        pipe.add_command(command(&c));
    }
    let replies: Vec<Value> = pipe.query(conn).unwrap();
    (replies.iter().map(ints).collect(), stored_stamps(conn, key))
}

/// A Lua body running every call with `redis.call` and returning their replies.
fn lua_body(key_ref: &str) -> String {
    let mut body = String::from("local out = {}\n");
    for (i, c) in calls("KEY").iter().enumerate() {
        let args: Vec<String> = c
            .iter()
            .map(|w| {
                if w == "KEY" {
                    key_ref.to_string()
                } else {
                    format!("'{w}'")
                }
            })
            .collect();
        body += &format!("out[{}] = redis.call({})\n", i + 1, args.join(", "));
    }
    body + "return out\n"
}

fn in_eval(conn: &mut Connection, key: &str) -> (Vec<Vec<i64>>, Vec<i64>) {
    let replies: Vec<Value> = redis::cmd("EVAL")
        .arg(lua_body("KEYS[1]"))
        .arg(1)
        .arg(key)
        .query(conn)
        .unwrap();
    (replies.iter().map(ints).collect(), stored_stamps(conn, key))
}

fn in_fcall(conn: &mut Connection, key: &str) -> (Vec<Vec<i64>>, Vec<i64>) {
    let replies: Vec<Value> = redis::cmd("FCALL")
        .arg("every_call")
        .arg(1)
        .arg(key)
        .query(conn)
        .unwrap();
    (replies.iter().map(ints).collect(), stored_stamps(conn, key))
}

fn error_text(result: redis::RedisResult<Value>) -> String {
    match result {
        Err(e) => format!("{} {}", e.code().unwrap_or(""), e.detail().unwrap_or("")),
        Ok(v) => panic!("expected an error, got {v:?}"),
    }
}

fn check_form(server: Server) {
    let mut conn = server.client();
    let reference = one_by_one(&mut conn, "plain");
    // Admitted, admitted (cost 2: full), rejected, peek, refund, admitted
    // into the refunded slot (and the tier), then all expired and admitted.
    assert_eq!(
        reference.0.iter().map(|r| r[0]).collect::<Vec<_>>(),
        [1, 1, 0, 0, 1, T + 1, 1]
    );
    assert_eq!(reference.1, [T + 70_000], "the last call trimmed the others");

    assert_eq!(in_multi(&mut conn, "multi"), reference, "MULTI/EXEC");
    assert_eq!(in_eval(&mut conn, "eval"), reference, "EVAL");
    if at_least_7_0() {
        let library = format!(
            "#!lua name=xcloakcalls\nredis.register_function('every_call', function(KEYS, ARGV)\n{}end)",
            lua_body("KEYS[1]")
        );
        let _: String = redis::cmd("FUNCTION")
            .arg("LOAD")
            .arg(&library)
            .query(&mut conn)
            .unwrap();
        assert_eq!(in_fcall(&mut conn, "fcall"), reference, "FCALL");
    } else {
        eprintln!("skipped: FCALL needs Redis 7.0+ (this server has no FUNCTION)");
    }

    // A bad argument: redis.call raises the module's error, redis.pcall returns it.
    let raised = error_text(
        redis::cmd("EVAL")
            .arg("return redis.call('XCLOAK.ALLOW', KEYS[1], 0, 3)")
            .arg(1)
            .arg("bad")
            .query(&mut conn),
    );
    assert!(
        raised.contains("window must be an integer from 1 to 9007199254740991"),
        "{raised}"
    );
    let returned: Value = redis::cmd("EVAL")
        .arg("local r = redis.pcall('XCLOAK.ALLOW', KEYS[1], 1000, 3, 'COST', 0); return {type(r), r['err']}")
        .arg(1)
        .arg("bad")
        .query(&mut conn)
        .unwrap();
    let text = format!("{returned:?}");
    assert!(
        text.contains("table") && text.contains("COST must be an integer from 1 to 1000000"),
        "{text}"
    );
    assert_eq!(key_type(&mut conn, "bad"), "none", "a refused call wrote nothing");

    // A script failing after an admission keeps the admission (no rollback).
    let failed = error_text(
        redis::cmd("EVAL")
            .arg("redis.call('XCLOAK.ALLOW', KEYS[1], 60000, 3, 'NOW', ARGV[1]); error('after the admission')")
            .arg(1)
            .arg("kept")
            .arg(T)
            .query(&mut conn),
    );
    assert!(failed.contains("after the admission"), "{failed}");
    assert_eq!(stored_stamps(&mut conn, "kept"), [T]);

    // Inside MULTI, a call with a bad argument fails alone; the others apply.
    // (Raw RESP: the client library turns an error inside EXEC's reply into
    // an error for the whole reply.)
    let mut raw = Raw::connect(server.port);
    assert_eq!(raw.call(&["MULTI"]), Resp::Simple("OK".into()));
    for limit in ["3", "-1", "3"] {
        assert_eq!(
            raw.call(&["XCLOAK.ALLOW", "tx", "60000", limit]),
            Resp::Simple("QUEUED".into())
        );
    }
    let exec = raw.call(&["EXEC"]);
    let replies = exec.items();
    assert_eq!((&replies[0], &replies[2]), (&Resp::Int(1), &Resp::Int(1)), "{exec:?}");
    assert_eq!(
        replies[1],
        Resp::Error("ERR limit must be an integer from 0 to 1000000".into()),
        "{exec:?}"
    );
    assert_eq!(stored_stamps(&mut conn, "tx").len(), 2);

    // Where a script may not write, ALLOW is refused by the server and PEEK answers.
    if at_least_7_0() {
        let before = digest(&mut conn);
        for (how, result) in [
            (
                "EVAL_RO",
                redis::cmd("EVAL_RO")
                    .arg("return redis.call('XCLOAK.ALLOW', KEYS[1], 60000, 3)")
                    .arg(1)
                    .arg("ro")
                    .query::<Value>(&mut conn),
            ),
            (
                "no-writes",
                redis::cmd("EVAL")
                    .arg("#!lua flags=no-writes\nreturn redis.call('XCLOAK.ALLOW', KEYS[1], 60000, 3)")
                    .arg(1)
                    .arg("ro")
                    .query::<Value>(&mut conn),
            ),
        ] {
            let text = error_text(result);
            assert!(
                text.to_ascii_lowercase().contains("write commands are not allowed"),
                "{how}: {text}"
            );
        }
        let library = "#!lua name=xcloakro\nredis.register_function{function_name='peek_ro', callback=function(KEYS, ARGV) return redis.call('XCLOAK.PEEK', KEYS[1], 60000, 3, 'NOW', ARGV[1]) end, flags={'no-writes'}}\n\
                       redis.register_function{function_name='allow_ro', callback=function(KEYS, ARGV) return redis.call('XCLOAK.ALLOW', KEYS[1], 60000, 3) end, flags={'no-writes'}}";
        let _: String = redis::cmd("FUNCTION")
            .arg("LOAD")
            .arg(library)
            .query(&mut conn)
            .unwrap();
        let text = error_text(redis::cmd("FCALL_RO").arg("allow_ro").arg(1).arg("ro").query(&mut conn));
        assert!(
            text.to_ascii_lowercase().contains("write commands are not allowed"),
            "FCALL_RO: {text}"
        );
        let peek: Value = redis::cmd("FCALL_RO")
            .arg("peek_ro")
            .arg(1)
            .arg("kept")
            .arg(T)
            .query(&mut conn)
            .unwrap();
        assert_eq!(ints(&peek), [1, 3, 2, 0, 60_000], "PEEK from a read-only function");
        let peek: Value = redis::cmd("EVAL_RO")
            .arg("return redis.call('XCLOAK.PEEK', KEYS[1], 60000, 3, 'NOW', ARGV[1])")
            .arg(1)
            .arg("kept")
            .arg(T)
            .query(&mut conn)
            .unwrap();
        assert_eq!(ints(&peek), [1, 3, 2, 0, 60_000], "PEEK from EVAL_RO");
        let _: () = redis::cmd("FUNCTION")
            .arg("DELETE")
            .arg("xcloakro")
            .query(&mut conn)
            .unwrap();
        let _: () = redis::cmd("FUNCTION")
            .arg("DELETE")
            .arg("xcloakcalls")
            .query(&mut conn)
            .unwrap();
        assert_eq!(digest(&mut conn), before, "nothing written by the refused calls");
    } else {
        eprintln!("skipped: EVAL_RO, FCALL_RO and script flags need Redis 7.0+");
    }
}

#[test]
fn calls_in_transactions_and_scripts_on_sorted_set_windows() {
    check_form(Server::start());
}

#[test]
fn calls_in_transactions_and_scripts_on_compact_windows() {
    check_form(ServerConfig::compact().start());
}
