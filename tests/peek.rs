//! XCLOAK.PEEK writes nothing: not the value, not the TTL, not the dirty
//! counter, not the replication stream; and, being `readonly`, it runs on a
//! read-only replica and under read-only ACLs.
//!
//! What would fail: a PEEK that trims expired entries, refreshes the TTL,
//! creates the key, calls `RedisModule_Replicate*`, opens the key for writing
//! (dirty counter, keyspace), or is registered `write`.

use crate::common;
use common::*;

use std::time::Duration;

use redis::Connection;

const WINDOW: i64 = 1000;
const LIMIT: i64 = 10;

fn peek(conn: &mut Connection, key: &str, now: i64) -> Vec<i64> {
    redis::cmd("XCLOAK.PEEK")
        .arg(key)
        .arg(WINDOW)
        .arg(LIMIT)
        .arg("NOW")
        .arg(now)
        .query(conn)
        .unwrap()
}

fn dump(conn: &mut Connection, key: &str) -> Option<Vec<u8>> {
    redis::cmd("DUMP").arg(key).query(conn).unwrap()
}

fn int(conn: &mut Connection, command: &str, key: &str) -> i64 {
    redis::cmd(command).arg(key).query(conn).unwrap()
}

fn dirty(conn: &mut Connection) -> i64 {
    info_field(conn, "persistence", "rdb_changes_since_last_save")
        .unwrap()
        .parse()
        .unwrap()
}

fn offset(conn: &mut Connection) -> i64 {
    info_field(conn, "replication", "master_repl_offset")
        .unwrap()
        .parse()
        .unwrap()
}

/// A key holding 3 entries at 1000 and 2 at 1500, real TTL about 2 s.
fn seeded(conn: &mut Connection, key: &str) {
    for now in [1000, 1000, 1000, 1500, 1500] {
        assert_eq!(allow_at(conn, key, WINDOW, LIMIT, now), 1);
    }
    // A TTL long enough to outlive the test on a slow machine, set once.
    let _: i64 = redis::cmd("PEXPIRE").arg(key).arg(600_000).query(conn).unwrap();
}

#[test]
fn peek_changes_neither_value_nor_ttl_nor_dirty_counter() {
    let server = Server::start();
    let mut conn = server.client();
    seeded(&mut conn, "k");
    let (value, ttl, dirty_before) = (dump(&mut conn, "k"), int(&mut conn, "PTTL", "k"), dirty(&mut conn));
    let expire_at = at_least_7_0().then(|| int(&mut conn, "PEXPIRETIME", "k"));

    // At 2200 the three entries from 1000 have expired (1000 <= 2200 - 1000):
    // PEEK counts 2 live, but must not remove the 3 expired ones.
    assert_eq!(peek(&mut conn, "k", 2200), [1, 10, 8, 0, 300]);
    // Far in the future everything has expired: still nothing removed.
    assert_eq!(peek(&mut conn, "k", 1_000_000), [1, 10, 10, 0, 0]);
    // In the past (a client clock behind): all 5 live, nothing added.
    assert_eq!(peek(&mut conn, "k", 1500), [1, 10, 5, 0, 1000]);
    for now in 0..200 {
        peek(&mut conn, "k", 1000 + now * 10);
    }

    assert_eq!(dump(&mut conn, "k"), value, "DUMP changed");
    assert_eq!(int(&mut conn, "ZCARD", "k"), 5);
    let ttl_after = int(&mut conn, "PTTL", "k");
    assert!(
        ttl_after > 0 && ttl_after <= ttl,
        "PTTL went from {ttl} to {ttl_after}: PEEK must not extend it"
    );
    if let Some(expire_at) = expire_at {
        assert_eq!(
            int(&mut conn, "PEXPIRETIME", "k"),
            expire_at,
            "the absolute expiry moved"
        );
    }
    assert_eq!(dirty(&mut conn), dirty_before, "PEEK counted as a write");

    // A missing key stays missing.
    assert_eq!(peek(&mut conn, "absent", 5000), [1, 10, 10, 0, 0]);
    assert_eq!(int(&mut conn, "EXISTS", "absent"), 0);
    assert_eq!(dirty(&mut conn), dirty_before);

    // The test can see a write: one ALLOW moves both DUMP and the counter.
    assert_eq!(allow_at(&mut conn, "k", WINDOW, LIMIT, 2200), 1);
    assert_ne!(dump(&mut conn, "k"), value);
    assert!(dirty(&mut conn) > dirty_before);
}

#[test]
fn peek_on_a_wrong_type_is_an_error_and_changes_nothing() {
    let server = Server::start();
    let mut conn = server.client();
    let _: () = redis::cmd("SET").arg("s").arg("v").query(&mut conn).unwrap();
    let before = dirty(&mut conn);
    let err = redis::cmd("XCLOAK.PEEK")
        .arg("s")
        .arg(WINDOW)
        .arg(LIMIT)
        .query::<Vec<i64>>(&mut conn)
        .unwrap_err();
    assert_eq!(err.code(), Some("WRONGTYPE"), "{err}");
    let value: String = redis::cmd("GET").arg("s").query(&mut conn).unwrap();
    assert_eq!(value, "v");
    assert_eq!(dirty(&mut conn), before);
}

fn wait_in_sync(primary: &mut Connection, replica: &mut Connection) {
    let synced = eventually(Duration::from_secs(20), || {
        info_field(replica, "replication", "master_link_status").as_deref() == Some("up")
            && offset(primary) == offset(replica)
    });
    assert!(
        synced,
        "replica not in sync: primary {} replica {}",
        offset(primary),
        offset(replica)
    );
}

