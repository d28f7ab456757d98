//! XCLOAK.REFUND and `STAMP` (issue 13), through real servers, on both
//! storage forms: the count-only-failures login under a burst of parallel
//! attempts, replication as effects, the expiry left alone, keyspace events,
//! and the `INFO xcloak` counter. (The call-by-call semantics against a model
//! are in tests/model.rs, the Lua fallback in tests/lua_fallback.rs, the bad
//! input in tests/grammar.rs.)
//!
//! What would fail: a refund that is not exact under concurrency (removing
//! another admission's entry of another millisecond, or more than asked), a
//! login flow that lets the window hold more than its limit, a refund
//! replicated as the command (a replica running XCLOAK.REFUND) or not at all,
//! a refund that trims or moves the expiry, an emptied window left as a key,
//! a missing `zrem`/`del` event, a counter that does not count.
use crate::common;
use common::*;

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Barrier, Mutex};
use std::thread;
use std::time::Duration;

use redis::Connection;

const ATTEMPTS: usize = 100;
const LIMIT: i64 = 5;
const WINDOW_MS: i64 = 600_000;

/// Live entries of the window, whatever its form: a PEEK with a limit far
/// above them reports `remaining = limit - live`.
fn live(conn: &mut Connection, key: &str) -> i64 {
    const HUGE: i64 = 1_000_000;
    let fields: Vec<i64> = redis::cmd("XCLOAK.PEEK")
        .arg(key)
        .arg(WINDOW_MS)
        .arg(HUGE)
        .query(conn)
        .unwrap();
    HUGE - fields[2]
}

/// 100 parallel login attempts on one account, limit 5: each reserves an
/// attempt with `ALLOW ... STAMP` before checking its (simulated) password,
/// and gives it back with REFUND when the password is right. Failed attempts
/// are all that count: the window never holds more than 5 entries (a monitor
/// samples it throughout), and at the end it holds exactly the stamps of the
/// admitted failures; every refund removed exactly its one entry. (How many
/// get in depends on how the refunds interleave: not asserted.) Then, one
/// after another, ten successes leave all five attempts for failures.
fn login_race(server: &Server, form: &str) {
    let key = format!("rl:login:{form}:alice");
    let mut conns: Vec<Connection> = (0..ATTEMPTS).map(|_| server.client()).collect();
    let barrier = Barrier::new(ATTEMPTS);
    let admitted_failures = Mutex::new(Vec::new());
    let (refunds, rejected) = (AtomicI64::new(0), AtomicI64::new(0));
    let done = AtomicBool::new(false);
    let mut monitor_conn = server.client();
    let most_seen = thread::scope(|scope| {
        let monitor = scope.spawn(|| {
            let mut most = 0;
            while !done.load(Ordering::SeqCst) {
                most = most.max(live(&mut monitor_conn, &key));
            }
            most
        });
        let attempts: Vec<_> = conns
            .iter_mut()
            .enumerate()
            .map(|(i, conn)| {
                let (barrier, key, admitted_failures, refunds, rejected) =
                    (&barrier, &key, &admitted_failures, &refunds, &rejected);
                scope.spawn(move || {
                    barrier.wait();
                    let stamp: i64 = redis::cmd("XCLOAK.ALLOW")
                        .arg(key)
                        .arg(WINDOW_MS)
                        .arg(LIMIT)
                        .arg("STAMP")
                        .query(conn)
                        .unwrap();
                    if stamp < 0 {
                        rejected.fetch_add(1, Ordering::SeqCst);
                        return;
                    }
                    let password_is_right = i % 3 != 0; // two in three succeed
                    if password_is_right {
                        let removed: i64 = redis::cmd("XCLOAK.REFUND").arg(key).arg(stamp).query(conn).unwrap();
                        assert_eq!(removed, 1, "attempt {i}: the refund of stamp {stamp}");
                        refunds.fetch_add(1, Ordering::SeqCst);
                    } else {
                        admitted_failures.lock().unwrap().push(stamp);
                    }
                })
            })
            .collect();
        // Every attempt ends (or panics) before the monitor is told to stop.
        let outcomes: Vec<_> = attempts.into_iter().map(|attempt| attempt.join()).collect();
        done.store(true, Ordering::SeqCst);
        let most = monitor.join().unwrap();
        for outcome in outcomes {
            outcome.unwrap();
        }
        most
    });
    let mut conn = server.client();
    assert_eq!(key_type(&mut conn, &key), form);
    let mut failures = admitted_failures.into_inner().unwrap();
    failures.sort_unstable();
    let (refunds, rejected) = (refunds.into_inner(), rejected.into_inner());
    assert!(most_seen <= LIMIT, "{form}: the window held {most_seen} entries");
    assert!(
        failures.len() as i64 <= LIMIT,
        "{form}: {} failures admitted",
        failures.len()
    );
    assert_eq!(
        stored_stamps(&mut conn, &key),
        failures,
        "{form}: the window holds exactly the admitted failures"
    );
    assert_eq!(failures.len() as i64 + refunds + rejected, ATTEMPTS as i64);
    let _: () = redis::cmd("DEL").arg(&key).query(&mut conn).unwrap();

    // One after another: successes never burn an attempt, so ten of them
    // leave all five for failures, and only the sixth failure is refused.
    let attempt = |conn: &mut Connection| -> i64 {
        redis::cmd("XCLOAK.ALLOW")
            .arg(&key)
            .arg(WINDOW_MS)
            .arg(LIMIT)
            .arg("STAMP")
            .query(conn)
            .unwrap()
    };
    for i in 0..10 {
        let stamp = attempt(&mut conn);
        assert!(stamp >= 0, "{form}: success {i} was refused");
        let removed: i64 = redis::cmd("XCLOAK.REFUND")
            .arg(&key)
            .arg(stamp)
            .query(&mut conn)
            .unwrap();
        assert_eq!(removed, 1, "{form}: success {i}");
    }
    let outcomes: Vec<bool> = (0..6).map(|_| attempt(&mut conn) >= 0).collect();
    assert_eq!(
        outcomes,
        [true, true, true, true, true, false],
        "{form}: five failures, then locked"
    );
    let _: () = redis::cmd("DEL").arg(&key).query(&mut conn).unwrap();
}

