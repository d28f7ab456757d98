//! What the server tells clients and operators: COMMAND INFO / DOCS /
//! GETKEYS, ACL key patterns and categories, INFO xcloak, the version
//! (MODULE LIST, INFO, load log line), and the
//! `MAX-LIMIT` / `xcloak.max-limit` setting. Each feature is asserted where
//! the server has it, and its exact absence where it does not (Redis 6.2 has
//! no COMMAND DOCS, key specs, module configs; ACL categories for modules
//! start at 7.2).
//!
//! What would fail: wrong command flags (PEEK `write` would be refused on
//! replicas), wrong key positions (Cluster routing, ACL), a SetCommandInfo
//! struct filled wrongly (garbage or missing docs, or a crash at load),
//! counters not counting, a config that does not bound `limit`, an
//! out-of-range setting that loads anyway.

use crate::common;
use common::*;

use redis::{Connection, Value};

fn text(value: &Value) -> String {
    redis::from_redis_value(value).unwrap_or_else(|_| panic!("not a string: {value:?}"))
}

fn texts(value: &Value) -> Vec<String> {
    redis::from_redis_value(value).unwrap_or_else(|_| panic!("not strings: {value:?}"))
}

fn int(value: &Value) -> i64 {
    redis::from_redis_value(value).unwrap_or_else(|_| panic!("not an integer: {value:?}"))
}

fn items(value: &Value) -> &[Value] {
    match value {
        Value::Array(items) => items,
        other => panic!("not an array: {other:?}"),
    }
}

/// A flat `[name, value, name, value...]` array (RESP2 maps) as a lookup.
fn field<'a>(value: &'a Value, name: &str) -> Option<&'a Value> {
    items(value)
        .chunks(2)
        .find(|pair| text(&pair[0]) == name)
        .map(|pair| &pair[1])
}

fn command_info(conn: &mut Connection, name: &str) -> Vec<Value> {
    let reply: Value = redis::cmd("COMMAND").arg("INFO").arg(name).query(conn).unwrap();
    items(&items(&reply)[0]).to_vec()
}

#[test]
fn command_info_flags_arity_keys_and_key_specs() {
    let server = Server::start();
    let mut conn = server.client();
    for (name, flags, not_flags, categories, key_flags) in [
        (
            "xcloak.allow",
            &["write", "denyoom", "fast"][..],
            "readonly",
            ["@write", "@fast"],
            &["RW", "access", "update"][..],
        ),
        (
            "xcloak.peek",
            &["readonly", "fast"][..],
            "write",
            ["@read", "@fast"],
            &["RO", "access"][..],
        ),
    ] {
        let info = command_info(&mut conn, name);
        assert_eq!(text(&info[0]), name);
        let got_flags = texts(&info[2]);
        for &flag in flags {
            assert!(
                got_flags.contains(&flag.to_string()),
                "{name}: {got_flags:?} lacks {flag}"
            );
        }
        assert!(!got_flags.contains(&not_flags.to_string()), "{name}: {got_flags:?}");
        assert!(!got_flags.contains(&"denyoom".to_string()) || name == "xcloak.allow");
        assert_eq!(
            (int(&info[3]), int(&info[4]), int(&info[5])),
            (1, 1, 1),
            "{name}: key positions"
        );
        if !at_least_7_0() {
            // 6.2: 7 elements (no tips, key specs, subcommands), no ACL
            // category, arity unknown to the server (-1).
            assert_eq!(info.len(), 7, "{name}: {info:?}");
            assert!(texts(&info[6]).is_empty(), "{name}: {info:?}");
            assert_eq!(
                int(&info[1]),
                -1,
                "{name}: 6.2 has no SetCommandInfo to declare the arity"
            );
            continue;
        }
        assert_eq!(int(&info[1]), -4, "{name}: arity");
        let expected_categories: Vec<String> = if at_least_7_2() {
            categories.iter().map(|c| c.to_string()).collect()
        } else {
            vec![]
        };
        assert_eq!(texts(&info[6]), expected_categories, "{name}: ACL categories");
        assert_eq!(texts(&info[7]), ["nondeterministic_output"], "{name}: tips");
        let specs = items(&info[8]);
        assert_eq!(specs.len(), 1, "{name}: one key spec");
        let spec = &specs[0];
        assert_eq!(
            texts(field(spec, "flags").unwrap()),
            key_flags,
            "{name}: key spec flags"
        );
        let begin = field(spec, "begin_search").unwrap();
        assert_eq!(text(field(begin, "type").unwrap()), "index");
        assert_eq!(int(field(field(begin, "spec").unwrap(), "index").unwrap()), 1);
        let find = field(spec, "find_keys").unwrap();
        assert_eq!(text(field(find, "type").unwrap()), "range");
        let range = field(find, "spec").unwrap();
        let range: Vec<i64> = ["lastkey", "keystep", "limit"]
            .iter()
            .map(|f| int(field(range, f).unwrap()))
            .collect();
        assert_eq!(range, [0, 1, 0], "{name}: find_keys range");
    }
}

