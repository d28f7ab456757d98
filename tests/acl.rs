//! Access control: key patterns and per-command rules apply to XCLOAK.* exactly
//! as to built-in commands (key position 1; ALLOW writes, PEEK reads).
use crate::common;
use common::*;

use redis::{Connection, Value};

fn login(server: &Server, user: &str) -> Connection {
    let mut conn = server.client();
    let _: () = redis::cmd("AUTH").arg(user).arg("pw").query(&mut conn).unwrap();
    conn
}

fn setuser(admin: &mut Connection, rules: &[&str]) -> redis::RedisResult<()> {
    let mut cmd = redis::cmd("ACL");
    cmd.arg("SETUSER");
    for rule in rules {
        cmd.arg(*rule);
    }
    cmd.query(admin)
}

/// The error code of a call that must be refused.
fn refused(conn: &mut Connection, cmd: &redis::Cmd) -> String {
    match cmd.query::<Value>(conn) {
        Ok(value) => panic!("call was not refused: {value:?}"),
        Err(e) => format!("{} {}", e.code().unwrap_or("?"), e.detail().unwrap_or("")),
    }
}

fn allow(key: &str) -> redis::Cmd {
    let mut cmd = redis::cmd("XCLOAK.ALLOW");
    cmd.arg(key).arg(60_000).arg(5);
    cmd
}

fn peek(key: &str) -> redis::Cmd {
    let mut cmd = redis::cmd("XCLOAK.PEEK");
    cmd.arg(key).arg(60_000).arg(5);
    cmd
}

#[test]
fn a_key_pattern_confines_allow_to_its_keys() {
    let server = Server::start();
    let mut admin = server.client();
    setuser(
        &mut admin,
        &["limiter", "on", ">pw", "~rl:*", "+xcloak.allow", "+xcloak.peek"],
    )
    .unwrap();
    let _: () = redis::cmd("SET").arg("other").arg("v").query(&mut admin).unwrap();
    assert_eq!(allow_at(&mut admin, "secret", 60_000, 5, 1_700_000_000_000), 1);
    let before_other = digest(&mut admin);

    let mut limiter = login(&server, "limiter");
    let admitted: Vec<i64> = (0..6)
        .map(|_| allow("rl:client-1").query(&mut limiter).unwrap())
        .collect();
    assert_eq!(admitted, [1, 1, 1, 1, 1, 0]);
    let seen: Vec<i64> = peek("rl:client-1").query(&mut limiter).unwrap();
    assert_eq!(&seen[..3], &[0, 5, 0]);
    let after_own = digest(&mut admin);
    assert_ne!(after_own, before_other, "the limiter wrote its own key");

    for key in ["secret", "other", "rl", "RL:client-1", "x:rl:1"] {
        for cmd in [allow(key), peek(key)] {
            let text = refused(&mut limiter, &cmd);
            assert!(text.starts_with("NOPERM"), "{key}: {text}");
        }
    }
    // Options do not open a way around the key check.
    let mut with_options = allow("secret");
    with_options.arg("COST").arg(1).arg("NOW").arg(1).arg("DETAILS");
    assert!(refused(&mut limiter, &with_options).starts_with("NOPERM"));
    assert_eq!(digest(&mut admin), after_own, "refused calls wrote nothing");
    assert_eq!(entries(&mut admin, "secret").len(), 1);
}

#[test]
fn a_read_only_user_can_peek_but_not_allow() {
    let server = Server::start();
    let mut admin = server.client();
    setuser(
        &mut admin,
        &["reader", "on", ">pw", "~*", "+xcloak.peek", "-xcloak.allow"],
    )
    .unwrap();
    for t in 0..3 {
        assert_eq!(allow_at(&mut admin, "rl:a", 60_000, 5, 1_700_000_000_000 + t), 1);
    }
    let before = digest(&mut admin);

    let mut reader = login(&server, "reader");
    let seen: Vec<i64> = peek("rl:a")
        .arg("NOW")
        .arg(1_700_000_000_010i64)
        .query(&mut reader)
        .unwrap();
    assert_eq!(seen, [1, 5, 2, 0, 60_000 - 8]);
    let text = refused(&mut reader, &allow("rl:a"));
    assert!(text.starts_with("NOPERM") && text.contains("xcloak.allow"), "{text}");
    let text = refused(&mut reader, allow("rl:new").arg("DETAILS"));
    assert!(text.starts_with("NOPERM"), "{text}");
    assert_eq!(digest(&mut admin), before, "the reader changed nothing");
}

/// Read-only key patterns (`%R~`, Redis 7.0+ and Valkey): PEEK's key is
/// read-only, ALLOW's is read-write, so a `%R~` user may PEEK but not ALLOW
/// even with both commands allowed. Redis 6.2 has no `%R~` and refuses the rule.
#[test]
fn read_only_key_patterns_allow_peek_only() {
    let server = Server::start();
    let mut admin = server.client();
    let rule = setuser(
        &mut admin,
        &["ro", "on", ">pw", "%R~rl:*", "+xcloak.allow", "+xcloak.peek"],
    );
    if !at_least_7_0() {
        let err = rule.expect_err("Redis 6.2 has no %R~ key permissions");
        assert!(
            err.to_string().contains("Syntax error") || err.to_string().contains("Error in ACL SETUSER"),
            "{err}"
        );
        return;
    }
    rule.unwrap();
    assert_eq!(allow_at(&mut admin, "rl:a", 60_000, 5, 1_700_000_000_000), 1);
    let before = digest(&mut admin);
    let mut ro = login(&server, "ro");
    let seen: Vec<i64> = peek("rl:a")
        .arg("NOW")
        .arg(1_700_000_000_000i64)
        .query(&mut ro)
        .unwrap();
    assert_eq!(&seen[..3], &[1, 5, 4]);
    let text = refused(&mut ro, &allow("rl:a"));
    assert!(text.starts_with("NOPERM"), "{text}");
    assert_eq!(digest(&mut admin), before);
}