#[test]
fn count_only_failures_under_a_burst_of_logins() {
    login_race(&Server::start(), "zset");
    login_race(&ServerConfig::compact().start(), "xcloaklog");
}

/// `cmdstat_<name>` names of INFO commandstats.
fn commands_run(conn: &mut Connection) -> Vec<String> {
    let text: String = redis::cmd("INFO").arg("commandstats").query(conn).unwrap();
    text.lines()
        .filter_map(|l| l.strip_prefix("cmdstat_"))
        .filter_map(|l| l.split_once(':'))
        .map(|(n, _)| n.to_lowercase())
        .collect()
}

/// On a primary/replica pair of each form: admissions with STAMP, refunds
/// (partial, whole, doubled, unknown, one emptying a key), then the replica
/// holds the same windows (DUMP bytes, and for sorted sets every member), the
/// same expiries, no emptied key, and never ran XCLOAK.ALLOW or XCLOAK.REFUND:
/// a sorted set gets `ZREM` of the exact members, a compact window
/// `XCLOAK.APPLY` with the removal.
#[test]
fn refunds_replicate_as_effects_on_both_forms() {
    for (config, form) in [
        (ServerConfig::default(), "zset"),
        (ServerConfig::compact(), "xcloaklog"),
    ] {
        let primary = config.clone().arg("repl-diskless-sync-delay", "0").start();
        let replica = config.start();
        let (mut conn, mut replica_conn) = (primary.client(), replica.client());
        let _: String = redis::cmd("REPLICAOF")
            .arg("127.0.0.1")
            .arg(primary.port)
            .query(&mut replica_conn)
            .unwrap();
        // Linked before the writes, so they reach the replica as commands, not in the initial RDB.
        let linked = eventually(Duration::from_secs(30), || {
            info_field(&mut replica_conn, "replication", "master_link_status").as_deref() == Some("up")
        });
        assert!(linked, "{form}: replica never linked:\n{}", replica.log());
        let now = 1_732_941_234_567i64;
        let allow = |conn: &mut Connection, key: &str, at: i64, cost: i64| -> i64 {
            redis::cmd("XCLOAK.ALLOW")
                .arg(key)
                .arg(WINDOW_MS)
                .arg(100)
                .arg("NOW")
                .arg(at)
                .arg("COST")
                .arg(cost)
                .arg("STAMP")
                .query(conn)
                .unwrap()
        };
        let refund = |conn: &mut Connection, key: &str, stamp: i64, cost: i64| -> i64 {
            redis::cmd("XCLOAK.REFUND")
                .arg(key)
                .arg(stamp)
                .arg("COST")
                .arg(cost)
                .query(conn)
                .unwrap()
        };
        for k in 0..4 {
            let key = format!("r:{k}");
            for i in 0..30 {
                assert_eq!(allow(&mut conn, &key, now + i / 3, 1 + i % 4), now + i / 3);
            }
            assert_eq!(refund(&mut conn, &key, now + 2, 2), 2, "partial");
            assert_eq!(
                refund(&mut conn, &key, now + 9, 1000),
                7,
                "the whole millisecond (4+1+2 entries)"
            );
            assert_eq!(refund(&mut conn, &key, now + 9, 1), 0, "doubled");
            assert_eq!(refund(&mut conn, &key, now - 5, 1), 0, "unknown");
        }
        assert_eq!(allow(&mut conn, "r:gone", now, 3), now);
        assert_eq!(refund(&mut conn, "r:gone", now, 3), 3);
        assert_eq!(
            key_type(&mut conn, "r:gone"),
            "none",
            "{form}: an emptied window leaves no key"
        );
        wait_replicated(&primary, &replica);
        for k in 0..4 {
            let key = format!("r:{k}");
            assert_eq!(key_type(&mut replica_conn, &key), form);
            let dump = |c: &mut Connection| -> Vec<u8> { redis::cmd("DUMP").arg(&key).query(c).unwrap() };
            assert_eq!(
                dump(&mut conn),
                dump(&mut replica_conn),
                "{form} {key}: the same window"
            );
            if form == "zset" {
                assert_eq!(
                    entries(&mut conn, &key),
                    entries(&mut replica_conn, &key),
                    "{key}: the same members"
                );
            }
            if at_least_7_0() {
                let expire_at = |c: &mut Connection| -> i64 { redis::cmd("PEXPIRETIME").arg(&key).query(c).unwrap() };
                assert_eq!(
                    expire_at(&mut conn),
                    expire_at(&mut replica_conn),
                    "{form} {key}: the same expiry"
                );
            }
        }
        assert_eq!(
            key_type(&mut replica_conn, "r:gone"),
            "none",
            "{form}: the replica deleted the emptied window too"
        );
        let ran = commands_run(&mut replica_conn);
        for command in ["xcloak.allow", "xcloak.refund"] {
            assert!(
                !ran.contains(&command.to_string()),
                "{form}: the replica ran {command}: {ran:?}"
            );
        }
        let effect = if form == "zset" { "zrem" } else { "xcloak.apply" };
        assert!(
            ran.contains(&effect.to_string()),
            "{form}: the replica got no {effect}: {ran:?}"
        );
    }
}

