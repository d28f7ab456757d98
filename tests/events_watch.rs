//! WATCH on a window, on both storage forms: a transaction watching a
//! window is aborted by every call that changes what the key stores, and by
//! nothing else (docs/commands.md, "WATCH and client-side caching").
//!
//! | call by another client | EXEC of the watcher |
//! |---|---|
//! | an admission | aborted |
//! | a rejection that trimmed expired entries (the stored log changed) | aborted |
//! | a rejection that changed nothing | runs |
//! | a PEEK | runs |
//! | a refund that removed entries / that found nothing | aborted / runs |
//! | a CONVERT that rewrote the key / a CONVERT to its own form | aborted / runs |
//! | a rejection on a missing key (nothing created) | runs |
//!
//! A rejection that changed nothing used to abort the watcher: the server
//! signals every key a module closed after opening it for writing, and ALLOW
//! opens its key for writing before it decides. The module now tells the
//! server itself which calls modified the key
//! (`REDISMODULE_OPTION_NO_IMPLICIT_SIGNAL_MODIFIED`).
use crate::common;
use common::*;

use redis::{Connection, Value};

const T: i64 = 1_700_000_000_000;

fn run(conn: &mut Connection, words: &[String]) -> Value {
    let mut cmd = redis::cmd(&words[0]);
    for word in &words[1..] {
        cmd.arg(word.as_str());
    }
    cmd.query(conn).unwrap_or_else(|e| panic!("{words:?}: {e}"))
}

fn words(text: &str) -> Vec<String> {
    text.split_whitespace()
        .map(|w| {
            w.replace("{T}", &T.to_string())
                .replace("{T+5000}", &(T + 5000).to_string())
        })
        .collect()
}

/// WATCH `key`, let `other` run `call`, then MULTI/PING/EXEC: whether the
/// transaction ran.
fn exec_after(watcher: &mut Connection, other: &mut Connection, key: &str, call: &[String]) -> bool {
    let _: () = redis::cmd("WATCH").arg(key).query(watcher).unwrap();
    run(other, call);
    let _: () = redis::cmd("MULTI").query(watcher).unwrap();
    let _: String = redis::cmd("PING").query(watcher).unwrap();
    let reply: Value = redis::cmd("EXEC").query(watcher).unwrap();
    match reply {
        Value::Nil => false,
        Value::Array(items) if items.len() == 1 => true,
        other => panic!("EXEC replied {other:?}"),
    }
}

/// (setup, call, whether the watcher's EXEC runs).
fn cases(compact_server: bool) -> Vec<(&'static str, &'static str, bool)> {
    let mut cases = vec![
        ("", "XCLOAK.ALLOW w 60000 2 NOW {T}", false),
        ("XCLOAK.ALLOW w 60000 1 NOW {T}", "XCLOAK.ALLOW w 60000 1 NOW {T}", true),
        (
            "XCLOAK.ALLOW w 60000 1 NOW {T}",
            "XCLOAK.ALLOW w 60000 1 NOW {T} DETAILS STAMP",
            true,
        ),
        (
            "XCLOAK.ALLOW w 60000 1 NOW {T}",
            "XCLOAK.ALLOW w 60000 1 TIER 120000 1 NOW {T} COST 2",
            true,
        ),
        (
            "XCLOAK.ALLOW w 1000 2 NOW {T}",
            "XCLOAK.ALLOW w 1000 0 NOW {T+5000}",
            false,
        ),
        (
            "XCLOAK.ALLOW w 1000 2 NOW {T} COST 2",
            "XCLOAK.ALLOW w 9000 2 NOW {T+5000}",
            true,
        ),
        ("XCLOAK.ALLOW w 60000 1 NOW {T}", "XCLOAK.PEEK w 60000 1 NOW {T}", true),
        ("XCLOAK.ALLOW w 60000 5 NOW {T} COST 2", "XCLOAK.REFUND w {T}", false),
        ("XCLOAK.ALLOW w 60000 5 NOW {T}", "XCLOAK.REFUND w 12345", true),
        ("", "XCLOAK.ALLOW w 60000 0", true),
        ("", "XCLOAK.REFUND w {T}", true),
        (
            "XCLOAK.ALLOW w 60000 5 NOW {T}",
            "XCLOAK.CONVERT w ZSET",
            !compact_server,
        ),
    ];
    if compact_server {
        cases.push(("XCLOAK.ALLOW w 60000 5 NOW {T}", "XCLOAK.CONVERT w COMPACT", true));
        cases.push((
            "XCLOAK.ALLOW w 60000 5 NOW {T} XCLOAK.CONVERT w ZSET",
            "XCLOAK.CONVERT w COMPACT",
            false,
        ));
    }
    cases
}

fn check_form(server: Server, compact_server: bool) {
    let mut watcher = server.client();
    let mut other = server.client();
    for (setup, call, runs) in cases(compact_server) {
        let _: () = redis::cmd("DEL").arg("w").query(&mut other).unwrap();
        // The setup may hold two commands, each starting with XCLOAK.
        for command in setup.split(" XCLOAK.").filter(|c| !c.is_empty()) {
            let command = if command.starts_with("XCLOAK.") {
                command.to_string()
            } else {
                format!("XCLOAK.{command}")
            };
            run(&mut other, &words(&command));
        }
        let ran = exec_after(&mut watcher, &mut other, "w", &words(call));
        assert_eq!(
            ran,
            runs,
            "after `{setup}`, `{call}` {} the watcher's transaction",
            if runs { "must not abort" } else { "must abort" }
        );
    }
}

#[test]
fn watch_is_invalidated_by_changes_to_a_sorted_set_window_only() {
    check_form(Server::start(), false);
}

#[test]
fn watch_is_invalidated_by_changes_to_a_compact_window_only() {
    check_form(ServerConfig::compact().start(), true);
}
