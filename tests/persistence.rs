//! Persistence: AOF (`appendfsync always`), AOF after BGREWRITEAOF, and RDB.
//!
//! A restart must bring back every sorted set exactly (members and scores):
//! the AOF holds the effects (ZREMRANGEBYSCORE / ZADD with explicit members /
//! PEXPIREAT), never XCLOAK.ALLOW, so nothing is re-run on a later clock. After
//! the restart the limits still hold: a full window stays full, and new
//! admissions at an unchanged NOW never collide with members written before.
//!
//! Windows are long (the key's TTL is server time + window + 1000 ms), so no key
//! expires while a test runs.
use crate::common;
use std::collections::BTreeMap;
use std::path::Path;

use common::*;
use redis::Connection;

/// Window of the keys driven by the server clock: nothing expires mid-test.
const LONG: i64 = 3_600_000;
/// Window of the keys driven by NOW (steps are chosen around it).
const NOW_WINDOW: i64 = 600_000;
const BASE_NOW: i64 = 1_700_000_000_000;
const CLOCK_KEYS: usize = 20;
const CLOCK_LIMIT: i64 = 60;
const NOW_KEYS: usize = 20;
const NOW_LIMIT: i64 = 25;
const BURST_LIMIT: i64 = 5_000;

/// What the workload left behind, for the checks after the restart.
struct Written {
    /// NOW-driven keys: their last NOW (each window was filled there).
    last_now: Vec<(String, i64)>,
    calls: usize,
}

/// A few thousand calls: server-clock keys (pipelined, so many land in the
/// same millisecond), NOW-driven keys with trims (steps of 0, 1, window-1,
/// window, window+1 and others; COST 1..3), and one key with 1,600 entries
/// in one millisecond (past the compact member form). Every NOW-driven window
/// ends full at its last NOW.
fn workload(conn: &mut Connection) -> Written {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut calls = 0;

    // Server clock: 1,200 calls in pipelines of 40.
    for _ in 0..30 {
        let mut pipe = redis::pipe();
        for _ in 0..40 {
            let key = format!("clock:{}", rng.below(CLOCK_KEYS as u64));
            pipe.cmd("XCLOAK.ALLOW").arg(key).arg(LONG).arg(CLOCK_LIMIT);
        }
        let _: Vec<i64> = pipe.query(conn).unwrap();
        calls += 40;
    }

    // NOW-driven: 1,500 calls with trims, rejections, same-ms admissions.
    let mut now: Vec<i64> = vec![BASE_NOW; NOW_KEYS];
    let steps = [0, 0, 0, 1, NOW_WINDOW - 1, NOW_WINDOW, NOW_WINDOW + 1, 12_345, 0];
    for _ in 0..1_500 {
        let i = rng.below(NOW_KEYS as u64) as usize;
        now[i] += steps[rng.below(steps.len() as u64) as usize];
        let cost = 1 + rng.below(3) as i64;
        let _: i64 = redis::cmd("XCLOAK.ALLOW")
            .arg(format!("now:{i}"))
            .arg(NOW_WINDOW)
            .arg(NOW_LIMIT)
            .arg("COST")
            .arg(cost)
            .arg("NOW")
            .arg(now[i])
            .query(conn)
            .unwrap();
        calls += 1;
    }
    // Fill each NOW-driven window at its last NOW.
    let mut last_now = Vec::new();
    for (i, &at) in now.iter().enumerate() {
        let key = format!("now:{i}");
        for _ in 0..=NOW_LIMIT {
            calls += 1;
            if allow_at(conn, &key, NOW_WINDOW, NOW_LIMIT, at) == 0 {
                break;
            }
        }
        last_now.push((key, at));
    }

    // 1,600 entries at one millisecond: members k >= 1000 use the long form.
    for _ in 0..15 {
        let admitted: i64 = redis::cmd("XCLOAK.ALLOW")
            .arg("burst")
            .arg(LONG)
            .arg(BURST_LIMIT)
            .arg("COST")
            .arg(100)
            .arg("NOW")
            .arg(BASE_NOW)
            .query(conn)
            .unwrap();
        assert_eq!(admitted, 1);
        calls += 1;
    }
    for _ in 0..100 {
        assert_eq!(allow_at(conn, "burst", LONG, BURST_LIMIT, BASE_NOW), 1);
        calls += 1;
    }
    Written { last_now, calls }
}

type Snapshot = BTreeMap<String, Vec<(String, f64)>>;

/// Every key's entries, in order.
fn snapshot(conn: &mut Connection) -> Snapshot {
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(conn).unwrap();
    keys.into_iter()
        .map(|k| {
            let e = entries(conn, &k);
            (k, e)
        })
        .collect()
}

