//! Redis Cluster through `redis::cluster_async` (docs/clients.md): every call
//! goes straight to its key's node (0 MOVED, counted by the servers), peeks go
//! to replicas when asked, a MOVED or ASK of a moving slot is followed once,
//! the fallback is chosen per node in a cluster where one primary lacks the
//! module, and a call into a paused primary runs once. Durable mode sends WAIT
//! to the node that admitted (after a MOVED or an ASK too), none after a
//! rejection; allow_all with a paused primary at request 1 refunds request 0
//! and answers by the policy once. It also shows why
//! `cluster_client` sets `retries(0)`: with the `redis` crate's default
//! retries and a response timeout, one timed-out ALLOW runs several times.
mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use redis::cluster_async::ClusterConnection;
use support::{Cluster, Server};
use xcloak_client::{cluster_client, ErrorPolicy, Limiter, Request, Via};

const KEYS: usize = 120;

fn minute(key: &str, limit: u64) -> Request {
    Request::new(key, Duration::from_secs(600), limit)
}

async fn connect(cluster: &Cluster, replicas: bool) -> ClusterConnection {
    cluster_client(cluster.seeds(), replicas)
        .build()
        .unwrap()
        .get_async_connection()
        .await
        .unwrap()
}

fn moved(cluster: &Cluster) -> u64 {
    cluster.sum(&cluster.nodes.iter().collect::<Vec<_>>(), |n| {
        n.errors("MOVED") + n.errors("ASK")
    })
}

