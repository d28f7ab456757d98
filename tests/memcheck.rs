//! The workload of `make test-valgrind`: every kind of call and every way a
//! window is saved, loaded, copied, moved and freed, on both storage forms.
//! Under `XCLOAK_VALGRIND` each server runs under valgrind's memcheck
//! (tests/common/valgrind.rs) and the test fails on any memory error and on
//! any block definitely lost through libxcloak; the counts shrink there
//! (`valgrind::scaled`), never the kinds of calls. Plain (`make test`), it
//! checks that each stage keeps every window (DEBUG DIGEST).
//!
//! The kinds: admissions, rejections and trims (server clock and NOW, COST,
//! TIER, DETAILS, STAMP), PEEK, REFUND, CONVERT both ways, every argument
//! error, WRONGTYPE, the refused XCLOAK.APPLY, COMMAND DOCS, INFO, module
//! configs (7.0+); SAVE, BGSAVE (the fork child runs `rdb_save`), DEBUG
//! RELOAD, a restart loading the RDB; AOF rewrites without and with the RDB
//! preamble (the child runs `aof_rewrite` / `rdb_save`), appended effects and
//! a restart replaying the AOF (`XCLOAK.APPLY` while loading); DUMP/RESTORE,
//! RESTORE REPLACE, COPY; a replica loading diskless (swapdb) and applying
//! the stream; SWAPDB, MOVE, RENAME; UNLINK of large windows and FLUSHALL /
//! FLUSHDB ASYNC (the lazyfree thread frees compact values through the
//! type's `free`); active defrag where the server has it; and a panic in a
//! handler (the fault-injection build), unwound and answered.
//! The hostile RESTORE corpus is tests/hostile_restore.rs, which
//! `make test-valgrind` runs under valgrind too.
use crate::common;
use common::*;

use std::time::Duration;

use redis::{Connection, Value};

const T: i64 = 1_700_000_000_000;

fn call(conn: &mut Connection, words: &[&str]) -> Value {
    let mut cmd = redis::cmd(words[0]);
    for word in &words[1..] {
        cmd.arg(*word);
    }
    cmd.query(conn).unwrap_or_else(|e| panic!("{words:?}: {e}"))
}

fn refused(conn: &mut Connection, words: &[&str], expected: &str) {
    let mut cmd = redis::cmd(words[0]);
    for word in &words[1..] {
        cmd.arg(*word);
    }
    let error = cmd.query::<Value>(conn).expect_err(&format!("{words:?} must fail"));
    assert!(format!("{error}").contains(expected), "{words:?}: {error}");
}

/// Windows last an hour in real time (their TTL follows the window), so no
/// key expires between a digest and the restart it is compared across; NOW
/// moves by 25 minutes a round, so entries leave and are trimmed.
const W: i64 = 3_600_000;

/// Admissions, rejections, trims, tiers, refunds and errors over `keys` windows.
fn calls(conn: &mut Connection, prefix: &str, keys: usize, rounds: usize) {
    let mut rng = Rng(0x5EED_7A16_0000 + keys as u64);
    for round in 0..rounds {
        let mut pipe = redis::pipe();
        for k in 0..keys {
            let key = format!("{prefix}:{k}");
            let now = T + (round as i64) * (W * 5 / 12) + rng.below(300) as i64;
            match rng.below(8) {
                0 => pipe.cmd("XCLOAK.ALLOW").arg(&key).arg(W).arg(3).arg("NOW").arg(now),
                1 => pipe
                    .cmd("XCLOAK.ALLOW")
                    .arg(&key)
                    .arg(W)
                    .arg(5)
                    .arg("TIER")
                    .arg(2 * W)
                    .arg(20)
                    .arg("COST")
                    .arg(2)
                    .arg("NOW")
                    .arg(now)
                    .arg("DETAILS"),
                2 => pipe
                    .cmd("XCLOAK.ALLOW")
                    .arg(&key)
                    .arg(W)
                    .arg(10)
                    .arg("STAMP")
                    .arg("DETAILS"),
                3 => pipe
                    .cmd("XCLOAK.PEEK")
                    .arg(&key)
                    .arg(W)
                    .arg(3)
                    .arg("TIER")
                    .arg(2 * W)
                    .arg(20)
                    .arg("NOW")
                    .arg(now),
                4 => pipe.cmd("XCLOAK.REFUND").arg(&key).arg(now - 300).arg("COST").arg(2),
                5 => pipe
                    .cmd("XCLOAK.ALLOW")
                    .arg(&key)
                    .arg(W)
                    .arg(0)
                    .arg("NOW")
                    .arg(now + 5 * W), // trims
                6 => pipe
                    .cmd("XCLOAK.ALLOW")
                    .arg(&key)
                    .arg(W)
                    .arg(1000)
                    .arg("COST")
                    .arg(1 + rng.below(40))
                    .arg("NOW")
                    .arg(now),
                _ => pipe.cmd("XCLOAK.PEEK").arg(&key).arg(W).arg(10).arg("COST").arg(3),
            };
        }
        let _: Vec<Value> = pipe.query(conn).unwrap();
    }
    // Every kind of refusal allocates its error text.
    let _: () = redis::cmd("SET")
        .arg(format!("{prefix}:string"))
        .arg("v")
        .query(conn)
        .unwrap();
    let string_key = format!("{prefix}:string");
    for (words, expected) in [
        (vec!["XCLOAK.ALLOW", "k", "0", "3"], "window must be"),
        (vec!["XCLOAK.ALLOW", "k", "1000", "-1"], "limit must be"),
        (vec!["XCLOAK.ALLOW", "k", "1000", "3", "COST", "0"], "COST must be"),
        (vec!["XCLOAK.ALLOW", "k", "1000", "3", "NOW", "x"], "NOW must be"),
        (vec!["XCLOAK.ALLOW", "k", "1000", "3", "TIER", "1"], "TIER needs"),
        (
            vec![
                "XCLOAK.ALLOW",
                "k",
                "1000",
                "3",
                "FAST\r\n\0xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
            ],
            "unknown option",
        ),
        (vec!["XCLOAK.PEEK", "k", "1000", "3", "DETAILS"], "unknown option"),
        (vec!["XCLOAK.REFUND", "k", "-5"], "stamp must be"),
        (vec!["XCLOAK.CONVERT", "k", "LIST"], "target must be"),
        (vec!["XCLOAK.ALLOW", &string_key, "1000", "3"], "WRONGTYPE"),
        (vec!["XCLOAK.REFUND", &string_key, "5"], "WRONGTYPE"),
        (vec!["XCLOAK.APPLY", "k", "A5*1"], "XCLOAK.APPLY is internal"),
    ] {
        refused(conn, &words, expected);
    }
}