/// Absolute expiry of every key (7.0+: PEXPIRETIME); on 6.2, which lacks it,
/// the remaining TTL, checked against its bounds by the caller.
fn expiries(conn: &mut Connection, keys: &Snapshot) -> BTreeMap<String, i64> {
    let command = if at_least_7_0() { "PEXPIRETIME" } else { "PTTL" };
    keys.keys()
        .map(|k| (k.clone(), redis::cmd(command).arg(k).query(conn).unwrap()))
        .collect()
}

fn check_expiries(before: &BTreeMap<String, i64>, after: &BTreeMap<String, i64>) {
    if at_least_7_0() {
        assert_eq!(
            before, after,
            "absolute expiry times (PEXPIREAT was logged) survive the restart"
        );
    } else {
        for (key, ttl) in after {
            assert!(*ttl > 0 && *ttl <= LONG + 1_000, "{key}: PTTL {ttl} after the restart");
        }
    }
}

/// No file of the server's directory contains the command: only effects were logged.
fn assert_no_command_logged(dir: &Path) {
    fn walk(path: &Path, found: &mut Vec<String>) {
        if path.is_dir() {
            for entry in std::fs::read_dir(path).unwrap() {
                walk(&entry.unwrap().path(), found);
            }
        } else if path.extension().is_some_and(|e| e != "log") {
            let bytes = std::fs::read(path).unwrap_or_default();
            if bytes.windows(6).any(|w| w.eq_ignore_ascii_case(b"XCLOAK")) {
                found.push(path.display().to_string());
            }
        }
    }
    let mut found = Vec::new();
    walk(dir, &mut found);
    assert!(found.is_empty(), "XCLOAK commands were persisted in {found:?}");
}

fn aof_files_exist(dir: &Path) -> bool {
    dir.join("appendonly.aof").exists() || dir.join("appendonlydir").is_dir()
}

/// After a restart: the data came back unchanged, no call was re-run, full
/// windows stay full, and new admissions at an old NOW add exactly as many
/// entries as admitted, overwriting nothing.
fn check_after_restart(server: &Server, before: &Snapshot, expiry_before: &BTreeMap<String, i64>, written: &Written) {
    let mut conn = server.client();
    let after = snapshot(&mut conn);
    assert_eq!(before.len(), after.len(), "same keys after the restart");
    for (key, entries) in before {
        assert_eq!(
            Some(entries),
            after.get(key),
            "{key}: members and scores identical after the restart"
        );
    }
    check_expiries(expiry_before, &expiries(&mut conn, &after));
    // Loading re-applied effects: the module's handler never ran.
    assert_eq!(
        info_field(&mut conn, "xcloak", "xcloak_admitted").as_deref(),
        Some("0"),
        "no XCLOAK.ALLOW re-run on load"
    );
    assert_eq!(
        info_field(&mut conn, "xcloak", "xcloak_rejected").as_deref(),
        Some("0"),
        "no XCLOAK.ALLOW re-run on load"
    );

    // A full window stays full.
    for (key, at) in &written.last_now {
        assert_eq!(
            allow_at(&mut conn, key, NOW_WINDOW, NOW_LIMIT, *at),
            0,
            "{key} full at NOW {at} before the restart"
        );
    }
    for i in 0..CLOCK_KEYS {
        let key = format!("clock:{i}");
        if before[&key].len() as i64 == CLOCK_LIMIT {
            let admitted: i64 = redis::cmd("XCLOAK.ALLOW")
                .arg(&key)
                .arg(LONG)
                .arg(CLOCK_LIMIT)
                .query(&mut conn)
                .unwrap();
            assert_eq!(admitted, 0, "{key} full before the restart");
        }
    }
    let card = |conn: &mut Connection, key: &str| -> usize { redis::cmd("ZCARD").arg(key).query(conn).unwrap() };
    for (key, _) in &written.last_now {
        assert_eq!(
            card(&mut conn, key),
            before[key].len(),
            "{key}: a rejection adds nothing"
        );
    }

    // New admissions at the same NOW never collide with earlier members.
    for (key, at) in written.last_now.iter().take(5) {
        for _ in 0..10 {
            assert_eq!(allow_at(&mut conn, key, NOW_WINDOW, NOW_LIMIT + 10, *at), 1);
        }
        assert_eq!(
            card(&mut conn, key),
            before[key].len() + 10,
            "{key}: 10 admissions at {at}, 10 new entries"
        );
        let now_entries = entries(&mut conn, key);
        for entry in &before[key] {
            assert!(now_entries.contains(entry), "{key}: {entry:?} kept");
        }
    }
    for cost in [1, 1, 1, 250, 250] {
        let admitted: i64 = redis::cmd("XCLOAK.ALLOW")
            .arg("burst")
            .arg(LONG)
            .arg(BURST_LIMIT)
            .arg("COST")
            .arg(cost)
            .arg("NOW")
            .arg(BASE_NOW)
            .query(&mut conn)
            .unwrap();
        assert_eq!(admitted, 1);
    }
    assert_eq!(
        card(&mut conn, "burst"),
        before["burst"].len() + 503,
        "burst: 503 new entries at the same NOW"
    );
    let burst = entries(&mut conn, "burst");
    assert!(burst.iter().all(|(_, score)| *score == BASE_NOW as f64));
    for entry in &before["burst"] {
        assert!(burst.contains(entry), "burst: {entry:?} kept");
    }
}

