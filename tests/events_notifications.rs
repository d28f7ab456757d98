//! Keyspace notifications, identical on both storage forms, on the primary
//! and on its replica: the same events, in the same order, for the same
//! calls (admissions, COST, TIER, rejections, PEEK, refunds, a trim that
//! empties a window, RENAME, MOVE, DEL, an expiry), so a consumer of
//! `__keyevent@*__:*` cannot tell the forms apart. A sorted-set replica
//! fires the core's events for the effects it applies (ZADD, PEXPIREAT...);
//! a compact replica fires the module's for XCLOAK.APPLY; they must agree.
//!
//! Pinned on the primary (docs/design.md): an admission `zadd` (and
//! `expire` when the expiry is re-armed), a trim `zremrangebyscore`, a
//! refund `zrem`, an emptied window `del`, a rejection and a PEEK nothing.
use crate::common;
use common::resp::Raw;
use common::*;

use std::time::Duration;

const T: i64 = 1_700_000_000_000;

fn run(conn: &mut redis::Connection, text: &str) {
    let words: Vec<String> = text
        .split_whitespace()
        .map(|w| {
            w.replace("{T}", &T.to_string())
                .replace("{T+1}", &(T + 1).to_string())
                .replace("{T+70000}", &(T + 70_000).to_string())
        })
        .collect();
    let mut cmd = redis::cmd(&words[0]);
    for word in &words[1..] {
        cmd.arg(word.as_str());
    }
    let _: redis::Value = cmd.query(conn).unwrap_or_else(|e| panic!("{words:?}: {e}"));
}

/// (calls, the events they fire on the primary, as `event key` in db 0
/// unless `@db` says otherwise).
const STEPS: &[(&[&str], &[&str])] = &[
    // A far expiry, so that no later admission re-arms it (whether one does
    // depends on the time between calls: at most every 500 ms).
    (
        &["XCLOAK.ALLOW ev 60000 3 NOW {T}", "PEXPIRE ev 100000000"],
        &["zadd ev", "expire ev", "expire ev"],
    ),
    (&["XCLOAK.ALLOW ev 60000 3 NOW {T} COST 2 DETAILS"], &["zadd ev"]),
    (
        &[
            "XCLOAK.ALLOW ev 60000 3 NOW {T+1}",
            "XCLOAK.ALLOW ev 60000 3 NOW {T+1} STAMP",
            "XCLOAK.PEEK ev 60000 3",
        ],
        &[],
    ),
    (&["XCLOAK.REFUND ev {T}", "XCLOAK.REFUND ev 5"], &["zrem ev"]),
    (&["XCLOAK.ALLOW ev 60000 3 TIER 1000 5 NOW {T+1}"], &["zadd ev"]),
    (
        &["XCLOAK.ALLOW ev 1000 0 NOW {T+70000}"],
        &["zremrangebyscore ev", "del ev"],
    ),
    (
        &["XCLOAK.ALLOW ev2 1000 5 NOW {T} COST 3", "XCLOAK.REFUND ev2 {T} COST 5"],
        &["zadd ev2", "expire ev2", "zrem ev2", "del ev2"],
    ),
    (
        &["XCLOAK.ALLOW ev3 60000 5", "PEXPIRE ev3 100000000", "RENAME ev3 ev4"],
        &[
            "zadd ev3",
            "expire ev3",
            "expire ev3",
            "rename_from ev3",
            "rename_to ev4",
        ],
    ),
    (&["MOVE ev4 1"], &["move_from ev4", "move_to ev4@1"]),
    (
        &["SELECT 1", "XCLOAK.ALLOW ev4 60000 5", "DEL ev4", "SELECT 0"],
        &["zadd ev4@1", "del ev4@1"],
    ),
];