/// A refund trims nothing, never extends or shortens the expiry, fires `zrem`
/// (and `del` when it empties the window), and `INFO xcloak` counts the
/// entries it removed.
#[test]
fn a_refund_leaves_the_expiry_and_the_rest_alone() {
    for config in [ServerConfig::default(), ServerConfig::compact()] {
        let server = config.arg("notify-keyspace-events", "KEA").start();
        let mut conn = server.client();
        let now = 1_732_941_234_567i64;
        for (at, cost) in [(now, 2), (now + 10, 3), (now + 20, 1)] {
            let _: i64 = redis::cmd("XCLOAK.ALLOW")
                .arg("k")
                .arg(1000)
                .arg(10)
                .arg("NOW")
                .arg(at)
                .arg("COST")
                .arg(cost)
                .query(&mut conn)
                .unwrap();
        }
        let _: i64 = redis::cmd("PEXPIREAT")
            .arg("k")
            .arg(4_000_000_000_000i64)
            .query(&mut conn)
            .unwrap();
        let mut events = server.client();
        let mut pubsub = events.as_pubsub();
        pubsub.subscribe("__keyspace@0__:k").unwrap();
        pubsub.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        // The entries from `now` are expired for any window ending after now + 1000:
        // a refund still finds them (no trim), and removes nothing else.
        let refund = |conn: &mut Connection, stamp: i64, cost: i64| -> i64 {
            redis::cmd("XCLOAK.REFUND")
                .arg("k")
                .arg(stamp)
                .arg("COST")
                .arg(cost)
                .query(conn)
                .unwrap()
        };
        let refunded_before: i64 = info_field(&mut conn, "xcloak", "xcloak_refunded")
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(refund(&mut conn, now + 10, 2), 2);
        assert_eq!(stored_stamps(&mut conn, "k"), [now, now, now + 10, now + 20]);
        let pttl: i64 = redis::cmd("PTTL").arg("k").query(&mut conn).unwrap();
        assert!(pttl > 2_000_000_000_000, "the expiry is untouched: PTTL {pttl}");
        if at_least_7_0() {
            let expire_at: i64 = redis::cmd("PEXPIRETIME").arg("k").query(&mut conn).unwrap();
            assert_eq!(expire_at, 4_000_000_000_000, "the expiry is untouched");
        }
        for (stamp, cost) in [(now, 5), (now + 10, 1), (now + 20, 1)] {
            refund(&mut conn, stamp, cost);
        }
        assert_eq!(key_type(&mut conn, "k"), "none");
        let refunded: i64 = info_field(&mut conn, "xcloak", "xcloak_refunded")
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(refunded - refunded_before, 6, "INFO xcloak counts refunded entries");
        let mut seen = Vec::new();
        while seen.len() < 5 {
            let message = pubsub.get_message().expect("a keyspace event");
            seen.push(message.get_payload::<String>().unwrap());
        }
        assert_eq!(seen, ["zrem", "zrem", "zrem", "zrem", "del"], "the events of k");
    }
}