/// XCLOAK.REFUND: `write fast` (not `denyoom`: it only frees), key 1,1,1,
/// arity -3, key spec `RW delete`, and its documented arguments.
#[test]
fn refund_command_info_and_docs() {
    let server = Server::start();
    let mut conn = server.client();
    let info = command_info(&mut conn, "xcloak.refund");
    let flags = texts(&info[2]);
    assert!(
        flags.contains(&"write".to_string()) && flags.contains(&"fast".to_string()),
        "{flags:?}"
    );
    assert!(!flags.contains(&"denyoom".to_string()), "{flags:?}");
    assert_eq!(
        (int(&info[3]), int(&info[4]), int(&info[5])),
        (1, 1, 1),
        "key positions"
    );
    let keys: Vec<String> = redis::cmd("COMMAND")
        .arg("GETKEYS")
        .arg(&["XCLOAK.REFUND", "rl:a", "5", "COST", "2"])
        .query(&mut conn)
        .unwrap();
    assert_eq!(keys, ["rl:a"]);
    if !at_least_7_0() {
        return;
    }
    assert_eq!(int(&info[1]), -3, "arity");
    let expected_categories: Vec<String> = if at_least_7_2() {
        vec!["@write".into(), "@fast".into()]
    } else {
        vec![]
    };
    assert_eq!(texts(&info[6]), expected_categories, "ACL categories");
    let specs = items(&info[8]);
    assert_eq!(
        texts(field(&specs[0], "flags").unwrap()),
        ["RW", "delete"],
        "key spec flags"
    );
    let reply: Value = redis::cmd("COMMAND")
        .arg("DOCS")
        .arg("xcloak.refund")
        .query(&mut conn)
        .unwrap();
    let docs = field(&reply, "xcloak.refund").expect("docs");
    assert!(text(field(docs, "summary").unwrap()).contains("removes up to COST entries stamped exactly stamp"));
    let arg = |name: &str, kind: &str, token: Option<&str>, optional: bool| {
        (name.to_string(), kind.to_string(), token.map(str::to_string), optional)
    };
    assert_eq!(
        documented_arguments(docs),
        [
            arg("key", "key", None, false),
            arg("stamp", "integer", None, false),
            arg("cost", "integer", Some("COST"), true)
        ]
    );
}

/// (name, type, token, optional) of each documented argument.
fn documented_arguments(docs: &Value) -> Vec<(String, String, Option<String>, bool)> {
    items(field(docs, "arguments").expect("arguments"))
        .iter()
        .map(|arg| {
            let flags = field(arg, "flags").map(texts).unwrap_or_default();
            (
                text(field(arg, "name").unwrap()),
                text(field(arg, "type").unwrap()),
                field(arg, "token").map(text),
                flags.contains(&"optional".to_string()),
            )
        })
        .collect()
}

