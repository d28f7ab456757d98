//! A primary with replicas under Redis Sentinel, as operators run it: data
//! nodes with the module loaded (`replicaof` the first one), and three
//! sentinels with a quorum of two that fail over on their own.
//!
//! ```ignore
//! let group = SentinelGroup::start(SentinelSetup::new(ServerConfig::default(), 2));
//! let (host, port) = group.primary().unwrap();  // as the sentinels name it
//! group.wait_settled();                         // one primary, every replica linked
//! ```
//!
//! The sentinel binary is `$XCLOAK_SENTINEL`, else the server of
//! `$XCLOAK_SERVER` run with `--sentinel`, else `redis-sentinel` (Debian's
//! package `redis-sentinel`, which `scripts/ensure-deps.sh redis-sentinel`
//! installs; its system service, if it starts one, listens on 26379, which
//! these tests never use). On a `netns::Network`, data node `i` runs on
//! host `i` and the sentinels in the test's namespace, on its gateway address.

use std::time::{Duration, Instant};

use super::netns::Network;
use super::*;

pub const MASTER_NAME: &str = "xcloak";

/// How to build the group.
#[derive(Clone)]
pub struct SentinelSetup {
    pub config: ServerConfig,
    pub replicas: usize,
    pub down_after_ms: u64,
    pub failover_timeout_ms: u64,
    /// `replica-priority` per data node (lower is promoted first; 0 never), if set.
    pub priorities: Option<Vec<u32>>,
}

impl SentinelSetup {
    pub fn new(config: ServerConfig, replicas: usize) -> SentinelSetup {
        SentinelSetup {
            config,
            replicas,
            down_after_ms: 1000,
            failover_timeout_ms: 5000,
            priorities: None,
        }
    }
}

pub fn sentinel_command() -> (String, Vec<String>) {
    if let Ok(binary) = std::env::var("XCLOAK_SENTINEL") {
        return (binary, Vec::new());
    }
    if let Ok(binary) = std::env::var("XCLOAK_SERVER") {
        return (binary, vec!["--sentinel".into()]);
    }
    ("redis-sentinel".into(), Vec::new())
}

/// One sentinel process, killed on drop.
pub struct Sentinel {
    pub port: u16,
    pub dir: PathBuf,
    child: Option<Child>,
}

