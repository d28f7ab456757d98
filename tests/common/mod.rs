//! The one way tests start a real server with the freshly built module.
//!
//! - server binary: `$XCLOAK_SERVER` (path), else `redis-server` on PATH;
//! - module: `$XCLOAK_MODULE`, else `target/release/libxcloak.so` (`make test`
//!   builds it first);
//! - each server gets its own loopback port (10000..=22767: it and its
//!   cluster bus port, +10000, stay below Linux's ephemeral range, 32768+, so
//!   no outgoing connection takes them during a restart) and its own
//!   directory, and is shut down when dropped.
#![allow(dead_code)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

pub use redis;
use redis::{Connection, RedisResult};

pub mod cluster;
pub mod netns;
pub mod resp;
pub mod sentinel;
pub mod sequences;
pub mod snapshot;
pub mod stream;
pub mod valgrind;

/// The article's script, verbatim: the reference semantics.
pub const ARTICLE_SCRIPT: &str = include_str!("../oracle/article.lua");

pub fn server_binary() -> String {
    std::env::var("XCLOAK_SERVER").unwrap_or_else(|_| "redis-server".to_string())
}

pub fn module_path() -> PathBuf {
    let path = std::env::var_os("XCLOAK_MODULE")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target/release/libxcloak.so"));
    assert!(
        path.exists(),
        "module not built at {} (run `make build` or `make test`)",
        path.display()
    );
    path
}

/// The dev build with the test-only `fault-injection` feature (`make
/// fault-module`, which `make test` runs): `$XCLOAK_FAULT_MODULE`, else
/// `target/fault/libxcloak.so`. Missing, it fails the test that needs it.
pub fn fault_module() -> PathBuf {
    let path = std::env::var_os("XCLOAK_FAULT_MODULE")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target/fault/libxcloak.so"));
    assert!(
        path.exists(),
        "fault-injection module not built at {} (run `make fault-module`, which `make test` does)",
        path.display()
    );
    path
}

/// The server binary's `--version` line, read once per test process.
fn version_line() -> &'static str {
    static LINE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    LINE.get_or_init(|| {
        let output = Command::new(server_binary())
            .arg("--version")
            .output()
            .expect("server binary runs");
        String::from_utf8_lossy(&output.stdout).into_owned()
    })
}

/// Major.minor.patch of the server binary, from `--version`.
pub fn server_version() -> (u32, u32, u32) {
    let version = version_line()
        .split_whitespace()
        .find_map(|word| word.strip_prefix("v="))
        .expect("a v=X.Y.Z in --version");
    let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    (
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
    )
}

pub fn is_valkey() -> bool {
    version_line().to_ascii_lowercase().contains("valkey")
}

/// Redis 6.2+ (or any Valkey): has CLIENT PAUSE WRITE, FAILOVER, COPY, GETEX.
pub fn at_least_6_2() -> bool {
    is_valkey() || server_version() >= (6, 2, 0)
}

/// Redis 7.0+ (or any Valkey): has `enable-debug-command`, COMMAND DOCS, module configs.
pub fn at_least_7_0() -> bool {
    is_valkey() || server_version() >= (7, 0, 0)
}

/// Redis 7.2+ (or any Valkey): has command ACL categories for modules.
pub fn at_least_7_2() -> bool {
    is_valkey() || server_version() >= (7, 2, 0)
}

static NEXT_PORT: AtomicU16 = AtomicU16::new(0);