#[test]
fn command_docs_on_7_0_and_their_absence_on_6_2() {
    let server = Server::start();
    let mut conn = server.client();
    let reply = redis::cmd("COMMAND")
        .arg("DOCS")
        .arg("xcloak.allow")
        .arg("xcloak.peek")
        .query::<Value>(&mut conn);
    if !at_least_7_0() {
        let err = reply.unwrap_err();
        assert_eq!(err.code(), Some("ERR"));
        assert!(
            err.detail().unwrap().to_lowercase().contains("unknown subcommand"),
            "{err}"
        );
        return;
    }
    let reply = reply.unwrap();
    let arg = |name: &str, kind: &str, token: Option<&str>, optional: bool| {
        (name.to_string(), kind.to_string(), token.map(str::to_string), optional)
    };
    let common = vec![
        arg("key", "key", None, false),
        arg("window", "integer", None, false),
        arg("limit", "integer", None, false),
        arg("tier", "block", Some("TIER"), true),
        arg("cost", "integer", Some("COST"), true),
        arg("unix-time-milliseconds", "unix-time", Some("NOW"), true),
    ];
    for name in ["xcloak.allow", "xcloak.peek"] {
        let docs = field(&reply, name).unwrap_or_else(|| panic!("no docs for {name}: {reply:?}"));
        assert_eq!(text(field(docs, "since").unwrap()), "0.1.0");
        assert_eq!(text(field(docs, "group").unwrap()), "module");
        assert_eq!(text(field(docs, "module").unwrap()), "xcloak");
        assert!(
            text(field(docs, "complexity").unwrap()).starts_with("O(log(N) + "),
            "{name}"
        );
        let summary = text(field(docs, "summary").unwrap());
        assert!(summary.contains("retry_after_ms"), "{name}: {summary}");
        let mut expected = common.clone();
        if name == "xcloak.allow" {
            assert!(summary.starts_with("Admits a request"), "{summary}");
            expected.push(arg("details", "pure-token", Some("DETAILS"), true));
            expected.push(arg("stamp", "pure-token", Some("STAMP"), true));
        } else {
            assert!(summary.contains("writing nothing"), "{summary}");
            expected.push(arg("oldest", "pure-token", Some("OLDEST"), true));
        }
        assert_eq!(documented_arguments(docs), expected, "{name}");
        let key = &items(field(docs, "arguments").unwrap())[0];
        assert_eq!(int(field(key, "key_spec_index").unwrap()), 0);
        // TIER is a repeatable block, its token repeated each time
        // (`[TIER window limit [TIER window limit ...]]` in redis-cli hints).
        let tier = &items(field(docs, "arguments").unwrap())[3];
        assert_eq!(
            texts(field(tier, "flags").unwrap()),
            ["optional", "multiple", "multiple_token"],
            "{name}"
        );
        let inside: Vec<(String, String)> = items(field(tier, "arguments").expect("TIER's arguments"))
            .iter()
            .map(|arg| (text(field(arg, "name").unwrap()), text(field(arg, "type").unwrap())))
            .collect();
        assert_eq!(
            inside,
            [
                ("window".to_string(), "integer".to_string()),
                ("limit".to_string(), "integer".to_string())
            ]
        );
    }
}

#[test]
fn command_getkeys_finds_the_key_whatever_the_options() {
    let server = Server::start();
    let mut conn = server.client();
    for line in [
        "XCLOAK.ALLOW user:1 1000 5",
        "XCLOAK.ALLOW user:1 1000 5 COST 2 NOW 7 DETAILS",
        "XCLOAK.PEEK user:1 1000 5",
        "XCLOAK.PEEK user:1 1000 5 NOW 7 COST 2",
        "XCLOAK.ALLOW user:1 1000 5 TIER 60000 50 TIER 10 1 DETAILS",
        "XCLOAK.PEEK user:1 1000 5 TIER 60000 50",
    ] {
        let keys: Vec<String> = redis::cmd("COMMAND")
            .arg("GETKEYS")
            .arg(line.split(' ').collect::<Vec<_>>())
            .query(&mut conn)
            .unwrap();
        assert_eq!(keys, ["user:1"], "{line}");
    }
}

