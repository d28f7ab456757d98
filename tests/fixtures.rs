//! Windows written by earlier releases load into this build and answer as
//! they did: the committed fixtures under `tests/fixtures/<version>/`
//! (`scripts/fixtures.py`, run with that release's build; 0.1.0 wrote compact
//! windows in RDB encoding version 1). Every version folder is checked:
//!
//! - `dump.rdb`, placed in a fresh server's directory before it starts;
//! - `aof-preamble/appendonlydir` (an RDB base file, then the effects) and
//!   `aof-plain/appendonlydir` (`aof-use-rdb-preamble no`: the base file is
//!   the type's `XCLOAK.APPLY key L <bytes>` and `ZADD`s), with `appendonly yes`;
//! - every key's `DUMP` payload, `RESTORE`d.
//!
//! Each loaded keyspace is compared with `expected.json`, recorded from the
//! release that wrote it: every key's type, stored entries (as runs), a sorted
//! set's members, its absolute expiry, `XCLOAK.PEEK` replies at the recorded
//! `NOW` (one and three tiers, costs 1 to 3), and an `XCLOAK.ALLOW ... DETAILS
//! STAMP` run on a `COPY` with what it leaves. The keyspace is then saved and
//! loaded again by this build (`DEBUG RELOAD`) and compared once more.
//!
//! Expiry: every fixture key has no expiry (`PERSIST`) or expires at
//! 253402300799000 (9999-12-31), so nothing expires by the wall clock; the
//! expiry is compared exactly (`PEXPIRETIME`, 7.0+), or as "none / some" on
//! older servers. Stamps are data, never compared with the clock: every
//! recorded answer names its `NOW`.
//!
//! The 0.1.0 fixtures were written by Redis 7.0.15: RDB version 10 and a
//! multi-part AOF folder. Redis 6.2.5 reads neither (nor a DUMP payload of
//! RDB version 10): there the RDB, preamble and RESTORE checks print
//! "skipped: ..." and return, and the plain AOF is checked through 6.2's
//! single-file layout (the base file and the incr file concatenated into
//! `appendonly.aof`, the commands as 0.1.0 wrote them).
//!
//! What would fail: a decoder that no longer reads encoding version 1 (or
//! reads it wrongly: a run's count, a delta, the multi flag), an
//! `XCLOAK.APPLY` effect of 0.1.0 no longer understood (`L`, `T`, `R`, `A`,
//! `E`), a loaded window that answers differently (counts, retry, reset), a
//! lost expiry, or a save of a loaded window that does not load back.
use crate::common;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use common::*;
use redis::{Connection, Value};

// ---------------------------------------------------------------------------
// A small JSON reader: expected.json holds objects, arrays, integers and strings.

#[derive(Clone, Debug, PartialEq)]
enum Json {
    Int(i64),
    Str(String),
    Arr(Vec<Json>),
    Obj(BTreeMap<String, Json>),
}

impl Json {
    fn parse(text: &str) -> Json {
        let mut parser = Parser {
            bytes: text.as_bytes(),
            pos: 0,
        };
        let value = parser.value();
        parser.space();
        assert_eq!(parser.pos, parser.bytes.len(), "trailing bytes in the JSON");
        value
    }
    fn get(&self, field: &str) -> Option<&Json> {
        match self {
            Json::Obj(map) => map.get(field),
            _ => None,
        }
    }
    fn field(&self, field: &str) -> &Json {
        self.get(field)
            .unwrap_or_else(|| panic!("no field {field:?} in {self:?}"))
    }
    fn int(&self) -> i64 {
        match self {
            Json::Int(i) => *i,
            other => panic!("not an integer: {other:?}"),
        }
    }
    fn str(&self) -> &str {
        match self {
            Json::Str(s) => s,
            other => panic!("not a string: {other:?}"),
        }
    }
    fn arr(&self) -> &[Json] {
        match self {
            Json::Arr(items) => items,
            other => panic!("not an array: {other:?}"),
        }
    }
    fn obj(&self) -> &BTreeMap<String, Json> {
        match self {
            Json::Obj(map) => map,
            other => panic!("not an object: {other:?}"),
        }
    }
    /// `[[a, b], ...]` as pairs.
    fn pairs(&self) -> Vec<(i64, i64)> {
        self.arr()
            .iter()
            .map(|p| (p.arr()[0].int(), p.arr()[1].int()))
            .collect()
    }
}

