//! Replication and failover: a primary with two replicas under continuous
//! load; one replica is promoted (`REPLICAOF NO ONE`), the other replica and
//! the old primary follow it, and the clients move to it.
//!
//! Counted per key, with NOW-free calls and a long window (nothing expires):
//! - every admission acknowledged and WAITed by both replicas before the switch
//!   is on the promoted node (no window lost or reset);
//! - admissions acknowledged before (WAITed) plus after the switch never exceed
//!   the limit: only admissions in flight and unacknowledged at the switch can
//!   be lost, and those are the only slack;
//! - entries written after the promotion add to the earlier ones, never
//!   overwrite them: ZCARD == entries at promotion + admissions after.
use crate::common;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::*;
use redis::{Connection, RedisResult};

const LONG: i64 = 3_600_000;
const LOAD_KEYS: usize = 30;
const SPAN_KEYS: usize = 8;
const SPAN_LIMIT: i64 = 50;
const CLIENTS: usize = 4;
const PHASE: Duration = Duration::from_millis(1200);

/// Limits 4, 8, ... 8192: whatever the machine's speed, some windows fill
/// before the switch, some after.
fn load_limit(i: usize) -> i64 {
    4 << (i % 12)
}

/// A server that starts a full sync at once (no diskless-sync delay: 5 s by default on 7.0+).
fn node() -> Server {
    ServerConfig::default().arg("repl-diskless-sync-delay", "0").start()
}

fn replicaof(server: &Server, primary: Option<&Server>) {
    let mut conn = server.client();
    let reply: String = match primary {
        Some(p) => redis::cmd("REPLICAOF")
            .arg("127.0.0.1")
            .arg(p.port)
            .query(&mut conn)
            .unwrap(),
        None => redis::cmd("REPLICAOF").arg("NO").arg("ONE").query(&mut conn).unwrap(),
    };
    assert!(reply.starts_with("OK"), "REPLICAOF: {reply}");
}

fn wait_linked(replica: &Server) {
    let linked = eventually(Duration::from_secs(30), || {
        replica
            .with(|c| info_field(c, "replication", "master_link_status"))
            .as_deref()
            == Some("up")
    });
    assert!(linked, "replica {} not linked:\n{}", replica.port, replica.log());
}

/// Waits until `replicas` have applied everything `primary` has written.
fn wait_synced(primary: &Server, replicas: &[&Server]) {
    for replica in replicas {
        wait_replicated(primary, replica);
    }
}

fn all_entries(server: &Server) -> BTreeMap<String, Vec<(String, f64)>> {
    server.with(|c| {
        let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(c).unwrap();
        keys.into_iter()
            .map(|k| {
                let e = entries(c, &k);
                (k, e)
            })
            .collect()
    })
}

fn no_xcloak_calls(server: &Server) -> bool {
    let stats: String = server.with(|c| redis::cmd("INFO").arg("commandstats").query(c).unwrap());
    !stats.to_ascii_lowercase().contains("xcloak")
}

fn allow(conn: &mut Connection, key: &str, limit: i64) -> RedisResult<i64> {
    redis::cmd("XCLOAK.ALLOW").arg(key).arg(LONG).arg(limit).query(conn)
}

#[derive(Default, Clone)]
struct Counts {
    /// Admissions replied 1 by the old primary.
    replied_before: i64,
    /// Of those, WAITed by both replicas.
    acked_before: i64,
    /// Calls to the old primary whose outcome is unknown (connection dropped
    /// by the demotion): at most one per client.
    unknown_before: i64,
    /// Admissions by the promoted node.
    admitted_after: i64,
}

#[test]
fn wait_after_allow_counts_the_replicas() {
    let primary = node();
    let replicas = [node(), node()];
    for r in &replicas {
        replicaof(r, Some(&primary));
        wait_linked(r);
    }
    let mut conn = primary.client();
    for i in 0..50 {
        assert_eq!(allow(&mut conn, &format!("w:{}", i % 5), 20).unwrap(), 1);
        let acked: i64 = redis::cmd("WAIT").arg(2).arg(30_000).query(&mut conn).unwrap();
        assert_eq!(acked, 2, "WAIT after XCLOAK.ALLOW returns the number of replicas");
    }
    let on_primary = all_entries(&primary);
    assert_eq!(on_primary.len(), 5);
    for r in &replicas {
        assert_eq!(all_entries(r), on_primary, "replica {} holds the same entries", r.port);
        assert!(no_xcloak_calls(r), "replicas apply effects, never run XCLOAK.ALLOW");
        let ttl: i64 = r.with(|c| redis::cmd("PTTL").arg("w:0").query(c).unwrap());
        assert!(ttl > 0 && ttl <= LONG + 1_000, "the replica got the expiry: PTTL {ttl}");
    }
}

