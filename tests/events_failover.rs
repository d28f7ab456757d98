//! `FAILOVER` (Redis 6.2+) under load, on both storage forms: clients keep
//! calling XCLOAK.ALLOW (admissions, COST, refunds of their own stamps) and
//! XCLOAK.PEEK on the primary while it hands over to its replica.
//!
//! FAILOVER pauses writes on the primary (`CLIENT PAUSE WRITE`, the path of
//! Redis PR #10364, where a may-replicate command arriving during the pause
//! crashed the server), waits for the replica to reach its offset, then
//! swaps the roles. So:
//! - neither server ever crashes, and every reply is an answer or
//!   `READONLY` (a write reaching the old primary once it is a replica);
//! - no acknowledged call is lost: on the new primary, each window holds
//!   exactly the units its admissions acknowledged minus what its refunds
//!   acknowledged removing;
//! - the old primary, now a replica, ends identical (DEBUG DIGEST), and the
//!   new primary continues every window.
use crate::common;
use common::*;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::{Connection, RedisResult, Value};

const KEYS: usize = 12;
const CLIENTS: usize = 3;

fn role(server: &Server) -> String {
    let mut conn = server.client();
    info_field(&mut conn, "replication", "role").unwrap_or_default()
}

/// One client's calls until the old primary refuses writes (READONLY):
/// per key, the units acknowledged as admitted minus those acknowledged as
/// refunded.
fn load(port: u16, client: usize, stop: Arc<AtomicBool>) -> (BTreeMap<String, i64>, usize) {
    let mut conn = redis::Client::open(format!("redis://127.0.0.1:{port}/"))
        .unwrap()
        .get_connection()
        .unwrap();
    let mut net: BTreeMap<String, i64> = BTreeMap::new();
    let mut rng = Rng(0x5EED_F00D + client as u64);
    let mut calls = 0;
    while !stop.load(Ordering::Relaxed) {
        let key = format!("fo:{}", rng.below(KEYS as u64));
        let cost = 1 + rng.below(2) as i64;
        calls += 1;
        let stamp: RedisResult<i64> = redis::cmd("XCLOAK.ALLOW")
            .arg(&key)
            .arg(3_600_000)
            .arg(1_000_000)
            .arg("COST")
            .arg(cost)
            .arg("STAMP")
            .query(&mut conn);
        let stamp = match stamp {
            Ok(stamp) => stamp,
            Err(e) if e.code() == Some("READONLY") => break,
            Err(e) => panic!("client {client}: ALLOW {key}: {e}"),
        };
        assert!(stamp > 0, "admitted under a limit of 10^6: {stamp}");
        *net.entry(key.clone()).or_default() += cost;
        if rng.below(4) == 0 {
            match redis::cmd("XCLOAK.REFUND").arg(&key).arg(stamp).query::<i64>(&mut conn) {
                Ok(removed) => *net.get_mut(&key).unwrap() -= removed,
                Err(e) if e.code() == Some("READONLY") => break,
                Err(e) => panic!("client {client}: REFUND {key}: {e}"),
            }
        }
        if rng.below(3) == 0 {
            let peek: Value = redis::cmd("XCLOAK.PEEK")
                .arg(&key)
                .arg(3_600_000)
                .arg(1_000_000)
                .query(&mut conn)
                .unwrap();
            assert!(
                matches!(peek, Value::Array(ref fields) if fields.len() == 5),
                "{peek:?}"
            );
        }
    }
    (net, calls)
}

fn stored(conn: &mut Connection) -> BTreeMap<String, i64> {
    (0..KEYS)
        .map(|k| format!("fo:{k}"))
        .map(|key| {
            let entries = stored_stamps(conn, &key).len() as i64;
            (key, entries)
        })
        .filter(|(_, n)| *n > 0)
        .collect()
}

fn failover_under_load(config: ServerConfig) {
    let node = |config: ServerConfig| config.arg("repl-diskless-sync-delay", "0").start();
    let primary = node(config.clone());
    let replica = node(config);
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(primary.port)
        .query(&mut replica.client())
        .unwrap();
    wait_replicated(&primary, &replica);

    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|client| {
            let (port, stop) = (primary.port, stop.clone());
            std::thread::spawn(move || load(port, client, stop))
        })
        .collect();
    // Some load first, then the handover while the clients keep calling.
    let mut conn = primary.client();
    let warmed = eventually(Duration::from_secs(20), || {
        info_field(&mut conn, "xcloak", "xcloak_admitted")
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(0)
            > 200
    });
    assert!(warmed, "no load reached the primary");
    let reply: String = redis::cmd("FAILOVER")
        .arg("TIMEOUT")
        .arg(30_000)
        .query(&mut conn)
        .unwrap();
    assert_eq!(reply, "OK");
    let swapped = eventually(Duration::from_secs(60), || {
        role(&replica) == "master" && role(&primary) == "slave"
    });
    assert!(
        swapped,
        "FAILOVER did not swap the roles:\n{}\n{}",
        primary.log(),
        replica.log()
    );
    // Every client calls a write each turn, so each meets READONLY on the
    // old primary and ends by itself; the flag only stops the others if not.
    let ended = eventually(Duration::from_secs(30), || clients.iter().all(|c| c.is_finished()));
    stop.store(true, Ordering::Relaxed);
    assert!(
        ended,
        "a client still called the old primary 30 s after the roles swapped"
    );
    let mut acknowledged: BTreeMap<String, i64> = BTreeMap::new();
    let mut calls = 0;
    for client in clients {
        let (net, n) = client.join().expect("a client thread failed");
        calls += n;
        for (key, units) in net {
            *acknowledged.entry(key).or_default() += units;
        }
    }
    acknowledged.retain(|_, units| *units > 0);

    let (old, new) = (primary, replica);
    let mut new_conn = new.client();
    assert_eq!(
        stored(&mut new_conn),
        acknowledged,
        "the new primary holds exactly what was acknowledged ({calls} calls)"
    );
    wait_replicated(&new, &old);
    assert_eq!(
        digest(&mut old.client()),
        digest(&mut new_conn),
        "the old primary follows the new one"
    );
    // The new primary continues the windows; the old one refuses writes.
    let before = stored_stamps(&mut new_conn, "fo:0").len();
    let _: i64 = redis::cmd("XCLOAK.ALLOW")
        .arg("fo:0")
        .arg(3_600_000)
        .arg(1_000_000)
        .query(&mut new_conn)
        .unwrap();
    assert_eq!(stored_stamps(&mut new_conn, "fo:0").len(), before + 1);
    let refused = redis::cmd("XCLOAK.ALLOW")
        .arg("fo:0")
        .arg(3_600_000)
        .arg(10)
        .query::<i64>(&mut old.client());
    assert_eq!(refused.unwrap_err().code(), Some("READONLY"));
    let mut old = old;
    let mut new = new;
    assert!(old.alive() && new.alive(), "a server crashed");
    eprintln!(
        "{calls} calls during the failover; {} units acknowledged",
        acknowledged.values().sum::<i64>()
    );
}

#[test]
fn failover_under_load_loses_no_acknowledged_call_on_sorted_sets() {
    if !at_least_6_2() {
        return eprintln!("skipped: FAILOVER needs Redis 6.2+");
    }
    failover_under_load(ServerConfig::default());
}

#[test]
fn failover_under_load_loses_no_acknowledged_call_on_compact_windows() {
    if !at_least_6_2() {
        return eprintln!("skipped: FAILOVER needs Redis 6.2+");
    }
    failover_under_load(ServerConfig::compact());
}