/// A free loopback port whose +10000 (cluster bus) is free too. Both stay
/// below 32768, where Linux hands out ephemeral ports (ip_local_port_range
/// 32768-60999): a port inside that range can be taken by any outgoing
/// connection between `Server::stop` and the relaunch on the same port.
pub fn free_port() -> u16 {
    const FIRST: u16 = 10000;
    const LAST: u16 = 22767;
    // Each process starts at its own offset (cargo runs test binaries one
    // after another, but the matrix and manual runs may overlap); the
    // atomic increment-and-wrap keeps every value in range and unique until
    // the whole range has been used.
    let _ = NEXT_PORT.compare_exchange(
        0,
        FIRST + (std::process::id() % 250) as u16 * 50,
        Ordering::SeqCst,
        Ordering::SeqCst,
    );
    loop {
        let port = NEXT_PORT
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |p| {
                Some(if p >= LAST { FIRST } else { p + 1 })
            })
            .unwrap();
        let free = |p: u16| TcpListener::bind(("127.0.0.1", p)).is_ok();
        if free(port) && free(port + 10000) {
            return port;
        }
    }
}

/// How to start a server.
#[derive(Clone)]
pub struct ServerConfig {
    pub module: bool,
    pub module_args: Vec<String>,
    pub extra: Vec<String>,
    /// Run inside this network namespace, also bound to this address
    /// (`in_host`); clients then reach the server there.
    pub netns: Option<(String, String)>,
    /// Environment variables of the server process only (the test process's
    /// environment is shared by every test running in it).
    pub env: Vec<(String, String)>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            module: true,
            module_args: Vec::new(),
            extra: Vec::new(),
            netns: None,
            env: Vec::new(),
        }
    }
}

impl ServerConfig {
    /// The module loaded with `STORAGE compact`: keys are created in the compact type.
    pub fn compact() -> Self {
        ServerConfig::default().module_args(&["STORAGE", "compact"])
    }
    pub fn without_module() -> Self {
        ServerConfig {
            module: false,
            ..Default::default()
        }
    }
    pub fn env(mut self, name: &str, value: &str) -> Self {
        self.env.push((name.to_string(), value.to_string()));
        self
    }
    pub fn module_args(mut self, args: &[&str]) -> Self {
        self.module_args = args.iter().map(|s| s.to_string()).collect();
        self
    }
    /// Extra `--name value` options, as pairs or flags.
    pub fn arg(mut self, name: &str, value: &str) -> Self {
        self.extra.push(format!("--{name}"));
        self.extra.push(value.to_string());
        self
    }
    /// The same option with a new value: earlier `--name value` pairs are
    /// dropped first (so a restart can change an option).
    pub fn set_arg(mut self, name: &str, value: &str) -> Self {
        let flag = format!("--{name}");
        let mut kept = Vec::with_capacity(self.extra.len());
        let mut words = std::mem::take(&mut self.extra).into_iter();
        while let Some(word) = words.next() {
            if word == flag {
                words.next();
            } else {
                kept.push(word);
            }
        }
        self.extra = kept;
        self.arg(name, value)
    }
    /// `--replicaof host port` (as three words: Redis 6.2 refuses the pair
    /// as one), replacing an earlier one.
    pub fn replica_of(mut self, host: &str, port: u16) -> Self {
        if let Some(at) = self.extra.iter().position(|word| word == "--replicaof") {
            let end = (at + 3).min(self.extra.len());
            self.extra.drain(at..end);
        }
        self.extra
            .extend(["--replicaof".to_string(), host.to_string(), port.to_string()]);
        self
    }
    /// Whether `--name` is among the extra options.
    pub fn has_arg(&self, name: &str) -> bool {
        let flag = format!("--{name}");
        self.extra.contains(&flag)
    }
    /// Runs the server on a host of a `netns::Network` (inside its namespace,
    /// bound to its address and to that namespace's loopback).
    pub fn in_host(mut self, host: &netns::Host) -> Self {
        self.netns = Some((host.ns.clone(), host.addr.clone()));
        self
    }
    pub fn start(self) -> Server {
        Server::start_with(self)
    }
    /// Starts a server that must refuse to start (e.g. the module refuses to
    /// load) and returns its log once it has exited. Panics if it serves.
    pub fn start_expecting_exit(self) -> String {
        let server = Server::prepare(self);
        let mut child = server.spawn();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(Some(_)) = child.try_wait() {
                return server.log();
            }
            let serving = server
                .try_client()
                .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c))
                .is_ok();
            if serving || Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "server on {} should have refused to start:\n{}",
                    server.port,
                    server.log()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