#[test]
fn acl_key_patterns_apply_to_the_key_argument() {
    let server = Server::start();
    let mut admin = server.client();
    let _: () = redis::cmd("ACL")
        .arg(&[
            "SETUSER",
            "limiter",
            "on",
            ">pw",
            "~rl:*",
            "+xcloak.allow",
            "+xcloak.peek",
        ])
        .query(&mut admin)
        .unwrap();
    let mut limiter = redis::Client::open(format!("redis://limiter:pw@127.0.0.1:{}/", server.port))
        .unwrap()
        .get_connection()
        .unwrap();
    assert_eq!(allow_at(&mut limiter, "rl:a", 1000, 5, 100), 1);
    let peeked: Vec<i64> = redis::cmd("XCLOAK.PEEK")
        .arg("rl:a")
        .arg(1000)
        .arg(5)
        .arg("NOW")
        .arg(100)
        .query(&mut limiter)
        .unwrap();
    assert_eq!(peeked, [1, 5, 4, 0, 1000]);
    for command in ["XCLOAK.ALLOW", "XCLOAK.PEEK"] {
        let err = redis::cmd(command)
            .arg("other:a")
            .arg(1000)
            .arg(5)
            .query::<Value>(&mut limiter)
            .unwrap_err();
        assert_eq!(err.code(), Some("NOPERM"), "{command}: {err}");
    }
    let exists: i64 = redis::cmd("EXISTS").arg("other:a").query(&mut admin).unwrap();
    assert_eq!(exists, 0);
}

fn stat(conn: &mut Connection, name: &str) -> i64 {
    info_field(conn, "xcloak", &format!("xcloak_{name}"))
        .unwrap_or_else(|| panic!("INFO xcloak has no xcloak_{name}"))
        .parse()
        .unwrap()
}

#[test]
fn info_xcloak_counts_a_known_sequence() {
    let server = Server::start();
    let mut conn = server.client();
    let counts = |conn: &mut Connection| ["admitted", "rejected", "peeks", "errors", "refunded"].map(|n| stat(conn, n));
    assert_eq!(counts(&mut conn), [0, 0, 0, 0, 0]);
    assert_eq!(stat(&mut conn, "max_limit"), 1_000_000);

    let run = |conn: &mut Connection, line: &str| {
        let words: Vec<&str> = line.split(' ').collect();
        let mut command = redis::cmd(words[0]);
        command.arg(&words[1..]);
        command.query::<Value>(conn)
    };
    for _ in 0..3 {
        run(&mut conn, "XCLOAK.ALLOW k 1000 2 NOW 1000").unwrap(); // 2 admitted, 1 rejected
    }
    run(&mut conn, "XCLOAK.ALLOW k 1000 2 NOW 1000 DETAILS").unwrap(); // rejected
    run(&mut conn, "XCLOAK.ALLOW k2 1000 5 COST 5 NOW 1").unwrap(); // admitted (one call, cost 5)
    for _ in 0..4 {
        run(&mut conn, "XCLOAK.PEEK k 1000 2 NOW 1000").unwrap();
    }
    let _: () = redis::cmd("SET").arg("s").arg("v").query(&mut conn).unwrap();
    for bad in [
        "XCLOAK.ALLOW k 0 2",
        "XCLOAK.PEEK k 1000 2 BAD",
        "XCLOAK.ALLOW s 1000 1",
        "XCLOAK.PEEK s 1000 1",
    ] {
        assert!(run(&mut conn, bad).is_err(), "{bad}");
    }
    // Arity: on 7.0+ the server refuses it from the declared arity before
    // the module runs; on 6.2 the module answers it and counts it.
    assert!(run(&mut conn, "XCLOAK.ALLOW k 1000").is_err());
    let arity_errors = if at_least_7_0() { 0 } else { 1 };
    // Refunds count the entries they removed: 3 of k2's 5, none of an unknown stamp.
    assert_eq!(run(&mut conn, "XCLOAK.REFUND k2 1 COST 3"), Ok(Value::Int(3)));
    assert_eq!(run(&mut conn, "XCLOAK.REFUND k2 2 COST 3"), Ok(Value::Int(0)));
    assert!(run(&mut conn, "XCLOAK.REFUND s 1").is_err(), "WRONGTYPE");
    assert_eq!(counts(&mut conn), [3, 2, 4, 5 + arity_errors, 3]);

    // The section is in `INFO xcloak`, `INFO modules` and `INFO everything`.
    for section in ["modules", "everything"] {
        let text: String = redis::cmd("INFO").arg(section).query(&mut conn).unwrap();
        assert!(
            text.contains("# xcloak_stats") && text.contains("xcloak_admitted:3"),
            "INFO {section}"
        );
    }
}

