//! The README's examples run as written: its two programs are
//! examples/first.rs and examples/axum.rs (compiled by cargo), byte for byte;
//! the `[dependencies]` lines before each name every crate the program uses;
//! and both programs, built, answer against a live server (the first through
//! the module and through the script, the axum one over HTTP up to its 429).
//! `make dist-check` builds them again in a fresh project from those lines.
mod support;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use support::Server;

fn readme() -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap()
}

/// The fenced block that follows the line `<!-- {marker} -->`.
fn block(readme: &str, marker: &str) -> String {
    let tag = format!("<!-- {marker} -->\n");
    let start = readme.find(&tag).unwrap_or_else(|| panic!("README: no {tag:?}")) + tag.len();
    let rest = &readme[start..];
    let body = rest[rest.find('\n').unwrap() + 1..].to_string();
    body[..body.find("```\n").unwrap()].to_string()
}

/// The crates a program names: the root of each `use` line, and each path
/// `x::` that starts an expression or an attribute (`#[tokio::main]`,
/// `axum::serve(..)`), without std's.
fn crates_used(program: &str) -> BTreeSet<String> {
    let mut crates = BTreeSet::new();
    for line in program.lines().map(str::trim) {
        if line.starts_with("//") {
            continue;
        }
        if let Some(path) = line.strip_prefix("use ") {
            crates.insert(path.split("::").next().unwrap().to_string());
            continue;
        }
        for (i, _) in line.match_indices("::") {
            let before = &line[..i];
            let start = before
                .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .map_or(0, |p| p + 1);
            let word = &before[start..];
            let root = start == 0 || matches!(before.as_bytes()[start - 1], b' ' | b'(' | b'&' | b'[' | b'!');
            if root && word.starts_with(|c: char| c.is_ascii_lowercase()) {
                crates.insert(word.to_string());
            }
        }
    }
    for local in ["std", "self", "super", "crate"] {
        crates.remove(local);
    }
    crates
}

/// The dependencies a `[dependencies]` block names, as crate names.
fn dependencies(toml: &str) -> BTreeSet<String> {
    toml.lines()
        .skip_while(|l| l.trim() != "[dependencies]")
        .skip(1)
        .filter_map(|l| l.split_once('=').map(|(name, _)| name.trim().replace('-', "_")))
        .collect()
}

#[test]
fn the_readme_examples_are_the_example_files_and_name_their_dependencies() {
    let readme = readme();
    for (name, cargo) in [("first", "cargo: first"), ("axum", "cargo: axum")] {
        let file = format!("examples/{name}.rs");
        let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(&file)).unwrap();
        assert_eq!(block(&readme, &format!("example: {file}")), text, "README's {file}");
        assert_eq!(
            dependencies(&block(&readme, cargo)),
            crates_used(&text),
            "README's [dependencies] for {file}"
        );
    }
}

/// The example binaries, built as test.sh builds everything (--all-features).
fn build_examples() -> (PathBuf, PathBuf) {
    let out = Command::new(env!("CARGO"))
        .args([
            "build",
            "--locked",
            "-p",
            "xcloak-client",
            "--all-features",
            "--examples",
        ])
        .args(["--message-format", "json"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    assert!(out.status.success(), "cargo build --examples");
    let mut found = (None, None);
    for line in String::from_utf8(out.stdout).unwrap().lines() {
        let message: serde_json::Value = serde_json::from_str(line).unwrap();
        let (Some(name), Some(exe)) = (message["target"]["name"].as_str(), message["executable"].as_str()) else {
            continue;
        };
        match name {
            "first" => found.0 = Some(PathBuf::from(exe)),
            "axum" => found.1 = Some(PathBuf::from(exe)),
            _ => {}
        }
    }
    (found.0.expect("examples/first"), found.1.expect("examples/axum"))
}

/// One GET over a new connection: the status and the response's head.
fn get(addr: SocketAddr) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    let status = text.split(' ').nth(1).unwrap().parse().unwrap();
    (status, text.to_ascii_lowercase())
}

#[test]
fn the_readme_examples_run_against_a_live_server() {
    let (first, axum) = build_examples();
    for (redis, via) in [(Server::start(), "Command"), (Server::without_module(), "Script")] {
        let out = Command::new(&first).env("REDIS_URL", redis.url()).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8(out.stdout).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4, "{text}");
        for (line, remaining) in lines[..3].iter().zip([2, 1, 0]) {
            assert_eq!(
                *line,
                format!("allowed=true remaining={remaining} retry_after=Some(0ns) via={via}")
            );
        }
        // Refused, with the wait until the first admission leaves the minute:
        // `Some(60s)` when the four calls fell in one millisecond, else `Some(59.9..s)`.
        let wait = lines[3]
            .strip_prefix("allowed=false remaining=0 retry_after=Some(")
            .and_then(|rest| rest.strip_suffix(&format!("s) via={via}")))
            .and_then(|seconds| seconds.parse::<f64>().ok());
        assert!(wait.is_some_and(|s| (59.0..=60.0).contains(&s)), "{}", lines[3]);
        assert_eq!(redis.entries("user:42"), 3);
    }

    let redis = Server::start();
    let addr: SocketAddr = format!("127.0.0.1:{}", support::free_port()).parse().unwrap();
    let mut app = Running(
        Command::new(&axum)
            .env("REDIS_URL", redis.url())
            .env("ADDR", addr.to_string())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut banner = String::new();
    BufReader::new(app.0.stdout.take().unwrap())
        .read_line(&mut banner)
        .unwrap();
    assert_eq!(banner, format!("listening on http://{addr}\n"));
    for _ in 0..100 {
        let (status, head) = get(addr);
        assert_eq!(status, 200, "{head}");
        assert!(head.contains("ratelimit-policy: \"100-in-60s\";q=100;w=60"), "{head}");
    }
    let (status, head) = get(addr);
    assert_eq!(status, 429, "{head}");
    assert!(head.contains("retry-after: "), "{head}");
    // Keyed by the peer's address (ConnectInfo), with no `.key(...)`.
    assert_eq!(redis.entries("rl:http:127.0.0.1"), 100);
}

/// The example's process, stopped when the test ends, passed or failed.
struct Running(std::process::Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
