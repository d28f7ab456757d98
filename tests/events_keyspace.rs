//! Windows moved and dropped by the keyspace commands, on both storage
//! forms, with a replica following: MOVE, RENAME, COPY ... DB, SWAPDB,
//! DEBUG RELOAD, UNLINK and FLUSHALL ASYNC.
//!
//! - A moved or renamed window keeps its entries and its expiry: the next
//!   call at its new place continues it, and its old place starts empty.
//! - SWAPDB swaps whole windows between databases; every call after it sees
//!   the window now in its database.
//! - UNLINK of a large sorted-set window is freed on the lazyfree thread
//!   (`lazyfreed_objects`); a compact window is freed at once whatever its
//!   size (its `free_effort` is 2: two deallocations). FLUSHALL ASYNC frees
//!   every window, compact ones included (the type's `free` callback), on the
//!   lazyfree thread; the server stays up and new windows start empty.
//! - Both forms reply the same to every call, and the replica ends
//!   identical (DEBUG DIGEST covers every database).
use crate::common;
use common::*;

use std::time::Duration;

use redis::{Connection, Value};

const T: i64 = 1_700_000_000_000;

fn run(conn: &mut Connection, words: &[&str]) -> Value {
    let mut cmd = redis::cmd(words[0]);
    for word in &words[1..] {
        cmd.arg(*word);
    }
    cmd.query(conn).unwrap_or_else(|e| panic!("{words:?}: {e}"))
}

fn peek(conn: &mut Connection, key: &str) -> Value {
    run(conn, &["XCLOAK.PEEK", key, "60000", "3", "NOW", &(T + 10).to_string()])
}

fn allow(conn: &mut Connection, key: &str) -> Value {
    run(conn, &["XCLOAK.ALLOW", key, "60000", "3", "NOW", &(T + 10).to_string()])
}

fn memory_stat(conn: &mut Connection, field: &str) -> u64 {
    info_field(conn, "memory", field)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("INFO memory {field}"))
}

/// `lazyfreed_objects` once the lazyfree thread is idle: no object pending,
/// and the counter the same over 100 ms (the thread lowers the pending count
/// before it raises this one).
fn settled_lazyfreed(conn: &mut Connection) -> u64 {
    let mut last = memory_stat(conn, "lazyfreed_objects");
    let settled = eventually(Duration::from_secs(30), || {
        std::thread::sleep(Duration::from_millis(100));
        let now = memory_stat(conn, "lazyfreed_objects");
        let idle = memory_stat(conn, "lazyfree_pending_objects") == 0 && now == last;
        last = now;
        idle
    });
    assert!(settled, "the lazyfree thread did not settle");
    last
}

fn select(conn: &mut Connection, db: i64) {
    let _: () = redis::cmd("SELECT").arg(db).query(conn).unwrap();
}