#[test]
fn promoting_a_replica_under_load_loses_no_window_and_over_admits_nothing() {
    let old_primary = node();
    let promoted = node();
    let other = node();
    for r in [&promoted, &other] {
        replicaof(r, Some(&old_primary));
        wait_linked(r);
    }

    // Span keys: half full before the switch (acknowledged by both replicas).
    {
        let mut conn = old_primary.client();
        for i in 0..SPAN_KEYS {
            for _ in 0..SPAN_LIMIT / 2 {
                assert_eq!(allow(&mut conn, &format!("span:{i}"), SPAN_LIMIT).unwrap(), 1);
            }
        }
        wait_synced(&old_primary, &[&promoted, &other]);
    }

    let switched = AtomicBool::new(false);
    let stop = AtomicBool::new(false);
    let (old_url, new_url) = (old_primary.url(), promoted.url());

    let (per_thread, at_promotion) = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..CLIENTS)
            .map(|t| {
                let (switched, stop, old_url, new_url) = (&switched, &stop, &old_url, &new_url);
                scope.spawn(move || {
                    let connect = |url: &str| redis::Client::open(url).unwrap().get_connection().unwrap();
                    let mut counts: BTreeMap<String, Counts> = BTreeMap::new();
                    let mut conn = connect(old_url);
                    let mut on_new = false;
                    let mut n = t;
                    let mut rng: u64 = 0x9e37_79b9_7f4a_7c15 ^ (t as u64 + 1);
                    while !stop.load(Ordering::SeqCst) {
                        if !on_new && switched.load(Ordering::SeqCst) {
                            conn = connect(new_url);
                            on_new = true;
                        }
                        n += CLIENTS;
                        // Before the switch: the load keys. After: the span keys too.
                        let (key, limit) = if on_new && n % 3 == 0 {
                            (format!("span:{}", (n / 3) % SPAN_KEYS), SPAN_LIMIT)
                        } else {
                            rng ^= rng << 13;
                            rng ^= rng >> 7;
                            rng ^= rng << 17;
                            let i = (rng % LOAD_KEYS as u64) as usize;
                            (format!("load:{i}"), load_limit(i))
                        };
                        match allow(&mut conn, &key, limit) {
                            Ok(1) => {}
                            Ok(_) => continue,
                            // The old primary, demoted: READONLY (not admitted), or it
                            // dropped the connection (outcome unknown). Move on.
                            Err(e) if !on_new => {
                                let dropped =
                                    e.is_io_error() || e.is_connection_dropped() || e.is_unrecoverable_error();
                                // (The crate displays READONLY as "ReadOnly": match the code.)
                                assert!(e.code() == Some("READONLY") || dropped, "old primary: {e}");
                                if dropped {
                                    counts.entry(key).or_default().unknown_before += 1;
                                    while !switched.load(Ordering::SeqCst) {
                                        std::thread::sleep(Duration::from_millis(1));
                                    }
                                }
                                continue;
                            }
                            Err(e) => panic!("promoted node: {e}"),
                        }
                        let entry = counts.entry(key).or_default();
                        let acked: RedisResult<i64> = redis::cmd("WAIT")
                            .arg(if on_new { 1 } else { 2 })
                            .arg(if on_new { 30_000 } else { 5_000 })
                            .query(&mut conn);
                        if on_new {
                            entry.admitted_after += 1;
                            assert!(acked.unwrap() >= 1, "WAIT on the promoted node reaches its replica");
                        } else {
                            entry.replied_before += 1;
                            // Mid-switch WAIT may return 0/1 or fail (demoted): unacknowledged.
                            if acked.unwrap_or(0) == 2 {
                                entry.acked_before += 1;
                            }
                        }
                    }
                    counts
                })
            })
            .collect();

        std::thread::sleep(PHASE);
        // The switch, while the clients keep calling the old primary.
        replicaof(&promoted, None);
        let at_promotion = all_entries(&promoted);
        replicaof(&other, Some(&promoted));
        replicaof(&old_primary, Some(&promoted));
        switched.store(true, Ordering::SeqCst);
        std::thread::sleep(PHASE);
        stop.store(true, Ordering::SeqCst);
        let per_thread: Vec<BTreeMap<String, Counts>> = workers.into_iter().map(|w| w.join().unwrap()).collect();
        (per_thread, at_promotion)
    });

    let mut counts: BTreeMap<String, Counts> = BTreeMap::new();
    for thread in per_thread {
        for (key, c) in thread {
            let total = counts.entry(key).or_default();
            total.replied_before += c.replied_before;
            total.acked_before += c.acked_before;
            total.admitted_after += c.admitted_after;
            total.unknown_before += c.unknown_before;
        }
    }
    let (replied, acked, after): (i64, i64, i64) = counts.values().fold((0, 0, 0), |(r, a, n), c| {
        (r + c.replied_before, a + c.acked_before, n + c.admitted_after)
    });
    assert!(
        acked > 0 && after > 0,
        "load on both sides of the switch: {acked} acked before, {after} after"
    );
    eprintln!("failover: {replied} admissions replied before the switch ({acked} WAITed), {after} after");

    // Then fill every window on the promoted node: each must take exactly
    // what its limit leaves after the entries it already holds.
    {
        let mut conn = promoted.client();
        let keys = (0..LOAD_KEYS)
            .map(|i| (format!("load:{i}"), load_limit(i)))
            .chain((0..SPAN_KEYS).map(|i| (format!("span:{i}"), SPAN_LIMIT)));
        for (key, limit) in keys {
            // Batches of 100: once a call is rejected, so are the rest (long window).
            loop {
                let mut pipe = redis::pipe();
                for _ in 0..100 {
                    pipe.cmd("XCLOAK.ALLOW").arg(&key).arg(LONG).arg(limit);
                }
                let replies: Vec<i64> = pipe.query(&mut conn).unwrap();
                let admitted = replies.iter().sum::<i64>();
                counts.entry(key.clone()).or_default().admitted_after += admitted;
                if admitted < 100 {
                    break;
                }
            }
        }
    }
    // (Waits for both to link to the promoted node first.)
    wait_synced(&promoted, &[&other, &old_primary]);
    let finally = all_entries(&promoted);
    assert_eq!(
        all_entries(&other),
        finally,
        "the other replica follows the promoted node exactly"
    );
    assert_eq!(
        all_entries(&old_primary),
        finally,
        "the demoted primary converged (its unacknowledged writes are gone)"
    );

    let limit_of = |key: &str| -> i64 {
        if key.starts_with("span:") {
            SPAN_LIMIT
        } else {
            load_limit(key["load:".len()..].parse().unwrap())
        }
    };
    let mut spanning = 0;
    for key in counts
        .keys()
        .chain(at_promotion.keys())
        .collect::<std::collections::BTreeSet<_>>()
    {
        let c = counts.get(key).cloned().unwrap_or_default();
        let limit = limit_of(key);
        let before = at_promotion.get(key).cloned().unwrap_or_default();
        let end = finally.get(key).cloned().unwrap_or_default();
        let span_seed = if key.starts_with("span:") { SPAN_LIMIT / 2 } else { 0 };
        // No acknowledged admission lost: the promoted node had them all.
        assert!(
            before.len() as i64 >= c.acked_before + span_seed,
            "{key}: {} entries at promotion < {} acknowledged",
            before.len(),
            c.acked_before + span_seed
        );
        assert!(
            before.len() as i64 <= c.replied_before + c.unknown_before + span_seed,
            "{key}: more entries than admissions"
        );
        // Earlier entries kept, with their scores; later ones only added.
        for entry in &before {
            assert!(
                end.contains(entry),
                "{key}: {entry:?} lost or overwritten after the promotion"
            );
        }
        assert_eq!(
            end.len() as i64,
            before.len() as i64 + c.admitted_after,
            "{key}: ZCARD == entries at promotion + admissions after"
        );
        // Nothing over-admitted: acknowledged before + admitted after <= limit.
        assert!(
            c.acked_before + span_seed + c.admitted_after <= limit,
            "{key}: over-admitted ({} + {} > {limit})",
            c.acked_before + span_seed,
            c.admitted_after
        );
        assert_eq!(end.len() as i64, limit, "{key}: full, and not beyond its limit");
        if !before.is_empty() && c.admitted_after > 0 {
            spanning += 1;
        }
        if key.starts_with("span:") {
            // Half full before the switch: exactly the other half admitted after.
            assert_eq!(
                c.admitted_after,
                SPAN_LIMIT - before.len() as i64,
                "{key}: window neither lost nor reset"
            );
        }
    }
    assert!(spanning >= SPAN_KEYS, "windows spanning the switch: {spanning}");
    assert!(no_xcloak_calls(&other), "the other replica never ran the command");
}
