//! XCLOAK.ALLOW/PEEK in a real Redis Cluster (3 primaries, 1 replica each,
//! built with `redis-cli --cluster create`, the module on every node):
//! routing by key with the `redis` crate's cluster client and `redis-cli -c`,
//! hash tags, and live resharding under load.
use crate::common;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::cluster::*;
use common::*;
use redis::cluster::ClusterConnection;
use redis::RedisResult;

/// Long enough that no key expires during a test (TTL = server time + window + 1 s).
const LONG: i64 = 3_600_000;

fn allow(conn: &mut ClusterConnection, key: &str, limit: i64) -> RedisResult<i64> {
    redis::cmd("XCLOAK.ALLOW").arg(key).arg(LONG).arg(limit).query(conn)
}

fn peek(conn: &mut ClusterConnection, key: &str, limit: i64) -> RedisResult<Vec<i64>> {
    redis::cmd("XCLOAK.PEEK").arg(key).arg(LONG).arg(limit).query(conn)
}

/// The slot of a key, computed by the client library (CRC16, hash tags).
fn slot(key: &str) -> u16 {
    redis::cluster_routing::get_slot(key.as_bytes())
}

/// Keys held by one node, read with a plain (non-cluster) connection.
fn local_keys(node: &Server) -> BTreeSet<String> {
    node.with(|c| redis::cmd("KEYS").arg("*").query::<Vec<String>>(c).unwrap())
        .into_iter()
        .collect()
}

#[test]
fn keys_on_every_shard_each_admit_exactly_their_limit() {
    let cluster = Cluster::start(3, 1);
    let mut conn = cluster.client();
    const KEYS: usize = 300;
    const LIMIT: i64 = 5;
    let keys: Vec<String> = (0..KEYS).map(|i| format!("user:{i}")).collect();
    for key in &keys {
        let replies: Vec<i64> = (0..LIMIT + 3).map(|_| allow(&mut conn, key, LIMIT).unwrap()).collect();
        assert_eq!(replies.iter().sum::<i64>(), LIMIT, "{key}: {replies:?}");
        assert_eq!(
            &replies[..LIMIT as usize],
            &[1; LIMIT as usize],
            "{key}: the first {LIMIT} admitted"
        );
        // PEEK is routed by key too: [allowed, limit, remaining, retry_after, reset_after].
        let details = peek(&mut conn, key, LIMIT).unwrap();
        assert_eq!(&details[..3], &[0, LIMIT, 0], "{key}: PEEK sees the full window");
        let card: i64 = redis::cmd("ZCARD").arg(key).query(&mut conn).unwrap();
        assert_eq!(card, LIMIT);
    }

    // Each key lives on the primary serving its slot, and only there; every
    // primary got a share.
    let primaries = cluster.primary_indexes();
    assert_eq!(primaries.len(), 3);
    let mut expected: BTreeMap<usize, BTreeSet<String>> = primaries.iter().map(|&p| (p, BTreeSet::new())).collect();
    for key in &keys {
        let owner = cluster.owner_of_slot(slot(key));
        expected
            .get_mut(&owner)
            .expect("owner is a primary")
            .insert(key.clone());
    }
    for (&p, owned) in &expected {
        assert!(
            owned.len() > 50,
            "primary {} serves {} of {KEYS} keys",
            cluster.nodes[p].port,
            owned.len()
        );
        assert_eq!(
            &local_keys(&cluster.nodes[p]),
            owned,
            "primary {} holds exactly the keys of its slots",
            cluster.nodes[p].port
        );
    }
    // Every other node replicates one primary, each primary has one replica,
    // and once a replica has applied its primary's stream it holds exactly
    // that primary's keys. (Not WAIT on a fresh connection: that returns at
    // once, before the replica has caught up.)
    let replicas: Vec<(usize, usize)> = (0..cluster.nodes.len())
        .filter(|i| !primaries.contains(i))
        .map(|r| (r, cluster.primary_of(r)))
        .collect();
    let followed: BTreeSet<usize> = replicas.iter().map(|&(_, p)| p).collect();
    assert_eq!(replicas.len(), primaries.len());
    assert_eq!(
        followed,
        primaries.iter().copied().collect::<BTreeSet<_>>(),
        "each primary has its own replica"
    );
    for &(r, p) in &replicas {
        let replica = &cluster.nodes[r];
        wait_replicated(&cluster.nodes[p], replica);
        let held = local_keys(replica);
        let owned = &expected[&p];
        assert!(
            held == *owned,
            "replica {} mirrors its primary {}: {} keys missing (e.g. {:?}), {} extra (e.g. {:?})",
            replica.port,
            cluster.nodes[p].port,
            owned.difference(&held).count(),
            owned.difference(&held).take(3).collect::<Vec<_>>(),
            held.difference(owned).count(),
            held.difference(owned).take(3).collect::<Vec<_>>()
        );
    }
}