/// `+@read`: on Redis 7.2+ and Valkey the module's ACL categories put PEEK in
/// @read (ALLOW is @write); before 7.2 module commands have no category, so
/// `+@read` grants neither (the exact degradation).
#[test]
fn the_read_category_grants_peek_where_categories_exist() {
    let server = Server::start();
    let mut admin = server.client();
    setuser(&mut admin, &["r", "on", ">pw", "~*", "+@read"]).unwrap();
    let before = digest(&mut admin);
    let mut reader = login(&server, "r");
    let peeked = peek("rl:a").query::<Vec<i64>>(&mut reader);
    if at_least_7_2() {
        assert_eq!(&peeked.unwrap()[..3], &[1, 5, 5]);
    } else {
        let err = peeked.expect_err("no categories before 7.2");
        assert_eq!(err.code(), Some("NOPERM"), "{err}");
    }
    assert!(refused(&mut reader, &allow("rl:a")).starts_with("NOPERM"));
    assert_eq!(digest(&mut admin), before);
}

/// The fallback user documented in docs/commands.md (the line itself, read
/// from the file) runs every script on a server without the module: ALLOW
/// with tiers, DETAILS and STAMP (every command the allow script calls), PEEK
/// through EVALSHA_RO on 7.0+, REFUND, and EVAL after NOSCRIPT; and is still
/// held to its key pattern. A command missing from the line fails inside the
/// script with NOPERM.
#[test]
fn the_documented_fallback_user_runs_every_script() {
    let docs = include_str!("../docs/commands.md");
    let line = docs
        .lines()
        .find(|l| l.starts_with("ACL SETUSER api on >secret ~rl:*") && l.contains("+evalsha "))
        .expect("the fallback user's line in docs/commands.md");
    let server = ServerConfig::without_module().start();
    let mut admin = server.client();
    let mut rules: Vec<&str> = line.split_whitespace().skip(2).collect();
    if !at_least_7_0() {
        rules.retain(|r| *r != "+evalsha_ro" && *r != "+eval_ro");
    }
    rules[2] = ">pw";
    setuser(&mut admin, &rules).unwrap_or_else(|e| panic!("{line}: {e}"));
    let script = |name: &str| -> String {
        std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("src/lua")
                .join(name),
        )
        .unwrap()
    };
    let (allow_lua, peek_lua, refund_lua) = (
        script("xcloak_allow.lua"),
        script("xcloak_peek.lua"),
        script("xcloak_refund.lua"),
    );
    let mut conn = login(&server, "api");
    let sha = |conn: &mut Connection, text: &str| -> String {
        redis::cmd("SCRIPT").arg("LOAD").arg(text).query(conn).unwrap()
    };
    let allow_sha = sha(&mut conn, &allow_lua);
    let evalsha = |conn: &mut Connection, eval: &str, sha: &str, args: &[&str]| -> Value {
        redis::cmd(eval)
            .arg(sha)
            .arg(1)
            .arg(args)
            .query(conn)
            .unwrap_or_else(|e| panic!("{eval} {args:?}: {e}"))
    };
    // Two admissions in one millisecond (the second reads the slot of the first),
    // then a rejection with its details (the retry's ZRANGEBYSCORE, per-tier ZCOUNT).
    for _ in 0..2 {
        evalsha(
            &mut conn,
            "EVALSHA",
            &allow_sha,
            &[
                "rl:a",
                "60000",
                "2",
                "TIER",
                "1000",
                "5",
                "NOW",
                "1700000000000",
                "DETAILS",
                "STAMP",
            ],
        );
    }
    let rejected = evalsha(
        &mut conn,
        "EVALSHA",
        &allow_sha,
        &[
            "rl:a",
            "60000",
            "2",
            "TIER",
            "1000",
            "5",
            "NOW",
            "1700000000001",
            "DETAILS",
        ],
    );
    assert!(
        matches!(&rejected, Value::Array(items) if items.first() == Some(&Value::Int(0))),
        "{rejected:?}"
    );
    let peek_sha = sha(&mut conn, &peek_lua);
    let ro = if at_least_7_0() { "EVALSHA_RO" } else { "EVALSHA" };
    evalsha(
        &mut conn,
        ro,
        &peek_sha,
        &[
            "rl:a",
            "60000",
            "3",
            "TIER",
            "1000",
            "5",
            "COST",
            "2",
            "NOW",
            "1700000000002",
            "OLDEST",
        ],
    );
    let refund_sha = sha(&mut conn, &refund_lua);
    assert_eq!(
        evalsha(
            &mut conn,
            "EVALSHA",
            &refund_sha,
            &["rl:a", "1700000000000", "COST", "2"]
        ),
        Value::Int(2)
    );
    // EVAL of the text, as clients send it after NOSCRIPT.
    let again: Value = redis::cmd("EVAL")
        .arg(&allow_lua)
        .arg(1)
        .arg("rl:a")
        .arg(60000)
        .arg(2)
        .query(&mut conn)
        .unwrap();
    assert_eq!(again, Value::Int(1));
    // The key pattern still holds inside the scripts.
    let outside = refused(
        &mut conn,
        redis::cmd("EVALSHA")
            .arg(&allow_sha)
            .arg(1)
            .arg("other:a")
            .arg(60000)
            .arg(2),
    );
    assert!(
        outside.contains("NOPERM") || outside.contains("No permissions"),
        "{outside}"
    );
}