pub struct Server {
    pub port: u16,
    /// The address clients connect to: 127.0.0.1, or the host's address in a network.
    pub host: String,
    pub dir: PathBuf,
    pub config: ServerConfig,
    child: Option<Child>,
    /// Set by `wait_ready` when another process's server holds our port.
    port_taken: bool,
    /// valgrind logs of this server already checked (`XCLOAK_VALGRIND`).
    valgrind_checked: Vec<PathBuf>,
}

impl Server {
    /// A server with the module loaded, no persistence.
    pub fn start() -> Server {
        ServerConfig::default().start()
    }

    pub fn start_with(config: ServerConfig) -> Server {
        // Another test process may bind the port between free_port() and our
        // bind (helpers run suites concurrently): then take the next port.
        for _ in 0..5 {
            let mut server = Server::prepare(config.clone());
            if server.try_launch() {
                return server;
            }
        }
        panic!("no free port after 5 attempts");
    }

    /// A port and an empty directory, not started yet.
    fn prepare(config: ServerConfig) -> Server {
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("xcloak-test-{}-{port}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("test directory");
        let host = config
            .netns
            .as_ref()
            .map_or_else(|| "127.0.0.1".to_string(), |(_, addr)| addr.clone());
        Server {
            port,
            host,
            dir,
            config,
            child: None,
            port_taken: false,
            valgrind_checked: Vec::new(),
        }
    }

    fn command_line(&self) -> Vec<String> {
        let mut args: Vec<String> = vec![
            "--port".into(),
            self.port.to_string(),
            "--bind".into(),
            if self.host == "127.0.0.1" {
                self.host.clone()
            } else {
                format!("127.0.0.1 {}", self.host)
            },
            "--dir".into(),
            self.dir.display().to_string(),
            "--logfile".into(),
            "server.log".into(),
            "--save".into(),
            "".into(),
            "--appendonly".into(),
            "no".into(),
            "--protected-mode".into(),
            "no".into(),
        ];
        if at_least_7_0() {
            args.extend(["--enable-debug-command".into(), "yes".into()]);
        }
        if self.config.module {
            args.push("--loadmodule".into());
            args.push(module_path().display().to_string());
            args.extend(self.config.module_args.iter().cloned());
        }
        args.extend(self.config.extra.iter().cloned());
        args
    }

    fn launch(&mut self) {
        assert!(
            self.try_launch(),
            "port {} was taken by another process's server",
            self.port
        );
    }

    /// The server process, with this server's options, its output discarded
    /// (the log goes to `server.log` in its directory).
    fn spawn(&self) -> Child {
        // The program and the arguments before the server's own: valgrind
        // (make test-valgrind) and `ip netns exec` (which execs what follows:
        // the child's pid is the server's) wrap it.
        let mut program = vec![server_binary()];
        // `$XCLOAK_SERVER_STARTS` names a file that gets a line per server
        // process started: the work a selection of tests does, counted.
        if let Some(path) = std::env::var_os("XCLOAK_SERVER_STARTS") {
            use std::io::Write;
            let mut file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .unwrap();
            writeln!(file, "{}", self.port).unwrap();
        }
        if let Some(dir) = valgrind::log_dir() {
            valgrind::check_server_binary(&server_binary());
            std::fs::create_dir_all(&dir).expect("valgrind log directory");
            program = std::iter::once("valgrind".to_string())
                .chain(valgrind::command(&dir, self.port))
                .chain(program)
                .collect();
        }
        if let Some((ns, _)) = &self.config.netns {
            program = ["ip", "netns", "exec", ns.as_str()]
                .into_iter()
                .map(String::from)
                .chain(program)
                .collect();
        }
        let mut command = Command::new(&program[0]);
        command.args(&program[1..]);
        command
            .args(self.command_line())
            .envs(self.config.env.iter().map(|(k, v)| (k, v)))
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", server_binary()))
    }

    /// `launch`, but false (and no process left) when another process's
    /// server holds the port.
    fn try_launch(&mut self) -> bool {
        self.port_taken = false;
        let child = self.spawn();
        self.child = Some(child);
        self.wait_ready();
        !self.port_taken
    }

    /// Whether the server answering on `conn` is our child (not another
    /// process's server on the same port).
    fn answered_by_child(&self, conn: &mut Connection) -> bool {
        let Some(child) = self.child.as_ref() else { return false };
        let info: String = redis::cmd("INFO").arg("server").query(conn).unwrap_or_default();
        let pid = info
            .lines()
            .find_map(|l| l.strip_prefix("process_id:"))
            .map(|v| v.trim().to_string());
        pid.is_none_or(|pid| pid == child.id().to_string())
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + valgrind::patience(Duration::from_secs(20));
        loop {
            if let Ok(mut conn) = self.try_client() {
                let pong: RedisResult<String> = redis::cmd("PING").query(&mut conn);
                if pong.is_ok() && self.answered_by_child(&mut conn) {
                    // Still loading an AOF/RDB answers -LOADING; PING passing means ready.
                    return;
                }
                if pong.is_ok() {
                    // Someone else's server: ours cannot bind; stop it and report.
                    if let Some(mut child) = self.child.take() {
                        let _ = child.kill();
                        let _ = child.wait();
                    }
                    self.port_taken = true;
                    return;
                }
            }
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    if self.log().contains("Address already in use") {
                        self.child = None;
                        self.port_taken = true;
                        return;
                    }
                    panic!("server exited ({status}) on port {}:\n{}", self.port, self.log());
                }
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
        format!("redis://{}:{}/", self.host, self.port)
    }

    /// `host:port`, as Sentinel and the cluster name this node.
    pub fn addr(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }

    /// The CPU time the server process has used so far (user + system, in
    /// milliseconds, at the kernel's clock-tick resolution). An idle server
    /// uses next to none: growth means it is executing something.
    pub fn cpu_ms(&self) -> u64 {
        let pid = self.pid().expect("server running");
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("/proc/PID/stat");
        // After the command name in parentheses: state is field 3, utime 14, stime 15.
        let fields: Vec<&str> = stat[stat.rfind(')').expect("comm") + 2..].split(' ').collect();
        let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
        // In USER_HZ, which Linux fixes at 100 for userspace (sysconf(_SC_CLK_TCK)).
        ticks * 10
    }

    /// Sends `signal` (e.g. `libc::SIGSTOP`, `libc::SIGCONT`) to the server.
    pub fn signal(&self, signal: i32) {
        let pid = self.pid().expect("the server runs");
        // SAFETY: kill(2) on our own child's pid.
        let status = unsafe { libc::kill(pid as i32, signal) };
        assert_eq!(status, 0, "kill -{signal} {pid}: {}", std::io::Error::last_os_error());
    }

    /// `kill -9`: the process dies at once, nothing is flushed or sent.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again (after `kill9` or `stop`), same port and
    /// directory, with its current `config` (which the caller may change).
    pub fn relaunch(&mut self) {
        assert!(self.child.is_none(), "the server on {} still runs", self.port);
        self.launch();
    }

    fn try_client(&self) -> RedisResult<Connection> {
        let client = redis::Client::open(self.url())?;
        client.get_connection_with_timeout(Duration::from_secs(2))
    }

    /// A connection, or `None` if the server does not answer (killed, stopped, cut off).
    pub fn try_connect(&self) -> Option<Connection> {
        let client = redis::Client::open(self.url()).ok()?;
        let conn = client.get_connection_with_timeout(Duration::from_millis(500)).ok()?;
        conn.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        Some(conn)
    }

    pub fn client(&self) -> Connection {
        self.try_client()
            .unwrap_or_else(|e| panic!("connect to {}: {e}\n{}", self.port, self.log()))
    }

    /// The server's process id, while it runs (for `kill -STOP` / `-CONT`).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// Whether the process is still running.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.as_mut().map(|c| c.try_wait()), Some(Ok(None)))
    }