struct Parser<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl Parser<'_> {
    fn space(&mut self) {
        while self.pos < self.bytes.len() && self.bytes[self.pos].is_ascii_whitespace() {
            self.pos += 1;
        }
    }
    fn eat(&mut self, byte: u8) {
        self.space();
        assert_eq!(
            self.bytes.get(self.pos),
            Some(&byte),
            "JSON: expected {:?} at {}",
            byte as char,
            self.pos
        );
        self.pos += 1;
    }
    fn peek(&mut self) -> u8 {
        self.space();
        self.bytes[self.pos]
    }
    fn value(&mut self) -> Json {
        match self.peek() {
            b'{' => {
                self.eat(b'{');
                let mut map = BTreeMap::new();
                if self.peek() != b'}' {
                    loop {
                        let key = self.string();
                        self.eat(b':');
                        map.insert(key, self.value());
                        if self.peek() == b',' {
                            self.eat(b',');
                        } else {
                            break;
                        }
                    }
                }
                self.eat(b'}');
                Json::Obj(map)
            }
            b'[' => {
                self.eat(b'[');
                let mut items = Vec::new();
                if self.peek() != b']' {
                    loop {
                        items.push(self.value());
                        if self.peek() == b',' {
                            self.eat(b',');
                        } else {
                            break;
                        }
                    }
                }
                self.eat(b']');
                Json::Arr(items)
            }
            b'"' => Json::Str(self.string()),
            _ => {
                let start = self.pos;
                while self.pos < self.bytes.len()
                    && (self.bytes[self.pos] == b'-' || self.bytes[self.pos].is_ascii_digit())
                {
                    self.pos += 1;
                }
                let text = std::str::from_utf8(&self.bytes[start..self.pos]).unwrap();
                Json::Int(
                    text.parse()
                        .unwrap_or_else(|_| panic!("JSON: not an integer at {start}: {text:?}")),
                )
            }
        }
    }
    fn string(&mut self) -> String {
        self.eat(b'"');
        let mut out = Vec::new();
        while self.bytes[self.pos] != b'"' {
            if self.bytes[self.pos] == b'\\' {
                self.pos += 1;
                out.push(match self.bytes[self.pos] {
                    b'n' => b'\n',
                    b't' => b'\t',
                    other => other, // \" \\ \/ (the fixtures hold no \u escapes)
                });
            } else {
                out.push(self.bytes[self.pos]);
            }
            self.pos += 1;
        }
        self.pos += 1;
        String::from_utf8(out).unwrap()
    }
}

/// A reply, in the JSON's terms (integers, strings, arrays).
fn json_of(value: &Value) -> Json {
    match value {
        Value::Int(i) => Json::Int(*i),
        Value::BulkString(bytes) => Json::Str(String::from_utf8_lossy(bytes).into_owned()),
        Value::SimpleString(s) => Json::Str(s.clone()),
        Value::Array(items) => Json::Arr(items.iter().map(json_of).collect()),
        other => panic!("unexpected reply {other:?}"),
    }
}

// ---------------------------------------------------------------------------
// The fixtures.

struct Fixture {
    version: String,
    dir: PathBuf,
    expected: Json,
}

/// Every version folder under tests/fixtures/ (at least 0.1.0).
fn fixtures() -> Vec<Fixture> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let mut found: Vec<Fixture> = std::fs::read_dir(&root)
        .expect("tests/fixtures")
        .filter_map(|entry| {
            let dir = entry.ok()?.path();
            let text = std::fs::read_to_string(dir.join("expected.json")).ok()?;
            let version = dir.file_name()?.to_string_lossy().into_owned();
            Some(Fixture {
                version,
                dir,
                expected: Json::parse(&text),
            })
        })
        .collect();
    found.sort_by(|a, b| a.version.cmp(&b.version));
    assert!(
        found.iter().any(|f| f.version == "0.1.0"),
        "the 0.1.0 fixtures are missing from {}",
        root.display()
    );
    found
}