impl Sentinel {
    fn start(port: u16, bind: &str, monitor: &Server, setup: &SentinelSetup) -> Sentinel {
        let dir = std::env::temp_dir().join(format!("xcloak-sentinel-{}-{port}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("sentinel directory");
        let config = format!(
            "port {port}\nbind {bind}\nprotected-mode no\ndir {}\nlogfile sentinel.log\n\
             sentinel monitor {MASTER_NAME} {} {} 2\n\
             sentinel down-after-milliseconds {MASTER_NAME} {}\n\
             sentinel failover-timeout {MASTER_NAME} {}\n\
             sentinel parallel-syncs {MASTER_NAME} 2\n",
            dir.display(),
            monitor.host,
            monitor.port,
            setup.down_after_ms,
            setup.failover_timeout_ms
        );
        let path = dir.join("sentinel.conf");
        std::fs::write(&path, config).expect("sentinel.conf");
        let (binary, extra) = sentinel_command();
        let child = Command::new(&binary)
            .arg(&path)
            .args(&extra)
            .current_dir(&dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start sentinel {binary}: {e} (scripts/ensure-deps.sh redis-sentinel)"));
        let sentinel = Sentinel {
            port,
            dir,
            child: Some(child),
        };
        let ready = eventually(Duration::from_secs(20), || sentinel.query(&["PING"]).is_some());
        assert!(ready, "sentinel on {port} not ready:\n{}", sentinel.log());
        sentinel
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("sentinel.log")).unwrap_or_default()
    }

    fn connection(&self) -> Option<Connection> {
        let client = redis::Client::open(format!("redis://127.0.0.1:{}/", self.port)).ok()?;
        let conn = client.get_connection_with_timeout(Duration::from_millis(500)).ok()?;
        conn.set_read_timeout(Some(Duration::from_millis(1000))).ok()?;
        Some(conn)
    }

    /// A command to this sentinel, `None` if it does not answer.
    pub fn query(&self, args: &[&str]) -> Option<redis::Value> {
        let mut conn = self.connection()?;
        let mut command = redis::cmd(args[0]);
        for arg in &args[1..] {
            command.arg(*arg);
        }
        command.query(&mut conn).ok()
    }

    /// The primary this sentinel names (`SENTINEL get-master-addr-by-name`).
    pub fn primary(&self) -> Option<(String, u16)> {
        let reply = self.query(&["SENTINEL", "get-master-addr-by-name", MASTER_NAME])?;
        let (host, port): (String, u16) = redis::from_redis_value(&reply).ok()?;
        Some((host, port))
    }

    /// A field of `SENTINEL MASTER xcloak` (flags, num-slaves, num-other-sentinels, ...).
    pub fn master_field(&self, field: &str) -> Option<String> {
        let reply = self.query(&["SENTINEL", "MASTER", MASTER_NAME])?;
        let pairs: Vec<String> = redis::from_redis_value(&reply).ok()?;
        pairs
            .chunks(2)
            .find(|pair| pair[0] == field)
            .map(|pair| pair[1].clone())
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        // XCLOAK_KEEP_LOGS=1 keeps the directory (and its sentinel.log).
        if !std::thread::panicking() && std::env::var_os("XCLOAK_KEEP_LOGS").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

pub struct SentinelGroup {
    /// Data nodes; node 0 is the first primary. Roles change with failovers.
    pub nodes: Vec<Server>,
    pub sentinels: Vec<Sentinel>,
    pub setup: SentinelSetup,
}

impl SentinelGroup {
    /// Starts the data nodes (on `network`'s hosts when given) and three
    /// sentinels, and returns once the group is settled.
    pub fn start(setup: SentinelSetup, network: Option<&Network>) -> SentinelGroup {
        let base = setup.config.clone().arg("repl-diskless-sync-delay", "0");
        let config_of = |i: usize| {
            let mut config = base.clone();
            if let Some(network) = network {
                config = config.in_host(&network.hosts[i]);
            }
            if let Some(priorities) = &setup.priorities {
                config = config.arg("replica-priority", &priorities[i].to_string());
            }
            config
        };
        let primary = config_of(0).start();
        let mut nodes = vec![primary];
        for i in 1..=setup.replicas {
            let (host, port) = (nodes[0].host.clone(), nodes[0].port);
            nodes.push(config_of(i).replica_of(&host, port).start());
        }
        let bind = network.map_or_else(|| "127.0.0.1".to_string(), |n| format!("127.0.0.1 {}", n.gateway));
        let sentinels = (0..3)
            .map(|_| Sentinel::start(free_port(), &bind, &nodes[0], &setup))
            .collect();
        let group = SentinelGroup {
            nodes,
            sentinels,
            setup,
        };
        group.wait_settled();
        group
    }

    /// The primary a majority of the sentinels name, if they agree.
    pub fn primary(&self) -> Option<(String, u16)> {
        let named: Vec<(String, u16)> = self.sentinels.iter().filter_map(Sentinel::primary).collect();
        named
            .iter()
            .find(|candidate| named.iter().filter(|n| n == candidate).count() >= 2)
            .cloned()
    }

    /// Index of the data node at `addr`.
    pub fn index_of(&self, (host, port): &(String, u16)) -> Option<usize> {
        self.nodes.iter().position(|n| n.host == *host && n.port == *port)
    }

    /// Index of the primary the sentinels name.
    pub fn primary_index(&self) -> Option<usize> {
        self.primary().and_then(|addr| self.index_of(&addr))
    }

    /// Waits (bounded, 90 s) until every sentinel names the same primary
    /// with nothing in progress (flags `master` only), that node is a primary
    /// with every other node linked to it and caught up (at the offset the
    /// primary had a moment before), and every sentinel knows all replicas
    /// and the other sentinels.
    pub fn wait_settled(&self) {
        let deadline = Instant::now() + Duration::from_secs(90);
        let replicas = self.setup.replicas.to_string();
        loop {
            let settled = (|| {
                let named: Vec<Option<(String, u16)>> = self.sentinels.iter().map(Sentinel::primary).collect();
                let first = named[0].clone()?;
                if named.iter().any(|n| n.as_ref() != Some(&first)) {
                    return None;
                }
                for sentinel in &self.sentinels {
                    if sentinel.master_field("flags")? != "master"
                        || sentinel.master_field("num-slaves")? != replicas
                        || sentinel.master_field("num-other-sentinels")? != "2"
                    {
                        return None;
                    }
                }
                let primary = &self.nodes[self.index_of(&first)?];
                let mut conn = primary.try_client().ok()?;
                let info: String = redis::cmd("INFO").arg("replication").query(&mut conn).ok()?;
                if field_of(&info, "role")? != "master" || field_of(&info, "connected_slaves")? != replicas {
                    return None;
                }
                let offset: u64 = field_of(&info, "master_repl_offset")?.parse().ok()?;
                for node in self
                    .nodes
                    .iter()
                    .filter(|n| n.port != primary.port || n.host != primary.host)
                {
                    let mut conn = node.try_client().ok()?;
                    let info: String = redis::cmd("INFO").arg("replication").query(&mut conn).ok()?;
                    // Caught up: at least where the primary was when asked, a moment before.
                    let linked = field_of(&info, "master_link_status")? == "up"
                        && field_of(&info, "master_port")? == primary.port.to_string()
                        && field_of(&info, "slave_repl_offset")?.parse::<u64>().ok()? >= offset;
                    if !linked {
                        return None;
                    }
                }
                Some(())
            })();
            if settled.is_some() {
                return;
            }
            if Instant::now() > deadline {
                let logs: Vec<String> = self
                    .sentinels
                    .iter()
                    .map(|s| format!("sentinel {}:\n{}", s.port, s.log()))
                    .collect();
                panic!("sentinel group not settled after 90 s:\n{}", logs.join("\n"));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Restarts a killed data node as a replica of the current primary (what
    /// an orchestrator does with a node that died), empty, so it full-syncs.
    /// If the sentinels still name the node itself (no failover happened),
    /// it restarts as it was configured, and `false` says so.
    pub fn restart_as_replica(&mut self, index: usize) -> bool {
        let named = self.primary();
        let node = &mut self.nodes[index];
        let as_replica = named
            .as_ref()
            .is_some_and(|(host, port)| (host, *port) != (&node.host, node.port));
        if let (true, Some((host, port))) = (as_replica, named) {
            node.config = node.config.clone().replica_of(&host, port);
        }
        node.relaunch();
        as_replica
    }

    /// How far each replica is behind the primary, in bytes of the
    /// replication stream (`master_repl_offset` - `slave_repl_offset`).
    pub fn replica_lags(&self) -> Vec<i64> {
        let Some(index) = self.primary_index() else {
            return Vec::new();
        };
        let offset = |node: &Server, field: &str| -> Option<i64> {
            field_of(
                &redis::cmd("INFO")
                    .arg("replication")
                    .query::<String>(&mut node.try_connect()?)
                    .ok()?,
                field,
            )?
            .parse()
            .ok()
        };
        let Some(primary) = offset(&self.nodes[index], "master_repl_offset") else {
            return Vec::new();
        };
        (0..self.nodes.len())
            .filter(|&i| i != index)
            .filter_map(|i| offset(&self.nodes[i], "slave_repl_offset").map(|o| primary - o))
            .collect()
    }

    /// The sentinels' addresses, for clients.
    pub fn sentinel_ports(&self) -> Vec<u16> {
        self.sentinels.iter().map(|s| s.port).collect()
    }
}
