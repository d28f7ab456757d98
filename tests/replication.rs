//! Replication of effects, on a real primary/replica pair: a few thousand
//! XCLOAK.ALLOW calls on the primary (many keys; admissions, rejections,
//! trims, windows emptied; with and without NOW; COST > 1) leave the replica
//! with exactly the same sorted sets (members and scores), the same key set
//! and the same expiry, while the replica never ran XCLOAK.ALLOW itself: it
//! received the trim, the exact members and an absolute PEXPIREAT.
use crate::common;
use common::*;

use std::collections::BTreeMap;
use std::time::Duration;

use redis::Connection;

const DAY_MS: i64 = 86_400_000;

/// SplitMix64: a deterministic workload without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn replicate_from(replica: &Server, primary: &Server) {
    let mut conn = replica.client();
    let reply: String = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(primary.port)
        .query(&mut conn)
        .unwrap();
    assert!(reply.starts_with("OK"), "REPLICAOF: {reply}");
    let up = eventually(Duration::from_secs(30), || {
        info_field(&mut conn, "replication", "master_link_status").as_deref() == Some("up")
    });
    assert!(up, "replica link not up:\n{}", replica.log());
}

fn keys(conn: &mut Connection, pattern: &str) -> Vec<String> {
    let mut keys: Vec<String> = redis::cmd("KEYS").arg(pattern).query(conn).unwrap();
    keys.sort();
    keys
}

/// `cmdstat_<name>` lines of INFO commandstats, by command name.
fn commandstats(conn: &mut Connection) -> BTreeMap<String, String> {
    let text: String = redis::cmd("INFO").arg("commandstats").query(conn).unwrap();
    text.lines()
        .filter_map(|line| line.strip_prefix("cmdstat_"))
        .filter_map(|line| line.split_once(':'))
        .map(|(name, stats)| (name.to_ascii_lowercase(), stats.trim().to_string()))
        .collect()
}

fn calls_of(stats: &BTreeMap<String, String>, name: &str) -> i64 {
    stats
        .get(name)
        .and_then(|s| s.split(',').find_map(|f| f.strip_prefix("calls=")))
        .map_or(0, |n| n.parse().unwrap())
}