fn reload(conn: &mut Connection, what: &str) {
    let before = digest(conn);
    assert_eq!(call(conn, &["DEBUG", "RELOAD"]), Value::Okay, "{what}");
    assert_eq!(digest(conn), before, "{what}: DEBUG RELOAD kept every window");
}

fn wait_persistence(conn: &mut Connection, field: &str) {
    let done = eventually(valgrind::patience(Duration::from_secs(30)), || {
        info_field(conn, "persistence", field).as_deref() == Some("0")
            && info_field(conn, "persistence", "aof_rewrite_scheduled")
                .as_deref()
                .unwrap_or("0")
                == "0"
    });
    assert!(done, "{field} still running");
}

/// One window of many runs (distinct stamps), and one of many entries at a stamp.
fn large_windows(conn: &mut Connection, prefix: &str, runs: usize) {
    let mut pipe = redis::pipe();
    for i in 0..runs {
        pipe.cmd("XCLOAK.ALLOW")
            .arg(format!("{prefix}:wide"))
            .arg(1i64 << 40)
            .arg(1_000_000)
            .arg("NOW")
            .arg(T + 3 * i as i64)
            .ignore();
    }
    pipe.cmd("XCLOAK.ALLOW")
        .arg(format!("{prefix}:deep"))
        .arg(1i64 << 40)
        .arg(1_000_000)
        .arg("COST")
        .arg(runs)
        .arg("NOW")
        .arg(T)
        .ignore();
    let () = pipe.query(conn).unwrap();
}