/// Whether this server reads the RDB version the fixture's server wrote
/// (0.1.0's: Redis 7.0.15, RDB 10; Redis 6.2 reads up to 9).
fn reads_its_rdb(fixture: &Fixture) -> bool {
    let written_by = fixture.expected.field("written_by").field("server").str().to_string();
    let newer_than_6 = !written_by.starts_with("Redis 6.");
    if newer_than_6 && !at_least_7_0() {
        eprintln!(
            "skipped: fixtures {} were written by {written_by} (RDB version 10 and multi-part AOF), which this server ({:?}) cannot read",
            fixture.version,
            server_version()
        );
        return false;
    }
    true
}

fn fnv1a64(items: &[Vec<u8>]) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for item in items {
        for &byte in item.iter().chain(b"\n") {
            hash = (hash ^ u64::from(byte)).wrapping_mul(0x100_0000_01b3);
        }
    }
    format!("{hash:016x}")
}

/// The stored entries of `key` as runs (stamp, count).
fn runs(conn: &mut Connection, key: &str) -> Vec<(i64, i64)> {
    let mut out: Vec<(i64, i64)> = Vec::new();
    for stamp in stored_stamps(conn, key) {
        match out.last_mut() {
            Some((last, count)) if *last == stamp => *count += 1,
            _ => out.push((stamp, 1)),
        }
    }
    out
}

fn query_args(command: &str, key: &str, tiers: &Json, cost: i64, now: i64) -> redis::Cmd {
    let tiers = tiers.pairs();
    let mut cmd = redis::cmd(command);
    cmd.arg(key).arg(tiers[0].0).arg(tiers[0].1);
    for &(window, limit) in &tiers[1..] {
        cmd.arg("TIER").arg(window).arg(limit);
    }
    cmd.arg("COST").arg(cost).arg("NOW").arg(now);
    cmd
}

/// How the keys were loaded: what can be compared (a RESTOREd key has no expiry).
#[derive(Clone, Copy, PartialEq)]
enum Loaded {
    Persisted,
    Restored,
}

/// Checks one key against its recorded answers.
fn check_key(conn: &mut Connection, fixture: &Fixture, key: &str, expected: &Json, loaded: Loaded, context: &str) {
    let context = format!("{context}, key {key}");
    let kind = expected.field("type").str();
    assert_eq!(key_type(conn, key), kind, "{context}: type");
    if kind == "string" {
        let value: String = redis::cmd("GET").arg(key).query(conn).unwrap();
        assert_eq!(value, expected.field("value").str(), "{context}");
    } else {
        let stored = runs(conn, key);
        let recorded = expected.field("runs").pairs();
        assert_eq!(stored, recorded, "{context}: stored entries");
        if kind == "zset" {
            let members: Vec<Vec<u8>> = redis::cmd("ZRANGE").arg(key).arg(0).arg(-1).query(conn).unwrap();
            assert_eq!(
                fnv1a64(&members),
                expected.field("members_fnv1a64").str(),
                "{context}: members"
            );
            if let Some(listed) = expected.get("members") {
                let listed: Vec<&str> = listed.arr().iter().map(Json::str).collect();
                let members: Vec<String> = members
                    .iter()
                    .map(|m| String::from_utf8_lossy(m).into_owned())
                    .collect();
                assert_eq!(members, listed, "{context}: members");
            }
        }
        let now = fixture.expected.field("now").int();
        for (peek, reply) in fixture
            .expected
            .field("peeks")
            .arr()
            .iter()
            .zip(expected.field("peek").arr())
        {
            let cmd = query_args("XCLOAK.PEEK", key, peek.field("tiers"), peek.field("cost").int(), now);
            let got: Value = cmd
                .query(conn)
                .unwrap_or_else(|e| panic!("{context}: PEEK {peek:?}: {e}"));
            assert_eq!(&json_of(&got), reply, "{context}: PEEK {peek:?}");
        }
        // An admission on a COPY: the same reply, and it leaves the trimmed
        // runs plus its own entries.
        let probe = format!("{{{key}}}:probe");
        let copied: i64 = redis::cmd("COPY")
            .arg(key)
            .arg(&probe)
            .arg("REPLACE")
            .query(conn)
            .unwrap();
        assert_eq!(copied, 1, "{context}: COPY");
        let spec = fixture.expected.field("probe");
        let cost = spec.field("cost").int();
        let mut cmd = query_args("XCLOAK.ALLOW", &probe, spec.field("tiers"), cost, now);
        let got: Value = cmd
            .arg("DETAILS")
            .arg("STAMP")
            .query(conn)
            .unwrap_or_else(|e| panic!("{context}: ALLOW: {e}"));
        let reply = json_of(&got);
        assert_eq!(&reply, expected.field("allow"), "{context}: ALLOW on a copy");
        let trimmed = expected.field("allow_trims_runs").int() as usize;
        let mut after: Vec<(i64, i64)> = recorded[trimmed..].to_vec();
        if reply.arr()[0].int() == 1 {
            match after.iter_mut().find(|(stamp, _)| *stamp == now) {
                Some((_, count)) => *count += cost,
                None => {
                    after.push((now, cost));
                    after.sort_unstable();
                }
            }
        }
        assert_eq!(
            runs(conn, &probe),
            after,
            "{context}: entries after the ALLOW on a copy"
        );
        let _: i64 = redis::cmd("DEL").arg(&probe).query(conn).unwrap();
    }
    let recorded_expiry = expected.field("pexpiretime").int();
    match loaded {
        Loaded::Restored => assert_eq!(
            redis::cmd("PTTL").arg(key).query::<i64>(conn).unwrap(),
            -1,
            "{context}: RESTORE ... 0"
        ),
        Loaded::Persisted if at_least_7_0() => {
            let expiry: i64 = redis::cmd("PEXPIRETIME").arg(key).query(conn).unwrap();
            assert_eq!(expiry, recorded_expiry, "{context}: expiry");
        }
        Loaded::Persisted => {
            let ttl: i64 = redis::cmd("PTTL").arg(key).query(conn).unwrap();
            assert_eq!(
                ttl > 0,
                recorded_expiry > 0,
                "{context}: PTTL {ttl}, recorded expiry {recorded_expiry}"
            );
            assert!(ttl == -1 || ttl > 0, "{context}: PTTL {ttl}");
        }
    }
}

