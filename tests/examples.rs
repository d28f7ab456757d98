//! The client examples under `docs/examples/` (Rust, Python, Node.js with
//! node-redis and with ioredis, Go) run for real: against a server with the
//! module (answered by XCLOAK.ALLOW), against one without it (answered by the
//! Lua fallback after "unknown command"), and through each client's cluster
//! mode against a Redis Cluster, with and without the module. The printed HTTP
//! decisions are asserted, and the servers' own statistics prove which path
//! answered, that no call was redirected (MOVED) and that reads went to
//! replicas.
//!
//! Python, Node and Go dependencies install on first use (`scripts/example-deps.sh`:
//! PyPI and npm into the examples' git-ignored folders, Go modules from the Go
//! module proxy).
use crate::common;
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
    /// node-redis (`node/ratelimit.js`).
    Node,
    /// ioredis with the xcloak package's routing helper (`node/ratelimit-ioredis.js`).
    Ioredis,
    Go,
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
        let status = Command::new(repo().join("scripts/example-deps.sh"))
            .arg(what)
            .status()
            .expect("run example-deps.sh");
        assert!(status.success(), "scripts/example-deps.sh {what} failed");
    };
    match lang {
        Lang::Python => *PYTHON.get_or_init(|| install("python")),
        Lang::Node | Lang::Ioredis => *NODE.get_or_init(|| install("node")),
        Lang::Rust => {
            ensure_rust_binary();
        }
        Lang::Go => {
            ensure_go_binary();
        }
    }
}

/// The `go` command: on PATH, else Go's default install folder.
fn go_binary() -> PathBuf {
    let on_path = Command::new("go")
        .arg("version")
        .output()
        .is_ok_and(|o| o.status.success());
    if on_path {
        PathBuf::from("go")
    } else {
        PathBuf::from("/usr/local/go/bin/go")
    }
}