#[tokio::test]
async fn calls_reach_the_key_node_directly_and_peeks_the_replicas() {
    let cluster = Cluster::start(1, &[]);
    let primaries = cluster.primaries();
    let replicas = cluster.replicas();
    let limiter = Limiter::builder(connect(&cluster, true).await)
        .replica_reads(true)
        .build()
        .unwrap();
    cluster.reset_stats();
    let mut admitted = 0;
    for round in 0..4 {
        for k in 0..KEYS {
            let d = limiter.allow(&minute(&format!("rl:{k}"), 3)).await.unwrap();
            assert_eq!(d.via, Via::Command);
            assert_eq!(d.allowed, round < 3, "round {round} key {k}");
            admitted += usize::from(d.allowed);
        }
    }
    assert_eq!(admitted, 3 * KEYS);
    assert_eq!(moved(&cluster), 0, "no call was redirected");
    assert_eq!(cluster.sum(&primaries, |n| n.calls("xcloak.allow")), 4 * KEYS as u64);
    let per_primary: Vec<u64> = primaries.iter().map(|p| p.calls("xcloak.allow")).collect();
    assert!(
        per_primary.iter().all(|&n| n > 0),
        "every primary served some keys: {per_primary:?}"
    );

    cluster.wait_replicated();
    cluster.reset_stats();
    for k in 0..KEYS {
        let d = limiter.peek(&minute(&format!("rl:{k}"), 3)).await.unwrap();
        assert!(
            !d.allowed && d.remaining == 0,
            "the replica holds the full window of rl:{k}"
        );
    }
    assert_eq!(
        cluster.sum(&replicas, |n| n.calls("xcloak.peek")),
        KEYS as u64,
        "every peek on a replica"
    );
    assert_eq!(cluster.sum(&primaries, |n| n.calls("xcloak.peek")), 0);
    assert_eq!(moved(&cluster), 0);

    // Without read_from_replicas, peeks stay on the primaries.
    let on_primaries = Limiter::new(connect(&cluster, false).await);
    cluster.reset_stats();
    for k in 0..10 {
        on_primaries.peek(&minute(&format!("rl:{k}"), 3)).await.unwrap();
    }
    assert_eq!(
        (cluster.sum(&primaries, |n| n.calls("xcloak.peek")), moved(&cluster)),
        (10, 0)
    );
    println!(
        "{} admitted of {}, 0 MOVED, per primary {per_primary:?}; {KEYS} peeks on replicas",
        3 * KEYS,
        4 * KEYS
    );

    // Durable mode: WAIT after each admission, on the key's primary, and
    // none after a rejection.
    let durable = Limiter::builder(connect(&cluster, false).await)
        .durable(1, Duration::from_secs(2))
        .build()
        .unwrap();
    cluster.reset_stats();
    for round in 0..2 {
        for k in 0..30 {
            let d = durable.allow(&minute(&format!("dur:{k}"), 1)).await.unwrap();
            assert_eq!(
                (d.allowed, d.via, d.stamp),
                (round == 0, Via::Command, None),
                "round {round} key {k}"
            );
        }
    }
    for primary in &primaries {
        assert_eq!(
            primary.calls("wait"),
            primary.calls("xcloak.allow") / 2,
            "node {}: one WAIT per admission, none per rejection",
            primary.port
        );
    }
    assert_eq!(cluster.sum(&primaries, |n| n.calls("wait")), 30);
    assert_eq!(cluster.sum(&replicas, |n| n.calls("wait")), 0);
    // After a MOVED, the WAIT goes to the node that answered (it waits for
    // that connection's write), not to the one the old map names.
    let (from, to) = move_slot(&cluster, "dur:moved", false);
    cluster.reset_stats();
    let d = durable.allow(&minute("dur:moved", 3)).await.unwrap();
    assert_eq!((d.allowed, d.via), (true, Via::Command), "{d:?}");
    let node = |port: u16| cluster.nodes.iter().find(|n| n.port == port).unwrap();
    assert_eq!((node(from).errors("MOVED"), node(from).calls("wait")), (1, 0));
    assert_eq!(
        (node(to).calls("xcloak.allow"), node(to).calls("wait")),
        (1, 1),
        "WAIT on the node that admitted it"
    );
    // After an ASK too, where the map still names the old owner.
    let (from, to) = move_slot(&cluster, "dur:asked", true);
    cluster.reset_stats();
    let d = durable.allow(&minute("dur:asked", 3)).await.unwrap();
    assert_eq!((d.allowed, d.via), (true, Via::Command), "{d:?}");
    assert_eq!((node(from).errors("ASK"), node(from).calls("wait")), (1, 0));
    assert_eq!(
        (node(to).entries_asking("dur:asked"), node(to).calls("wait")),
        (1, 1),
        "WAIT on the importing node that admitted it"
    );
}

#[tokio::test]
async fn the_fallback_is_chosen_per_node() {
    // Three primaries, the second without the module.
    let cluster = Cluster::start(0, &[true, false, true]);
    let bare: &Server = cluster.nodes.iter().find(|n| !n.module).unwrap();
    let limiter = Limiter::new(connect(&cluster, false).await);
    cluster.reset_stats();
    let mut via: BTreeMap<u16, Vec<Via>> = BTreeMap::new();
    for k in 0..KEYS {
        let key = format!("pn:{k}");
        let d = limiter.allow(&minute(&key, 3)).await.unwrap();
        via.entry(cluster.owner(&key).port).or_default().push(d.via);
        assert_eq!(d.remaining, 2);
    }
    for (port, vias) in &via {
        let expected = if *port == bare.port { Via::Script } else { Via::Command };
        assert!(vias.iter().all(|v| *v == expected), "node {port}: {vias:?}");
    }
    let bare_keys = via[&bare.port].len() as u64;
    // One unknown command, one NOSCRIPT, then the script alone.
    assert_eq!(
        (bare.errors("ERR"), bare.errors("NOSCRIPT")),
        (1, 1),
        "the bare node was probed once"
    );
    assert_eq!(bare.calls("evalsha") + bare.calls("eval"), bare_keys + 1);
    let others: Vec<&Server> = cluster.nodes.iter().filter(|n| n.module).collect();
    assert_eq!(
        cluster.sum(&others, |n| n.calls("xcloak.allow")),
        KEYS as u64 - bare_keys
    );
    assert_eq!(
        cluster.sum(&others, |n| n.calls("evalsha") + n.calls("eval")),
        0,
        "the nodes with the module never ran the script"
    );
    assert_eq!(moved(&cluster), 0);
    println!(
        "per node: {:?}",
        via.iter().map(|(p, v)| (p, v.len(), v[0])).collect::<Vec<_>>()
    );
}

