//! The one way the crate's tests start real servers on loopback: a
//! `redis-server` with the module (`$XCLOAK_MODULE`, else the workspace's
//! target/release/libxcloak.so) or without it, a primary and its replica, a
//! 3+3 cluster whose nodes may differ; each on a free port of this package's
//! slice (22500..=22767, the bus port +10000 free too), in its own directory,
//! shut down when dropped. The module's own tests have tests/common at the
//! repository root; this one speaks the `redis` crate this package uses.
#![allow(dead_code)]

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

pub const FIRST_PORT: u16 = 22500;
pub const LAST_PORT: u16 = 22767;

pub fn server_binary() -> String {
    std::env::var("XCLOAK_SERVER").unwrap_or_else(|_| "redis-server".into())
}

pub fn redis_cli() -> String {
    std::env::var("XCLOAK_REDIS_CLI").unwrap_or_else(|_| "redis-cli".into())
}

pub fn module_path() -> PathBuf {
    let path = std::env::var_os("XCLOAK_MODULE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/release/libxcloak.so"));
    assert!(path.exists(), "module not built at {} (make build)", path.display());
    path
}

/// (major, minor) of the server binary.
pub fn server_version() -> (u32, u32) {
    let out = Command::new(server_binary())
        .arg("--version")
        .output()
        .expect("server --version");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let v = text
        .split_whitespace()
        .find_map(|w| w.strip_prefix("v="))
        .expect("v=X.Y.Z");
    let mut parts = v.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let valkey = text.to_ascii_lowercase().contains("valkey");
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    if valkey {
        (major.max(7), minor)
    } else {
        (major, minor)
    }
}

static NEXT: AtomicU16 = AtomicU16::new(0);

/// A free port of this package's slice whose cluster bus port is free too.
pub fn free_port() -> u16 {
    let span = LAST_PORT - FIRST_PORT + 1;
    let _ = NEXT.compare_exchange(
        0,
        (std::process::id() % u32::from(span)) as u16 + 1,
        Ordering::SeqCst,
        Ordering::SeqCst,
    );
    for _ in 0..span {
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let port = FIRST_PORT + n % span;
        let free = |p: u16| TcpListener::bind(("127.0.0.1", p)).is_ok();
        if free(port) && free(port + 10000) {
            return port;
        }
    }
    panic!("no free port in {FIRST_PORT}..={LAST_PORT}");
}

pub struct Server {
    pub port: u16,
    pub module: bool,
    dir: PathBuf,
    extra: Vec<String>,
    child: Option<Child>,
}

impl Server {
    pub fn start() -> Server {
        Server::start_with(true, &[])
    }

    pub fn without_module() -> Server {
        Server::start_with(false, &[])
    }

