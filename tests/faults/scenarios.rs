//! The runs: a topology with the module on every node, the load, the
//! snapshotter, and faults injected one after another, each in a segment
//! of its own:
//!
//! ```text
//! |-- steady (no fault) --|-- lead 1 s | fault | failover, recovery, settled | quiet: one window --|-- next ...
//! ```
//!
//! A segment starts one second before its fault (so the admissions the fault
//! may lose are in it) and ends one second before the next one, after the
//! group has settled and a whole window has passed: every interval that
//! could count an admission the fault touched ends inside it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::history::{History, Ms, Segment};
use super::load::{key_name, now_ms, Load, LoadConfig, Topology};
use super::snapshots::Snapshotter;
use crate::common::cluster::Cluster;
use crate::common::netns::{Host, Network};
use crate::common::sentinel::{SentinelGroup, SentinelSetup};
use crate::common::*;

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Form {
    Zset,
    Compact,
}

impl Form {
    pub fn name(&self) -> &'static str {
        match self {
            Form::Zset => "zset",
            Form::Compact => "compact",
        }
    }
    fn config(&self) -> ServerConfig {
        match self {
            Form::Zset => ServerConfig::default(),
            Form::Compact => ServerConfig::compact(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Fault {
    /// Sentinel: `kill -9` of the primary; restarted empty as a replica once replaced.
    Kill9,
    /// Sentinel: SIGSTOP of the primary beyond the failover, then SIGCONT: a stale primary.
    Stop,
    /// Sentinel: the primary's link cut (network namespaces) with four writers
    /// on its side of the partition, then healed.
    Partition,
    /// Cluster: `CLUSTER FAILOVER FORCE` on a primary's replica.
    ClusterForce,
    /// Cluster: `kill -9` of a primary; restarted once its replica took over.
    ClusterKill,
    /// Sentinel, two replicas: one replica cut off from the primary alone
    /// (lagging; the sentinels still reach it) for 2 s while WAIT 1 is
    /// answered by the other, then `kill -9` of the primary. The replica that
    /// answered WAIT has `replica-priority 0` (never promoted), so the
    /// lagging one is.
    LaggingPromoted,
    /// The same with equal priorities: the sentinels choose by offset.
    LaggingEqual,
}

impl Fault {
    pub fn label(&self) -> &'static str {
        match self {
            Fault::Kill9 => "kill -9 of the primary",
            Fault::Stop => "SIGSTOP of the primary 4 s, then SIGCONT",
            Fault::Partition => "partition: primary + 4 writers cut off 5 s",
            Fault::ClusterForce => "CLUSTER FAILOVER FORCE",
            Fault::ClusterKill => "kill -9 of a cluster primary",
            Fault::LaggingPromoted => {
                "kill -9, WAIT 1 of 2 answered by a replica-priority 0 replica, the lagging one promoted"
            }
            Fault::LaggingEqual => "kill -9, WAIT 1 of 2, one replica lagging, equal priorities",
        }
    }
    fn needs_network(&self) -> bool {
        matches!(self, Fault::Partition | Fault::LaggingPromoted | Fault::LaggingEqual)
    }
}

#[derive(Clone, Debug)]
pub struct RunSpec {
    /// E.g. "sentinel, zset, plain".
    pub label: String,
    pub cluster: bool,
    pub form: Form,
    pub load: LoadConfig,
    pub faults: Vec<Fault>,
    /// Extra server options (e.g. `min-replicas-to-write`).
    pub server_args: Vec<(String, String)>,
}

pub struct RunResult {
    pub label: String,
    pub history: History,
    /// What happened, for the report (failover times, promoted nodes, faults not run).
    pub notes: Vec<String>,
}

/// Writers that join the primary's side of a partition.
const MINORITY: usize = 4;
const LEAD: Duration = Duration::from_millis(1000);
const STOP: Duration = Duration::from_millis(4000);
const CUT: Duration = Duration::from_millis(5000);
const LAG: Duration = Duration::from_millis(2000);
/// Load and snapshots go on this long after the last segment closes.
const TAIL: Duration = Duration::from_millis(1500);

/// Opens and closes segments.
struct Timeline {
    segments: Vec<Segment>,
    open: Option<(String, Ms)>,
}

impl Timeline {
    fn begin(&mut self, kind: &str) {
        assert!(self.open.is_none());
        self.open = Some((kind.to_string(), now_ms()));
    }
    /// Names the open segment after what happened in it.
    fn rename(&mut self, kind: String) {
        if let Some((open, _)) = self.open.as_mut() {
            *open = kind;
        }
    }
    fn close(&mut self, final_primary: BTreeMap<u16, String>) {
        let (kind, start_ms) = self.open.take().expect("an open segment");
        self.segments.push(Segment {
            kind,
            start_ms,
            end_ms: now_ms(),
            final_primary,
        });
    }
}

fn server_config(spec: &RunSpec) -> ServerConfig {
    let mut config = spec.form.config();
    for (name, value) in &spec.server_args {
        config = config.arg(name, value);
    }
    config
}

pub fn run(spec: &RunSpec) -> RunResult {
    let mut result = if spec.cluster {
        run_cluster(spec)
    } else {
        run_sentinel(spec)
    };
    let mut reads: Vec<Ms> = result
        .history
        .snapshots
        .iter()
        .filter(|s| s.primary)
        .map(|s| s.read_by_ms - s.at_ms)
        .collect();
    reads.sort_unstable();
    if let (Some(median), Some(max)) = (reads.get(reads.len() / 2), reads.last()) {
        result.notes.push(format!(
            "a primary's snapshot took {median} ms (median), {max} ms at most, over {} snapshots",
            reads.len()
        ));
    }
    result
}

fn all_keys(keys: u16, node: &str) -> BTreeMap<u16, String> {
    (0..keys).map(|k| (k, node.to_string())).collect()
}

fn wait_for(timeout: Duration, mut check: impl FnMut() -> bool) -> Option<Duration> {
    let started = Instant::now();
    eventually(timeout, &mut check).then(|| started.elapsed())
}

fn run_sentinel(spec: &RunSpec) -> RunResult {
    let mut notes = Vec::new();
    let wants_network = spec.faults.iter().any(Fault::needs_network);
    // Declared before the group, so dropped after its servers.
    let network = if wants_network {
        match Network::create(3) {
            Ok(network) => Some(network),
            Err(why) => {
                notes.push(format!(
                    "network namespaces unavailable, partition faults not run: {why}"
                ));
                None
            }
        }
    } else {
        None
    };
    let replicas = 2;
    let setup = SentinelSetup::new(server_config(spec), replicas);
    let mut group = SentinelGroup::start(setup, network.as_ref());
    let hosts: Vec<Arc<Host>> = network.as_ref().map(|n| n.hosts.clone()).unwrap_or_default();
    let keys = spec.load.keys;
    let addrs: Vec<String> = group.nodes.iter().map(Server::addr).collect();
    let snapshotter = Snapshotter::start(addrs.clone(), keys, spec.form == Form::Compact);
    let topology = Topology::Sentinel {
        ports: group.sentinel_ports(),
        gateway: network.as_ref().map(|n| n.gateway.clone()),
    };
    let load = Load::start(&spec.load, &topology);
    let window = Duration::from_millis(spec.load.window_ms as u64);
    let primary_addr = |group: &SentinelGroup| group.primary().map(|(h, p)| format!("{h}:{p}")).unwrap_or_default();

    let mut timeline = Timeline {
        segments: Vec::new(),
        open: None,
    };
    std::thread::sleep(Duration::from_millis(500));
    timeline.begin("none (steady load)");
    std::thread::sleep(window * 2);
    for fault in &spec.faults {
        if fault.needs_network() && network.is_none() {
            continue;
        }
        group.wait_settled();
        let old = group.primary_index().expect("a primary");
        if matches!(fault, Fault::LaggingPromoted | Fault::LaggingEqual) {
            // Before the segment: the sentinels take seconds to see priorities.
            let lagger = (0..group.nodes.len()).find(|&i| i != old).unwrap();
            let priorities: Vec<u32> = (0..group.nodes.len())
                .map(|i| {
                    if i != lagger && i != old && *fault == Fault::LaggingPromoted {
                        0
                    } else {
                        100
                    }
                })
                .collect();
            set_priorities(&group, &priorities);
        }
        std::thread::sleep(window);
        timeline.close(all_keys(keys, &primary_addr(&group)));
        timeline.begin(fault.label());
        eprintln!("faults: {}: {}", spec.label, fault.label());
        let minority: Vec<_> = load.controls.iter().take(MINORITY).cloned().collect();
        if *fault == Fault::Partition {
            for control in &minority {
                *control.host.lock().unwrap() = Some(hosts[old].clone());
            }
        }
        let switches_before = switch_count(&group);
        std::thread::sleep(LEAD);
        let lags = group.replica_lags();
        notes.push(format!(
            "{}: replicas behind the primary at the fault: {lags:?} bytes",
            fault.label()
        ));
        let injected = Instant::now();
        let changed = |group: &SentinelGroup| group.primary_index().is_some_and(|i| i != old);
        match fault {
            Fault::Kill9 => {
                group.nodes[old].kill9();
                let took = wait_for(Duration::from_secs(60), || changed(&group));
                notes.push(failover_note(fault, took));
                restart(&mut group, old, fault, &mut notes);
            }
            Fault::Stop => {
                group.nodes[old].signal(libc::SIGSTOP);
                std::thread::sleep(STOP);
                let promoted = changed(&group);
                group.nodes[old].signal(libc::SIGCONT);
                notes.push(format!(
                    "{}: {}",
                    fault.label(),
                    if promoted {
                        "a replica was promoted while it was stopped"
                    } else {
                        "no replica promoted while it was stopped"
                    }
                ));
                let _ = wait_for(Duration::from_secs(60), || changed(&group));
            }
            Fault::Partition => {
                hosts[old].cut();
                std::thread::sleep(CUT);
                let promoted = injected.elapsed();
                let during = changed(&group);
                hosts[old].heal();
                notes.push(format!(
                    "{}: {} within {:.1} s of the cut",
                    fault.label(),
                    if during {
                        "a replica was promoted"
                    } else {
                        "no replica promoted"
                    },
                    promoted.as_secs_f64()
                ));
                let _ = wait_for(Duration::from_secs(60), || changed(&group));
            }
            Fault::LaggingPromoted | Fault::LaggingEqual => {
                let lagger = (0..group.nodes.len()).find(|&i| i != old).unwrap();
                let (lagger_addr, old_addr) = (hosts[lagger].addr.clone(), hosts[old].addr.clone());
                hosts[lagger].block(&old_addr);
                hosts[old].block(&lagger_addr);
                std::thread::sleep(LAG);
                group.nodes[old].kill9();
                hosts[lagger].unblock(&old_addr);
                hosts[old].unblock(&lagger_addr);
                let took = wait_for(Duration::from_secs(60), || changed(&group));
                let promoted = group.primary_index();
                notes.push(format!(
                    "{}; promoted node {} ({})",
                    failover_note(fault, took),
                    promoted.map_or("none".into(), |i| i.to_string()),
                    if promoted == Some(lagger) {
                        "the lagging replica"
                    } else {
                        "the up-to-date replica"
                    }
                ));
                restart(&mut group, old, fault, &mut notes);
            }
            Fault::ClusterForce | Fault::ClusterKill => unreachable!("cluster faults in a sentinel run"),
        }
        group.wait_settled();
        for control in &minority {
            *control.host.lock().unwrap() = None;
        }
        // What the sentinels did: one switch per failover. Under load they
        // may mark a just-promoted primary down and fail over again, while
        // the first keeps serving the clients it has: say so in the table.
        let switches = switch_count(&group) - switches_before;
        if switches > 1 {
            timeline.rename(format!("{} + a second failover ({switches} switches)", fault.label()));
        }
        notes.push(format!(
            "{}: {switches} primary switch(es) in the sentinels' logs",
            fault.label()
        ));
    }
    group.wait_settled();
    std::thread::sleep(window);
    timeline.close(all_keys(keys, &primary_addr(&group)));
    // Snapshots after the last admissions of the segment, to check them.
    std::thread::sleep(TAIL);
    let (ops, late) = load.finish();
    let snapshots = snapshotter.finish();
    let history = History {
        window_ms: spec.load.window_ms,
        limit: spec.load.limit,
        keys,
        ops,
        late,
        snapshots,
        segments: timeline.segments,
    };
    drop(group);
    drop(network);
    RunResult {
        label: spec.label.clone(),
        history,
        notes,
    }
}

/// `+switch-master` lines in the sentinels' logs (the most any one has).
fn switch_count(group: &SentinelGroup) -> usize {
    group
        .sentinels
        .iter()
        .map(|s| s.log().matches("+switch-master").count())
        .max()
        .unwrap_or(0)
}

/// Restarts a killed node, as a replica of the new primary if there is one.
fn restart(group: &mut SentinelGroup, index: usize, fault: &Fault, notes: &mut Vec<String>) {
    if !group.restart_as_replica(index) {
        notes.push(format!(
            "{}: no failover before the restart: the node came back empty as the primary (every window reset)",
            fault.label()
        ));
    }
}

fn failover_note(fault: &Fault, took: Option<Duration>) -> String {
    match took {
        Some(took) => format!(
            "{}: the sentinels named a new primary {:.1} s after the fault",
            fault.label(),
            took.as_secs_f64()
        ),
        None => format!("{}: no new primary within 60 s", fault.label()),
    }
}

/// `CONFIG SET replica-priority` on every node, then waits until each
/// sentinel's view of the replicas shows it (they read it from INFO).
fn set_priorities(group: &SentinelGroup, priorities: &[u32]) {
    for (node, priority) in group.nodes.iter().zip(priorities) {
        node.with(|c| {
            let _: () = redis::cmd("CONFIG")
                .arg("SET")
                .arg("replica-priority")
                .arg(*priority)
                .query(c)
                .unwrap();
        });
    }
    let seen = eventually(Duration::from_secs(30), || {
        group.sentinels.iter().all(|sentinel| {
            let Some(reply) = sentinel.query(&["SENTINEL", "REPLICAS", crate::common::sentinel::MASTER_NAME]) else {
                return false;
            };
            let Ok(replicas) = redis::from_redis_value::<Vec<Vec<String>>>(&reply) else {
                return false;
            };
            replicas.iter().all(|fields| {
                let field = |name: &str| fields.chunks(2).find(|p| p[0] == name).map(|p| p[1].clone());
                let port: Option<u16> = field("port").and_then(|p| p.parse().ok());
                let index = group
                    .nodes
                    .iter()
                    .position(|n| Some(n.port) == port && Some(n.host.clone()) == field("ip"));
                index.is_some_and(|i| field("slave-priority") == Some(priorities[i].to_string()))
            })
        })
    });
    assert!(seen, "the sentinels never saw replica-priority {priorities:?}");
}

/// The node serving each key, from `CLUSTER SLOTS` of the first node that answers.
fn cluster_owners(cluster: &Cluster, keys: u16) -> BTreeMap<u16, String> {
    for node in &cluster.nodes {
        let Some(mut conn) = node.try_connect() else { continue };
        let Ok(redis::Value::Array(ranges)) = redis::cmd("CLUSTER").arg("SLOTS").query::<redis::Value>(&mut conn)
        else {
            continue;
        };
        let ranges: Vec<(u16, u16, String)> = ranges
            .iter()
            .filter_map(|range| {
                let redis::Value::Array(parts) = range else { return None };
                let redis::Value::Array(primary) = parts.get(2)? else {
                    return None;
                };
                let host: String = redis::from_redis_value(primary.first()?).ok()?;
                let port: u16 = redis::from_redis_value(primary.get(1)?).ok()?;
                Some((
                    redis::from_redis_value(&parts[0]).ok()?,
                    redis::from_redis_value(&parts[1]).ok()?,
                    format!("{host}:{port}"),
                ))
            })
            .collect();
        return (0..keys)
            .filter_map(|k| {
                let slot = redis::cluster_routing::get_slot(key_name(k).as_bytes());
                ranges
                    .iter()
                    .find(|(start, end, _)| (*start..=*end).contains(&slot))
                    .map(|(_, _, addr)| (k, addr.clone()))
            })
            .collect();
    }
    BTreeMap::new()
}

fn role_is_master(node: &Server) -> bool {
    node.try_connect()
        .is_some_and(|mut c| info_field(&mut c, "replication", "role").as_deref() == Some("master"))
}

fn run_cluster(spec: &RunSpec) -> RunResult {
    let mut notes = Vec::new();
    let config = server_config(spec)
        .arg("cluster-node-timeout", "2000")
        .arg("repl-diskless-sync-delay", "0");
    let mut cluster = Cluster::start_with(config, 3, 1);
    let keys = spec.load.keys;
    let addrs: Vec<String> = cluster.nodes.iter().map(Server::addr).collect();
    let snapshotter = Snapshotter::start(addrs.clone(), keys, spec.form == Form::Compact);
    let load = Load::start(&spec.load, &Topology::Cluster { seeds: addrs });
    let window = Duration::from_millis(spec.load.window_ms as u64);
    let mut timeline = Timeline {
        segments: Vec::new(),
        open: None,
    };
    std::thread::sleep(Duration::from_millis(500));
    timeline.begin("none (steady load)");
    std::thread::sleep(window * 2);
    for (n, fault) in spec.faults.iter().enumerate() {
        cluster.wait_ok();
        std::thread::sleep(window);
        timeline.close(cluster_owners(&cluster, keys));
        timeline.begin(fault.label());
        eprintln!("faults: {}: {}", spec.label, fault.label());
        let primaries = cluster.primary_indexes();
        let old = primaries[n % primaries.len()];
        let replica = (0..cluster.nodes.len())
            .find(|&i| i != old && !primaries.contains(&i) && cluster.primary_of(i) == old)
            .expect("the primary's replica");
        std::thread::sleep(LEAD);
        match fault {
            Fault::ClusterForce => {
                cluster.nodes[replica].with(|c| {
                    let _: () = redis::cmd("CLUSTER").arg("FAILOVER").arg("FORCE").query(c).unwrap();
                });
                let took = wait_for(Duration::from_secs(60), || role_is_master(&cluster.nodes[replica]));
                notes.push(cluster_note(fault, took));
            }
            Fault::ClusterKill => {
                cluster.nodes[old].kill9();
                let took = wait_for(Duration::from_secs(60), || role_is_master(&cluster.nodes[replica]));
                notes.push(cluster_note(fault, took));
                // Its nodes.conf makes it rejoin, as a replica of the node that took over.
                cluster.nodes[old].relaunch();
            }
            other => unreachable!("{other:?} in a cluster run"),
        }
        cluster.wait_ok();
    }
    cluster.wait_ok();
    std::thread::sleep(window);
    timeline.close(cluster_owners(&cluster, keys));
    std::thread::sleep(TAIL);
    let (ops, late) = load.finish();
    let snapshots = snapshotter.finish();
    let history = History {
        window_ms: spec.load.window_ms,
        limit: spec.load.limit,
        keys,
        ops,
        late,
        snapshots,
        segments: timeline.segments,
    };
    RunResult {
        label: spec.label.clone(),
        history,
        notes,
    }
}

fn cluster_note(fault: &Fault, took: Option<Duration>) -> String {
    match took {
        Some(took) => format!(
            "{}: the replica was a primary {:.1} s after the fault",
            fault.label(),
            took.as_secs_f64()
        ),
        None => format!("{}: the replica not promoted within 60 s", fault.label()),
    }
}