/// Checks the whole keyspace of a server that loaded a fixture file.
fn check_keyspace(conn: &mut Connection, fixture: &Fixture, context: &str) {
    let keys = fixture.expected.field("keys").obj();
    let dbsize: i64 = redis::cmd("DBSIZE").query(conn).unwrap();
    assert_eq!(dbsize as usize, keys.len(), "{context}: DBSIZE");
    let compact = keys.values().filter(|k| k.field("type").str() == "xcloaklog").count();
    assert!(
        compact >= 10 && keys.len() > compact,
        "{context}: both forms are in the fixture"
    );
    for (key, expected) in keys {
        check_key(conn, fixture, key, expected, Loaded::Persisted, context);
    }
}

/// A compact server whose directory holds `files` (source, name in the
/// directory) before it starts, with `extra` options.
fn server_with(files: &[(PathBuf, &str)], extra: &[(&str, &str)]) -> Server {
    let mut server = ServerConfig::compact().start();
    server.stop();
    for (source, name) in files {
        let target = server.dir.join(name);
        if source.is_dir() {
            std::fs::create_dir_all(&target).unwrap();
            for entry in std::fs::read_dir(source).unwrap() {
                let entry = entry.unwrap();
                std::fs::copy(entry.path(), target.join(entry.file_name())).unwrap();
            }
        } else {
            std::fs::copy(source, &target).unwrap_or_else(|e| panic!("copy {}: {e}", source.display()));
        }
    }
    for (name, value) in extra {
        server.config = server.config.clone().arg(name, value);
    }
    server.restart();
    server
}

/// After a load: saved and loaded again by this build, the same answers.
fn reload_and_check(server: &Server, fixture: &Fixture, context: &str) {
    let mut conn = server.client();
    check_keyspace(&mut conn, fixture, context);
    let reloaded: String = redis::cmd("DEBUG").arg("RELOAD").query(&mut conn).unwrap();
    assert_eq!(reloaded, "OK");
    check_keyspace(
        &mut conn,
        fixture,
        &format!("{context}, then saved and reloaded by this build"),
    );
}

