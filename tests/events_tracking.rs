//! Client-side caching (`CLIENT TRACKING`) of windows, on both storage forms:
//! a client that read a window with XCLOAK.PEEK is sent an invalidation for
//! it when a call changes what the key stores, and only then (the same rule
//! as WATCH, tests/events_watch.rs); on a replica, when the primary's effect
//! is applied.
//!
//! The invalidations are redirected (RESP2 `REDIRECT`) to a connection
//! subscribed to `__redis__:invalidate`, where they arrive in order. After
//! each call the test invalidates a marker key the reader also tracks, so
//! whether the window's invalidation came is read deterministically: it is
//! before the marker's, or it is not there.
use crate::common;
use common::resp::{Raw, Resp};
use common::*;

const T: i64 = 1_700_000_000_000;

struct Tracked {
    /// Reads with tracking on (PEEK, GET of the marker).
    reader: Raw,
    /// Receives the invalidations.
    sink: Raw,
    marks: u64,
}

impl Tracked {
    fn new(port: u16) -> Tracked {
        let mut sink = Raw::connect(port);
        let sink_id = sink.call(&["CLIENT", "ID"]).int();
        let subscribed = sink.call(&["SUBSCRIBE", "__redis__:invalidate"]);
        assert_eq!(subscribed.items()[0].text(), "subscribe");
        let mut reader = Raw::connect(port);
        assert_eq!(
            reader
                .call(&["CLIENT", "TRACKING", "on", "REDIRECT", &sink_id.to_string()])
                .text(),
            "OK"
        );
        Tracked { reader, sink, marks: 0 }
    }

    /// Reads the window (so it is tracked) and the marker key.
    fn read(&mut self, key: &str) {
        let peek = self
            .reader
            .call(&["XCLOAK.PEEK", key, "60000", "5", "NOW", &T.to_string()]);
        assert!(!peek.is_error(), "PEEK {key}: {peek:?}");
        let _ = self.reader.call(&["GET", "marker"]);
    }

    /// The keys invalidated since the last call, read up to the marker's
    /// invalidation (which `writer` triggers).
    fn invalidated_since(&mut self, writer: &mut redis::Connection) -> Vec<String> {
        self.marks += 1;
        let _: () = redis::cmd("SET").arg("marker").arg(self.marks).query(writer).unwrap();
        let mut keys = Vec::new();
        loop {
            let message = self.sink.read().expect("an invalidation message");
            let items = message.items();
            assert_eq!(items[0].text(), "message", "{message:?}");
            assert_eq!(items[1].text(), "__redis__:invalidate");
            let invalidated: Vec<String> = match &items[2] {
                Resp::Array(keys) => keys.iter().map(Resp::text).collect(),
                Resp::Nil => vec!["<flush>".to_string()],
                other => panic!("{other:?}"),
            };
            for key in invalidated {
                if key == "marker" {
                    // Tracked again for the next call.
                    let _ = self.reader.call(&["GET", "marker"]);
                    return keys;
                }
                keys.push(key);
            }
        }
    }
}

/// (setup, call by another client, whether the window is invalidated).
const CASES: &[(&str, &str, bool)] = &[
    ("", "XCLOAK.ALLOW w 60000 5 NOW {T}", true),
    (
        "XCLOAK.ALLOW w 60000 1 NOW {T}",
        "XCLOAK.ALLOW w 60000 1 NOW {T}",
        false,
    ),
    (
        "XCLOAK.ALLOW w 1000 1 NOW {T}",
        "XCLOAK.ALLOW w 1000 0 NOW {T+5000}",
        true,
    ),
    ("XCLOAK.ALLOW w 60000 1 NOW {T}", "XCLOAK.PEEK w 60000 1", false),
    ("XCLOAK.ALLOW w 60000 5 NOW {T}", "XCLOAK.REFUND w {T}", true),
    ("XCLOAK.ALLOW w 60000 5 NOW {T}", "XCLOAK.REFUND w 7", false),
];

fn words(text: &str) -> Vec<String> {
    text.split_whitespace()
        .map(|w| {
            w.replace("{T}", &T.to_string())
                .replace("{T+5000}", &(T + 5000).to_string())
        })
        .collect()
}

fn run(conn: &mut redis::Connection, text: &str) {
    let words = words(text);
    let mut cmd = redis::cmd(&words[0]);
    for word in &words[1..] {
        cmd.arg(word.as_str());
    }
    let _: redis::Value = cmd.query(conn).unwrap_or_else(|e| panic!("{words:?}: {e}"));
}

fn check_form(server: Server) {
    let mut writer = server.client();
    let mut tracked = Tracked::new(server.port);
    for &(setup, call, invalidates) in CASES {
        run(&mut writer, "DEL w");
        if !setup.is_empty() {
            run(&mut writer, setup);
        }
        tracked.read("w");
        tracked.invalidated_since(&mut writer);
        run(&mut writer, call);
        let keys = tracked.invalidated_since(&mut writer);
        let expected: &[&str] = if invalidates { &["w"] } else { &[] };
        assert_eq!(keys, expected, "after `{setup}`, `{call}`");
    }
}

/// A reader of the replica is told when the primary's effects change a
/// window there (the compact form's XCLOAK.APPLY, the core's ZADD...), and
/// not for calls that replicate nothing.
fn check_replica(config: ServerConfig) {
    let primary = config.clone().arg("repl-diskless-sync-delay", "0").start();
    let replica = config.start();
    let mut on_replica = replica.client();
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(primary.port)
        .query(&mut on_replica)
        .unwrap();
    let mut writer = primary.client();
    run(&mut writer, "XCLOAK.ALLOW w 60000 5 NOW {T}");
    wait_replicated(&primary, &replica);
    let mut tracked = Tracked::new(replica.port);
    for (call, invalidates) in [
        ("XCLOAK.ALLOW w 60000 5 NOW {T}", true),
        ("XCLOAK.ALLOW w 60000 2 NOW {T}", false),
        ("XCLOAK.REFUND w {T}", true),
        ("XCLOAK.ALLOW w 1000 0 NOW {T+5000}", true),
    ] {
        tracked.read("w");
        // The marker is written on the primary and replicated after the call.
        tracked.invalidated_since(&mut writer);
        run(&mut writer, call);
        let keys = tracked.invalidated_since(&mut writer);
        let expected: &[&str] = if invalidates { &["w"] } else { &[] };
        assert_eq!(keys, expected, "on the replica, after `{call}`");
    }
}

#[test]
fn tracking_invalidates_a_sorted_set_window_when_it_changes() {
    check_form(Server::start());
    check_replica(ServerConfig::default());
}

#[test]
fn tracking_invalidates_a_compact_window_when_it_changes() {
    check_form(ServerConfig::compact().start());
    check_replica(ServerConfig::compact());
}