#[test]
fn hash_tagged_keys_share_a_slot_and_redis_cli_follows_redirects() {
    let cluster = Cluster::start(3, 1);
    // A tenant whose slot is served by another node than the one redis-cli
    // connects to, so the call must follow a MOVED redirect.
    let tenant = (0..)
        .map(|i| format!("tenant{i}"))
        .find(|t| {
            let owner = cluster.owner_of_slot(cluster.keyslot(t));
            cluster.nodes[owner].port != cluster.nodes[0].port
        })
        .unwrap();
    let keys: Vec<String> = ["login", "api", "reset"]
        .iter()
        .map(|s| format!("{{{tenant}}}:{s}"))
        .collect();
    let tenant_slot = cluster.keyslot(&tenant);
    for key in &keys {
        assert_eq!(cluster.keyslot(key), tenant_slot, "{key} hashes on its tag");
        assert_eq!(slot(key), tenant_slot, "the client library agrees on {key}'s slot");
    }

    // redis-cli -c, connected to a node that does not serve the slot.
    let window = LONG.to_string();
    for key in &keys {
        let replies: Vec<String> = (0..4)
            .map(|_| cluster.cli(&["XCLOAK.ALLOW", key, &window, "3"]))
            .collect();
        assert_eq!(replies, ["1", "1", "1", "0"], "{key} via redis-cli -c");
        let details = cluster.cli(&["XCLOAK.PEEK", key, &window, "3"]);
        assert_eq!(
            details.lines().take(3).collect::<Vec<_>>(),
            ["0", "3", "0"],
            "{key}: PEEK via redis-cli -c"
        );
    }

    // The cluster client sees the same windows, each separate.
    let mut conn = cluster.client();
    for key in &keys {
        assert_eq!(allow(&mut conn, key, 3).unwrap(), 0, "{key} is full");
        assert_eq!(
            allow(&mut conn, key, 4).unwrap(),
            1,
            "{key}: a higher limit admits one more"
        );
    }
    // All of them together on the one node serving the tag's slot.
    let owner = &cluster.nodes[cluster.owner_of_slot(tenant_slot)];
    let held = local_keys(owner);
    for key in &keys {
        assert!(held.contains(key), "{key} on the node serving slot {tenant_slot}");
        let card: i64 = owner.with(|c| redis::cmd("ZCARD").arg(key).query(c).unwrap());
        assert_eq!(card, 4);
    }
    // A multi-key transaction over one tenant's keys works (same slot).
    let total: Vec<i64> = {
        let mut pipe = redis::pipe();
        pipe.atomic();
        for key in &keys {
            pipe.cmd("ZCARD").arg(key);
        }
        owner.with(|c| pipe.query(c).unwrap())
    };
    assert_eq!(total, [4, 4, 4]);
}

/// Per-key counts from one client thread.
#[derive(Default)]
struct Tally {
    admitted: BTreeMap<String, i64>,
    calls: u64,
}