/// Runs the workload and returns what a restart must reproduce.
fn fill(server: &Server) -> (Snapshot, BTreeMap<String, i64>, Written) {
    let mut conn = server.client();
    let written = workload(&mut conn);
    assert!(written.calls >= 2_500, "a few thousand calls ({})", written.calls);
    let before = snapshot(&mut conn);
    assert_eq!(before.len(), CLOCK_KEYS + NOW_KEYS + 1);
    assert_eq!(before["burst"].len(), 1_600);
    assert!(
        before["burst"].iter().any(|(m, _)| m.contains(':')) && before["burst"].iter().any(|(m, _)| !m.contains(':')),
        "both member forms present"
    );
    let expiry = expiries(&mut conn, &before);
    // A re-run on a later clock would show: let the server's clock move on.
    server.with(|c| wait_server_clock(c, 5));
    (before, expiry, written)
}

fn aof_server() -> Server {
    ServerConfig::default()
        .arg("appendonly", "yes")
        .arg("appendfsync", "always")
        .start()
}

fn wait_rewrite_done(server: &Server) {
    let mut conn = server.client();
    let conn = &mut conn;
    let done = eventually(std::time::Duration::from_secs(30), || {
        info_field(conn, "persistence", "aof_rewrite_in_progress").as_deref() == Some("0")
            && info_field(conn, "persistence", "aof_rewrite_scheduled").as_deref() == Some("0")
    });
    assert!(done, "BGREWRITEAOF did not finish:\n{}", server.log());
    let status = info_field(conn, "persistence", "aof_last_bgrewrite_status");
    assert_eq!(
        status.as_deref(),
        Some("ok"),
        "BGREWRITEAOF failed in {} (exists: {}, files: {:?}):\n{}",
        server.dir.display(),
        server.dir.exists(),
        std::fs::read_dir(&server.dir).map(|d| d.map(|e| e.unwrap().file_name()).collect::<Vec<_>>()),
        server.log()
    );
}

#[test]
fn aof_always_restores_every_window_exactly() {
    let mut server = aof_server();
    // The initial rewrite (7.0+ creates the base file in the background) must not race the load.
    wait_rewrite_done(&server);
    let (before, expiry, written) = fill(&server);
    assert_no_command_logged(&server.dir);
    server.restart();
    assert!(aof_files_exist(&server.dir));
    let log = server.log();
    assert!(
        log.to_lowercase().contains("append only file"),
        "loaded from the AOF:\n{log}"
    );
    check_after_restart(&server, &before, &expiry, &written);
}

#[test]
fn aof_after_bgrewriteaof_restores_every_window_exactly() {
    let mut server = aof_server();
    wait_rewrite_done(&server);
    let (before, expiry, written) = fill(&server);
    {
        let mut conn = server.client();
        let _: String = redis::cmd("BGREWRITEAOF").query(&mut conn).unwrap();
        wait_rewrite_done(&server);
        // A few effects after the rewrite go to the new incremental file.
        assert_eq!(allow_at(&mut conn, "after-rewrite", LONG, 5, BASE_NOW), 1);
    }
    let mut before = before;
    let mut expiry = expiry;
    before.insert("after-rewrite".into(), server.with(|c| entries(c, "after-rewrite")));
    expiry.insert(
        "after-rewrite".into(),
        server.with(|c| expiries(c, &before)["after-rewrite"]),
    );
    assert_no_command_logged(&server.dir);
    server.with(|c| wait_server_clock(c, 5));
    server.restart();
    check_after_restart(&server, &before, &expiry, &written);
}

#[test]
fn rdb_snapshot_restores_every_window_exactly() {
    let mut server = Server::start();
    let (before, expiry, written) = fill(&server);
    let _: String = server.with(|c| redis::cmd("SAVE").query(c).unwrap());
    assert!(server.dir.join("dump.rdb").exists());
    assert!(
        !aof_files_exist(&server.dir),
        "appendonly no: the snapshot is the only source"
    );
    server.restart();
    assert!(
        server.log().contains("DB loaded from disk"),
        "loaded from the RDB:\n{}",
        server.log()
    );
    check_after_restart(&server, &before, &expiry, &written);
}