/// A few thousand calls on the primary; after WAIT the replica holds the same
/// keys, the same members with the same scores, the same absolute expiry
/// (PEXPIRETIME, 7.0+) and the same DEBUG DIGEST, and its commandstats show
/// no XCLOAK.ALLOW but the effects (ZADD, ZREMRANGEBYSCORE, PEXPIREAT).
/// Short windows on the server clock expire on the primary and their DELs
/// reach the replica. The replica refuses XCLOAK.ALLOW from clients (READONLY).
/// Fails if: the command is replicated verbatim (the replica would run it on
/// its own clock: commandstats show it, members or scores differ), the trim
/// or a member is not replicated exactly, the TTL is replicated relative
/// (expiry differs), or a window emptied on the primary survives on the replica.
#[test]
fn replica_receives_exact_effects_and_never_runs_the_command() {
    // No 5 s wait for more replicas before a diskless full sync (7.0+ default).
    let primary = ServerConfig::default().arg("repl-diskless-sync-delay", "0").start();
    let replica = Server::start();
    replicate_from(&replica, &primary);
    let mut conn = primary.client();
    let mut rng = Rng(0x5EED_C10A_4B1D_2026);

    // NOW-driven keys: each with its own clock, window and limit; time steps
    // of 0, 1, a third of the window, window + 1, and back.
    const NOW_KEYS: usize = 40;
    let mut clocks: Vec<i64> = (0..NOW_KEYS).map(|k| 1_700_000_000_000 + k as i64 * 7_919).collect();
    let windows: Vec<i64> = (0..NOW_KEYS)
        .map(|k| [60_000, 600_000, 3_600_000, DAY_MS][k % 4])
        .collect();
    let mut calls = 0usize;
    let mut with_now = 0usize;
    for _batch in 0..20 {
        let mut pipe = redis::pipe();
        for _ in 0..150 {
            let kind = rng.below(10);
            if kind < 7 {
                let k = rng.below(NOW_KEYS as u64) as usize;
                let w = windows[k];
                clocks[k] += match rng.below(12) {
                    0..=4 => 0,
                    5..=7 => 1,
                    8 => w / 3,
                    9 => w + 1,
                    10 => -(rng.below(w as u64) as i64),
                    _ => rng.below(w as u64) as i64,
                };
                let limit = rng.below(12) as i64;
                let cost = if rng.below(5) == 0 { 1 + rng.below(4) as i64 } else { 1 };
                pipe.cmd("XCLOAK.ALLOW")
                    .arg(format!("now:{k}"))
                    .arg(w)
                    .arg(limit)
                    .arg("COST")
                    .arg(cost)
                    .arg("NOW")
                    .arg(clocks[k]);
                with_now += 1;
            } else if kind < 9 {
                // Server clock, long window: admissions, then rejections.
                let k = rng.below(20);
                pipe.cmd("XCLOAK.ALLOW")
                    .arg(format!("clock:{k}"))
                    .arg(600_000)
                    .arg(1 + k as i64)
                    .arg("COST")
                    .arg(1 + rng.below(2) as i64);
            } else {
                // Server clock, 5 ms window: trims in real time, keys expire soon.
                let k = rng.below(30);
                pipe.cmd("XCLOAK.ALLOW").arg(format!("short:{k}")).arg(5).arg(3);
            }
            calls += 1;
        }
        let replies: Vec<i64> = pipe.query(&mut conn).unwrap();
        assert!(replies.iter().all(|&r| r == 0 || r == 1));
    }

    // Same millisecond past the compact member form (k >= 1000), via COST.
    for _ in 0..3 {
        assert_eq!(
            int(
                &mut conn,
                &[
                    "XCLOAK.ALLOW",
                    "burst",
                    "600000",
                    "100000",
                    "COST",
                    "500",
                    "NOW",
                    "1700000000000"
                ]
            ),
            1
        );
    }
    // A window emptied by a later call: the key must vanish on both sides.
    assert_eq!(
        int(
            &mut conn,
            &["XCLOAK.ALLOW", "emptied", "1000", "5", "COST", "3", "NOW", "1000"]
        ),
        1
    );
    assert_eq!(
        int(&mut conn, &["XCLOAK.ALLOW", "emptied", "1000", "0", "NOW", "2000"]),
        0
    );
    calls += 5;
    assert!(calls >= 3000 && with_now >= 1000, "{calls} calls, {with_now} with NOW");

    let acked: i64 = redis::cmd("WAIT").arg(1).arg(10_000).query(&mut conn).unwrap();
    assert_eq!(acked, 1, "the replica acknowledged the stream");

    // The short windows expire on the primary; their DELs reach the replica.
    let mut replica_conn = replica.client();
    let drained = eventually(Duration::from_secs(30), || {
        keys(&mut conn, "short:*").is_empty() && keys(&mut replica_conn, "short:*").is_empty()
    });
    assert!(
        drained,
        "short-window keys left: primary {:?}, replica {:?}",
        keys(&mut conn, "short:*"),
        keys(&mut replica_conn, "short:*")
    );
    // KEYS hides keys that are logically expired but not yet deleted; touching
    // them makes the primary delete them now and replicate the DEL.
    let mut touch = redis::cmd("EXISTS");
    for k in 0..30 {
        touch.arg(format!("short:{k}"));
    }
    assert_eq!(touch.query::<i64>(&mut conn).unwrap(), 0);
    // Not WAIT: if active expiry had already deleted every key, EXISTS wrote
    // nothing and WAIT would return at once, before the replica applied the DELs.
    wait_replicated(&primary, &replica);

    let primary_keys = keys(&mut conn, "*");
    let dbsize = |c: &mut Connection| redis::cmd("DBSIZE").query::<usize>(c).unwrap();
    assert_eq!(
        dbsize(&mut conn),
        primary_keys.len(),
        "no expired key left on the primary"
    );
    assert_eq!(
        dbsize(&mut replica_conn),
        primary_keys.len(),
        "no expired key left on the replica"
    );
    assert_eq!(keys(&mut replica_conn, "*"), primary_keys, "same key set");
    assert!(
        !primary_keys.contains(&"emptied".to_string()),
        "an emptied window leaves no key"
    );
    assert!(primary_keys.len() > 40, "{primary_keys:?}");
    let has_pexpiretime = at_least_7_0();
    let mut total_entries = 0;
    for key in &primary_keys {
        let on_primary = entries(&mut conn, key);
        assert_eq!(entries(&mut replica_conn, key), on_primary, "{key}: members and scores");
        total_entries += on_primary.len();
        for side in [&mut conn, &mut replica_conn] {
            assert!(int(side, &["PTTL", key]) > 0, "{key} has a TTL on both sides");
        }
        if has_pexpiretime {
            let expire_at = int(&mut conn, &["PEXPIRETIME", key]);
            assert_eq!(
                int(&mut replica_conn, &["PEXPIRETIME", key]),
                expire_at,
                "{key}: absolute expiry"
            );
        }
    }
    assert_eq!(entries(&mut conn, "burst").len(), 1500);
    assert!(total_entries > 1500);
    assert_eq!(digest(&mut replica_conn), digest(&mut conn), "DEBUG DIGEST");

    let on_primary = commandstats(&mut conn);
    let on_replica = commandstats(&mut replica_conn);
    assert_eq!(
        calls_of(&on_primary, "xcloak.allow") as usize,
        calls,
        "primary ran every call: {on_primary:?}"
    );
    assert!(
        !on_replica.contains_key("xcloak.allow"),
        "the replica ran XCLOAK.ALLOW: {on_replica:?}"
    );
    for effect in ["zadd", "zremrangebyscore", "pexpireat"] {
        assert!(
            calls_of(&on_replica, effect) > 0,
            "the replica applied {effect}: {on_replica:?}"
        );
    }

    // A client cannot run it on the replica either (it is a write command).
    let refused = redis::cmd("XCLOAK.ALLOW")
        .arg("now:0")
        .arg(1000)
        .arg(10)
        .query::<i64>(&mut replica_conn);
    let error = refused.expect_err("a replica refuses a write command");
    assert_eq!(error.code(), Some("READONLY"), "{error}");
}

fn int(conn: &mut Connection, args: &[&str]) -> i64 {
    let mut cmd = redis::cmd(args[0]);
    for arg in &args[1..] {
        cmd.arg(*arg);
    }
    cmd.query(conn).unwrap_or_else(|e| panic!("{args:?}: {e}"))
}