#[test]
fn peek_sends_nothing_to_replicas_and_runs_on_a_read_only_replica() {
    // No periodic PING from the primary during the test: the offset may only
    // move because of commands.
    let primary = ServerConfig::default()
        .arg("repl-ping-replica-period", "3600")
        .arg("repl-diskless-sync-delay", "0")
        .start();
    let replica = Server::start();
    let (mut p, mut r) = (primary.client(), replica.client());
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(primary.port)
        .query(&mut r)
        .unwrap();
    seeded(&mut p, "k");
    wait_in_sync(&mut p, &mut r);

    let before = offset(&mut p);
    let mut pipe = redis::pipe();
    for i in 0..500 {
        pipe.cmd("XCLOAK.PEEK")
            .arg("k")
            .arg(WINDOW)
            .arg(LIMIT)
            .arg("NOW")
            .arg(1000 + i * 5)
            .ignore();
        pipe.cmd("XCLOAK.PEEK")
            .arg(format!("absent:{i}"))
            .arg(WINDOW)
            .arg(LIMIT)
            .ignore();
    }
    let _: () = pipe.query(&mut p).unwrap();
    assert_eq!(peek(&mut p, "k", 2200), [1, 10, 8, 0, 300]);
    assert_eq!(offset(&mut p), before, "PEEK fed the replication stream");
    wait_in_sync(&mut p, &mut r);
    assert_eq!(offset(&mut r), before);

    // The replica holds the same value and answers PEEK (a read-only
    // replica refuses writes: ALLOW gets READONLY).
    assert_eq!(dump(&mut r, "k"), dump(&mut p, "k"));
    assert_eq!(peek(&mut r, "k", 2200), [1, 10, 8, 0, 300]);
    let err = redis::cmd("XCLOAK.ALLOW")
        .arg("k")
        .arg(WINDOW)
        .arg(LIMIT)
        .query::<i64>(&mut r)
        .unwrap_err();
    assert_eq!(err.code(), Some("READONLY"), "{err}");

    // The test can see replication: one ALLOW moves the offset.
    assert_eq!(allow_at(&mut p, "k", WINDOW, LIMIT, 2200), 1);
    assert!(offset(&mut p) > before, "an admission must be replicated");
    wait_in_sync(&mut p, &mut r);
    assert_eq!(peek(&mut r, "k", 2200), [1, 10, 7, 0, 1000]);
}

fn connect_as(server: &Server, user: &str) -> Connection {
    let client = redis::Client::open(format!("redis://{user}:pw@127.0.0.1:{}/", server.port)).unwrap();
    client.get_connection().unwrap()
}

fn acl(conn: &mut Connection, rules: &[&str]) {
    let _: () = redis::cmd("ACL").arg("SETUSER").arg(rules).query(conn).unwrap();
}

fn denied(result: redis::RedisResult<redis::Value>) -> bool {
    matches!(&result, Err(e) if e.code() == Some("NOPERM"))
}

#[test]
fn peek_runs_under_read_only_acls() {
    let server = Server::start();
    let mut admin = server.client();
    seeded(&mut admin, "k");
    let peek_cmd = || {
        redis::cmd("XCLOAK.PEEK")
            .arg("k")
            .arg(WINDOW)
            .arg(LIMIT)
            .arg("NOW")
            .arg(2200)
            .clone()
    };
    let allow_cmd = || {
        redis::cmd("XCLOAK.ALLOW")
            .arg("k")
            .arg(WINDOW)
            .arg(LIMIT)
            .arg("NOW")
            .arg(2200)
            .clone()
    };

    // A user allowed PEEK and the read commands, not ALLOW.
    acl(&mut admin, &["reader", "on", ">pw", "~*", "+@read", "+xcloak.peek"]);
    let mut reader = connect_as(&server, "reader");
    assert_eq!(peek_cmd().query::<Vec<i64>>(&mut reader).unwrap(), [1, 10, 8, 0, 300]);
    assert!(
        denied(allow_cmd().query(&mut reader)),
        "ALLOW must be refused to a read-only user"
    );

    // The categories: on 7.2+ PEEK is in @read and ALLOW in @write, so +@read
    // alone grants PEEK; older servers give module commands no category.
    acl(&mut admin, &["bycategory", "on", ">pw", "~*", "+@read"]);
    let mut by_category = connect_as(&server, "bycategory");
    let result = peek_cmd().query::<redis::Value>(&mut by_category);
    if at_least_7_2() {
        assert!(result.is_ok(), "+@read must grant XCLOAK.PEEK on 7.2+: {result:?}");
    } else {
        assert!(denied(result), "module commands have no ACL category before 7.2");
    }
    assert!(denied(allow_cmd().query(&mut by_category)));

    // Read-only key permissions (7.0+) follow the key specs: PEEK's key is
    // RO, ALLOW's RW, so %R~* grants PEEK and refuses ALLOW.
    if at_least_7_0() {
        acl(
            &mut admin,
            &["rokeys", "on", ">pw", "%R~*", "+xcloak.peek", "+xcloak.allow"],
        );
        let mut ro_keys = connect_as(&server, "rokeys");
        assert_eq!(peek_cmd().query::<Vec<i64>>(&mut ro_keys).unwrap(), [1, 10, 8, 0, 300]);
        assert!(
            denied(allow_cmd().query(&mut ro_keys)),
            "a read-only key permission must refuse ALLOW"
        );
    }
    assert_eq!(int(&mut admin, "ZCARD", "k"), 5, "nothing was admitted");
}