/// Every reply of the sequence, for the comparison of the forms.
fn sequence(config: ServerConfig, window_type: &str) -> Vec<Value> {
    let primary = config.clone().arg("repl-diskless-sync-delay", "0").start();
    let replica = config.start();
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(primary.port)
        .query(&mut replica.client())
        .unwrap();
    let mut conn = primary.client();
    let mut replies = Vec::new();
    let t = T.to_string();
    run(
        &mut conn,
        &["XCLOAK.ALLOW", "full", "60000", "3", "NOW", &t, "COST", "3"],
    );
    run(&mut conn, &["XCLOAK.ALLOW", "one", "60000", "3", "NOW", &t]);
    run(
        &mut conn,
        &["XCLOAK.ALLOW", "big", "3600000", "1000000", "NOW", &t, "COST", "5000"],
    );
    let mut pipe = redis::pipe();
    for i in 0..300 {
        pipe.cmd("XCLOAK.ALLOW")
            .arg("wide")
            .arg(3_600_000)
            .arg(1000)
            .arg("NOW")
            .arg(T + i)
            .ignore();
    }
    let () = pipe.query(&mut conn).unwrap();

    // MOVE: the window goes to db 1 with its entries and expiry.
    assert_eq!(run(&mut conn, &["MOVE", "full", "1"]), Value::Int(1));
    replies.push(allow(&mut conn, "full")); // db 0: a fresh window
    select(&mut conn, 1);
    assert_eq!(key_type(&mut conn, "full"), window_type);
    assert!(
        run(&mut conn, &["PTTL", "full"]) != Value::Int(-1),
        "MOVE kept the expiry"
    );
    replies.push(peek(&mut conn, "full"));
    replies.push(allow(&mut conn, "full")); // still full in db 1: rejected
    select(&mut conn, 0);

    // RENAME: the window follows its new name; RENAME over a window replaces it.
    run(&mut conn, &["RENAME", "one", "renamed"]);
    replies.push(peek(&mut conn, "renamed"));
    replies.push(allow(&mut conn, "one"));
    replies.push(Value::Int(
        (run(&mut conn, &["PTTL", "renamed"]) == Value::Int(-1)) as i64,
    ));
    run(&mut conn, &["RENAME", "renamed", "full"]);
    replies.push(peek(&mut conn, "full"));

    // COPY to another database.
    replies.push(run(&mut conn, &["COPY", "wide", "wide2", "DB", "1"]));
    let wide = peek(&mut conn, "wide");
    select(&mut conn, 1);
    assert_eq!(peek(&mut conn, "wide2"), wide, "COPY ... DB 1");
    select(&mut conn, 0);

    // SWAPDB: db 0 now holds what db 1 held, and the other way round.
    assert_eq!(run(&mut conn, &["SWAPDB", "0", "1"]), Value::Okay);
    replies.push(peek(&mut conn, "full")); // the full one, moved earlier
    replies.push(allow(&mut conn, "full"));
    replies.push(peek(&mut conn, "wide2"));
    select(&mut conn, 1);
    replies.push(peek(&mut conn, "full")); // the renamed one
    replies.push(peek(&mut conn, "big"));
    select(&mut conn, 0);

    // DEBUG RELOAD keeps every window of every database.
    let before = digest(&mut conn);
    assert_eq!(run(&mut conn, &["DEBUG", "RELOAD"]), Value::Okay);
    assert_eq!(digest(&mut conn), before, "DEBUG RELOAD");

    // UNLINK of a large window: a sorted set goes to the lazyfree thread, a
    // compact window is freed at once. First let the lazyfree thread finish
    // what came before (Valkey empties the old dataset of DEBUG RELOAD there,
    // and counts it in lazyfreed_objects only after lazyfree_pending_objects
    // is back to 0): a baseline read in between counted 6 objects against
    // the UNLINK on Valkey 9.1.2, once in the matrix.
    let lazyfreed = settled_lazyfreed(&mut conn);
    select(&mut conn, 1);
    assert_eq!(run(&mut conn, &["UNLINK", "big"]), Value::Int(1));
    select(&mut conn, 0);
    let drained = eventually(Duration::from_secs(30), || {
        memory_stat(&mut conn, "lazyfree_pending_objects") == 0
    });
    assert!(drained);
    let on_thread = memory_stat(&mut conn, "lazyfreed_objects") - lazyfreed;
    let expected_on_thread = if window_type == "zset" { 1 } else { 0 };
    assert_eq!(
        on_thread, expected_on_thread,
        "UNLINK of a 5,000-entry {window_type} window on the lazyfree thread"
    );

    // FLUSHALL ASYNC: every window, of both databases, freed on the lazyfree thread.
    let keys: u64 = [0, 1]
        .iter()
        .map(|&db| {
            select(&mut conn, db);
            redis::cmd("DBSIZE").query::<u64>(&mut conn).unwrap()
        })
        .sum();
    select(&mut conn, 0);
    assert!(keys >= 5, "{keys} keys before FLUSHALL");
    let lazyfreed = settled_lazyfreed(&mut conn);
    assert_eq!(run(&mut conn, &["FLUSHALL", "ASYNC"]), Value::Okay);
    assert_eq!(redis::cmd("DBSIZE").query::<u64>(&mut conn).unwrap(), 0);
    let drained = eventually(Duration::from_secs(30), || {
        memory_stat(&mut conn, "lazyfree_pending_objects") == 0
    });
    assert!(drained);
    assert_eq!(
        memory_stat(&mut conn, "lazyfreed_objects") - lazyfreed,
        keys,
        "FLUSHALL ASYNC freed every window on the lazyfree thread"
    );
    replies.push(allow(&mut conn, "full"));
    assert_eq!(
        key_type(&mut conn, "full"),
        window_type,
        "a window after the flush is in the configured form"
    );

    wait_replicated(&primary, &replica);
    assert_eq!(
        digest(&mut replica.client()),
        digest(&mut conn),
        "the replica followed MOVE, RENAME, COPY, SWAPDB, UNLINK and FLUSHALL"
    );
    let mut primary = primary;
    assert!(primary.alive());
    replies
}

#[test]
fn windows_follow_move_rename_copy_swapdb_and_are_freed_by_unlink_and_flushall_async() {
    if !at_least_6_2() {
        return eprintln!("skipped: COPY needs Redis 6.2+");
    }
    let zset = sequence(ServerConfig::default(), "zset");
    let compact = sequence(ServerConfig::compact(), "xcloaklog");
    assert_eq!(compact, zset, "both forms reply alike");
    let fields = |v: &Value| -> Vec<i64> {
        match v {
            Value::Array(items) => items
                .iter()
                .map(|i| if let Value::Int(n) = i { *n } else { panic!("{v:?}") })
                .collect(),
            Value::Int(n) => vec![*n],
            other => panic!("{other:?}"),
        }
    };
    let got: Vec<Vec<i64>> = zset.iter().map(fields).collect();
    assert_eq!(
        got,
        [
            vec![1],                       // db 0 after MOVE: fresh
            vec![0, 3, 0, 59_990, 59_990], // db 1: the moved window, full
            vec![0],                       // still full
            vec![1, 3, 2, 0, 59_990],      // renamed: one entry
            vec![1],                       // the old name: fresh
            vec![0],                       // RENAME kept the expiry (PTTL not -1)
            vec![1, 3, 2, 0, 59_990],      // RENAME over a window replaced it
            vec![1],                       // COPY ... DB 1
            vec![0, 3, 0, 59_990, 59_990], // after SWAPDB, db 0: the moved window
            vec![0],
            vec![0, 3, 0, 60_287, 60_289], // wide2: 300 entries from T to T+299
            vec![1, 3, 2, 0, 59_990],      // db 1: the renamed one
            vec![0, 3, 0, 59_990, 59_990], // big: 5,000 entries
            vec![1],                       // after FLUSHALL: fresh
        ]
    );
}