#[test]
fn rdb_files_of_earlier_releases_load() {
    for fixture in fixtures() {
        if !reads_its_rdb(&fixture) {
            continue;
        }
        let server = server_with(&[(fixture.dir.join("dump.rdb"), "dump.rdb")], &[]);
        let log = server.log();
        assert!(!log.contains("refusing"), "{log}");
        reload_and_check(&server, &fixture, &format!("{} dump.rdb", fixture.version));
    }
}

#[test]
fn aof_files_with_the_rdb_preamble_of_earlier_releases_load() {
    for fixture in fixtures() {
        if !reads_its_rdb(&fixture) {
            continue;
        }
        let dir = fixture.dir.join("aof-preamble/appendonlydir");
        let server = server_with(&[(dir, "appendonlydir")], &[("appendonly", "yes")]);
        reload_and_check(
            &server,
            &fixture,
            &format!("{} AOF with the RDB preamble", fixture.version),
        );
    }
}

#[test]
fn aof_files_without_the_rdb_preamble_of_earlier_releases_load() {
    for fixture in fixtures() {
        let dir = fixture.dir.join("aof-plain/appendonlydir");
        let context = format!("{} AOF without the RDB preamble", fixture.version);
        let server = if at_least_7_0() {
            server_with(&[(dir, "appendonlydir")], &[("appendonly", "yes")])
        } else {
            // One file, as 6.2 keeps its AOF: the base and the incr file, in
            // the manifest's order.
            let manifest = std::fs::read_to_string(dir.join("appendonly.aof.manifest")).unwrap();
            let mut text = Vec::new();
            for kind in ["b", "i"] {
                for line in manifest.lines().filter(|l| l.ends_with(&format!("type {kind}"))) {
                    let name = line.split_whitespace().nth(1).unwrap();
                    text.extend(std::fs::read(dir.join(name)).unwrap());
                }
            }
            let single =
                std::env::temp_dir().join(format!("xcloak-fixture-{}-{}.aof", fixture.version, std::process::id()));
            std::fs::write(&single, text).unwrap();
            eprintln!("{context}: loaded as one appendonly.aof (base + incr) on this server");
            let server = server_with(&[(single.clone(), "appendonly.aof")], &[("appendonly", "yes")]);
            let _ = std::fs::remove_file(single);
            server
        };
        let mut conn = server.client();
        check_keyspace(&mut conn, &fixture, &context);
        if at_least_7_0() {
            reload_and_check(&server, &fixture, &context);
        }
    }
}

#[test]
fn dump_payloads_of_earlier_releases_restore() {
    for fixture in fixtures() {
        if !reads_its_rdb(&fixture) {
            continue;
        }
        let server = ServerConfig::compact().start();
        let mut conn = server.client();
        let mut restored = 0;
        for (key, expected) in fixture.expected.field("keys").obj() {
            let Some(hex) = expected.get("dump") else { continue };
            let payload: Vec<u8> = (0..hex.str().len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex.str()[i..i + 2], 16).unwrap())
                .collect();
            let context = format!("{} DUMP payload of {key}", fixture.version);
            let _: () = redis::cmd("RESTORE")
                .arg(key)
                .arg(0)
                .arg(payload.as_slice())
                .query(&mut conn)
                .unwrap_or_else(|e| panic!("{context}: RESTORE refused it: {e}\n{}", server.log()));
            check_key(&mut conn, &fixture, key, expected, Loaded::Restored, &context);
            // The payload this build dumps for it restores to the same window.
            let again: Vec<u8> = redis::cmd("DUMP").arg(key).query(&mut conn).unwrap();
            let _: () = redis::cmd("RESTORE")
                .arg(key)
                .arg(0)
                .arg(again.as_slice())
                .arg("REPLACE")
                .query(&mut conn)
                .unwrap();
            check_key(
                &mut conn,
                &fixture,
                key,
                expected,
                Loaded::Restored,
                &format!("{context}, dumped and restored by this build"),
            );
            restored += 1;
        }
        let compact = fixture
            .expected
            .field("keys")
            .obj()
            .values()
            .filter(|k| k.field("type").str() == "xcloaklog" && k.get("dump").is_some())
            .count();
        assert!(
            compact >= 10 && restored > compact,
            "{}: payloads of both forms ({restored}, {compact} compact)",
            fixture.version
        );
    }
}
