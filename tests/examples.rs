//! The client examples under `docs/examples/` (Rust, Python, Node.js) run for
//! real: against a server with the module (answered by XCLOAK.ALLOW), against
//! one without it (answered by the Lua fallback after "unknown command"), and
//! for Python and Node through their client's cluster mode against a Redis
//! Cluster, with and without the module. The printed HTTP decisions are
//! asserted, and the servers' own statistics prove which path answered.
//!
//! Python and Node dependencies install on first use into the examples'
//! git-ignored folders (`scripts/example-deps.sh`, from PyPI and npm).
mod common;
use common::cluster::Cluster;
use common::*;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// Not a whole number of seconds: an admission's reset (exactly the window)
/// prints 61 only when rounded up, as HTTP clients must not come back early.
const WINDOW_MS: u64 = 60_200;
const LIMIT: u64 = 3;
const CALLS: usize = 5;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Lang {
    Rust,
    Python,
    Node,
}

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Installs the example's dependencies once per test process (the script
/// itself is idempotent and takes a lock).
fn ensure_deps(lang: Lang) {
    static PYTHON: OnceLock<()> = OnceLock::new();
    static NODE: OnceLock<()> = OnceLock::new();
    let install = |what: &str| {
        let status = Command::new(repo().join("scripts/example-deps.sh")).arg(what).status().expect("run example-deps.sh");
        assert!(status.success(), "scripts/example-deps.sh {what} failed");
    };
    match lang {
        Lang::Python => *PYTHON.get_or_init(|| install("python")),
        Lang::Node => *NODE.get_or_init(|| install("node")),
        Lang::Rust => {
            ensure_rust_binary();
        }
    }
}

/// Builds the Rust example (`[[example]] ratelimit` in Cargo.toml) with the
/// cargo running this test, and returns its binary.
fn rust_example() -> PathBuf {
    let output = Command::new(env!("CARGO"))
        .args(["build", "--quiet", "--example", "ratelimit", "--message-format=short"])
        .current_dir(repo())
        .output()
        .expect("run cargo");
    assert!(output.status.success(), "cargo build --example ratelimit:\n{}", String::from_utf8_lossy(&output.stderr));
    // Same profile directory as this test binary: target/<profile>/deps/examples-*.
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().and_then(Path::parent).unwrap();
    let binary = profile_dir.join("examples/ratelimit");
    assert!(binary.exists(), "{} not built", binary.display());
    binary
}