    /// Stops the process (SHUTDOWN, so persistence is flushed as configured).
    /// Under valgrind, then checks its logs (see `valgrind.rs`).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            if let Ok(mut conn) = self.try_client() {
                let _: RedisResult<()> = redis::cmd("SHUTDOWN").arg("NOSAVE").query(&mut conn);
            }
            // valgrind's leak check at exit takes a while on a large heap.
            let deadline = Instant::now() + valgrind::patience(Duration::from_secs(10));
            let mut exited = false;
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    exited = true;
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            if !exited {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        self.check_valgrind_logs();
    }

    /// Under valgrind: reads this server's logs not read yet, prints one
    /// line per process, and fails the test on a memory error or a leak
    /// through the module (not while already failing: that would abort).
    fn check_valgrind_logs(&mut self) {
        let Some(dir) = valgrind::log_dir() else { return };
        let (lines, failures) =
            valgrind::check_logs(&dir, &valgrind::log_prefix(self.port), &mut self.valgrind_checked);
        for line in lines {
            eprintln!("{line}");
        }
        if !failures.is_empty() && !std::thread::panicking() {
            panic!(
                "valgrind found errors in the server on port {}:\n{}",
                self.port,
                failures.join("\n\n")
            );
        }
    }

    /// Stops and starts again on the same port, directory and options.
    pub fn restart(&mut self) {
        self.stop();
        self.launch();
    }

    /// Runs `f` on a connection and returns its result.
    pub fn with<T>(&self, f: impl FnOnce(&mut Connection) -> T) -> T {
        f(&mut self.client())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if valgrind::enabled() && self.child.is_some() {
            // A clean exit, so that valgrind reports; then its verdict.
            self.stop();
        }
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// `XCLOAK.ALLOW key window limit NOW now` -> 0/1.
pub fn allow_at(conn: &mut Connection, key: &str, window: i64, limit: i64, now: i64) -> i64 {
    redis::cmd("XCLOAK.ALLOW")
        .arg(key)
        .arg(window)
        .arg(limit)
        .arg("NOW")
        .arg(now)
        .query(conn)
        .unwrap()
}

/// The article's script at `now` -> 0/1.
pub fn article_at(conn: &mut Connection, key: &str, window: i64, limit: i64, now: i64) -> i64 {
    redis::Script::new(ARTICLE_SCRIPT)
        .key(key)
        .arg(now)
        .arg(window)
        .arg(limit)
        .invoke(conn)
        .unwrap()
}

/// Every (member, score) of a sorted set, in order.
pub fn entries(conn: &mut Connection, key: &str) -> Vec<(String, f64)> {
    redis::cmd("ZRANGE")
        .arg(key)
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query(conn)
        .unwrap()
}

/// A small deterministic generator (xorshift64*): the same workload on
/// every run and every server.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// `TYPE key`.
pub fn key_type(conn: &mut Connection, key: &str) -> String {
    redis::cmd("TYPE").arg(key).query(conn).unwrap()
}

/// The stamps stored in the window at `key`, oldest first, whatever its form:
/// a sorted set's scores, or a compact key's entries read through a COPY
/// converted to a sorted set (which also exercises COPY and XCLOAK.CONVERT).
pub fn stored_stamps(conn: &mut Connection, key: &str) -> Vec<i64> {
    let scores = |conn: &mut Connection, key: &str| -> Vec<i64> {
        let stored: Vec<(Vec<u8>, f64)> = redis::cmd("ZRANGE")
            .arg(key)
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .query(conn)
            .unwrap();
        stored.into_iter().map(|(_, score)| score as i64).collect()
    };
    match key_type(conn, key).as_str() {
        "none" => Vec::new(),
        "zset" => scores(conn, key),
        "xcloaklog" => {
            // In the key's slot (a cluster node refuses another one).
            let copy = if key.contains('{') {
                format!("{key}:stamps")
            } else {
                format!("{{{key}}}:stamps")
            };
            let (copied, converted): (i64, i64) = redis::pipe()
                .atomic()
                .cmd("COPY")
                .arg(key)
                .arg(&copy)
                .arg("REPLACE")
                .cmd("XCLOAK.CONVERT")
                .arg(&copy)
                .arg("ZSET")
                .query(conn)
                .unwrap();
            assert_eq!((copied, converted), (1, 1), "COPY and CONVERT of {key}");
            let stamps = scores(conn, &copy);
            let _: () = redis::cmd("DEL").arg(&copy).query(conn).unwrap();
            stamps
        }
        other => panic!("{key} holds a {other}, not a window"),
    }
}

/// `DEBUG DIGEST` of the whole dataset (7.0+ needs enable-debug-command).
pub fn digest(conn: &mut Connection) -> String {
    redis::cmd("DEBUG").arg("DIGEST").query(conn).unwrap()
}

/// A field of `INFO <section>` as a string.
pub fn info_field(conn: &mut Connection, section: &str, field: &str) -> Option<String> {
    let text: String = redis::cmd("INFO").arg(section).query(conn).unwrap();
    field_of(&text, field)
}

/// The value of `field` in an INFO text (`field:value` lines).
pub fn field_of(info: &str, field: &str) -> Option<String> {
    info.lines().find_map(|line| {
        line.strip_prefix(field)?
            .strip_prefix(':')
            .map(|v| v.trim().to_string())
    })
}

/// Waits (bounded, 60 s) until `replica` is linked and has applied everything
/// `primary` had sent when this was called: its `slave_repl_offset` reaches
/// the primary's `master_repl_offset`. After writes made over other
/// connections use this, not WAIT: WAIT waits for the offset of its own
/// client's last write, so on a connection that wrote nothing it returns at
/// once, counting every linked replica, caught up or not. (The link check:
/// a replica just pointed elsewhere reports its old master's offset.)
pub fn wait_replicated(primary: &Server, replica: &Server) {
    let replication = |server: &Server| -> Option<String> {
        redis::cmd("INFO")
            .arg("replication")
            .query(&mut server.try_client().ok()?)
            .ok()
    };
    let offset = |info: &str, field: &str| -> Option<u64> { field_of(info, field)?.parse().ok() };
    let target = replication(primary)
        .and_then(|info| offset(&info, "master_repl_offset"))
        .expect("the primary's master_repl_offset");
    let port = primary.port.to_string();
    let applied = eventually(Duration::from_secs(60), || {
        replication(replica).is_some_and(|info| {
            field_of(&info, "master_link_status").as_deref() == Some("up")
                && field_of(&info, "master_port") == Some(port.clone())
                && offset(&info, "slave_repl_offset").is_some_and(|o| o >= target)
        })
    });
    assert!(
        applied,
        "replica {} not linked to its primary {} at offset {target} or beyond after 60 s:\n{}\n{}",
        replica.port,
        primary.port,
        replication(replica).unwrap_or_default(),
        replica.log()
    );
}

/// The server's clock (`TIME`), in milliseconds.
pub fn server_time_ms(conn: &mut Connection) -> i64 {
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query(conn).unwrap();
    secs * 1000 + micros / 1000
}

/// Returns once the server's clock has moved `ms` milliseconds on from now
/// (what a later call stamps or re-arms then differs from what it did before).
pub fn wait_server_clock(conn: &mut Connection, ms: i64) {
    let start = server_time_ms(conn);
    let moved = eventually(Duration::from_secs(10), || server_time_ms(conn) >= start + ms);
    assert!(moved, "the server's clock did not move {ms} ms on in 10 s");
}

/// Polls `check` until it returns true or `timeout` passes.
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