fn workload(config: ServerConfig, compact_server: bool) {
    let keys = valgrind::scaled(300, 60);
    let rounds = valgrind::scaled(20, 6);
    let runs = valgrind::scaled(20_000, 3_000);
    let mut server = config.clone().arg("repl-diskless-sync-delay", "0").start();
    let mut conn = server.client();
    calls(&mut conn, "rl", keys, rounds);
    large_windows(&mut conn, "big", runs);
    let _ = call(&mut conn, &["INFO", "xcloak"]);
    if at_least_7_0() {
        let _ = call(
            &mut conn,
            &[
                "COMMAND",
                "DOCS",
                "xcloak.allow",
                "xcloak.peek",
                "xcloak.refund",
                "xcloak.convert",
            ],
        );
        let _ = call(&mut conn, &["COMMAND", "INFO", "xcloak.allow"]);
        call(&mut conn, &["CONFIG", "SET", "xcloak.max-limit", "2000000"]);
        let _ = call(&mut conn, &["CONFIG", "GET", "xcloak.*"]);
        if compact_server {
            call(&mut conn, &["CONFIG", "SET", "xcloak.storage", "zset"]);
            calls(&mut conn, "other-form", keys / 4, 2);
            call(&mut conn, &["CONFIG", "SET", "xcloak.storage", "compact"]);
        }
    }

    // CONVERT both ways (a compact server holds both forms), large windows too.
    if compact_server {
        for k in 0..keys / 2 {
            let _ = call(&mut conn, &["XCLOAK.CONVERT", &format!("rl:{k}"), "ZSET"]);
        }
        for k in 0..keys / 4 {
            let _ = call(&mut conn, &["XCLOAK.CONVERT", &format!("rl:{k}"), "COMPACT"]);
        }
        let wide = call(
            &mut conn,
            &[
                "XCLOAK.PEEK",
                "big:wide",
                "1099511627776",
                "1000000",
                "NOW",
                &T.to_string(),
            ],
        );
        assert!(matches!(&wide, Value::Array(f) if f.len() == 5));
        assert_eq!(call(&mut conn, &["XCLOAK.CONVERT", "big:wide", "ZSET"]), Value::Int(1));
        assert_eq!(
            call(&mut conn, &["XCLOAK.CONVERT", "big:wide", "COMPACT"]),
            Value::Int(1)
        );
        assert_eq!(
            call(
                &mut conn,
                &[
                    "XCLOAK.PEEK",
                    "big:wide",
                    "1099511627776",
                    "1000000",
                    "NOW",
                    &T.to_string()
                ]
            ),
            wide
        );
    }

    // DUMP/RESTORE, RESTORE REPLACE, COPY.
    for k in 0..keys / 3 {
        let key = format!("rl:{k}");
        let dump: Option<Vec<u8>> = redis::cmd("DUMP").arg(&key).query(&mut conn).unwrap();
        let Some(dump) = dump else { continue };
        let _: () = redis::cmd("RESTORE")
            .arg(format!("restored:{k}"))
            .arg(0)
            .arg(&dump)
            .query(&mut conn)
            .unwrap();
        let _: () = redis::cmd("RESTORE")
            .arg(format!("restored:{k}"))
            .arg(0)
            .arg(&dump)
            .arg("REPLACE")
            .query(&mut conn)
            .unwrap();
        let _: i64 = redis::cmd("COPY")
            .arg(&key)
            .arg(format!("copied:{k}"))
            .query(&mut conn)
            .unwrap();
    }
    for key in ["big:wide", "big:deep"] {
        let _: i64 = redis::cmd("COPY")
            .arg(key)
            .arg(format!("{key}:copy"))
            .query(&mut conn)
            .unwrap();
        assert_eq!(
            call(&mut conn, &["DEBUG", "DIGEST-VALUE", key]),
            call(&mut conn, &["DEBUG", "DIGEST-VALUE", &format!("{key}:copy")])
        );
    }

    // A replica loading diskless, then applying the stream.
    let replica = config.clone().arg("repl-diskless-load", "swapdb").start();
    let mut on_replica = replica.client();
    call(&mut on_replica, &["REPLICAOF", "127.0.0.1", &server.port.to_string()]);
    wait_replicated(&server, &replica);
    calls(&mut conn, "rl", keys, 2);
    wait_replicated(&server, &replica);
    assert_eq!(
        digest(&mut on_replica),
        digest(&mut conn),
        "the replica holds every window"
    );
    drop(on_replica);
    drop(replica);

    // RDB: SAVE, BGSAVE (a fork child under valgrind too), DEBUG RELOAD, a restart.
    // (The replica's sync may still have its fork child: SAVE refuses then.)
    wait_persistence(&mut conn, "rdb_bgsave_in_progress");
    assert_eq!(call(&mut conn, &["SAVE"]), Value::Okay);
    let _ = call(&mut conn, &["BGSAVE"]);
    wait_persistence(&mut conn, "rdb_bgsave_in_progress");
    reload(&mut conn, "after BGSAVE");
    let before = digest(&mut conn);
    // SHUTDOWN NOSAVE: what the restart loads is the RDB just saved.
    assert_eq!(call(&mut conn, &["SAVE"]), Value::Okay);
    server.restart();
    conn = server.client();
    assert_eq!(digest(&mut conn), before, "a restart loaded every window from the RDB");

    // AOF: a rewrite without the RDB preamble (aof_rewrite), appended effects,
    // a rewrite with it (rdb_save), a restart replaying it (XCLOAK.APPLY).
    call(&mut conn, &["CONFIG", "SET", "aof-use-rdb-preamble", "no"]);
    call(&mut conn, &["CONFIG", "SET", "appendonly", "yes"]);
    wait_persistence(&mut conn, "aof_rewrite_in_progress");
    calls(&mut conn, "rl", keys, 2);
    let before = digest(&mut conn);
    server.config = server
        .config
        .clone()
        .arg("appendonly", "yes")
        .arg("aof-use-rdb-preamble", "no");
    server.restart();
    conn = server.client();
    assert_eq!(
        digest(&mut conn),
        before,
        "a restart replayed the rewritten AOF (XCLOAK.APPLY ... L) and its tail"
    );
    let _ = call(&mut conn, &["BGREWRITEAOF"]);
    wait_persistence(&mut conn, "aof_rewrite_in_progress");
    calls(&mut conn, "aof", keys / 2, 2);
    call(&mut conn, &["CONFIG", "SET", "aof-use-rdb-preamble", "yes"]);
    let _ = call(&mut conn, &["BGREWRITEAOF"]);
    wait_persistence(&mut conn, "aof_rewrite_in_progress");
    calls(&mut conn, "aof", keys / 2, 1);
    let before = digest(&mut conn);
    server.restart();
    conn = server.client();
    assert_eq!(
        digest(&mut conn),
        before,
        "a restart replayed the RDB-preamble AOF and its tail"
    );
    call(&mut conn, &["CONFIG", "SET", "appendonly", "no"]);

    // SWAPDB, MOVE, RENAME.
    call(&mut conn, &["SWAPDB", "0", "1"]);
    call(&mut conn, &["SELECT", "1"]);
    let _ = call(&mut conn, &["MOVE", "rl:1", "0"]);
    let _ = call(&mut conn, &["RENAME", "big:deep", "big:deep:renamed"]);
    call(&mut conn, &["SWAPDB", "0", "1"]);
    call(&mut conn, &["SELECT", "0"]);
    reload(&mut conn, "after SWAPDB, MOVE and RENAME");

    // Active defrag, where the server can defragment.
    match redis::cmd("CONFIG")
        .arg("SET")
        .arg("activedefrag")
        .arg("yes")
        .query::<()>(&mut conn)
    {
        Ok(()) => {
            for (name, value) in [
                ("active-defrag-ignore-bytes", "1"),
                ("active-defrag-threshold-lower", "1"),
                ("active-defrag-cycle-min", "50"),
            ] {
                call(&mut conn, &["CONFIG", "SET", name, value]);
            }
            let _ = eventually(valgrind::patience(Duration::from_secs(5)), || {
                info_field(&mut conn, "stats", "active_defrag_hits")
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0)
                    > 100
            });
            call(&mut conn, &["CONFIG", "SET", "activedefrag", "no"]);
            reload(&mut conn, "after active defrag");
        }
        Err(e) => eprintln!("skipped: active defrag (this server cannot defragment: {e})"),
    }

    // Freed on the lazyfree thread: UNLINK of large windows, FLUSHDB and FLUSHALL ASYNC.
    large_windows(&mut conn, "lazy", runs);
    for key in ["big:wide", "big:wide:copy", "lazy:wide", "lazy:deep"] {
        let _ = call(&mut conn, &["UNLINK", key]);
    }
    call(&mut conn, &["SELECT", "1"]);
    calls(&mut conn, "db1", keys / 4, 2);
    call(&mut conn, &["FLUSHDB", "ASYNC"]);
    call(&mut conn, &["SELECT", "0"]);
    call(&mut conn, &["FLUSHALL", "ASYNC"]);
    let drained = eventually(valgrind::patience(Duration::from_secs(30)), || {
        info_field(&mut conn, "memory", "lazyfree_pending_objects").as_deref() == Some("0")
    });
    assert!(drained, "the lazyfree thread drained");
    calls(&mut conn, "after-flush", keys / 4, 2);
    assert!(server.alive());
    server.stop();
}

