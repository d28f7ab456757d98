//! The compact form as a real data type (`STORAGE compact`, type `xcloaklog`):
//! persistence (AOF of effects, AOF rewrite without the RDB preamble, RDB),
//! replication (a replica only ever runs `XCLOAK.APPLY`), DUMP/RESTORE and
//! MIGRATE, COPY, MEMORY USAGE, DEBUG DIGEST-VALUE, TYPE and SCAN TYPE,
//! keyspace events, `XCLOAK.CONVERT` both ways, the `STORAGE` / `xcloak.storage`
//! settings, and a window of 1,000,000 entries.
//!
//! Windows are long (an hour), so no key expires while a test runs.
use crate::common;
use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use redis::Connection;

const HOUR: i64 = 3_600_000;
const BASE_NOW: i64 = 1_700_000_000_000;

fn cmd_i64(conn: &mut Connection, args: &[&str]) -> i64 {
    let mut command = redis::cmd(args[0]);
    for arg in &args[1..] {
        command.arg(*arg);
    }
    command.query(conn).unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

fn error_of(conn: &mut Connection, args: &[&str]) -> String {
    let mut command = redis::cmd(args[0]);
    for arg in &args[1..] {
        command.arg(*arg);
    }
    match command.query::<redis::Value>(conn) {
        Err(e) => e.to_string(),
        Ok(v) => panic!("{args:?} should fail, replied {v:?}"),
    }
}

fn dump(conn: &mut Connection, key: &str) -> Vec<u8> {
    redis::cmd("DUMP").arg(key).query(conn).unwrap()
}

/// Windows of several shapes: lone entries, runs of one millisecond,
/// trims, a step back, COST, and one of the server clock. Returns the keys.
fn workload(conn: &mut Connection, prefix: &str) -> Vec<String> {
    let mut keys = Vec::new();
    for k in 0..6i64 {
        let key = format!("{prefix}:{k}");
        let mut now = BASE_NOW + k;
        for i in 0..(40 + k * 7) {
            now += [0, 1, 63, 64, 500, 8191, 8192][(i % 7) as usize];
            if i % 13 == 12 {
                now -= 700; // a caller's clock stepping back
            }
            let cost = 1 + (i % 3);
            let _: i64 = redis::cmd("XCLOAK.ALLOW")
                .arg(&key)
                .arg(60_000)
                .arg(100)
                .arg("COST")
                .arg(cost)
                .arg("NOW")
                .arg(now)
                .query(conn)
                .unwrap();
        }
        keys.push(key);
    }
    let clock = format!("{prefix}:clock");
    for _ in 0..50 {
        let _: i64 = redis::cmd("XCLOAK.ALLOW")
            .arg(&clock)
            .arg(HOUR)
            .arg(1000)
            .query(conn)
            .unwrap();
    }
    keys.push(clock);
    for key in &keys {
        assert_eq!(key_type(conn, key), "xcloaklog", "{key}");
    }
    keys
}

/// DUMP and stamps of every key: what a restart or a replica must reproduce.
fn snapshot(conn: &mut Connection, keys: &[String]) -> BTreeMap<String, (Vec<u8>, Vec<i64>)> {
    keys.iter()
        .map(|key| (key.clone(), (dump(conn, key), stored_stamps(conn, key))))
        .collect()
}

fn wait_for_rewrite(conn: &mut Connection) {
    let done = eventually(Duration::from_secs(30), || {
        let info: String = redis::cmd("INFO").arg("persistence").query(conn).unwrap();
        field_of(&info, "aof_rewrite_in_progress").as_deref() == Some("0")
            && field_of(&info, "aof_rewrite_scheduled").as_deref() == Some("0")
    });
    assert!(done, "AOF rewrite did not finish");
}

#[test]
fn aof_of_effects_aof_rewrite_and_rdb_keep_every_window_byte_for_byte() {
    let mut server = ServerConfig::compact()
        .arg("appendonly", "yes")
        .arg("appendfsync", "always")
        .arg("aof-use-rdb-preamble", "no")
        .start();
    let mut conn = server.client();
    let keys = workload(&mut conn, "persist");
    let before = snapshot(&mut conn, &keys);
    let digest_before = digest(&mut conn);

    // 1. The AOF as written: XCLOAK.APPLY effects, replayed on restart.
    server.restart();
    let mut conn = server.client();
    assert_eq!(snapshot(&mut conn, &keys), before, "after replaying the AOF of effects");
    assert_eq!(digest(&mut conn), digest_before);

    // 2. A rewritten AOF without the RDB preamble: the type's aof_rewrite.
    let _: String = redis::cmd("BGREWRITEAOF").query(&mut conn).unwrap();
    wait_for_rewrite(&mut conn);
    server.restart();
    let mut conn = server.client();
    assert_eq!(
        snapshot(&mut conn, &keys),
        before,
        "after a rewritten AOF (aof-use-rdb-preamble no)"
    );

    // 3. RDB: DEBUG RELOAD saves and loads in place.
    let _: String = redis::cmd("DEBUG").arg("RELOAD").query(&mut conn).unwrap();
    assert_eq!(snapshot(&mut conn, &keys), before, "after DEBUG RELOAD");
    for key in &keys {
        let ttl = cmd_i64(&mut conn, &["PTTL", key]);
        assert!(ttl > 0, "{key} keeps its expiry through every reload ({ttl})");
    }
}

#[test]
fn replicas_apply_effects_and_never_run_the_commands() {
    let primary = ServerConfig::compact().start();
    let mut conn = primary.client();
    // Keys written before the replica attaches travel in the full sync's RDB.
    let mut keys = workload(&mut conn, "early");

    // Diskless load needs every module type to handle read errors itself
    // (REDISMODULE_OPTIONS_HANDLE_IO_ERRORS), or the server loads from disk.
    let replica = ServerConfig::compact().arg("repl-diskless-load", "on-empty-db").start();
    let mut rconn = replica.client();
    let reply: String = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(primary.port)
        .query(&mut rconn)
        .unwrap();
    assert!(reply.starts_with("OK"));
    wait_replicated(&primary, &replica);

    keys.extend(workload(&mut conn, "late"));
    // A refund-free mix of everything else that writes: trims to empty,
    // rejections, CONVERT both ways.
    assert_eq!(allow_at(&mut conn, "late:0", 60_000, 0, BASE_NOW + 10 * HOUR), 0);
    assert_eq!(cmd_i64(&mut conn, &["EXISTS", "late:0"]), 0, "emptied by the trim");
    assert_eq!(cmd_i64(&mut conn, &["XCLOAK.CONVERT", "late:1", "ZSET"]), 1);
    assert_eq!(cmd_i64(&mut conn, &["XCLOAK.CONVERT", "early:1", "ZSET"]), 1);
    assert_eq!(cmd_i64(&mut conn, &["XCLOAK.CONVERT", "early:1", "COMPACT"]), 1);
    // A sorted-set window emptied and recreated compact in one call.
    let _: i64 = redis::cmd("ZADD")
        .arg("switch")
        .arg(BASE_NOW)
        .arg("1")
        .query(&mut conn)
        .unwrap();
    assert_eq!(allow_at(&mut conn, "switch", 1000, 5, BASE_NOW + 5000), 1);
    assert_eq!(key_type(&mut conn, "switch"), "xcloaklog");
    keys.push("switch".to_string());
    wait_replicated(&primary, &replica);

    for key in &keys {
        assert_eq!(dump(&mut rconn, key), dump(&mut conn, key), "{key} on the replica");
        let (ttl, rttl) = (cmd_i64(&mut conn, &["PTTL", key]), cmd_i64(&mut rconn, &["PTTL", key]));
        assert!(
            (ttl - rttl).abs() < 5_000,
            "{key}: PTTL {ttl} on the primary, {rttl} on the replica"
        );
    }
    assert_eq!(key_type(&mut rconn, "late:1"), "zset");
    assert_eq!(key_type(&mut rconn, "switch"), "xcloaklog");
    assert_eq!(key_type(&mut rconn, "early:1"), "xcloaklog");
    let stats: String = redis::cmd("INFO").arg("commandstats").query(&mut rconn).unwrap();
    for never in [
        "cmdstat_xcloak.allow:",
        "cmdstat_xcloak.peek:",
        "cmdstat_xcloak.convert:",
    ] {
        assert!(!stats.contains(never), "the replica ran {never}\n{stats}");
    }
    assert!(
        stats.contains("cmdstat_xcloak.apply:"),
        "the replica applied no effect\n{stats}"
    );
    let log = replica.log();
    assert!(
        !log.contains("Skipping diskless-load") && !log.contains("to disk"),
        "{log}"
    );
}

#[test]
fn a_client_cannot_run_the_internal_effect_command() {
    let server = ServerConfig::compact().start();
    let mut conn = server.client();
    assert_eq!(allow_at(&mut conn, "k", HOUR, 5, BASE_NOW), 1);
    let before = digest(&mut conn);
    for args in [
        &["XCLOAK.APPLY", "k", "ADD", "5", "100"][..],
        &["XCLOAK.APPLY", "k", "TRIM", "9000000000000000"],
        &["XCLOAK.APPLY", "new", "LOAD", "\x02"],
    ] {
        assert!(
            error_of(&mut conn, args).contains("XCLOAK.APPLY is internal"),
            "{args:?}"
        );
    }
    let script = "return redis.call('XCLOAK.APPLY', KEYS[1], 'ADD', '5', '100')";
    let err = redis::cmd("EVAL")
        .arg(script)
        .arg(1)
        .arg("k")
        .query::<redis::Value>(&mut conn)
        .unwrap_err();
    assert!(err.to_string().contains("internal"), "{err}");
    assert_eq!(digest(&mut conn), before, "nothing changed");
}

#[test]
fn dump_restore_migrate_copy_memory_and_digest() {
    let source = ServerConfig::compact().start();
    let target = ServerConfig::compact().start();
    let plain = Server::start();
    let mut conn = source.client();
    let keys = workload(&mut conn, "move");
    let key = &keys[2];
    let payload = dump(&mut conn, key);

    // RESTORE on another compact server: the same window, the same DUMP.
    let mut tconn = target.client();
    let _: () = redis::cmd("RESTORE")
        .arg("copy")
        .arg(0)
        .arg(&payload)
        .query(&mut tconn)
        .unwrap();
    assert_eq!(dump(&mut tconn, "copy"), payload);
    assert_eq!(stored_stamps(&mut tconn, "copy"), stored_stamps(&mut conn, key));
    // A server loaded without STORAGE compact has no such type.
    let err = redis::cmd("RESTORE")
        .arg("copy")
        .arg(0)
        .arg(&payload)
        .query::<()>(&mut plain.client())
        .unwrap_err();
    assert!(err.to_string().to_lowercase().contains("bad data format"), "{err}");

    // MIGRATE moves it (what resharding does).
    let stamps = stored_stamps(&mut conn, &keys[3]);
    let reply: String = redis::cmd("MIGRATE")
        .arg("127.0.0.1")
        .arg(target.port)
        .arg(&keys[3])
        .arg(0)
        .arg(5000)
        .query(&mut conn)
        .unwrap();
    assert_eq!(reply, "OK");
    assert_eq!(cmd_i64(&mut conn, &["EXISTS", &keys[3]]), 0);
    assert_eq!(stored_stamps(&mut tconn, &keys[3]), stamps);
    assert!(cmd_i64(&mut tconn, &["PTTL", &keys[3]]) > 0, "MIGRATE keeps the TTL");

    // COPY is independent of its source.
    assert_eq!(cmd_i64(&mut conn, &["COPY", key, "dup"]), 1);
    let original = stored_stamps(&mut conn, key);
    let _: i64 = redis::cmd("XCLOAK.ALLOW")
        .arg("dup")
        .arg(60_000)
        .arg(1000)
        .arg("NOW")
        .arg(BASE_NOW + 600_000)
        .query(&mut conn)
        .unwrap();
    assert_eq!(
        stored_stamps(&mut conn, key),
        original,
        "writing the copy left the source alone"
    );
    assert_ne!(stored_stamps(&mut conn, "dup"), original);

    // DEBUG DIGEST-VALUE: equal windows have equal digests whatever their
    // history (a trimmed prefix, a different server), different ones differ.
    let build = |conn: &mut Connection, name: &str, first: i64| {
        for stamp in first..BASE_NOW + 10 {
            let _: i64 = redis::cmd("XCLOAK.ALLOW")
                .arg(name)
                .arg(5)
                .arg(100)
                .arg("NOW")
                .arg(stamp.max(BASE_NOW))
                .query(conn)
                .unwrap();
        }
        let _: i64 = redis::cmd("XCLOAK.ALLOW")
            .arg(name)
            .arg(5)
            .arg(100)
            .arg("NOW")
            .arg(BASE_NOW + 10)
            .query(conn)
            .unwrap();
    };
    build(&mut conn, "d1", BASE_NOW);
    build(&mut tconn, "d2", BASE_NOW + 3);
    let digest_value = |conn: &mut Connection, key: &str| -> Vec<String> {
        redis::cmd("DEBUG").arg("DIGEST-VALUE").arg(key).query(conn).unwrap()
    };
    assert_eq!(stored_stamps(&mut conn, "d1"), stored_stamps(&mut tconn, "d2"));
    assert_eq!(digest_value(&mut conn, "d1"), digest_value(&mut tconn, "d2"));
    assert_eq!(
        dump(&mut conn, "d1"),
        dump(&mut tconn, "d2"),
        "canonical: equal windows dump equal bytes"
    );
    assert_ne!(digest_value(&mut conn, "d1"), digest_value(&mut conn, key));

    // TYPE and SCAN TYPE know the type by name.
    let (_, found): (i64, Vec<String>) = redis::cmd("SCAN")
        .arg(0)
        .arg("TYPE")
        .arg("xcloaklog")
        .arg("COUNT")
        .arg(1000)
        .query(&mut conn)
        .unwrap();
    assert!(found.contains(key) && found.contains(&"dup".to_string()), "{found:?}");
    let _: () = redis::cmd("SET").arg("string").arg("x").query(&mut conn).unwrap();
    assert!(!found.contains(&"string".to_string()));

    // MEMORY USAGE grows with the entries and stays a few bytes per entry.
    let small = cmd_i64(&mut conn, &["MEMORY", "USAGE", "d1", "SAMPLES", "0"]);
    for i in 0..1000i64 {
        let _: i64 = redis::cmd("XCLOAK.ALLOW")
            .arg("big")
            .arg(HOUR)
            .arg(5000)
            .arg("NOW")
            .arg(BASE_NOW + i * 60)
            .query(&mut conn)
            .unwrap();
    }
    let big = cmd_i64(&mut conn, &["MEMORY", "USAGE", "big", "SAMPLES", "0"]);
    // The key's own costs (name, dict entry, object headers) are about 70 B;
    // the window is one block: 11 lone entries 1 ms apart take no slot bits
    // (a 16-byte block), 1,000 entries 60 ms apart 6 bits each (768 B).
    assert!(small > 60 && small < 120, "11 entries take {small} B");
    assert!(big > 768 && big < 900, "1,000 entries 60 ms apart take {big} B");
}

#[test]
fn convert_both_ways_keeps_entries_members_and_ttl() {
    let server = ServerConfig::compact().start();
    let mut conn = server.client();
    // A sorted-set window, made as the module makes them.
    if at_least_7_0() {
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("xcloak.storage")
            .arg("zset")
            .query(&mut conn)
            .unwrap();
    } else {
        let _: i64 = redis::cmd("ZADD")
            .arg("w")
            .arg(BASE_NOW - 1)
            .arg("seed")
            .query(&mut conn)
            .unwrap();
    }
    for i in 0..30i64 {
        let _: i64 = redis::cmd("XCLOAK.ALLOW")
            .arg("w")
            .arg(HOUR)
            .arg(100)
            .arg("COST")
            .arg(1 + i % 3)
            .arg("NOW")
            .arg(BASE_NOW + i / 2)
            .query(&mut conn)
            .unwrap();
    }
    if at_least_7_0() {
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("xcloak.storage")
            .arg("compact")
            .query(&mut conn)
            .unwrap();
    }
    assert_eq!(key_type(&mut conn, "w"), "zset");
    let members = entries(&mut conn, "w");
    let ttl = cmd_i64(&mut conn, &["PTTL", "w"]);

    assert_eq!(cmd_i64(&mut conn, &["XCLOAK.CONVERT", "w", "compact"]), 1);
    assert_eq!(key_type(&mut conn, "w"), "xcloaklog");
    let stamps: Vec<i64> = members.iter().map(|(_, score)| *score as i64).collect();
    assert_eq!(stored_stamps(&mut conn, "w"), stamps);
    let ttl_after = cmd_i64(&mut conn, &["PTTL", "w"]);
    assert!(
        ttl_after <= ttl && ttl - ttl_after < 5_000,
        "TTL kept: {ttl} then {ttl_after}"
    );
    assert_eq!(
        cmd_i64(&mut conn, &["XCLOAK.CONVERT", "w", "COMPACT"]),
        0,
        "already compact"
    );

    assert_eq!(cmd_i64(&mut conn, &["XCLOAK.CONVERT", "w", "ZSET"]), 1);
    if at_least_7_0() {
        assert_eq!(
            entries(&mut conn, "w"),
            members,
            "the same members, as the module writes them"
        );
    }
    assert!(cmd_i64(&mut conn, &["PTTL", "w"]) > 0);
    // The same decisions after the round trip.
    let peek: Vec<i64> = redis::cmd("XCLOAK.PEEK")
        .arg("w")
        .arg(HOUR)
        .arg(100)
        .arg("NOW")
        .arg(BASE_NOW + 20)
        .query(&mut conn)
        .unwrap();
    assert_eq!(peek[2], 100 - members.len() as i64);

    assert_eq!(cmd_i64(&mut conn, &["XCLOAK.CONVERT", "missing", "ZSET"]), 0);
    let _: () = redis::cmd("SET").arg("s").arg("x").query(&mut conn).unwrap();
    assert!(error_of(&mut conn, &["XCLOAK.CONVERT", "s", "COMPACT"]).starts_with("WRONGTYPE"));
    assert!(error_of(&mut conn, &["XCLOAK.CONVERT", "w", "LIST"]).contains("target must be ZSET or COMPACT"));
    assert!(error_of(&mut conn, &["XCLOAK.CONVERT", "w"]).contains("wrong number of arguments"));
    // A sorted set that is not a window (a negative score) is left alone.
    let _: i64 = redis::cmd("ZADD")
        .arg("foreign")
        .arg(-5)
        .arg("a")
        .query(&mut conn)
        .unwrap();
    let before = digest(&mut conn);
    assert!(error_of(&mut conn, &["XCLOAK.CONVERT", "foreign", "COMPACT"]).contains("cannot convert"));
    assert_eq!(digest(&mut conn), before);

    // Into a sorted set, a window of more than xcloak.max-limit entries is refused.
    for i in 0..3i64 {
        let _: i64 = redis::cmd("XCLOAK.ALLOW")
            .arg("huge")
            .arg(HOUR)
            .arg(1200)
            .arg("COST")
            .arg(400)
            .arg("NOW")
            .arg(BASE_NOW + i)
            .query(&mut conn)
            .unwrap();
    }
    let with_max_limit = |conn: &mut Connection, max: &str| {
        if at_least_7_0() {
            let _: () = redis::cmd("CONFIG")
                .arg("SET")
                .arg("xcloak.max-limit")
                .arg(max)
                .query(conn)
                .unwrap();
        }
    };
    if at_least_7_0() {
        with_max_limit(&mut conn, "1100");
        let err = error_of(&mut conn, &["XCLOAK.CONVERT", "huge", "ZSET"]);
        assert!(
            err.contains("holds 1200 entries, more than xcloak.max-limit (1100)"),
            "{err}"
        );
        assert_eq!(key_type(&mut conn, "huge"), "xcloaklog");
        with_max_limit(&mut conn, "1000000");
    }
    assert_eq!(cmd_i64(&mut conn, &["XCLOAK.CONVERT", "huge", "ZSET"]), 1);

    // A server without STORAGE compact refuses COMPACT and says why.
    let plain = Server::start();
    let mut pconn = plain.client();
    assert_eq!(allow_at(&mut pconn, "z", HOUR, 5, BASE_NOW), 1);
    assert!(error_of(&mut pconn, &["XCLOAK.CONVERT", "z", "COMPACT"]).contains("load the module with STORAGE compact"));
    assert_eq!(cmd_i64(&mut pconn, &["XCLOAK.CONVERT", "z", "ZSET"]), 0);
}

#[test]
fn an_emptied_sorted_set_window_comes_back_compact() {
    let server = ServerConfig::compact().start();
    let mut conn = server.client();
    let _: i64 = redis::cmd("ZADD")
        .arg("w")
        .arg(BASE_NOW)
        .arg("1")
        .query(&mut conn)
        .unwrap();
    assert_eq!(allow_at(&mut conn, "w", 1000, 5, BASE_NOW + 10), 1);
    assert_eq!(key_type(&mut conn, "w"), "zset", "an existing key keeps its form");
    // Every entry expired: the trim empties it, the admission recreates it.
    assert_eq!(allow_at(&mut conn, "w", 1000, 5, BASE_NOW + 5000), 1);
    assert_eq!(key_type(&mut conn, "w"), "xcloaklog");
    assert_eq!(stored_stamps(&mut conn, "w"), [BASE_NOW + 5000]);
}

/// The same keyspace events, in the same order, from both forms.
#[test]
fn keyspace_events_are_the_same_for_both_forms() {
    let events_of = |server: Server| -> Vec<String> {
        let mut conn = server.client();
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("notify-keyspace-events")
            .arg("KEA")
            .query(&mut conn)
            .unwrap();
        let client = redis::Client::open(server.url()).unwrap();
        let mut sub = client.get_connection().unwrap();
        let mut pubsub = sub.as_pubsub();
        pubsub.psubscribe("__keyevent@0__:*").unwrap();
        pubsub.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
        for (now, limit) in [
            (BASE_NOW, 2),
            (BASE_NOW, 2),
            (BASE_NOW + 1, 2),
            (BASE_NOW + 2000, 2),
            (BASE_NOW + 9000, 0),
        ] {
            let _: i64 = redis::cmd("XCLOAK.ALLOW")
                .arg("ev")
                .arg(1000)
                .arg(limit)
                .arg("NOW")
                .arg(now)
                .query(&mut conn)
                .unwrap();
        }
        let _: () = redis::cmd("PUBLISH")
            .arg("__keyevent@0__:end")
            .arg("ev")
            .query(&mut conn)
            .unwrap();
        let mut events = Vec::new();
        while let Ok(message) = pubsub.get_message() {
            let channel = message.get_channel_name().to_string();
            if channel.ends_with(":end") {
                break;
            }
            events.push(channel.trim_start_matches("__keyevent@0__:").to_string());
        }
        events
    };
    let zset = events_of(Server::start());
    let compact = events_of(ServerConfig::compact().start());
    // admit (new key: expiry), admit, reject (nothing), trim all + admit
    // (a new key again), trim all + reject (no key left).
    assert_eq!(
        zset,
        [
            "zadd",
            "expire",
            "zadd",
            "zremrangebyscore",
            "zadd",
            "expire",
            "zremrangebyscore",
            "del"
        ]
    );
    assert_eq!(compact, zset);
}

#[test]
fn storage_settings_and_unload() {
    let module_command = |config: ServerConfig| {
        if at_least_7_0() {
            config.arg("enable-module-command", "yes")
        } else {
            config
        }
    };
    let plain = module_command(ServerConfig::default()).start();
    let mut conn = plain.client();
    let info: String = redis::cmd("INFO").arg("xcloak").query(&mut conn).unwrap();
    assert_eq!(field_of(&info, "xcloak_storage").as_deref(), Some("zset"));
    if at_least_7_0() {
        let err = error_of(&mut conn, &["CONFIG", "SET", "xcloak.storage", "compact"]);
        assert!(err.contains("STORAGE compact"), "{err}");
        let got: Vec<String> = redis::cmd("CONFIG")
            .arg("GET")
            .arg("xcloak.storage")
            .query(&mut conn)
            .unwrap();
        assert_eq!(got, ["xcloak.storage", "zset"]);
    }
    // No data type registered: the module unloads.
    let reply: String = redis::cmd("MODULE")
        .arg("UNLOAD")
        .arg("xcloak")
        .query(&mut conn)
        .unwrap();
    assert_eq!(reply, "OK");

    let compact = module_command(ServerConfig::compact()).start();
    let mut conn = compact.client();
    let info: String = redis::cmd("INFO").arg("xcloak").query(&mut conn).unwrap();
    assert_eq!(field_of(&info, "xcloak_storage").as_deref(), Some("compact"));
    if at_least_7_0() {
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("xcloak.storage")
            .arg("zset")
            .query(&mut conn)
            .unwrap();
        assert_eq!(allow_at(&mut conn, "z", HOUR, 5, BASE_NOW), 1);
        assert_eq!(key_type(&mut conn, "z"), "zset");
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("xcloak.storage")
            .arg("compact")
            .query(&mut conn)
            .unwrap();
    }
    assert_eq!(allow_at(&mut conn, "c", HOUR, 5, BASE_NOW), 1);
    assert_eq!(key_type(&mut conn, "c"), "xcloaklog");
    // A module that registered a type cannot be unloaded.
    assert!(redis::cmd("MODULE")
        .arg("UNLOAD")
        .arg("xcloak")
        .query::<String>(&mut conn)
        .is_err());

    let log = ServerConfig::default()
        .module_args(&["STORAGE", "list"])
        .start_expecting_exit();
    assert!(log.contains("STORAGE must be zset or compact"), "{log}");
}

#[test]
fn a_million_entries_in_one_window() {
    let server = ServerConfig::compact().start();
    let mut conn = server.client();
    for i in 0..1000i64 {
        let admitted: i64 = redis::cmd("XCLOAK.ALLOW")
            .arg("m")
            .arg(HOUR)
            .arg(1_000_000)
            .arg("COST")
            .arg(1000)
            .arg("NOW")
            .arg(BASE_NOW + i * 3)
            .query(&mut conn)
            .unwrap();
        assert_eq!(admitted, 1);
    }
    let peek: Vec<i64> = redis::cmd("XCLOAK.PEEK")
        .arg("m")
        .arg(HOUR)
        .arg(1_000_000)
        .arg("NOW")
        .arg(BASE_NOW + 3000)
        .query(&mut conn)
        .unwrap();
    // The oldest run (BASE_NOW) must leave; the newest is BASE_NOW + 2997.
    assert_eq!(peek, [0, 1_000_000, 0, HOUR - 3000, HOUR - 3]);
    let memory = cmd_i64(&mut conn, &["MEMORY", "USAGE", "m", "SAMPLES", "0"]);
    assert!(memory < 10_000, "1,000,000 entries in 1,000 runs take {memory} B");
    // Half of it expires at once: one call trims 500,000 entries and admits.
    let d: Vec<i64> = redis::cmd("XCLOAK.ALLOW")
        .arg("m")
        .arg(HOUR)
        .arg(1_000_000)
        .arg("NOW")
        .arg(BASE_NOW + HOUR + 1499)
        .arg("DETAILS")
        .query(&mut conn)
        .unwrap();
    assert_eq!(d[..3], [1, 1_000_000, 1_000_000 - 500_000 - 1]);
}

/// `scripts/convert.sh`: every window matching the pattern, and nothing else,
/// moves to the target form and back, entries and TTL kept.
#[test]
fn the_convert_script_moves_a_keyspace_pattern_both_ways() {
    let server = ServerConfig::compact().start();
    let mut conn = server.client();
    let _: i64 = redis::cmd("ZADD")
        .arg("rl:seed")
        .arg(BASE_NOW)
        .arg("0")
        .query(&mut conn)
        .unwrap();
    // 40 sorted-set windows under rl:, one under another prefix, one string.
    for i in 0..40i64 {
        let key = format!("rl:{i}");
        let _: i64 = redis::cmd("ZADD")
            .arg(&key)
            .arg(BASE_NOW + i)
            .arg(format!("{}", (BASE_NOW + i) % 100_000_000_000 * 1000))
            .query(&mut conn)
            .unwrap();
        assert_eq!(allow_at(&mut conn, &key, HOUR, 10, BASE_NOW + 100), 1);
    }
    let _: i64 = redis::cmd("ZADD")
        .arg("other:1")
        .arg(BASE_NOW)
        .arg("x")
        .query(&mut conn)
        .unwrap();
    let _: () = redis::cmd("SET").arg("rl:string").arg("x").query(&mut conn).unwrap();
    let stamps: Vec<Vec<i64>> = (0..40).map(|i| stored_stamps(&mut conn, &format!("rl:{i}"))).collect();
    let run = |target: &str| {
        let output = std::process::Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/convert.sh"))
            .args(["-p", &server.port.to_string(), "rl:*", target])
            .output()
            .expect("scripts/convert.sh runs");
        let text = String::from_utf8_lossy(&output.stdout).to_string() + &String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "{text}");
        text
    };
    let text = run("compact");
    assert!(text.contains("41 converted to compact, 0 skipped, 0 failed"), "{text}");
    for (i, expected) in stamps.iter().enumerate() {
        let key = format!("rl:{i}");
        assert_eq!(key_type(&mut conn, &key), "xcloaklog");
        assert_eq!(&stored_stamps(&mut conn, &key), expected);
        assert!(cmd_i64(&mut conn, &["PTTL", &key]) > 0);
    }
    assert_eq!(key_type(&mut conn, "other:1"), "zset", "outside the pattern");
    assert_eq!(key_type(&mut conn, "rl:string"), "string");
    assert!(run("compact").contains("0 converted"), "a second run has nothing to do");
    let text = run("zset");
    assert!(text.contains("41 converted to zset"), "{text}");
    assert_eq!(key_type(&mut conn, "rl:7"), "zset");
    assert_eq!(stored_stamps(&mut conn, "rl:7"), stamps[7]);
}