/// The version from Cargo.toml, in the three places an operator looks: MODULE
/// LIST (encoded major * 10000 + minor * 100 + patch, as modules report it),
/// INFO xcloak (text) and the load line of the server log. What would fail:
/// a hard-coded or mis-encoded version (the crate's macro default was 1).
#[test]
fn version_in_module_list_info_and_log() {
    let version = env!("CARGO_PKG_VERSION");
    let numbers: Vec<i64> = version
        .split(['-', '+'])
        .next()
        .unwrap()
        .split('.')
        .map(|n| n.parse().unwrap())
        .collect();
    let encoded = numbers[0] * 10000 + numbers[1] * 100 + numbers[2];

    let server = Server::start();
    let mut conn = server.client();
    let modules: Value = redis::cmd("MODULE").arg("LIST").query(&mut conn).unwrap();
    let xcloak = items(&modules)
        .iter()
        .find(|module| field(module, "name").map(text).as_deref() == Some("xcloak"))
        .unwrap_or_else(|| panic!("MODULE LIST has no xcloak: {modules:?}"));
    assert_eq!(field(xcloak, "ver").map(int), Some(encoded), "MODULE LIST: {xcloak:?}");

    assert_eq!(
        info_field(&mut conn, "xcloak", "xcloak_version").as_deref(),
        Some(version)
    );
    let log = server.log();
    let load_line = format!("<xcloak> version {version} loaded");
    assert!(
        log.lines().any(|line| line.ends_with(&load_line)),
        "no line '{load_line}' in the log:\n{log}"
    );
}

fn limit_error(conn: &mut Connection, limit: i64) -> Option<String> {
    redis::cmd("XCLOAK.PEEK")
        .arg("k")
        .arg(1000)
        .arg(limit)
        .query::<Value>(conn)
        .err()
        .map(|e| format!("{} {}", e.code().unwrap_or(""), e.detail().unwrap_or("")))
}

fn config_get(conn: &mut Connection) -> Vec<String> {
    redis::cmd("CONFIG")
        .arg("GET")
        .arg("xcloak.max-limit")
        .query(conn)
        .unwrap()
}

#[test]
fn config_set_bounds_the_limit() {
    let server = Server::start();
    let mut conn = server.client();
    let set = |conn: &mut Connection, value: &str| -> redis::RedisResult<()> {
        redis::cmd("CONFIG")
            .arg("SET")
            .arg("xcloak.max-limit")
            .arg(value)
            .query(conn)
    };
    if !at_least_7_0() {
        // 6.2 has no module configs: only the load argument exists.
        let err = set(&mut conn, "50").unwrap_err();
        assert!(err.detail().unwrap().contains("Unsupported CONFIG parameter"), "{err}");
        assert!(config_get(&mut conn).is_empty());
        assert_eq!(limit_error(&mut conn, 1_000_000), None);
        return;
    }
    assert_eq!(config_get(&mut conn), ["xcloak.max-limit", "1000000"]);
    set(&mut conn, "50").unwrap();
    assert_eq!(config_get(&mut conn), ["xcloak.max-limit", "50"]);
    assert_eq!(stat(&mut conn, "max_limit"), 50);
    assert_eq!(limit_error(&mut conn, 50), None);
    assert_eq!(
        limit_error(&mut conn, 51).as_deref(),
        Some("ERR limit must be an integer from 0 to 50")
    );
    // Out of range: refused by the server, value unchanged.
    for bad in ["0", "-1", "1000000001", "abc"] {
        let err = set(&mut conn, bad).unwrap_err();
        assert_eq!(err.code(), Some("ERR"), "{bad}: {err}");
        assert_eq!(config_get(&mut conn), ["xcloak.max-limit", "50"], "{bad}");
    }
    // Up to the ceiling.
    set(&mut conn, "1000000000").unwrap();
    assert_eq!(limit_error(&mut conn, 1_000_000_000), None);
    assert!(limit_error(&mut conn, 1_000_000_001).is_some());
}