#[test]
fn live_resharding_keeps_every_window_and_over_admits_nothing() {
    // Both storage forms move: the nodes create compact windows, except for
    // the keys created while `xcloak.storage` is `zset` (7.0+; 6.2 has no
    // module configs and moves compact windows only).
    let cluster = Cluster::start_with(ServerConfig::compact(), 3, 1);
    let mut conn = cluster.client();
    let first = cluster.owner_of_slot(0);
    let second = cluster.owner_of_slot(16383);
    let third = *cluster
        .primary_indexes()
        .iter()
        .find(|&&p| p != first && p != second)
        .unwrap();
    let (first_id, second_id, third_id) = (cluster.node_id(first), cluster.node_id(second), cluster.node_id(third));

    // Keys in the slots that will move: `--cluster reshard` takes a source's
    // lowest slots first. 100 slots out of `first` (0..99), then 100 out of
    // `second`'s lowest (the same 0..99, now its lowest) to `third`.
    const MOVED_SLOTS: u16 = 100;
    let moving: Vec<String> = (0..)
        .map(|i| format!("r:{i}"))
        .filter(|k| slot(k) < MOVED_SLOTS)
        .take(120)
        .collect();
    let staying: Vec<String> = (0..)
        .map(|i| format!("s:{i}"))
        .filter(|k| slot(k) >= 2 * MOVED_SLOTS)
        .take(30)
        .collect();
    // Full keys: every call to them during the move must be rejected.
    const FULL_LIMIT: i64 = 8;
    // Busy keys: admissions keep landing while their slot moves.
    const BUSY_LIMIT: i64 = 400;
    let is_full = |key: &str| {
        key.trim_start_matches(|c: char| !c.is_ascii_digit())
            .parse::<usize>()
            .unwrap()
            % 2
            == 0
    };
    let limit_of = |key: &str| if is_full(key) { FULL_LIMIT } else { BUSY_LIMIT };
    let all: Vec<String> = moving.iter().chain(&staying).cloned().collect();

    let in_zset_form = |key: &str| {
        at_least_7_0()
            && key
                .trim_start_matches(|c: char| !c.is_ascii_digit())
                .parse::<usize>()
                .unwrap()
                % 4
                < 2
    };
    let set_storage = |form: &str| {
        for node in &cluster.nodes {
            node.with(|c| {
                redis::cmd("CONFIG")
                    .arg("SET")
                    .arg("xcloak.storage")
                    .arg(form)
                    .query::<()>(c)
                    .unwrap()
            });
        }
    };
    let mut admitted_before: BTreeMap<String, i64> = BTreeMap::new();
    for (form, zset) in [("zset", true), ("compact", false)] {
        if at_least_7_0() {
            set_storage(form);
        }
        for key in all.iter().filter(|k| in_zset_form(k) == zset) {
            let n = if is_full(key) { FULL_LIMIT } else { 3 };
            for _ in 0..n {
                assert_eq!(allow(&mut conn, key, limit_of(key)).unwrap(), 1);
            }
            admitted_before.insert(key.clone(), n);
        }
    }
    let form_of = |key: &str| cluster.nodes[cluster.owner_of_slot(slot(key))].with(|c| key_type(c, key));
    for key in &all {
        assert_eq!(
            form_of(key),
            if in_zset_form(key) { "zset" } else { "xcloaklog" },
            "{key}"
        );
    }
    let full_before: BTreeMap<String, Vec<i64>> = all
        .iter()
        .filter(|k| is_full(k))
        .map(|k| {
            (
                k.clone(),
                cluster.nodes[cluster.owner_of_slot(slot(k))].with(|c| stored_stamps(c, k)),
            )
        })
        .collect();
    for (key, e) in &full_before {
        assert_eq!(e.len() as i64, FULL_LIMIT, "{key}");
    }

    let stop = AtomicBool::new(false);
    // Calls answered so far, by every worker: the resharding starts once calls
    // flow, and the workers stop once calls have flowed after it too.
    let answered = AtomicU64::new(0);
    let deadline = Instant::now() + Duration::from_secs(300);
    let (tallies, reshards) = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..3)
            .map(|t| {
                let (stop, all, cluster, answered) = (&stop, &all, &cluster, &answered);
                scope.spawn(move || {
                    let mut conn = cluster.client();
                    let mut tally = Tally::default();
                    let mut n: usize = t * 7919 + 1;
                    while !stop.load(Ordering::SeqCst) && Instant::now() < deadline {
                        n = n.wrapping_mul(1_103_515_245).wrapping_add(12_345) % (1 << 31);
                        let key = &all[n % all.len()];
                        tally.calls += 1;
                        if n.is_multiple_of(5) {
                            let details =
                                peek(&mut conn, key, limit_of(key)).unwrap_or_else(|e| panic!("PEEK {key}: {e}"));
                            assert!(details[2] >= 0 && details[2] <= limit_of(key));
                            answered.fetch_add(1, Ordering::SeqCst);
                            continue;
                        }
                        let reply = allow(&mut conn, key, limit_of(key))
                            .unwrap_or_else(|e| panic!("ALLOW {key} during resharding: {e}"));
                        *tally.admitted.entry(key.clone()).or_default() += reply;
                        answered.fetch_add(1, Ordering::SeqCst);
                    }
                    tally
                })
            })
            .collect();

        // Calls flow through every worker's client before the first slot moves.
        let flowing = |since: u64| {
            eventually(Duration::from_secs(60), || {
                answered.load(Ordering::SeqCst) >= since + 50 || workers.iter().any(|w| w.is_finished())
            })
        };
        assert!(flowing(0), "no calls answered before the resharding");
        let seed = format!("127.0.0.1:{}", cluster.nodes[first].port);
        let slots = MOVED_SLOTS.to_string();
        let mut reshards = Vec::new();
        for (from, to) in [(&first_id, &second_id), (&second_id, &third_id)] {
            let started = Instant::now();
            let output = redis_cli(&[
                "--cluster",
                "reshard",
                &seed,
                "--cluster-from",
                from,
                "--cluster-to",
                to,
                "--cluster-slots",
                &slots,
                "--cluster-yes",
            ]);
            assert!(
                output.status.success(),
                "reshard failed:\n{}\n{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
            let moved = started.elapsed();
            // Until the replicas hear of the move, the next reshard would refuse.
            cluster.wait_ok();
            reshards.push((moved, started.elapsed() - moved));
        }
        // And after the last move, calls against the new layout.
        let flowed = flowing(answered.load(Ordering::SeqCst));
        stop.store(true, Ordering::SeqCst);
        assert!(flowed, "no calls answered after the resharding");
        let tallies: Vec<Tally> = workers.into_iter().map(|w| w.join().unwrap()).collect();
        (tallies, reshards)
    });
    assert!(Instant::now() < deadline, "resharding finished within the time bound");
    let calls: u64 = tallies.iter().map(|t| t.calls).sum();
    eprintln!("resharding: {calls} calls during two reshards of {MOVED_SLOTS} slots (each: time to move, then until every node agreed: {reshards:?})");

    // The slots moved: 0..99 are now served by `third`, with every moving key.
    assert_eq!(cluster.owner_of_slot(0), third);
    assert_eq!(cluster.owner_of_slot(MOVED_SLOTS - 1), third);
    let on_third = local_keys(&cluster.nodes[third]);
    for key in &moving {
        assert!(
            on_third.contains(key),
            "{key} (slot {}) migrated to the new owner",
            slot(key)
        );
    }
    let check = redis_cli(&["--cluster", "check", &format!("127.0.0.1:{}", cluster.nodes[0].port)]);
    let check_text = String::from_utf8_lossy(&check.stdout);
    assert!(
        check.status.success() && !check_text.contains("[WARNING]"),
        "cluster check:\n{check_text}"
    );

    let mut during: BTreeMap<String, i64> = BTreeMap::new();
    for tally in &tallies {
        for (key, n) in &tally.admitted {
            *during.entry(key.clone()).or_default() += n;
        }
    }
    let mut conn = cluster.client();
    let mut busy_moved_with_admissions = 0;
    for key in &all {
        let owner = &cluster.nodes[cluster.owner_of_slot(slot(key))];
        let now = owner.with(|c| stored_stamps(c, key));
        assert_eq!(
            owner.with(|c| key_type(c, key)),
            if in_zset_form(key) { "zset" } else { "xcloaklog" },
            "{key} kept its form"
        );
        let admitted = admitted_before[key] + during.get(key).copied().unwrap_or(0);
        // Every admission is one entry, none lost, none overwritten.
        assert_eq!(now.len() as i64, admitted, "{key}: ZCARD == admissions acknowledged");
        assert!(
            admitted <= limit_of(key),
            "{key}: over-admitted ({admitted} > {})",
            limit_of(key)
        );
        if is_full(key) {
            assert_eq!(
                during.get(key).copied().unwrap_or(0),
                0,
                "{key}: a full window admitted during the move"
            );
            assert_eq!(now, full_before[key], "{key}: the window moved intact (every stamp)");
        } else if moving.contains(key) && during.get(key).copied().unwrap_or(0) > 0 {
            busy_moved_with_admissions += 1;
        }
        let ttl: i64 = redis::cmd("PTTL").arg(key).query(&mut conn).unwrap();
        assert!(
            ttl > 0 && ttl <= LONG + 1_000,
            "{key}: TTL kept through MIGRATE ({ttl})"
        );
        // The limits still hold after the move.
        let details = peek(&mut conn, key, limit_of(key)).unwrap();
        assert_eq!(details[2], limit_of(key) - admitted, "{key}: PEEK remaining");
    }
    assert!(
        busy_moved_with_admissions > 0,
        "some moving keys were admitted to during the test"
    );
    // Full windows stay full on their new node.
    for key in moving.iter().filter(|k| is_full(k)) {
        assert_eq!(allow(&mut conn, key, FULL_LIMIT).unwrap(), 0, "{key}");
    }
}