/// Moves the (empty) slot of `key` from its owner to another primary, as a
/// reshard does: IMPORTING / MIGRATING, then, unless `halfway`, NODE everywhere.
fn move_slot(cluster: &Cluster, key: &str, halfway: bool) -> (u16, u16) {
    let from = cluster.owner(key);
    let to = cluster.primaries().into_iter().find(|p| p.port != from.port).unwrap();
    let slot: i64 = redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(key)
        .query(&mut from.conn())
        .unwrap();
    let id = |n: &Server| -> String { redis::cmd("CLUSTER").arg("MYID").query(&mut n.conn()).unwrap() };
    let (from_id, to_id) = (id(from), id(to));
    let setslot = |n: &Server, args: &[&str]| {
        let _: () = redis::cmd("CLUSTER")
            .arg("SETSLOT")
            .arg(slot)
            .arg(args)
            .query(&mut n.conn())
            .unwrap();
    };
    setslot(to, &["IMPORTING", &from_id]);
    setslot(from, &["MIGRATING", &to_id]);
    if !halfway {
        for primary in cluster.primaries() {
            setslot(primary, &["NODE", &to_id]);
        }
    }
    (from.port, to.port)
}

#[tokio::test]
async fn a_moved_or_asked_call_is_followed_once() {
    let cluster = Cluster::start(0, &[]);
    let limiter = Limiter::new(connect(&cluster, false).await);
    // The client learns the map; then the slots move under it.
    limiter.allow(&minute("warm", 3)).await.unwrap();
    let (from, to) = move_slot(&cluster, "mv", false);
    cluster.reset_stats();
    let d = limiter.allow(&minute("mv", 100)).await.unwrap();
    assert_eq!((d.allowed, d.via), (true, Via::Command));
    let node = |port: u16| cluster.nodes.iter().find(|n| n.port == port).unwrap();
    assert_eq!(
        (
            node(from).errors("MOVED"),
            node(to).calls("xcloak.allow"),
            node(to).entries("mv")
        ),
        (1, 1, 1)
    );
    // The client refreshed its map: the next calls go straight there.
    let mut straight = false;
    for _ in 0..50 {
        let before = node(from).errors("MOVED");
        limiter.allow(&minute("mv", 100)).await.unwrap();
        if node(from).errors("MOVED") == before {
            straight = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(straight, "the client never refreshed its slot map");

    let (from, to) = move_slot(&cluster, "ask", true);
    cluster.reset_stats();
    let d = limiter.allow(&minute("ask", 3)).await.unwrap();
    assert!(d.allowed);
    assert_eq!(
        (node(from).errors("ASK"), node(to).entries_asking("ask")),
        (1, 1),
        "ASKING then the call, on the importing node"
    );
}

#[tokio::test]
async fn a_paused_primary_runs_a_timed_out_allow_once() {
    let cluster = Cluster::start(0, &[]);
    let key = "paused";
    let owner = cluster.owner(key);
    let limiter = Limiter::builder(connect(&cluster, false).await)
        .timeout(Duration::from_millis(800))
        .build()
        .unwrap();
    limiter.allow(&minute(key, 100)).await.unwrap();
    owner.pause();
    let error = limiter.allow(&minute(key, 100)).await.unwrap_err();
    owner.resume();
    assert!(error.is_unavailable(), "{error:?}");
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(owner.calls("xcloak.allow"), 2, "the timed-out ALLOW ran once");

    // allow_all with an outage at request 1: request 0 (another primary) is
    // refunded, then the policy answers once for the whole call.
    let other = (0..)
        .map(|i| format!("other:{i}"))
        .find(|k| cluster.owner(k).port != owner.port)
        .unwrap();
    let other_owner = cluster.owner(&other);
    let requests = [
        minute(&other, 100),
        minute(key, 100).tier(Duration::from_secs(3600), 1000),
    ];
    owner.pause();
    let error = limiter.allow_all(&requests).await.unwrap_err();
    assert!(error.is_unavailable(), "raise: {error:?}");
    for (policy, allowed) in [(ErrorPolicy::Allow, true), (ErrorPolicy::Deny, false)] {
        let m = limiter.with_on_error(policy).allow_all(&requests).await.unwrap();
        assert_eq!(
            (m.allowed, m.rejected, m.binding_index, m.decisions.len()),
            (allowed, (!allowed).then_some(1), 1, 2),
            "{policy:?}"
        );
        assert_eq!(
            (m.decisions[0].allowed, m.decisions[0].via, m.decisions[0].remaining),
            (true, Via::Command, 99),
            "{policy:?}: request 0's own admission"
        );
        let last = &m.decisions[1];
        assert_eq!(
            (last.allowed, last.via, last.limit, last.window, last.tiers.len()),
            (allowed, Via::Error, 100, Duration::from_secs(600), 0),
            "{policy:?}: request 1's tier 0"
        );
        assert!(
            m.headers(xcloak_client::Style::Both).is_empty(),
            "{policy:?}: the binding decision is the policy's, no headers"
        );
    }
    assert_eq!(other_owner.entries(&other), 0, "request 0 refunded each time");
    owner.resume();
}

/// The server runs the ALLOW and its reply is lost with the connection (a
/// proxy in front of the key's primary, through `node_address_map`). With
/// `retries(0)` the call goes to the policy and ran once; with the `redis`
/// crate's default retries the cluster connection sends it again on a new
/// connection, and it runs twice: why `cluster_client` sets `retries(0)`.
#[tokio::test]
async fn a_lost_reply_runs_once_with_retries_0_and_twice_with_the_default_retries() {
    use redis::cluster::{ClusterClientBuilder, NodeAddress};
    let cluster = Cluster::start(0, &[]);
    let key = "lost";
    let owner = cluster.owner(key);
    let proxy = support::Proxy::start(owner.port).await;
    let map = std::collections::HashMap::from([(
        NodeAddress::new("127.0.0.1", owner.port),
        NodeAddress::new("127.0.0.1", proxy.port),
    )]);
    let seeds: Vec<_> = cluster
        .nodes
        .iter()
        .filter(|n| n.port != owner.port)
        .map(Server::info_of)
        .collect();
    let mut ran = Vec::new();
    for retries in [Some(0), None] {
        let mut builder = ClusterClientBuilder::new(seeds.clone()).node_address_map(map.clone());
        if let Some(retries) = retries {
            builder = builder.retries(retries);
        }
        let limiter = Limiter::new(builder.build().unwrap().get_async_connection().await.unwrap());
        limiter.allow(&minute(key, 100)).await.unwrap();
        let before = owner.calls("xcloak.allow");
        proxy.lose_next_allow_reply();
        let result = limiter.allow(&minute(key, 100)).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let count = owner.calls("xcloak.allow") - before;
        println!(
            "retries {retries:?}: {:?}; the ALLOW ran {count} time(s)",
            result.as_ref().map(|d| d.allowed)
        );
        if retries == Some(0) {
            assert!(
                matches!(&result, Err(e) if e.is_unavailable()),
                "the lost reply goes to the policy: {result:?}"
            );
        }
        ran.push(count);
    }
    assert_eq!(ran[0], 1, "retries(0): applied once");
    assert!(ran[1] >= 2, "the default retries send it again: ran {}", ran[1]);
}