/// An AOF holding compact windows, replayed by a server loaded without
/// `STORAGE compact`: it starts, the windows are not restored, and the log
/// says why (an effect is never applied to a type that is not registered,
/// which would crash the server when the key is freed).
#[test]
fn an_aof_of_compact_windows_on_a_server_without_the_type_says_so() {
    let mut server = ServerConfig::compact()
        .arg("appendonly", "yes")
        .arg("appendfsync", "always")
        .start();
    let mut conn = server.client();
    assert_eq!(allow_at(&mut conn, "k", HOUR, 5, BASE_NOW), 1);
    assert_eq!(allow_at(&mut conn, "z", HOUR, 5, BASE_NOW), 1);
    let _: i64 = redis::cmd("XCLOAK.CONVERT")
        .arg("z")
        .arg("ZSET")
        .query(&mut conn)
        .unwrap();
    server.config.module_args.clear();
    server.restart();
    let mut conn = server.client();
    assert_eq!(
        cmd_i64(&mut conn, &["EXISTS", "k"]),
        0,
        "the compact window is not restored"
    );
    assert_eq!(key_type(&mut conn, "z"), "zset", "the sorted-set window is");
    assert!(
        server
            .log()
            .contains("XCLOAK.APPLY for key 'k' ignored: compact storage is not enabled"),
        "{}",
        server.log()
    );
    let pong: String = redis::cmd("PING").query(&mut conn).unwrap();
    assert_eq!(pong, "PONG");
}

