//! `CLIENT PAUSE ... WRITE` (Redis 6.2+, what FAILOVER and planned
//! switchovers use), on both storage forms: every call that may write waits,
//! without running, until the pause ends, and then runs as if sent then;
//! PEEK keeps answering from the unchanged window (docs/operations.md,
//! "Failover").
//!
//! Waiting: XCLOAK.ALLOW (an admission and a rejection alike: the server
//! pauses by the command's `write` flag, before the module decides),
//! XCLOAK.REFUND, XCLOAK.CONVERT, an EVAL calling ALLOW, and the EXEC of a
//! transaction holding ALLOW (queueing a write command into a MULTI waits
//! too).
//! Answering: XCLOAK.PEEK, and (7.0+) PEEK from EVAL_RO.
//!
//! A paused call is known to be waiting from `CLIENT LIST` (its client is
//! flagged `b`, blocked), not from a timer; PEEKs sent after it then show
//! the window untouched.
use crate::common;
use common::resp::{Raw, Resp};
use common::*;

use std::time::Duration;

const T: i64 = 1_700_000_000_000;

/// Waits until the client `id` is blocked (paused) in `CLIENT LIST`.
fn wait_blocked(conn: &mut redis::Connection, id: i64) {
    let blocked = eventually(Duration::from_secs(10), || {
        let list: String = redis::cmd("CLIENT").arg("LIST").query(conn).unwrap();
        list.lines().any(|line| {
            line.split(' ').any(|f| f == format!("id={id}"))
                && line
                    .split(' ')
                    .find_map(|f| f.strip_prefix("flags="))
                    .is_some_and(|flags| flags.contains('b'))
        })
    });
    assert!(
        blocked,
        "client {id} is not paused:\n{}",
        redis::cmd("CLIENT").arg("LIST").query::<String>(conn).unwrap()
    );
}

fn peek(conn: &mut redis::Connection) -> Vec<i64> {
    redis::cmd("XCLOAK.PEEK")
        .arg("w")
        .arg(60_000)
        .arg(5)
        .arg("NOW")
        .arg(T + 10)
        .query(conn)
        .unwrap()
}

fn check_form(server: Server, compact_server: bool) {
    let mut conn = server.client();
    let t = T.to_string();
    for _ in 0..2 {
        let _: i64 = redis::cmd("XCLOAK.ALLOW")
            .arg("w")
            .arg(60_000)
            .arg(5)
            .arg("NOW")
            .arg(T)
            .query(&mut conn)
            .unwrap();
    }
    let _: i64 = redis::cmd("XCLOAK.ALLOW")
        .arg("full")
        .arg(60_000)
        .arg(1)
        .arg("NOW")
        .arg(T)
        .query(&mut conn)
        .unwrap();
    let before = peek(&mut conn);
    assert_eq!(before, [1, 5, 3, 0, 59_990]);
    let digest_before = digest(&mut conn);

    let t1 = (T + 1).to_string();
    let mut tx = Raw::connect(server.port);
    let tx_id = tx.call(&["CLIENT", "ID"]).int();
    assert_eq!(tx.call(&["MULTI"]), Resp::Simple("OK".into()));
    assert_eq!(
        tx.call(&["XCLOAK.ALLOW", "w", "60000", "5", "NOW", &t1]),
        Resp::Simple("QUEUED".into())
    );

    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(600_000)
        .arg("WRITE")
        .query(&mut conn)
        .unwrap();
    let waiting: Vec<(&str, Vec<&str>)> = vec![
        (
            "an admission",
            vec!["XCLOAK.ALLOW", "w", "60000", "5", "NOW", &t1, "DETAILS"],
        ),
        ("a rejection", vec!["XCLOAK.ALLOW", "full", "60000", "1", "NOW", &t1]),
        ("a refund", vec!["XCLOAK.REFUND", "w", &t]),
        ("a convert", vec!["XCLOAK.CONVERT", "full", "ZSET"]),
        (
            "EVAL calling ALLOW",
            vec![
                "EVAL",
                "return redis.call('XCLOAK.ALLOW', KEYS[1], 60000, 5, 'NOW', ARGV[1])",
                "1",
                "w",
                &t1,
            ],
        ),
    ];
    let mut clients = Vec::new();
    for (what, words) in &waiting {
        let mut raw = Raw::connect(server.port);
        let id = raw.call(&["CLIENT", "ID"]).int();
        raw.send(words);
        wait_blocked(&mut conn, id);
        clients.push((what, raw));
    }
    // A transaction calling ALLOW (queued before the pause: queueing a write
    // command waits too) waits at its EXEC.
    tx.send(&["EXEC"]);
    wait_blocked(&mut conn, tx_id);

    // Reads answer meanwhile, from the window as it was.
    let mut reader = server.client();
    assert_eq!(peek(&mut reader), before, "PEEK while writes are paused");
    if at_least_7_0() {
        let from_script: Vec<i64> = redis::cmd("EVAL_RO")
            .arg("return redis.call('XCLOAK.PEEK', KEYS[1], 60000, 5, 'NOW', ARGV[1])")
            .arg(1)
            .arg("w")
            .arg(T + 10)
            .query(&mut reader)
            .unwrap();
        assert_eq!(from_script, before, "PEEK from EVAL_RO while paused");
    }
    for (what, raw) in clients.iter_mut() {
        assert!(
            raw.nothing_within(Duration::from_millis(50)),
            "{what} answered while paused"
        );
    }
    assert_eq!(digest(&mut reader), digest_before, "nothing was written while paused");

    let _: () = redis::cmd("CLIENT").arg("UNPAUSE").query(&mut conn).unwrap();
    let replies: Vec<Resp> = clients.iter_mut().map(|(_, raw)| raw.read().unwrap()).collect();
    let exec = tx.read().unwrap();
    // Then each ran, in the order sent: admitted (3 entries), rejected,
    // refunded one of T's entries, converted (or already a sorted set),
    // admitted (3 again), and the transaction's admission (4).
    assert_eq!(
        replies[0].items().iter().map(Resp::int).collect::<Vec<_>>(),
        [1, 5, 2, 0, 60_000],
        "{replies:?}"
    );
    assert_eq!(replies[1], Resp::Int(0));
    assert_eq!(replies[2], Resp::Int(1));
    assert_eq!(replies[3], Resp::Int(compact_server as i64));
    assert_eq!(replies[4], Resp::Int(1));
    assert_eq!(exec, Resp::Array(vec![Resp::Int(1)]));
    assert_eq!(stored_stamps(&mut conn, "w"), [T, T + 1, T + 1, T + 1]);
    assert_eq!(key_type(&mut conn, "full"), "zset");
}

#[test]
fn writes_wait_and_peek_answers_during_client_pause_write_on_sorted_sets() {
    if !at_least_6_2() {
        return eprintln!("skipped: CLIENT PAUSE WRITE needs Redis 6.2+");
    }
    check_form(Server::start(), false);
}

#[test]
fn writes_wait_and_peek_answers_during_client_pause_write_on_compact_windows() {
    if !at_least_6_2() {
        return eprintln!("skipped: CLIENT PAUSE WRITE needs Redis 6.2+");
    }
    check_form(ServerConfig::compact().start(), true);
}