/// Runs an example for `CALLS` requests on `key`; returns its stdout lines.
fn run_example(lang: Lang, url: &str, key: &str, cluster: bool) -> Vec<String> {
    ensure_deps(lang);
    let examples = repo().join("docs/examples");
    let args = [url.to_string(), key.to_string(), WINDOW_MS.to_string(), LIMIT.to_string(), CALLS.to_string()];
    let mut command = match lang {
        Lang::Rust => Command::new(ensure_rust_binary()),
        Lang::Python => {
            let mut c = Command::new(examples.join("python/.venv/bin/python"));
            c.arg(examples.join("python/ratelimit.py"));
            c
        }
        Lang::Node => {
            let mut c = Command::new("node");
            c.arg(examples.join("node/ratelimit.js"));
            c
        }
    };
    command.args(args);
    if cluster {
        command.arg("--cluster");
    }
    let output = command.output().unwrap_or_else(|e| panic!("{lang:?} example: {e}"));
    let stdout = String::from_utf8_lossy(&output.stdout).to_string();
    assert!(
        output.status.success(),
        "{lang:?} example failed ({}):\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout.lines().map(str::to_string).collect()
}

fn ensure_rust_binary() -> PathBuf {
    static RUST: OnceLock<PathBuf> = OnceLock::new();
    RUST.get_or_init(rust_example).clone()
}

/// One printed decision: `200 RateLimit-Limit: 3 | ... | via command`.
#[derive(Debug)]
struct Decision {
    status: u16,
    headers: BTreeMap<String, i64>,
    via: String,
}

fn parse(line: &str) -> Decision {
    let (status, rest) = line.split_once(' ').unwrap_or_else(|| panic!("bad line {line:?}"));
    let mut headers = BTreeMap::new();
    let mut via = String::new();
    for field in rest.split(" | ") {
        if let Some(v) = field.strip_prefix("via ") {
            via = v.to_string();
        } else {
            let (name, value) = field.split_once(": ").unwrap_or_else(|| panic!("bad field {field:?} in {line:?}"));
            headers.insert(name.to_string(), value.parse().unwrap_or_else(|_| panic!("bad value in {line:?}")));
        }
    }
    Decision { status: status.parse().unwrap(), headers, via }
}

/// Limit 3 per 60.2 s, 5 calls: 200 with 2, 1, 0 remaining, then two 429s
/// with a Retry-After of at most 61 s, all answered by `via`.
fn assert_decisions(lang: Lang, lines: &[String], via: &str) {
    assert_eq!(lines.len(), CALLS, "{lang:?}: {lines:?}");
    let window_s = WINDOW_MS.div_ceil(1000) as i64;
    for (i, line) in lines.iter().enumerate() {
        let d = parse(line);
        assert_eq!(d.via, via, "{lang:?} call {i}: {line}");
        assert_eq!(d.headers["RateLimit-Limit"], LIMIT as i64, "{lang:?}: {line}");
        if i < LIMIT as usize {
            assert_eq!(d.status, 200, "{lang:?} call {i}: {line}");
            assert_eq!(d.headers["RateLimit-Remaining"], LIMIT as i64 - 1 - i as i64, "{lang:?}: {line}");
            // Just admitted: the window empties one full window from now.
            assert_eq!(d.headers["RateLimit-Reset"], window_s, "{lang:?}: {line}");
            assert!(!d.headers.contains_key("Retry-After"), "{lang:?}: {line}");
        } else {
            assert_eq!(d.status, 429, "{lang:?} call {i}: {line}");
            assert_eq!(d.headers["RateLimit-Remaining"], 0, "{lang:?}: {line}");
            let retry = d.headers["Retry-After"];
            let reset = d.headers["RateLimit-Reset"];
            assert!((1..=window_s).contains(&retry) && (retry..=window_s).contains(&reset), "{lang:?}: {line}");
        }
    }
}

fn commandstats(conn: &mut redis::Connection) -> String {
    redis::cmd("INFO").arg("commandstats").query(conn).unwrap()
}

fn check_standalone(lang: Lang) {
    let with_module = Server::start();
    let without = ServerConfig::without_module().start();
    let key = format!("user:{lang:?}");

    let lines = run_example(lang, &with_module.url(), &key, false);
    assert_decisions(lang, &lines, "command");
    let mut conn = with_module.client();
    assert_eq!(entries(&mut conn, &key).len(), LIMIT as usize);
    let stats = commandstats(&mut conn);
    assert!(stats.contains("cmdstat_xcloak.allow:calls=5,") && !stats.contains("cmdstat_evalsha"), "{lang:?}:\n{stats}");

    let lines = run_example(lang, &without.url(), &key, false);
    assert_decisions(lang, &lines, "script");
    let mut conn = without.client();
    // The script's members are the module's: integers (now mod 10^11)*1000+k.
    let members = entries(&mut conn, &key);
    assert_eq!(members.len(), LIMIT as usize);
    for (member, score) in &members {
        assert_eq!(member.parse::<i64>().unwrap() / 1000, *score as i64 % 100_000_000_000, "{lang:?}: member {member}");
    }
    let stats = commandstats(&mut conn);
    assert!(stats.contains("cmdstat_evalsha:calls="), "{lang:?}: the script did not answer:\n{stats}");
    // A fresh server had no script cached: the first EVALSHA got NOSCRIPT and
    // the client loaded it (SCRIPT LOAD, or EVAL for node-redis).
    assert!(
        stats.contains("cmdstat_script") || stats.contains("cmdstat_eval:"),
        "{lang:?}: the script was never loaded after NOSCRIPT:\n{stats}"
    );
}

fn check_cluster(cluster: &Cluster, lang: Lang, via: &str) {
    // Keys in different slots, so several primaries answer.
    for n in 0..3 {
        let key = format!("{lang:?}:user:{n}");
        let lines = run_example(lang, &cluster.seed_url(), &key, true);
        assert_decisions(lang, &lines, via);
        let owner = cluster.owner_of_key(&key);
        let held = cluster.nodes[owner].with(|c| entries(c, &key).len());
        assert_eq!(held, LIMIT as usize, "{lang:?}: {key} on its slot's primary");
    }
}

#[test]
fn rust_example_uses_the_command_or_the_script() {
    check_standalone(Lang::Rust);
}

#[test]
fn python_example_uses_the_command_or_the_script() {
    check_standalone(Lang::Python);
}

#[test]
fn node_example_uses_the_command_or_the_script() {
    check_standalone(Lang::Node);
}

#[test]
fn cluster_clients_with_the_module() {
    let cluster = Cluster::start(3, 0);
    check_cluster(&cluster, Lang::Python, "command");
    check_cluster(&cluster, Lang::Node, "command");
}

#[test]
fn cluster_clients_without_the_module() {
    let cluster = Cluster::start_with(ServerConfig::without_module(), 3, 0);
    check_cluster(&cluster, Lang::Python, "script");
    check_cluster(&cluster, Lang::Node, "script");
}