/// Builds the Go example the way its doc comment says (module mode: its
/// go.mod points at clients/go; go-redis from the Go module proxy), into
/// target/go/, with Go's own build cache (shared with clients/go/test.sh).
fn go_example() -> PathBuf {
    let status = Command::new(repo().join("scripts/example-deps.sh"))
        .arg("go")
        .status()
        .expect("run example-deps.sh");
    assert!(status.success(), "scripts/example-deps.sh go failed");
    let dir = repo().join("target/go");
    let binary = dir.join("ratelimit");
    let output = Command::new(go_binary())
        .args(["build", "-o"])
        .arg(&binary)
        .arg(".")
        .env("GOTOOLCHAIN", "local")
        .current_dir(repo().join("docs/examples/go"))
        .output()
        .expect("run go build");
    assert!(
        output.status.success(),
        "go build docs/examples/go:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    binary
}

fn ensure_go_binary() -> PathBuf {
    static GO: OnceLock<PathBuf> = OnceLock::new();
    GO.get_or_init(go_example).clone()
}

/// Builds the Rust example, a user of the `xcloak-client` crate
/// (`[[example]] ratelimit` of clients/rust/Cargo.toml), with the cargo
/// running this test, and returns its binary. `--all-features` is the
/// feature set clients/rust/test.sh builds, so the two share every artifact.
fn rust_example() -> PathBuf {
    // Same profile directory as this test binary: target/<profile>/deps/examples-*
    // (`cargo test --release` runs it from target/release).
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().and_then(Path::parent).unwrap();
    let mut build = Command::new(env!("CARGO"));
    build.args([
        "build",
        "--quiet",
        "-p",
        "xcloak-client",
        "--all-features",
        "--example",
        "ratelimit",
        "--message-format=short",
    ]);
    if profile_dir.ends_with("release") {
        build.arg("--release");
    }
    let output = build.current_dir(repo()).output().expect("run cargo");
    assert!(
        output.status.success(),
        "cargo build -p xcloak-client --example ratelimit:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let binary = profile_dir.join("examples/ratelimit");
    assert!(binary.exists(), "{} not built", binary.display());
    binary
}

/// Runs an example for `CALLS` requests on `key`; returns its stdout lines.
fn run_example(lang: Lang, url: &str, key: &str, cluster: bool) -> Vec<String> {
    let mut args = vec![
        url.to_string(),
        key.to_string(),
        WINDOW_MS.to_string(),
        LIMIT.to_string(),
        CALLS.to_string(),
    ];
    if cluster {
        args.push("--cluster".to_string());
    }
    run_example_with(lang, &args)
}

/// Runs an example with this command line; returns its stdout lines.
fn run_example_with(lang: Lang, args: &[String]) -> Vec<String> {
    ensure_deps(lang);
    let examples = repo().join("docs/examples");
    let mut command = match lang {
        Lang::Rust => Command::new(ensure_rust_binary()),
        Lang::Go => Command::new(ensure_go_binary()),
        Lang::Python => {
            let mut c = Command::new(examples.join("python/.venv/bin/python"));
            c.arg(examples.join("python/ratelimit.py"));
            c
        }
        Lang::Node | Lang::Ioredis => {
            let mut c = Command::new("node");
            c.arg(examples.join(if lang == Lang::Node {
                "node/ratelimit.js"
            } else {
                "node/ratelimit-ioredis.js"
            }));
            c
        }
    };
    command.args(args);
    let output = command.output().unwrap_or_else(|e| panic!("{lang:?} example: {e}"));
    let stdout = String::from_utf8_lossy(&output.stdout).to_string();
    assert!(
        output.status.success(),
        "{lang:?} example {args:?} failed ({}):\n{}\n{}",
        output.status,
        stdout.lines().take(20).collect::<Vec<_>>().join("\n"),
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
            let (name, value) = field
                .split_once(": ")
                .unwrap_or_else(|| panic!("bad field {field:?} in {line:?}"));
            headers.insert(
                name.to_string(),
                value.parse().unwrap_or_else(|_| panic!("bad value in {line:?}")),
            );
        }
    }
    Decision {
        status: status.parse().unwrap(),
        headers,
        via,
    }
}

/// Limit 3 per 60.2 s, 5 calls: 200 with 2, 1, 0 remaining, then two 429s
/// with a Retry-After of at most 61 s, all answered by `via`, except that a
/// package's block cache (docs/clients.md) may answer the second 429 (`via
/// cache`). Returns how many calls reached the server.
fn assert_decisions(lang: Lang, lines: &[String], via: &str) -> usize {
    assert_eq!(lines.len(), CALLS, "{lang:?}: {lines:?}");
    let window_s = WINDOW_MS.div_ceil(1000) as i64;
    let mut sent = 0;
    for (i, line) in lines.iter().enumerate() {
        let d = parse(line);
        if i > LIMIT as usize && d.via == "cache" {
            assert_eq!(d.status, 429, "{lang:?} call {i}: {line}");
        } else {
            assert_eq!(d.via, via, "{lang:?} call {i}: {line}");
            sent += 1;
        }
        assert_eq!(d.headers["RateLimit-Limit"], LIMIT as i64, "{lang:?}: {line}");
        if i < LIMIT as usize {
            assert_eq!(d.status, 200, "{lang:?} call {i}: {line}");
            assert_eq!(
                d.headers["RateLimit-Remaining"],
                LIMIT as i64 - 1 - i as i64,
                "{lang:?}: {line}"
            );
            // Just admitted: the window empties one full window from now.
            assert_eq!(d.headers["RateLimit-Reset"], window_s, "{lang:?}: {line}");
            assert!(!d.headers.contains_key("Retry-After"), "{lang:?}: {line}");
        } else {
            assert_eq!(d.status, 429, "{lang:?} call {i}: {line}");
            assert_eq!(d.headers["RateLimit-Remaining"], 0, "{lang:?}: {line}");
            let retry = d.headers["Retry-After"];
            let reset = d.headers["RateLimit-Reset"];
            assert!(
                (1..=window_s).contains(&retry) && (retry..=window_s).contains(&reset),
                "{lang:?}: {line}"
            );
        }
    }
    sent
}

fn commandstats(conn: &mut redis::Connection) -> String {
    redis::cmd("INFO").arg("commandstats").query(conn).unwrap()
}

fn check_standalone(lang: Lang) {
    let with_module = Server::start();
    let without = ServerConfig::without_module().start();
    let key = format!("user:{lang:?}");

    let lines = run_example(lang, &with_module.url(), &key, false);
    let sent = assert_decisions(lang, &lines, "command");
    let mut conn = with_module.client();
    assert_eq!(entries(&mut conn, &key).len(), LIMIT as usize);
    let stats = commandstats(&mut conn);
    assert!(
        stats.contains(&format!("cmdstat_xcloak.allow:calls={sent},")) && !stats.contains("cmdstat_evalsha"),
        "{lang:?}:\n{stats}"
    );

    let lines = run_example(lang, &without.url(), &key, false);
    assert_decisions(lang, &lines, "script");
    let mut conn = without.client();
    // The script's members are the module's: integers (now mod 10^11)*1000+k.
    let members = entries(&mut conn, &key);
    assert_eq!(members.len(), LIMIT as usize);
    for (member, score) in &members {
        assert_eq!(
            member.parse::<i64>().unwrap() / 1000,
            *score as i64 % 100_000_000_000,
            "{lang:?}: member {member}"
        );
    }
    let stats = commandstats(&mut conn);
    assert!(
        stats.contains("cmdstat_evalsha:calls="),
        "{lang:?}: the script did not answer:\n{stats}"
    );
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
fn ioredis_example_uses_the_command_or_the_script() {
    check_standalone(Lang::Ioredis);
}

#[test]
fn go_example_uses_the_command_or_the_script() {
    check_standalone(Lang::Go);
}

#[test]
fn cluster_clients_without_the_module() {
    let cluster = Cluster::start_with(ServerConfig::without_module(), 3, 0);
    for lang in [Lang::Python, Lang::Node, Lang::Ioredis, Lang::Go, Lang::Rust] {
        check_cluster(&cluster, lang, "script");
    }
}

// ---- Tiers: `--tier WINDOW:LIMIT` and the IETF multi-policy headers,
// the same lines from every example, through the command and the script.

/// The second tier, one hour; the positional one is WINDOW_MS / LIMIT.
const TIER: &str = "3600000:5";
/// Seeded into `KEY:1` before the run: in the hour, out of the minute.
const SEEDED: i64 = 3;
const SEEDED_AGO_MS: i64 = 120_000;

/// 7 requests alternating `KEY:0` and `KEY:1` (`--keys 2`), `KEY:1` holding
/// 3 entries from 2 minutes ago. `KEY:0` fills its minute (3) and is refused
/// by it: Retry-After within the minute. `KEY:1` fills its hour (3 + 2 = 5)
/// first and is refused by the hour with room in the minute (r=1): Retry-After
/// is when the seeded entries leave the hour, about 3480 s. Admitted: every
/// tier's reset is exactly its window, rounded up (60.2 s: 61). `{a..=b}`:
/// a number that depends on the milliseconds between requests.
const TIER_LINES: [&str; 7] = [
    r#"200 RateLimit-Policy: "60200ms";q=3;w=61, "3600000ms";q=5;w=3600 | RateLimit: "60200ms";r=2;t=61, "3600000ms";r=4;t=3600"#,
    r#"200 RateLimit-Policy: "60200ms";q=3;w=61, "3600000ms";q=5;w=3600 | RateLimit: "60200ms";r=2;t=61, "3600000ms";r=1;t=3600"#,
    r#"200 RateLimit-Policy: "60200ms";q=3;w=61, "3600000ms";q=5;w=3600 | RateLimit: "60200ms";r=1;t=61, "3600000ms";r=3;t=3600"#,
    r#"200 RateLimit-Policy: "60200ms";q=3;w=61, "3600000ms";q=5;w=3600 | RateLimit: "60200ms";r=1;t=61, "3600000ms";r=0;t=3600"#,
    r#"200 RateLimit-Policy: "60200ms";q=3;w=61, "3600000ms";q=5;w=3600 | RateLimit: "60200ms";r=0;t=61, "3600000ms";r=2;t=3600"#,
    r#"429 RateLimit-Policy: "60200ms";q=3;w=61, "3600000ms";q=5;w=3600 | RateLimit: "60200ms";r=1;t={1..=61}, "3600000ms";r=0;t={3000..=3600} | Retry-After: {3000..=3480}"#,
    r#"429 RateLimit-Policy: "60200ms";q=3;w=61, "3600000ms";q=5;w=3600 | RateLimit: "60200ms";r=0;t={1..=61}, "3600000ms";r=2;t={3000..=3600} | Retry-After: {1..=61}"#,
];

/// Whether `line` is `pattern`, where `{lo..=hi}` stands for an integer in that range.
fn matches_pattern(line: &str, pattern: &str) -> bool {
    let mut rest = line;
    for (i, piece) in pattern.split(['{', '}']).enumerate() {
        if i % 2 == 0 {
            let Some(after) = rest.strip_prefix(piece) else {
                return false;
            };
            rest = after;
            continue;
        }
        let (lo, hi) = piece.split_once("..=").expect("{lo..=hi}");
        let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        let Ok(n) = rest[..digits].parse::<i64>() else {
            return false;
        };
        if !(lo.parse::<i64>().unwrap()..=hi.parse().unwrap()).contains(&n) {
            return false;
        }
        rest = &rest[digits..];
    }
    rest.is_empty()
}

/// Records `SEEDED` entries in `key` stamped `SEEDED_AGO_MS` before the
/// server's clock, with the same tiers, by the module or by the script.
fn seed_past_entries(conn: &mut redis::Connection, key: &str, via: &str) {
    const FALLBACK: &str = include_str!("../src/lua/xcloak_allow.lua");
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query(conn).unwrap();
    let then = secs * 1000 + micros / 1000 - SEEDED_AGO_MS;
    let (tier_window, tier_limit) = TIER.split_once(':').unwrap();
    for _ in 0..SEEDED {
        let args = [
            WINDOW_MS.to_string(),
            LIMIT.to_string(),
            "TIER".into(),
            tier_window.into(),
            tier_limit.into(),
            "NOW".into(),
            then.to_string(),
        ];
        let admitted: i64 = if via == "command" {
            redis::cmd("XCLOAK.ALLOW").arg(key).arg(&args).query(conn).unwrap()
        } else {
            redis::Script::new(FALLBACK).key(key).arg(&args).invoke(conn).unwrap()
        };
        assert_eq!(admitted, 1, "seeding {key} via {via}");
    }
}

/// Every example with `--tier`, against one server with the module and one
/// without it (the script answers): the same RateLimit-Policy / RateLimit /
/// Retry-After lines, and rejections recorded nothing. Fails if an example
/// drops the TIER (the hour never refuses `KEY:1`), reads the wrong field of
/// the reply, rounds down (60 for 60.2 s) or names the tiers differently.
#[test]
fn examples_print_ietf_headers_for_tiers() {
    let with_module = Server::start();
    let without = ServerConfig::without_module().start();
    for lang in [Lang::Rust, Lang::Python, Lang::Node, Lang::Ioredis, Lang::Go] {
        for (server, via) in [(&with_module, "command"), (&without, "script")] {
            let key = format!("tiers:{lang:?}");
            server.with(|c| seed_past_entries(c, &format!("{key}:1"), via));
            let args = [
                server.url(),
                key.clone(),
                WINDOW_MS.to_string(),
                LIMIT.to_string(),
                TIER_LINES.len().to_string(),
            ];
            let args: Vec<String> = args
                .into_iter()
                .chain(["--keys", "2", "--tier", TIER].map(String::from))
                .collect();
            let lines = run_example_with(lang, &args);
            assert_eq!(lines.len(), TIER_LINES.len(), "{lang:?} via {via}: {lines:#?}");
            for (i, (line, expected)) in lines.iter().zip(TIER_LINES).enumerate() {
                let expected = format!("{expected} | via {via}");
                assert!(
                    matches_pattern(line, &expected),
                    "{lang:?} request {i}:\n got      {line}\n expected {expected}"
                );
            }
            // Admitted: 3 on KEY:0; 2 on KEY:1 beside the 3 seeded. Refused: none recorded.
            let held = server.with(|c| [0, 1].map(|n| entries(c, &format!("{key}:{n}")).len()));
            assert_eq!(held, [LIMIT as usize, SEEDED as usize + 2], "{lang:?} via {via}");
        }
    }
}

// ---- Every cluster client against one 3+3 cluster, as the documented
// least-privilege user: exact admissions, no redirection, reads on replicas.

/// Long enough that nothing leaves a window during the runs.
const CLUSTER_WINDOW_MS: u64 = 600_000;
const CLUSTER_KEYS: usize = 300;
const CLUSTER_CALLS: usize = 1_200;
const ACL_USER: &str = "api";
const ACL_PASSWORD: &str = "secret";

/// Where a client's PEEKs land with `--peek` in cluster mode.
#[derive(Clone, Copy, Debug, PartialEq)]
enum ReplicaReads {
    /// Every PEEK on a replica (ioredis `scaleReads: 'slave'`, redis-py
    /// `target_nodes`, go-redis `ReadOnly`, xcloak-client `read_from_replicas`).
    Only,
    /// node-redis `useReplicas`: the primary and its replicas in turn.
    Shared,
}

/// One client run: a name (also its key prefix), the example, extra options.
struct ClusterRun {
    name: &'static str,
    lang: Lang,
    options: &'static [&'static str],
    /// ioredis `--key-prefix`: the client, not the caller, puts it on the key.
    key_prefix: &'static str,
    replica_reads: Option<ReplicaReads>,
}

const CLUSTER_RUNS: &[ClusterRun] = &[
    ClusterRun {
        name: "node-redis",
        lang: Lang::Node,
        options: &[],
        key_prefix: "",
        replica_reads: Some(ReplicaReads::Shared),
    },
    ClusterRun {
        name: "ioredis",
        lang: Lang::Ioredis,
        options: &[],
        key_prefix: "",
        replica_reads: Some(ReplicaReads::Only),
    },
    ClusterRun {
        name: "ioredis-pipeline",
        lang: Lang::Ioredis,
        options: &["--mode", "pipeline"],
        key_prefix: "",
        replica_reads: None,
    },
    // The key given is "ioredis-auto": only the prefix puts it under the ACL's `rl:*`.
    ClusterRun {
        name: "ioredis-auto",
        lang: Lang::Ioredis,
        options: &["--mode", "auto", "--key-prefix", "rl:"],
        key_prefix: "rl:",
        replica_reads: Some(ReplicaReads::Only),
    },
    ClusterRun {
        name: "redis-py",
        lang: Lang::Python,
        options: &[],
        key_prefix: "",
        replica_reads: Some(ReplicaReads::Only),
    },
    ClusterRun {
        name: "redis-py-asyncio",
        lang: Lang::Python,
        options: &["--asyncio"],
        key_prefix: "",
        replica_reads: Some(ReplicaReads::Only),
    },
    ClusterRun {
        name: "go-redis",
        lang: Lang::Go,
        options: &[],
        key_prefix: "",
        replica_reads: Some(ReplicaReads::Only),
    },
    ClusterRun {
        name: "rust-redis",
        lang: Lang::Rust,
        options: &[],
        key_prefix: "",
        replica_reads: Some(ReplicaReads::Only),
    },
];

/// The ACL rules of the cluster user documented in docs/commands.md (the line
/// `ACL SETUSER api on >secret ... +cluster|slots ...`), so the docs and this
/// test cannot drift apart.
fn documented_cluster_acl() -> Vec<String> {
    let doc = std::fs::read_to_string(repo().join("docs/commands.md")).expect("docs/commands.md");
    let prefix = format!("ACL SETUSER {ACL_USER} on >{ACL_PASSWORD} ");
    let line = doc
        .lines()
        .find(|l| l.starts_with(&prefix) && l.contains("+cluster|slots"))
        .expect("docs/commands.md documents the cluster client's ACL line");
    line.split_whitespace().skip(3).map(str::to_string).collect()
}

/// Sum of a counter over nodes: `errorstat_MOVED:count=N` (INFO errorstats) or
/// `cmdstat_xcloak.peek:calls=N` (INFO commandstats).
fn stat_sum(nodes: &[&Server], section: &str, line_prefix: &str) -> u64 {
    nodes
        .iter()
        .map(|node| {
            let info: String = node.with(|c| redis::cmd("INFO").arg(section).query(c).unwrap());
            info.lines()
                .find_map(|l| l.strip_prefix(line_prefix))
                .map(|rest| {
                    rest.split(|ch: char| !ch.is_ascii_digit())
                        .next()
                        .unwrap()
                        .parse::<u64>()
                        .unwrap()
                })
                .unwrap_or(0)
        })
        .sum()
}

/// Waits until every node's `CLUSTER SLOTS` lists a replica for every range:
/// a node leaves a replica out until it has heard (by gossip, seconds after
/// the replica linked up) a replication offset other than 0 from it, and a
/// client that reads its slot map before then has no replica to read from.
fn wait_replicas_listed(cluster: &Cluster) {
    let listed = |node: &Server| -> bool {
        let Ok(redis::Value::Array(ranges)) = node.with(|c| redis::cmd("CLUSTER").arg("SLOTS").query(c)) else {
            return false;
        };
        !ranges.is_empty()
            && ranges
                .iter()
                .all(|r| matches!(r, redis::Value::Array(parts) if parts.len() >= 3 + cluster.replicas_per_primary))
    };
    for node in &cluster.nodes {
        let ok = eventually(std::time::Duration::from_secs(60), || listed(node));
        let slots: redis::Value = node.with(|c| redis::cmd("CLUSTER").arg("SLOTS").query(c).unwrap());
        assert!(
            ok,
            "node {} does not list every replica in CLUSTER SLOTS after 60 s: {slots:?}",
            node.port
        );
    }
}

fn reset_stats(cluster: &Cluster) {
    for node in &cluster.nodes {
        node.with(|c| redis::cmd("CONFIG").arg("RESETSTAT").query::<()>(c).unwrap());
    }
}

/// `--keys 300`, 1,200 requests, limit 3: requests 0..899 fill every key's
/// window (three rounds over the 300 keys), the fourth round is rejected.
fn assert_admissions(run: &ClusterRun, lines: &[String], peek: bool) {
    assert_eq!(lines.len(), CLUSTER_CALLS, "{}: {} lines", run.name, lines.len());
    let admitted = lines.iter().filter(|l| l.starts_with("200 ")).count();
    for (i, line) in lines.iter().enumerate() {
        let d = parse(line);
        assert_eq!(d.via, "command", "{} request {i}: {line}", run.name);
        let expected = if !peek && i < CLUSTER_KEYS * LIMIT as usize {
            200
        } else {
            429
        };
        assert_eq!(
            d.status, expected,
            "{} request {i} ({admitted} admitted in all): {line}",
            run.name
        );
    }
    if !peek {
        assert_eq!(admitted, CLUSTER_KEYS * LIMIT as usize, "{}", run.name);
    }
}

#[test]
fn cluster_clients_reach_the_key_node_directly() {
    let cluster = Cluster::start(3, 1);
    println!(
        "server {} {:?}",
        if is_valkey() { "valkey" } else { "redis" },
        server_version()
    );
    let primaries: Vec<&Server> = cluster
        .primary_indexes()
        .into_iter()
        .map(|i| &cluster.nodes[i])
        .collect();
    let replicas: Vec<&Server> = cluster
        .nodes
        .iter()
        .filter(|n| !primaries.iter().any(|p| p.port == n.port))
        .collect();
    let rules = documented_cluster_acl();
    for node in &cluster.nodes {
        node.with(|c| {
            redis::cmd("ACL")
                .arg("SETUSER")
                .arg(ACL_USER)
                .arg(&rules)
                .query::<()>(c)
        })
        .unwrap_or_else(|e| panic!("ACL SETUSER {rules:?} on {}: {e}", node.port));
    }
    let url = format!("redis://{ACL_USER}:{ACL_PASSWORD}@127.0.0.1:{}/", cluster.nodes[0].port);
    let all: Vec<&Server> = cluster.nodes.iter().collect();

    for run in CLUSTER_RUNS {
        // Under the ACL's `rl:*`: given by the caller, or added by the client's prefix.
        let key = if run.key_prefix.is_empty() {
            format!("rl:{}", run.name)
        } else {
            run.name.to_string()
        };
        let mut args = vec![
            url.clone(),
            key.clone(),
            CLUSTER_WINDOW_MS.to_string(),
            LIMIT.to_string(),
            CLUSTER_CALLS.to_string(),
        ];
        args.extend(["--cluster", "--keys", &CLUSTER_KEYS.to_string()].map(String::from));
        args.extend(run.options.iter().map(|o| o.to_string()));

        reset_stats(&cluster);
        let lines = run_example_with(run.lang, &args);
        assert_admissions(run, &lines, false);
        assert_eq!(
            stat_sum(&all, "errorstats", "errorstat_MOVED:count="),
            0,
            "{}: MOVED replies",
            run.name
        );
        assert_eq!(
            stat_sum(&primaries, "commandstats", "cmdstat_xcloak.allow:calls="),
            CLUSTER_CALLS as u64,
            "{}",
            run.name
        );
        // Every window where its slot lives, under the key the client built.
        let stored_key = format!("{}{key}", run.key_prefix);
        let counts: Vec<usize> = primaries
            .iter()
            .map(|p| {
                p.with(|c| {
                    redis::cmd("KEYS")
                        .arg(format!("{stored_key}:*"))
                        .query::<Vec<String>>(c)
                        .unwrap()
                        .len()
                })
            })
            .collect();
        assert_eq!(
            counts.iter().sum::<usize>(),
            CLUSTER_KEYS,
            "{}: keys {stored_key}:* per primary {counts:?}",
            run.name
        );
        assert!(
            counts.iter().all(|&n| n > 0),
            "{}: every primary serves some keys {counts:?}",
            run.name
        );
        println!(
            "{}: {} of {} admitted, 0 MOVED, keys per primary {counts:?}",
            run.name,
            CLUSTER_KEYS * LIMIT as usize,
            CLUSTER_CALLS
        );

        let Some(reads) = run.replica_reads else { continue };
        for &replica in &replicas {
            let primary =
                &cluster.nodes[cluster.primary_of(cluster.nodes.iter().position(|n| n.port == replica.port).unwrap())];
            wait_replicated(primary, replica);
        }
        wait_replicas_listed(&cluster);
        reset_stats(&cluster);
        args.push("--peek".to_string());
        let lines = run_example_with(run.lang, &args);
        assert_admissions(run, &lines, true);
        assert_eq!(
            stat_sum(&all, "errorstats", "errorstat_MOVED:count="),
            0,
            "{} --peek: MOVED replies",
            run.name
        );
        let on_replicas = stat_sum(&replicas, "commandstats", "cmdstat_xcloak.peek:calls=");
        let on_primaries = stat_sum(&primaries, "commandstats", "cmdstat_xcloak.peek:calls=");
        assert_eq!(on_replicas + on_primaries, CLUSTER_CALLS as u64, "{} --peek", run.name);
        match reads {
            ReplicaReads::Only => assert_eq!(on_primaries, 0, "{} --peek: PEEKs on primaries", run.name),
            ReplicaReads::Shared => assert!(on_replicas > 0, "{} --peek: no PEEK on a replica", run.name),
        }
        println!(
            "{} --peek: {on_replicas} PEEKs on replicas, {on_primaries} on primaries, 0 MOVED",
            run.name
        );
    }
}

/// The xcloak package (clients/node) works with ioredis 5 and 6 through its
/// public API, and a `Limiter` refuses a client of any other major when it is
/// built, naming the version, rather than route wrongly at run time.
#[test]
fn the_node_package_refuses_an_unsupported_ioredis() {
    ensure_deps(Lang::Ioredis);
    let dir = std::env::temp_dir().join(format!("xcloak-ioredis-version-{}", std::process::id()));
    let folder = dir.join("node_modules").join("ioredis");
    std::fs::create_dir_all(folder.join("built")).unwrap();
    std::fs::write(
        folder.join("package.json"),
        r#"{"name":"ioredis","version":"4.31.0","main":"built/index.js"}"#,
    )
    .unwrap();
    std::fs::write(
        folder.join("built").join("Redis.js"),
        "class Redis { constructor() { this.isCluster = false; this.options = {}; } sendCommand() {} duplicate() {} }\nexports.default = Redis;\n",
    )
    .unwrap();
    std::fs::write(
        folder.join("built").join("index.js"),
        "exports.default = require('./Redis').default;\n",
    )
    .unwrap();
    let script = format!(
        "const Redis = require({:?}).default; const {{ Limiter }} = require('xcloak'); new Limiter(new Redis());",
        folder.to_str().unwrap()
    );
    let output = Command::new("node")
        .args(["-e", &script])
        .current_dir(repo().join("docs/examples/node"))
        .output()
        .expect("run node");
    let _ = std::fs::remove_dir_all(&dir);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "a Limiter took ioredis 4.31.0:\n{stderr}");
    assert!(
        stderr.contains("ioredis 4.31.0 (")
            && stderr.contains("is not supported: xcloak works with ioredis 5.x and 6.x"),
        "{stderr}"
    );
}