#[test]
fn every_kind_of_call_on_sorted_set_windows() {
    workload(ServerConfig::default(), false);
}

#[test]
fn every_kind_of_call_on_compact_windows() {
    workload(ServerConfig::compact(), true);
}

/// A panic in a handler, caught and answered (the fault-injection build of
/// `make fault-module`): its unwinding frees what the call held.
#[test]
fn a_panicking_call_unwinds_cleanly() {
    let module = fault_module();
    let mut config = ServerConfig::without_module().arg("loadmodule", &module.display().to_string());
    config.extra.extend(["STORAGE".to_string(), "compact".to_string()]);
    let mut server = config.start();
    let mut conn = server.client();
    for i in 0..valgrind::scaled(50, 10) {
        let words = [
            "XCLOAK.ALLOW",
            "xcloak:fault:panic",
            "1000",
            "3",
            "COST",
            "2",
            "DETAILS",
        ];
        refused(
            &mut conn,
            if i % 2 == 0 { &words } else { &words[..4] },
            "internal error",
        );
        refused(
            &mut conn,
            &["XCLOAK.PEEK", "xcloak:fault:panic", "1000", "3"],
            "internal error",
        );
    }
    assert_eq!(call(&mut conn, &["XCLOAK.ALLOW", "fine", "1000", "3"]), Value::Int(1));
    server.stop();
}

/// The parser of valgrind's logs, on records as valgrind 3.19 writes them.
#[test]
fn valgrind_log_verdicts() {
    valgrind::self_test();
}