    /// `extra`: `--name value` pairs.
    pub fn start_with(module: bool, extra: &[&str]) -> Server {
        for _ in 0..5 {
            let port = free_port();
            let dir = std::env::temp_dir().join(format!("xcloak-client-test-{}-{port}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            let mut server = Server {
                port,
                module,
                dir,
                extra: extra.iter().map(|s| s.to_string()).collect(),
                child: None,
            };
            if server.launch() {
                return server;
            }
        }
        panic!("no server could start after 5 ports");
    }

    fn launch(&mut self) -> bool {
        let mut args: Vec<String> = [
            "--port",
            &self.port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.extend([
            "--dir".into(),
            self.dir.display().to_string(),
            "--logfile".into(),
            "server.log".into(),
        ]);
        args.extend(["--protected-mode".into(), "no".into()]);
        if server_version() >= (7, 0) {
            args.extend([
                "--enable-module-command".into(),
                "yes".into(),
                "--enable-debug-command".into(),
                "yes".into(),
            ]);
        }
        if self.module {
            args.extend(["--loadmodule".into(), module_path().display().to_string()]);
        }
        args.extend(self.extra.iter().cloned());
        let child = Command::new(server_binary())
            .args(&args)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", server_binary()));
        let pid = child.id();
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(mut conn) = self.try_conn() {
                if let Ok(info) = redis::cmd("INFO").arg("server").query::<String>(&mut conn) {
                    // Ours, not another process's server on the same port.
                    return info.contains(&format!("process_id:{pid}"));
                }
            }
            if let Some(Ok(Some(_))) = self.child.as_mut().map(|c| c.try_wait()) {
                let log = self.log();
                self.child = None;
                if log.contains("Address already in use") {
                    return false;
                }
                panic!("server exited on port {}:\n{log}", self.port);
            }
            assert!(
                Instant::now() < deadline,
                "server on {} not ready:\n{}",
                self.port,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// A client of this server that skips `CLIENT SETINFO` (Redis 7.0 answers
    /// it with an ERR that would count in `errorstat_ERR`).
    pub fn client(&self) -> redis::Client {
        redis::Client::open(self.info_of()).unwrap()
    }

    pub fn info_of(&self) -> redis::ConnectionInfo {
        use redis::IntoConnectionInfo;
        let info = self.url().into_connection_info().unwrap();
        let settings = info.redis_settings().clone().set_skip_set_lib_name();
        info.set_redis_settings(settings)
    }

    fn try_conn(&self) -> redis::RedisResult<redis::Connection> {
        self.client().get_connection_with_timeout(Duration::from_secs(2))
    }

    /// A plain connection for checks (never the limiter's).
    pub fn conn(&self) -> redis::Connection {
        self.try_conn()
            .unwrap_or_else(|e| panic!("connect to {}: {e}\n{}", self.port, self.log()))
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.pid().to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill {signal} {}", self.pid());
    }

    /// SIGSTOP: the server keeps its sockets open and answers nothing.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    pub fn resume(&self) {
        self.signal("-CONT");
    }

    /// Kills the process (the port refuses connections until `restart`).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts again on the same port and directory.
    pub fn restart(&mut self) {
        self.stop();
        assert!(self.launch(), "port {} taken while restarting", self.port);
    }

    /// `calls=N` of `cmdstat_<command>` in INFO commandstats (0 when absent).
    pub fn calls(&self, command: &str) -> u64 {
        let info: String = redis::cmd("INFO").arg("commandstats").query(&mut self.conn()).unwrap();
        stat(&info, &format!("cmdstat_{command}:calls="))
    }

    /// `count=N` of `errorstat_<code>` in INFO errorstats.
    pub fn errors(&self, code: &str) -> u64 {
        let info: String = redis::cmd("INFO").arg("errorstats").query(&mut self.conn()).unwrap();
        stat(&info, &format!("errorstat_{code}:count="))
    }

    /// Calls that failed: `failed_calls=N` of `cmdstat_<command>` (7.0+), else 0.
    pub fn failed_calls(&self, command: &str) -> u64 {
        let info: String = redis::cmd("INFO").arg("commandstats").query(&mut self.conn()).unwrap();
        info.lines()
            .find(|l| l.starts_with(&format!("cmdstat_{command}:")))
            .and_then(|l| l.split(',').find_map(|f| f.strip_prefix("failed_calls=")))
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    }

    pub fn reset_stats(&self) {
        let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query(&mut self.conn()).unwrap();
    }

    /// `ZCARD key` (the sorted-set form).
    pub fn entries(&self, key: &str) -> u64 {
        redis::cmd("ZCARD").arg(key).query(&mut self.conn()).unwrap()
    }

    /// `ZCARD key` after `ASKING` (on a node importing the key's slot).
    pub fn entries_asking(&self, key: &str) -> u64 {
        let (n,): (u64,) = redis::pipe()
            .cmd("ASKING")
            .ignore()
            .cmd("ZCARD")
            .arg(key)
            .query(&mut self.conn())
            .unwrap();
        n
    }

    pub fn info(&self, section: &str) -> String {
        redis::cmd("INFO").arg(section).query(&mut self.conn()).unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SIGKILL ends a stopped (paused) process too.
            let _ = child.kill();
            let _ = child.wait();
        }
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

fn stat(info: &str, prefix: &str) -> u64 {
    info.lines()
        .find_map(|l| l.strip_prefix(prefix))
        .map(|rest| {
            rest.split(|c: char| !c.is_ascii_digit())
                .next()
                .unwrap()
                .parse()
                .unwrap()
        })
        .unwrap_or(0)
}

pub fn field(info: &str, name: &str) -> Option<String> {
    info.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':').map(|v| v.trim().to_string()))
}

/// Polls `check` (every 20 ms) until true or `timeout`.
pub fn eventually(timeout: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if check() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    check()
}

/// A primary and one replica, linked.
pub struct Replicated {
    pub primary: Server,
    pub replica: Server,
}

impl Replicated {
    pub fn start() -> Replicated {
        let primary = Server::start();
        let port = primary.port.to_string();
        let replica = Server::start_with(true, &["--replicaof", "127.0.0.1", &port]);
        let linked = eventually(Duration::from_secs(30), || {
            field(&replica.info("replication"), "master_link_status").as_deref() == Some("up")
        });
        assert!(linked, "replica not linked:\n{}", replica.log());
        Replicated { primary, replica }
    }
}

/// A Redis Cluster on loopback, joined by `redis-cli --cluster create`.
pub struct Cluster {
    pub nodes: Vec<Server>,
}

impl Cluster {
    /// 3 primaries with `replicas` each; `module[i]` says whether node i
    /// (primaries first) loads the module.
    pub fn start(replicas: usize, module: &[bool]) -> Cluster {
        let total = 3 * (1 + replicas);
        let nodes: Vec<Server> = (0..total)
            .map(|i| {
                let with = module.get(i).copied().unwrap_or(true);
                Server::start_with(
                    with,
                    &[
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        "nodes.conf",
                        "--cluster-node-timeout",
                        "15000",
                    ],
                )
            })
            .collect();
        let mut args: Vec<String> = vec!["--cluster".into(), "create".into()];
        args.extend(nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)));
        args.extend([
            "--cluster-replicas".into(),
            replicas.to_string(),
            "--cluster-yes".into(),
        ]);
        let out = Command::new(redis_cli())
            .args(&args)
            .stdin(Stdio::null())
            .output()
            .expect("redis-cli");
        assert!(
            out.status.success(),
            "redis-cli --cluster create:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let cluster = Cluster { nodes };
        cluster.wait_ok();
        cluster
    }

    fn wait_ok(&self) {
        let total = self.nodes.len().to_string();
        for node in &self.nodes {
            let ok = eventually(Duration::from_secs(60), || {
                let Ok(mut c) = node.try_conn() else { return false };
                let Ok(info) = redis::cmd("CLUSTER").arg("INFO").query::<String>(&mut c) else {
                    return false;
                };
                let repl = node.info("replication");
                field(&info, "cluster_state").as_deref() == Some("ok")
                    && field(&info, "cluster_known_nodes").as_deref() == Some(total.as_str())
                    && (!repl.contains("role:slave") || repl.contains("master_link_status:up"))
            });
            assert!(ok, "cluster node {} not ready:\n{}", node.port, node.log());
        }
        // Every node lists every replica in CLUSTER SLOTS (a client reading
        // the map before then has no replica to read from).
        let replicas = self.nodes.len() / 3 - 1;
        for node in &self.nodes {
            let listed = eventually(Duration::from_secs(60), || {
                let Ok(redis::Value::Array(ranges)) = redis::cmd("CLUSTER")
                    .arg("SLOTS")
                    .query::<redis::Value>(&mut node.conn())
                else {
                    return false;
                };
                !ranges.is_empty()
                    && ranges
                        .iter()
                        .all(|r| matches!(r, redis::Value::Array(p) if p.len() >= 3 + replicas))
            });
            assert!(listed, "node {} does not list every replica", node.port);
        }
    }

    pub fn seed_urls(&self) -> Vec<String> {
        self.nodes.iter().map(Server::url).collect()
    }

    /// Every node's connection info, without `CLIENT SETINFO`.
    pub fn seeds(&self) -> Vec<redis::ConnectionInfo> {
        self.nodes.iter().map(Server::info_of).collect()
    }

    pub fn primaries(&self) -> Vec<&Server> {
        self.nodes
            .iter()
            .filter(|n| n.info("replication").contains("role:master"))
            .collect()
    }

    pub fn replicas(&self) -> Vec<&Server> {
        self.nodes
            .iter()
            .filter(|n| n.info("replication").contains("role:slave"))
            .collect()
    }

    /// The primary serving `key`.
    pub fn owner(&self, key: &str) -> &Server {
        let slot: i64 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query(&mut self.nodes[0].conn())
            .unwrap();
        self.primaries()
            .into_iter()
            .find(|p| {
                let nodes: String = redis::cmd("CLUSTER").arg("NODES").query(&mut p.conn()).unwrap();
                nodes.lines().any(|l| l.contains("myself") && serves(l, slot))
            })
            .expect("an owner")
    }

    /// Waits until every replica has applied what its primary had.
    pub fn wait_replicated(&self) {
        for replica in self.replicas() {
            let info = replica.info("replication");
            let port: u16 = field(&info, "master_port").unwrap().parse().unwrap();
            let primary = self.nodes.iter().find(|n| n.port == port).unwrap();
            let target: u64 = field(&primary.info("replication"), "master_repl_offset")
                .unwrap()
                .parse()
                .unwrap();
            let ok = eventually(Duration::from_secs(30), || {
                field(&replica.info("replication"), "slave_repl_offset")
                    .and_then(|o| o.parse::<u64>().ok())
                    .is_some_and(|o| o >= target)
            });
            assert!(ok, "replica {} behind", replica.port);
        }
    }

    pub fn reset_stats(&self) {
        self.nodes.iter().for_each(Server::reset_stats);
    }

    pub fn sum(&self, nodes: &[&Server], f: impl Fn(&Server) -> u64) -> u64 {
        nodes.iter().map(|n| f(n)).sum()
    }
}

/// Whether a `CLUSTER NODES` line serves `slot`.
fn serves(line: &str, slot: i64) -> bool {
    line.split_whitespace()
        .skip(8)
        .any(|range| match range.split_once('-') {
            Some((a, b)) => a.parse::<i64>().is_ok_and(|a| a <= slot) && b.parse::<i64>().is_ok_and(|b| slot <= b),
            None => range.parse::<i64>() == Ok(slot),
        })
}

/// A TCP proxy in front of a server that can lose one reply: armed, the next
/// connection to send an `XCLOAK.ALLOW` through it gets no reply to it, and
/// is closed once the server has answered (so the call was applied). The
/// fault a client must not answer by sending the call again.
pub struct Proxy {
    pub port: u16,
    armed: std::sync::Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    pub async fn start(upstream: u16) -> Proxy {
        use std::sync::atomic::AtomicBool;
        use std::sync::Arc;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = loop {
            if let Ok(l) = tokio::net::TcpListener::bind(("127.0.0.1", free_port())).await {
                break l;
            }
        };
        let port = listener.local_addr().unwrap().port();
        let armed = Arc::new(AtomicBool::new(false));
        let arm = armed.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await else {
                    continue;
                };
                let (mut client_read, mut client_write) = client.into_split();
                let (mut server_read, mut server_write) = server.into_split();
                let lose = Arc::new(AtomicBool::new(false));
                let (arm, lose_up) = (arm.clone(), lose.clone());
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 65536];
                    while let Ok(n @ 1..) = client_read.read(&mut buf).await {
                        if buf[..n].windows(12).any(|w| w == b"XCLOAK.ALLOW") && arm.swap(false, Ordering::SeqCst) {
                            lose_up.store(true, Ordering::SeqCst);
                        }
                        if server_write.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                });
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 65536];
                    while let Ok(n @ 1..) = server_read.read(&mut buf).await {
                        if lose.load(Ordering::SeqCst) {
                            // The server ran it; the client never hears. Close.
                            let _ = client_write.shutdown().await;
                            return;
                        }
                        if client_write.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        Proxy { port, armed, task }
    }

    /// Loses the reply to the next `XCLOAK.ALLOW`, and its connection.
    pub fn lose_next_allow_reply(&self) {
        self.armed.store(true, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}
