//! A real Redis Cluster on loopback, built the way operators build one:
//! `cluster-enabled yes` nodes (the module loaded on every one), joined by
//! `redis-cli --cluster create ... --cluster-replicas N --cluster-yes`.
//!
//! ```ignore
//! let cluster = Cluster::start(3, 1);          // 3 primaries, 1 replica each
//! let mut conn = cluster.client();             // redis::cluster::ClusterConnection
//! let url = cluster.seed_url();                // redis://127.0.0.1:PORT/ of a node
//! let ports = cluster.ports();                 // every node, for other clients
//! ```
//!
//! Ports come from `free_port()` (<= 22767, bus port +10000 free). Each node's
//! `nodes.conf` lives in its own directory, so `Server::restart` keeps its
//! identity. `redis-cli` is `$XCLOAK_REDIS_CLI`, else `redis-cli` on PATH.

use std::process::{Command, Output};
use std::time::Duration;

use super::*;

pub fn redis_cli_binary() -> String {
    std::env::var("XCLOAK_REDIS_CLI").unwrap_or_else(|_| "redis-cli".to_string())
}

/// Runs `redis-cli` with `args`; panics if it cannot start or runs longer
/// than two minutes (`--cluster create` waits forever for a join that fails).
pub fn redis_cli(args: &[&str]) -> Output {
    static RUNS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let run = RUNS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let out_path = std::env::temp_dir().join(format!("xcloak-cli-{}-{run}.out", std::process::id()));
    let err_path = out_path.with_extension("err");
    let mut child = Command::new(redis_cli_binary())
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::fs::File::create(&out_path).expect("redis-cli output file"))
        .stderr(std::fs::File::create(&err_path).expect("redis-cli error file"))
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", redis_cli_binary()));
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(status) = child.try_wait().expect("redis-cli status") {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "redis-cli {args:?} still running after 120 s:\n{}\n{}",
                std::fs::read_to_string(&out_path).unwrap_or_default(),
                std::fs::read_to_string(&err_path).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let output = Output {
        status,
        stdout: std::fs::read(&out_path).unwrap_or_default(),
        stderr: std::fs::read(&err_path).unwrap_or_default(),
    };
    let _ = std::fs::remove_file(&out_path);
    let _ = std::fs::remove_file(&err_path);
    output
}

pub struct Cluster {
    /// Every node, in the order given to `--cluster create` (redis-cli makes
    /// the first `primaries` of them primaries; roles may change later).
    pub nodes: Vec<Server>,
    pub primaries: usize,
    pub replicas_per_primary: usize,
}

impl Cluster {
    /// `primaries` (>= 3) primaries with `replicas_per_primary` replicas each,
    /// the module loaded everywhere; returns once every node reports
    /// `cluster_state:ok` and every replica is linked to its primary.
    pub fn start(primaries: usize, replicas_per_primary: usize) -> Cluster {
        Cluster::start_with(ServerConfig::default(), primaries, replicas_per_primary)
    }