/// Subscribes to every key event of `server` (raw RESP: a client library's
/// subscription object unsubscribes when dropped).
fn subscribe(server: &Server) -> Raw {
    let mut conn = server.client();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("notify-keyspace-events")
        .arg("KEA")
        .query(&mut conn)
        .unwrap();
    let mut sub = Raw::connect(server.port);
    let reply = sub.call(&["PSUBSCRIBE", "__keyevent@*__:*"]);
    assert_eq!(reply.items()[0].text(), "psubscribe");
    sub
}

/// The events on `sub` up to the `end` message, as `event key[@db]`.
fn events_until_end(sub: &mut Raw) -> Vec<String> {
    let mut events = Vec::new();
    loop {
        let message = sub.read().expect("a keyspace event");
        let items = message.items();
        assert_eq!(items[0].text(), "pmessage", "{message:?}");
        let (channel, key) = (items[2].text(), items[3].text());
        let (db, event) = channel.trim_start_matches("__keyevent@").split_once("__:").unwrap();
        if event == "end" {
            return events;
        }
        events.push(if db == "0" {
            format!("{event} {key}")
        } else {
            format!("{event} {key}@{db}")
        });
    }
}

/// The events each step fires, on the primary and on the replica.
fn events_of(config: ServerConfig) -> (Vec<Vec<String>>, Vec<Vec<String>>) {
    let primary = config.clone().arg("repl-diskless-sync-delay", "0").start();
    let replica = config.start();
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(primary.port)
        .query(&mut replica.client())
        .unwrap();
    wait_replicated(&primary, &replica);
    let mut on_primary = subscribe(&primary);
    let mut on_replica = subscribe(&replica);
    let mut conn = primary.client();
    let (mut primary_events, mut replica_events) = (Vec::new(), Vec::new());
    for (calls, _) in STEPS {
        for call in *calls {
            run(&mut conn, call);
        }
        // The end mark: a message on a channel no step fires. PUBLISH is
        // replicated, so the replica's subscriber gets it after the step's
        // effects, in order.
        run(&mut conn, "PUBLISH __keyevent@0__:end -");
        primary_events.push(events_until_end(&mut on_primary));
        replica_events.push(events_until_end(&mut on_replica));
    }
    // A window that expires: the primary's active expiry fires `expired`
    // and sends the replica a DEL.
    run(&mut conn, "XCLOAK.ALLOW short 1 5");
    let gone = eventually(Duration::from_secs(30), || key_type(&mut conn, "short") == "none");
    assert!(gone, "the 1 ms window expired");
    run(&mut conn, "PUBLISH __keyevent@0__:end -");
    primary_events.push(events_until_end(&mut on_primary));
    replica_events.push(events_until_end(&mut on_replica));
    (primary_events, replica_events)
}

#[test]
fn keyspace_events_are_the_same_on_both_forms_on_primaries_and_replicas() {
    let (zset_primary, zset_replica) = events_of(ServerConfig::default());
    let (compact_primary, compact_replica) = events_of(ServerConfig::compact());
    for (i, (_, expected)) in STEPS.iter().enumerate() {
        assert_eq!(
            zset_primary[i], *expected,
            "sorted-set primary, step {i}: {:?}",
            STEPS[i].0
        );
        assert_eq!(
            compact_primary[i], *expected,
            "compact primary, step {i}: {:?}",
            STEPS[i].0
        );
        assert_eq!(
            compact_replica[i], zset_replica[i],
            "replicas, step {i}: {:?}",
            STEPS[i].0
        );
    }
    let expiry = STEPS.len();
    assert_eq!(zset_primary[expiry], ["zadd short", "expire short", "expired short"]);
    assert_eq!(compact_primary[expiry], zset_primary[expiry]);
    assert_eq!(compact_replica[expiry], zset_replica[expiry]);
    // The replica applies what the primary did: the same events, but for
    // an expiry, which it learns as a DEL.
    assert_eq!(
        zset_replica[..expiry],
        zset_primary[..expiry],
        "a sorted-set replica fires the primary's events"
    );
    assert_eq!(zset_replica[expiry], ["zadd short", "expire short", "del short"]);
}