/// Active defrag moves compact values and their buffers (the type's defrag
/// callback, `RedisModule_DefragAlloc`) without changing a byte of them.
/// Runs where the server can defragment (Redis 8.2.3 of the matrix; Debian's
/// 7.0.15 and Valkey's wheel are built without the jemalloc it needs).
#[test]
fn active_defrag_moves_compact_windows_intact() {
    let server = ServerConfig::compact().start();
    let mut conn = server.client();
    let enabled = redis::cmd("CONFIG")
        .arg("SET")
        .arg("activedefrag")
        .arg("yes")
        .query::<()>(&mut conn);
    if let Err(e) = enabled {
        eprintln!("skipped: this server cannot defragment ({e})");
        return;
    }
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("activedefrag")
        .arg("no")
        .query(&mut conn)
        .unwrap();
    // 60,000 windows of 1 to 40 entries, then every other one deleted: the
    // allocator's pages are left half empty.
    for chunk in 0..60 {
        let mut pipe = redis::pipe();
        for i in chunk * 1000..(chunk + 1) * 1000 {
            for j in 0..(1 + i % 40) {
                pipe.cmd("XCLOAK.ALLOW")
                    .arg(format!("f:{i}"))
                    .arg(HOUR)
                    .arg(100)
                    .arg("NOW")
                    .arg(BASE_NOW + j * 70)
                    .ignore();
            }
        }
        let _: () = pipe.query(&mut conn).unwrap();
    }
    let mut pipe = redis::pipe();
    for i in (0..60_000).step_by(2) {
        pipe.cmd("DEL").arg(format!("f:{i}")).ignore();
    }
    let _: () = pipe.query(&mut conn).unwrap();
    let kept: Vec<String> = (1..60_000).step_by(2).map(|i| format!("f:{i}")).collect();
    let sample: Vec<&String> = kept.iter().step_by(97).collect();
    let before: Vec<Vec<u8>> = sample.iter().map(|k| dump(&mut conn, k)).collect();
    let digest_before = digest(&mut conn);
    for (name, value) in [
        ("active-defrag-ignore-bytes", "1"),
        ("active-defrag-threshold-lower", "1"),
        ("active-defrag-cycle-min", "50"),
        ("activedefrag", "yes"),
    ] {
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg(name)
            .arg(value)
            .query(&mut conn)
            .unwrap();
    }
    let stat = |conn: &mut Connection, field: &str| -> i64 {
        info_field(conn, "stats", field)
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    let defragged = eventually(Duration::from_secs(30), || {
        stat(&mut conn, "active_defrag_hits") > 10_000 && stat(&mut conn, "active_defrag_running") == 0
    });
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("activedefrag")
        .arg("no")
        .query(&mut conn)
        .unwrap();
    assert!(
        defragged,
        "active defrag moved {} allocations",
        stat(&mut conn, "active_defrag_hits")
    );
    let after: Vec<Vec<u8>> = sample.iter().map(|k| dump(&mut conn, k)).collect();
    assert_eq!(after, before, "every window dumps as before");
    assert_eq!(digest(&mut conn), digest_before);
    // And they keep working.
    let d: Vec<i64> = redis::cmd("XCLOAK.ALLOW")
        .arg("f:1")
        .arg(HOUR)
        .arg(100)
        .arg("NOW")
        .arg(BASE_NOW + 10_000)
        .arg("DETAILS")
        .query(&mut conn)
        .unwrap();
    assert_eq!(d[..3], [1, 100, 100 - 3]);
}

/// A window at the inline capacity of the compact form (1,024 lone entries
/// 1 ms apart fit in one 16-byte block), one below it and one above it,
/// under admissions, trims, refunds and a step back: every reply and the
/// stored entries are the sorted-set form's, and the value becomes an index
/// of blocks exactly past the capacity (its MEMORY USAGE jumps by the index
/// and a second block) and one block again when it shrinks back.
///
/// What would fail: a form switch one entry early or late, a window lost or
/// doubled across the switch, a refund or a trim that does not bring it back.
#[test]
fn the_inline_capacity_boundary() {
    const CAPACITY: i64 = 1024;
    let zset_server = Server::start();
    let compact_server = ServerConfig::compact().start();
    let (mut z, mut c) = (zset_server.client(), compact_server.client());
    let memory = |conn: &mut Connection, key: &str| cmd_i64(conn, &["MEMORY", "USAGE", key, "SAMPLES", "0"]);
    let mut sizes = Vec::new();
    for size in [CAPACITY - 1, CAPACITY, CAPACITY + 1] {
        let key = format!("edge:{size}");
        let both = |z: &mut Connection, c: &mut Connection, args: &[String]| -> redis::Value {
            let run = |conn: &mut Connection| -> redis::Value {
                let mut command = redis::cmd(&args[0]);
                for arg in &args[1..] {
                    command.arg(arg.as_str());
                }
                command.query(conn).unwrap_or_else(|e| panic!("{args:?}: {e}"))
            };
            let (on_zset, on_compact) = (run(z), run(c));
            assert_eq!(on_compact, on_zset, "{args:?}");
            on_compact
        };
        let allow = |now: i64, window: i64| -> Vec<String> {
            [
                "XCLOAK.ALLOW",
                &key,
                &window.to_string(),
                "5000",
                "NOW",
                &now.to_string(),
                "DETAILS",
            ]
            .map(String::from)
            .to_vec()
        };
        let refund =
            |stamp: i64| -> Vec<String> { ["XCLOAK.REFUND", &key, &stamp.to_string()].map(String::from).to_vec() };
        let same_entries = |z: &mut Connection, c: &mut Connection, what: &str| {
            assert_eq!(stored_stamps(c, &key), stored_stamps(z, &key), "{key}: {what}");
        };
        for conn in [&mut z, &mut c] {
            let mut pipe = redis::pipe();
            for i in 0..size {
                pipe.cmd("XCLOAK.ALLOW")
                    .arg(&key)
                    .arg(HOUR)
                    .arg(5000)
                    .arg("NOW")
                    .arg(BASE_NOW + i)
                    .ignore();
            }
            let _: () = pipe.query(conn).unwrap();
        }
        same_entries(&mut z, &mut c, "filled");
        let at_size = memory(&mut c, &key);
        sizes.push(at_size);
        // One more admission, its refund (the newest), then a middle refund and its step back.
        both(&mut z, &mut c, &allow(BASE_NOW + size, HOUR));
        let one_more = memory(&mut c, &key);
        assert_eq!(both(&mut z, &mut c, &refund(BASE_NOW + size)), redis::Value::Int(1));
        let after_refund = memory(&mut c, &key);
        if size > CAPACITY {
            // The newest block of a large window is allocated at its full
            // size (it fills); a refund that leaves it mostly empty gives
            // the room back.
            assert!(
                after_refund <= at_size,
                "{key}: {after_refund} B after the refund, {at_size} B before the admission"
            );
        } else {
            assert_eq!(after_refund, at_size, "{key}: back to one block after the refund");
        }
        same_entries(&mut z, &mut c, "after the refund of the newest");
        if size == CAPACITY {
            assert!(
                one_more > at_size + 100,
                "{key}: {one_more} B with one more entry, {at_size} B before: no index"
            );
        } else {
            // Below: one block still holds them all; above: the second block has room.
            assert_eq!(one_more, at_size, "{key}: one more entry in the same blocks");
        }
        both(&mut z, &mut c, &refund(BASE_NOW + size / 2));
        both(&mut z, &mut c, &allow(BASE_NOW + size / 2, HOUR));
        same_entries(&mut z, &mut c, "after a middle refund and a step back");
        // PEEK with tiers that cut the window at the middle and at its newest entry.
        let mut peek = vec![
            "XCLOAK.PEEK".to_string(),
            key.clone(),
            HOUR.to_string(),
            "5000".to_string(),
        ];
        for window in [size / 2, 2, 1] {
            peek.extend(["TIER".to_string(), window.to_string(), "3".to_string()]);
        }
        peek.extend(["NOW".to_string(), (BASE_NOW + size).to_string()]);
        both(&mut z, &mut c, &peek);
        // Trims: exactly the oldest entry (and an admission an hour later,
        // whose gap no longer fits one block), then every entry of the first hour.
        both(&mut z, &mut c, &allow(BASE_NOW + HOUR, HOUR));
        same_entries(&mut z, &mut c, "after a trim of one");
        both(&mut z, &mut c, &allow(BASE_NOW + HOUR + size, HOUR));
        same_entries(&mut z, &mut c, "after a trim to two");
        assert_eq!(stored_stamps(&mut c, &key).len(), 2);
        assert!(
            memory(&mut c, &key) <= sizes[0] + 32,
            "{key}: the emptied index was given back"
        );
        // What is left survives a reload, byte for byte.
        let dump = dump(&mut c, &key);
        let _: String = redis::cmd("DEBUG").arg("RELOAD").query(&mut c).unwrap();
        assert_eq!(self::dump(&mut c, &key), dump, "{key}: DUMP across DEBUG RELOAD");
    }
    assert_eq!(
        sizes[0], sizes[1],
        "1,023 and 1,024 lone entries: the same 16-byte block"
    );
    assert!(
        sizes[2] > sizes[1] + 100,
        "1,025 entries: an index and two blocks ({} B, {} B)",
        sizes[2],
        sizes[1]
    );
}

/// A window of many blocks costs the server one deallocation per block:
/// past 64 (`free_effort`), `UNLINK` hands it to the lazy-free thread, whose
/// `free` must touch nothing but the value. Measured from the server's own
/// counters: `lazyfreed_objects` goes up by one for the big window, not for
/// the small one, and the server keeps answering.
///
/// What would fail: a `free_effort` that ignores the blocks (the big window
/// freed on the main thread), or a `free` that is wrong off the main thread.
#[test]
fn a_window_of_many_blocks_is_freed_by_the_lazy_free_thread() {
    let server = ServerConfig::compact().start();
    let mut conn = server.client();
    let lazyfreed = |conn: &mut Connection| -> i64 {
        info_field(conn, "memory", "lazyfreed_objects")
            .and_then(|v| v.parse().ok())
            .unwrap_or(-1)
    };
    if lazyfreed(&mut conn) < 0 {
        eprintln!("skipped: this server has no lazyfreed_objects counter");
        return;
    }
    // 100,000 entries 1 s apart: some 500 blocks; and a window of 10 entries: one.
    for (key, entries) in [("big", 100_000i64), ("small", 10)] {
        let mut pipe = redis::pipe();
        for i in 0..entries {
            pipe.cmd("XCLOAK.ALLOW")
                .arg(key)
                .arg(10 * HOUR * 1000)
                .arg(1_000_000)
                .arg("NOW")
                .arg(BASE_NOW + i * 1000)
                .ignore();
        }
        let _: () = pipe.query(&mut conn).unwrap();
    }
    let before = lazyfreed(&mut conn);
    assert_eq!(cmd_i64(&mut conn, &["UNLINK", "small"]), 1);
    assert_eq!(lazyfreed(&mut conn), before, "one block is freed at once");
    assert_eq!(cmd_i64(&mut conn, &["UNLINK", "big"]), 1);
    let freed = eventually(Duration::from_secs(10), || lazyfreed(&mut conn) == before + 1);
    assert!(freed, "lazyfreed_objects {} (before {before})", lazyfreed(&mut conn));
    assert_eq!(cmd_i64(&mut conn, &["EXISTS", "big"]), 0);
    assert_eq!(allow_at(&mut conn, "after", HOUR, 5, BASE_NOW), 1, "the server goes on");
}