#[test]
fn max_limit_load_argument_and_which_setting_wins() {
    let server = ServerConfig::default().module_args(&["MAX-LIMIT", "20"]).start();
    let mut conn = server.client();
    assert_eq!(limit_error(&mut conn, 20), None);
    assert_eq!(
        limit_error(&mut conn, 21).as_deref(),
        Some("ERR limit must be an integer from 0 to 20")
    );
    assert_eq!(stat(&mut conn, "max_limit"), 20);
    if !at_least_7_0() {
        return;
    }
    assert_eq!(
        config_get(&mut conn),
        ["xcloak.max-limit", "20"],
        "MAX-LIMIT is the config's default"
    );
    drop(conn);
    drop(server);

    // A config value (config file / command line / MODULE LOADEX CONFIG) is
    // applied after the load argument and wins: what CONFIG REWRITE persists
    // survives a restart with the same loadmodule line.
    let server = ServerConfig::default()
        .module_args(&["MAX-LIMIT", "9"])
        .arg("xcloak.max-limit", "7")
        .start();
    let mut conn = server.client();
    assert_eq!(config_get(&mut conn), ["xcloak.max-limit", "7"]);
    assert_eq!(limit_error(&mut conn, 7), None);
    assert_eq!(
        limit_error(&mut conn, 8).as_deref(),
        Some("ERR limit must be an integer from 0 to 7")
    );
}

#[test]
fn out_of_range_settings_refuse_the_load() {
    for (args, message) in [
        (
            &["MAX-LIMIT", "0"][..],
            "xcloak: refusing to load: MAX-LIMIT must be an integer from 1 to 1000000000",
        ),
        (
            &["MAX-LIMIT", "1000000001"],
            "xcloak: refusing to load: MAX-LIMIT must be an integer from 1 to 1000000000",
        ),
        (
            &["MAX-LIMIT", "ten"],
            "xcloak: refusing to load: MAX-LIMIT must be an integer from 1 to 1000000000",
        ),
        (
            &["MAX-LIMIT"],
            "xcloak: refusing to load: MAX-LIMIT must be an integer from 1 to 1000000000",
        ),
        (
            &["MAX-LIMIT", "5", "MAX-LIMIT", "6"],
            "xcloak: refusing to load: MAX-LIMIT is given more than once",
        ),
        (
            &["LIMIT", "5"],
            "xcloak: refusing to load: unknown load argument 'LIMIT' (expected MAX-LIMIT n or STORAGE zset|compact)",
        ),
    ] {
        let log = ServerConfig::default().module_args(args).start_expecting_exit();
        assert!(log.contains(message), "{args:?}: no {message:?} in\n{log}");
    }
    if at_least_7_0() {
        let log = ServerConfig::default()
            .arg("xcloak.max-limit", "0")
            .start_expecting_exit();
        let message = "xcloak: refusing to load: xcloak.max-limit or xcloak.storage from the configuration is invalid";
        assert!(log.contains(message), "no {message:?} in\n{log}");
    }
}

