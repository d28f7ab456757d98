//! The article's race, reproduced on a real server: 100 clients, each on its
//! own connection and thread, released together by a barrier, limit 10.
//!
//! The naive pipeline (ZREMRANGEBYSCORE + ZCARD, then a separate ZADD when the
//! count was below the limit) must be seen admitting more than 10: that proves
//! this test can see the race at all. XCLOAK.ALLOW must admit exactly 10 in
//! every round, and exactly each key's limit when many keys are hit at once.
use crate::common;
use common::*;

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Barrier;
use std::thread;

use redis::Connection;

const CLIENTS: usize = 100;
const LIMIT: i64 = 10;
const WINDOW_MS: i64 = 600_000;

fn clients(server: &Server) -> Vec<Connection> {
    (0..CLIENTS).map(|_| server.client()).collect()
}

/// Releases one thread per connection at once; each runs `call(client index,
/// connection)`, which returns whether it was admitted. Returns the admissions.
fn burst(conns: &mut [Connection], call: impl Fn(usize, &mut Connection) -> bool + Sync) -> i64 {
    let barrier = Barrier::new(conns.len());
    let admitted = AtomicI64::new(0);
    thread::scope(|scope| {
        for (i, conn) in conns.iter_mut().enumerate() {
            let (barrier, admitted, call) = (&barrier, &admitted, &call);
            scope.spawn(move || {
                barrier.wait();
                if call(i, conn) {
                    admitted.fetch_add(1, Ordering::SeqCst);
                }
            });
        }
    });
    admitted.into_inner()
}

fn unix_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// The article's Go code, as Rust: a non-transactional pipeline of
/// ZREMRANGEBYSCORE + ZCARD, then, if the count was below the limit, a ZADD
/// (with a unique member, so the overcount is the race alone and not a member
/// collision).
fn naive(conn: &mut Connection, key: &str, client: usize) -> bool {
    let now = unix_ms();
    let (_, count): (i64, i64) = redis::pipe()
        .cmd("ZREMRANGEBYSCORE")
        .arg(key)
        .arg("-inf")
        .arg(now - WINDOW_MS)
        .cmd("ZCARD")
        .arg(key)
        .query(conn)
        .unwrap();
    if count >= LIMIT {
        return false;
    }
    let _: i64 = redis::cmd("ZADD")
        .arg(key)
        .arg(now)
        .arg(format!("{now}-{client}"))
        .query(conn)
        .unwrap();
    true
}

fn allow(conn: &mut Connection, key: &str, limit: i64) -> bool {
    redis::cmd("XCLOAK.ALLOW")
        .arg(key)
        .arg(WINDOW_MS)
        .arg(limit)
        .query::<i64>(conn)
        .unwrap()
        == 1
}

fn zcard(conn: &mut Connection, key: &str) -> i64 {
    redis::cmd("ZCARD").arg(key).query(conn).unwrap()
}

/// The naive pipeline admits more than the limit under 100 concurrent
/// clients (rounds on fresh keys until seen, at most 20), while XCLOAK.ALLOW
/// and the article's script each admit exactly 10 in every round.
/// Fails if: the test cannot provoke the race (then it could not tell a racy
/// implementation either), or XCLOAK.ALLOW admits one request more or fewer
/// than the limit, or records a different number of entries than it admitted.
#[test]
fn naive_pipeline_races_past_the_limit_and_the_command_holds_it() {
    let server = Server::start();
    let mut conns = clients(&server);
    let mut check = server.client();

    let mut naive_rounds = Vec::new();
    for round in 0..20 {
        let key = format!("naive:{round}");
        let admitted = burst(&mut conns, |i, conn| naive(conn, &key, i));
        naive_rounds.push(admitted);
        assert_eq!(zcard(&mut check, &key), admitted, "every naive admission left an entry");
        if admitted > LIMIT {
            break;
        }
    }
    eprintln!("naive pipeline admissions per round (limit {LIMIT}): {naive_rounds:?}");
    assert!(
        naive_rounds.iter().any(|&n| n > LIMIT),
        "the naive pipeline never exceeded the limit in {} rounds: {naive_rounds:?}",
        naive_rounds.len()
    );

    for round in 0..5 {
        let key = format!("allow:{round}");
        let admitted = burst(&mut conns, |_, conn| allow(conn, &key, LIMIT));
        assert_eq!(admitted, LIMIT, "XCLOAK.ALLOW round {round}");
        assert_eq!(zcard(&mut check, &key), LIMIT, "XCLOAK.ALLOW round {round}: entries");

        let key = format!("script:{round}");
        let admitted = burst(&mut conns, |_, conn| {
            article_at(conn, &key, WINDOW_MS, LIMIT, unix_ms()) == 1
        });
        assert_eq!(admitted, LIMIT, "the article's script, round {round}");
    }
}

/// 50 keys with limits 1..=25 hit by 100 concurrent clients, each calling
/// every key once (each client starts at a different key, so the keys are
/// contended at once): each key admits exactly its limit and holds exactly
/// that many entries; a second pass admits nothing.
/// Fails if: admissions on one key leak into another, or the per-key
/// atomicity breaks under concurrent load on many keys.
#[test]
fn many_keys_under_concurrent_load_each_admit_exactly_their_limit() {
    const KEYS: usize = 50;
    let server = Server::start();
    let mut conns = clients(&server);
    let mut check = server.client();
    let limit_of = |k: usize| 1 + (k % 25) as i64;
    let per_key: Vec<AtomicI64> = (0..KEYS).map(|_| AtomicI64::new(0)).collect();

    for pass in 0..2 {
        let admitted = burst(&mut conns, |i, conn| {
            for step in 0..KEYS {
                let k = (i + step) % KEYS;
                if allow(conn, &format!("many:{k}"), limit_of(k)) {
                    per_key[k].fetch_add(1, Ordering::SeqCst);
                }
            }
            false
        });
        assert_eq!(admitted, 0);
        for (k, count) in per_key.iter().enumerate() {
            assert_eq!(count.load(Ordering::SeqCst), limit_of(k), "pass {pass}, key many:{k}");
            assert_eq!(
                zcard(&mut check, &format!("many:{k}")),
                limit_of(k),
                "pass {pass}, entries of many:{k}"
            );
        }
    }
}