    /// Same, with a base configuration (module args, persistence, ...).
    pub fn start_with(config: ServerConfig, primaries: usize, replicas_per_primary: usize) -> Cluster {
        assert!(primaries >= 3, "redis-cli --cluster create needs at least 3 primaries");
        let mut config = config
            .arg("cluster-enabled", "yes")
            .arg("cluster-config-file", "nodes.conf");
        // 15 s (the server's default) unless the caller set it (fault tests fail over faster).
        if !config.has_arg("cluster-node-timeout") {
            config = config.arg("cluster-node-timeout", "15000");
        }
        let total = primaries * (1 + replicas_per_primary);
        let nodes: Vec<Server> = (0..total).map(|_| config.clone().start()).collect();
        let cluster = Cluster {
            nodes,
            primaries,
            replicas_per_primary,
        };
        let mut args: Vec<String> = vec!["--cluster".into(), "create".into()];
        args.extend(cluster.addrs());
        args.extend([
            "--cluster-replicas".into(),
            replicas_per_primary.to_string(),
            "--cluster-yes".into(),
        ]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let output = redis_cli(&args);
        assert!(
            output.status.success(),
            "redis-cli --cluster create failed:\n{}\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        cluster.wait_ok();
        cluster
    }

    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(|n| n.port).collect()
    }

    /// `127.0.0.1:PORT` of every node.
    pub fn addrs(&self) -> Vec<String> {
        self.nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)).collect()
    }

    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(Server::url).collect()
    }

    /// A node to start discovery from (any node works).
    pub fn seed_url(&self) -> String {
        self.nodes[0].url()
    }

    /// A cluster-aware connection (routes by key, follows MOVED/ASK).
    pub fn client(&self) -> redis::cluster::ClusterConnection {
        let client = redis::cluster::ClusterClient::builder(self.urls())
            .retries(20)
            .min_retry_wait(20)
            .max_retry_wait(500)
            .connection_timeout(Duration::from_secs(5))
            .response_timeout(Duration::from_secs(10))
            .build()
            .expect("cluster client");
        client.get_connection().expect("cluster connection")
    }

    /// Runs `redis-cli -c -p <seed> args...` and returns its stdout, trimmed.
    pub fn cli(&self, args: &[&str]) -> String {
        let port = self.nodes[0].port.to_string();
        let mut all = vec!["-c", "-h", "127.0.0.1", "-p", port.as_str()];
        all.extend_from_slice(args);
        let output = redis_cli(&all);
        assert!(
            output.status.success(),
            "redis-cli {all:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).trim().to_string()
    }

    /// Waits (bounded) until every node reports `cluster_state:ok`, all slots
    /// assigned, every node known, every replica linked, and every node holds
    /// the same slot map (what `redis-cli --cluster` checks before a reshard).
    pub fn wait_ok(&self) {
        let total = self.nodes.len().to_string();
        for node in &self.nodes {
            let ready = eventually(Duration::from_secs(60), || {
                let Ok(mut conn) = node.try_client() else { return false };
                let Ok(info) = redis::cmd("CLUSTER").arg("INFO").query::<String>(&mut conn) else {
                    return false;
                };
                let field = |name: &str| field_of(&info, name);
                if field("cluster_state").as_deref() != Some("ok")
                    || field("cluster_slots_assigned").as_deref() != Some("16384")
                    || field("cluster_known_nodes").as_deref() != Some(total.as_str())
                {
                    return false;
                }
                let Ok(repl) = redis::cmd("INFO").arg("replication").query::<String>(&mut conn) else {
                    return false;
                };
                !repl.contains("role:slave") || repl.contains("master_link_status:up")
            });
            assert!(ready, "cluster node {} not ready:\n{}", node.port, node.log());
        }
        // Replicas learn of a slot move by gossip, some time after
        // `redis-cli --cluster reshard` returns (15-55 ms here, longer on a
        // loaded machine); until every node holds the same map, the next
        // reshard refuses to start ("Nodes don't agree about configuration!").
        let agreed = eventually(Duration::from_secs(60), || {
            let signatures: Vec<Option<String>> = self.nodes.iter().map(config_signature).collect();
            signatures[0].is_some() && signatures.iter().all(|s| *s == signatures[0])
        });
        assert!(
            agreed,
            "cluster nodes disagree on the slot map after 60 s:\n{}",
            self.nodes
                .iter()
                .map(|n| format!("{}: {:?}", n.port, config_signature(n)))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }

    /// `CLUSTER KEYSLOT key`.
    pub fn keyslot(&self, key: &str) -> u16 {
        self.nodes[0].with(|c| redis::cmd("CLUSTER").arg("KEYSLOT").arg(key).query(c).unwrap())
    }

    /// This node's cluster id (`CLUSTER MYID`).
    pub fn node_id(&self, index: usize) -> String {
        self.nodes[index].with(|c| redis::cmd("CLUSTER").arg("MYID").query(c).unwrap())
    }

    /// Indexes of the nodes that are primaries now (`role:master`).
    pub fn primary_indexes(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&i| {
                let repl: String = self.nodes[i].with(|c| redis::cmd("INFO").arg("replication").query(c).unwrap());
                repl.contains("role:master")
            })
            .collect()
    }

    /// Index of the primary that replica `index` replicates from (its
    /// `master_port` in INFO replication).
    pub fn primary_of(&self, index: usize) -> usize {
        let port = self.nodes[index].with(|c| info_field(c, "replication", "master_port"));
        let port: u16 = port
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("node {} is not a replica", self.nodes[index].port));
        self.nodes
            .iter()
            .position(|n| n.port == port)
            .expect("its primary is one of our nodes")
    }

    /// Index of the primary serving `slot`, as the first node sees it.
    pub fn owner_of_slot(&self, slot: u16) -> usize {
        let ranges: Vec<(i64, i64, (String, i64))> = self.nodes[0].with(|c| {
            let value: redis::Value = redis::cmd("CLUSTER").arg("SLOTS").query(c).unwrap();
            let redis::Value::Array(items) = value else {
                panic!("CLUSTER SLOTS: {value:?}")
            };
            items
                .into_iter()
                .map(|item| {
                    let redis::Value::Array(parts) = item else {
                        panic!("slot range: {item:?}")
                    };
                    let start: i64 = redis::from_redis_value(&parts[0]).unwrap();
                    let end: i64 = redis::from_redis_value(&parts[1]).unwrap();
                    let redis::Value::Array(primary) = &parts[2] else {
                        panic!("slot owner")
                    };
                    let host: String = redis::from_redis_value(&primary[0]).unwrap();
                    let port: i64 = redis::from_redis_value(&primary[1]).unwrap();
                    (start, end, (host, port))
                })
                .collect()
        });
        let (_, _, (_, port)) = ranges
            .iter()
            .find(|(start, end, _)| (*start..=*end).contains(&(slot as i64)))
            .unwrap_or_else(|| panic!("slot {slot} not served"));
        self.nodes
            .iter()
            .position(|n| n.port as i64 == *port)
            .expect("owner is one of our nodes")
    }

    /// Index of the primary serving `key`.
    pub fn owner_of_key(&self, key: &str) -> usize {
        self.owner_of_slot(self.keyslot(key))
    }
}

/// A node's view of who serves which slots, as `redis-cli --cluster check`
/// compares it: from `CLUSTER NODES`, every node that serves slots with its
/// ranges (migrating/importing markers `[...]` left out), sorted. `None` when
/// the node cannot be asked.
fn config_signature(node: &Server) -> Option<String> {
    let mut conn = node.try_client().ok()?;
    let nodes: String = redis::cmd("CLUSTER").arg("NODES").query(&mut conn).ok()?;
    let mut entries: Vec<String> = nodes
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let mut ranges: Vec<&str> = fields
                .get(8..)?
                .iter()
                .copied()
                .filter(|r| !r.starts_with('['))
                .collect();
            if ranges.is_empty() {
                return None;
            }
            ranges.sort_unstable();
            Some(format!("{}:{}", fields[0], ranges.join(",")))
        })
        .collect();
    entries.sort_unstable();
    Some(entries.join("|"))
}