#[test]
fn module_load_at_runtime_refuses_bad_arguments() {
    let mut config = ServerConfig::without_module();
    if at_least_7_0() {
        config = config.arg("enable-module-command", "yes");
    }
    let server = config.start();
    let mut conn = server.client();
    let path = module_path().display().to_string();
    let load = |conn: &mut Connection, args: &[&str]| -> redis::RedisResult<()> {
        redis::cmd("MODULE").arg("LOAD").arg(&path).arg(args).query(conn)
    };
    assert!(load(&mut conn, &["MAX-LIMIT", "0"]).is_err());
    let info: Value = redis::cmd("COMMAND")
        .arg("INFO")
        .arg("xcloak.allow")
        .query(&mut conn)
        .unwrap();
    assert_eq!(items(&info), [Value::Nil], "a refused load leaves no command behind");
    assert!(server
        .log()
        .contains("xcloak: refusing to load: MAX-LIMIT must be an integer from 1 to 1000000000"));

    load(&mut conn, &["MAX-LIMIT", "12"]).unwrap();
    assert_eq!(limit_error(&mut conn, 12), None);
    assert_eq!(
        limit_error(&mut conn, 13).as_deref(),
        Some("ERR limit must be an integer from 0 to 12")
    );
    if at_least_7_0() {
        // Loaded after startup, the command metadata is there too.
        assert_eq!(int(&command_info(&mut conn, "xcloak.allow")[1]), -4);
        // Unloading frees nothing of the module's (the server copied the
        // docs), and MODULE LOADEX's CONFIG wins over the load argument.
        let _: () = redis::cmd("MODULE")
            .arg("UNLOAD")
            .arg("xcloak")
            .query(&mut conn)
            .unwrap();
        let _: () = redis::cmd("MODULE")
            .arg(&[
                "LOADEX",
                &path,
                "CONFIG",
                "xcloak.max-limit",
                "33",
                "ARGS",
                "MAX-LIMIT",
                "44",
            ])
            .query(&mut conn)
            .unwrap();
        assert_eq!(config_get(&mut conn), ["xcloak.max-limit", "33"]);
        assert_eq!(
            limit_error(&mut conn, 34).as_deref(),
            Some("ERR limit must be an integer from 0 to 33")
        );
        let docs: Value = redis::cmd("COMMAND")
            .arg("DOCS")
            .arg("xcloak.peek")
            .query(&mut conn)
            .unwrap();
        assert!(field(&docs, "xcloak.peek").is_some(), "docs after a reload: {docs:?}");
    }
}

/// The whole of `COMMAND DOCS` and `COMMAND INFO` of every command, as Redis
/// 7.0 replies them (RESP3), against the committed snapshot
/// `tests/fixtures/command_docs.txt` (rendered by `common::snapshot`).
///
/// What would fail: any byte of a summary, complexity, tip, argument (name,
/// type, token, flags, block), arity, flag, key position or key spec that
/// changes, for instance when the grammar they are generated from drifts from
/// what the parser accepts. Other servers add fields of their own (7.2+: the
/// ACL categories in COMMAND INFO; 6.2: no DOCS at all), which the other
/// tests of this file assert; the snapshot is compared on 7.0.
#[test]
fn command_docs_and_info_match_the_snapshot() {
    let (major, minor, _) = server_version();
    if is_valkey() || (major, minor) != (7, 0) {
        eprintln!("skipped: the snapshot is of Redis 7.0's replies (this server is {major}.{minor})");
        return;
    }
    let server = Server::start();
    let mut conn = redis::Client::open(format!("{}?protocol=resp3", server.url()))
        .unwrap()
        .get_connection()
        .unwrap();
    let names = [
        "xcloak.allow",
        "xcloak.peek",
        "xcloak.refund",
        "xcloak.convert",
        "xcloak.apply",
    ];
    let mut live = String::new();
    for subcommand in ["DOCS", "INFO"] {
        let reply: Value = redis::cmd("COMMAND")
            .arg(subcommand)
            .arg(&names)
            .query(&mut conn)
            .unwrap();
        live.push_str(&format!("COMMAND {subcommand} {}\n", names.join(" ")));
        common::snapshot::render(&reply, 1, &mut live);
    }
    common::snapshot::check("command_docs.txt", &live);
}
