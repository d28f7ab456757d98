//! The server's own clock stepping backwards and forwards (NTP step, VM
//! resume, an operator's `date -s`), on a live server: a tiny LD_PRELOAD shim
//! (tests/clock/shim.c, compiled here with the system C compiler) shifts the
//! server's wall clock by the milliseconds written in a file.
//!
//! Claims (docs/hardening.md): retry_after_ms and reset_after_ms are never
//! negative; no entry still inside the window is removed; entries stamped
//! "in the future" after a step back keep counting until they leave.
use crate::common;
use common::*;

use std::path::PathBuf;
use std::process::Command;

struct Clock {
    file: PathBuf,
    shim: PathBuf,
}

impl Clock {
    /// Builds the shim and a clock file of this test's own (tests run in
    /// parallel in one process, so nothing goes through the process's environment).
    fn install() -> Clock {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let dir = std::env::temp_dir().join(format!("xcloak-clock-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let shim = dir.join("shim.so");
        let source = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/clock/shim.c");
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
        let status = Command::new(&cc)
            .args(["-shared", "-fPIC", "-O2", "-o"])
            .arg(&shim)
            .arg(source)
            .status()
            .unwrap_or_else(|e| panic!("{cc}: {e}"));
        assert!(status.success(), "compiling {source} failed");
        let file = dir.join("offset-ms");
        std::fs::write(&file, "0").unwrap();
        Clock { file, shim }
    }

    /// A server (with the module) whose wall clock this clock shifts: the shim
    /// is preloaded into it alone.
    fn server(&self) -> Server {
        ServerConfig::default()
            .env("LD_PRELOAD", &self.shim.display().to_string())
            .env("XCLOAK_CLOCK_FILE", &self.file.display().to_string())
            .start()
    }

    /// Sets the server clock to real time + `offset_ms`, and waits until the
    /// server reads it (Valkey caches its clock between event-loop iterations).
    fn shift(&self, conn: &mut redis::Connection, offset_ms: i64) {
        std::fs::write(&self.file, offset_ms.to_string()).unwrap();
        let real_ms = || {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_millis() as i64
        };
        let seen = eventually(std::time::Duration::from_secs(5), || {
            (server_ms(conn) - real_ms() - offset_ms).abs() < 500
        });
        assert!(seen, "the server clock did not move to real time {offset_ms:+} ms");
    }
}

fn server_ms(conn: &mut redis::Connection) -> i64 {
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query(conn).unwrap();
    secs * 1000 + micros / 1000
}

/// `cmd key window limit`, with DETAILS for ALLOW: both reply the 5 fields.
fn details_command(cmd: &str, key: &str, window: i64, limit: i64) -> redis::Cmd {
    let mut c = redis::cmd(cmd);
    c.arg(key).arg(window).arg(limit);
    if cmd == "XCLOAK.ALLOW" {
        c.arg("DETAILS");
    }
    c
}

fn details(conn: &mut redis::Connection, cmd: &str, key: &str, window: i64, limit: i64) -> Vec<i64> {
    details_command(cmd, key, window, limit).query(conn).unwrap()
}

/// Runs `call` and `PTTL key` in one MULTI, so no stall of the test machine
/// between the two can eat into the TTL: (the call's reply, the PTTL).
fn with_pttl(conn: &mut redis::Connection, call: redis::Cmd, key: &str) -> (Vec<i64>, i64) {
    redis::pipe()
        .atomic()
        .add_command(call)
        .cmd("PTTL")
        .arg(key)
        .query(conn)
        .unwrap()
}

#[test]
fn a_server_clock_stepping_back_and_forth() {
    let clock = Clock::install();
    let server = clock.server();
    let mut conn = server.client();
    let (window, limit) = (3_000, 3);

    // The shim works: the server's clock moves (asserted inside `shift`).
    clock.shift(&mut conn, -60_000);
    clock.shift(&mut conn, 0);

    let first = details(&mut conn, "XCLOAK.ALLOW", "k", window, limit);
    assert_eq!(&first[..4], &[1, 3, 2, 0]);

    // Step back 5 s: the entry just admitted now lies 5 s in the future and is still live.
    clock.shift(&mut conn, -5_000);
    let second = details(&mut conn, "XCLOAK.ALLOW", "k", window, limit);
    assert_eq!(&second[..4], &[1, 3, 1, 0], "the future entry still counts");
    assert!(second[4] > window, "reset waits for the future entry: {second:?}");
    let third = details(&mut conn, "XCLOAK.ALLOW", "k", window, limit);
    assert_eq!(third[0], 1);
    let rejected = details(&mut conn, "XCLOAK.ALLOW", "k", window, limit);
    assert_eq!(&rejected[..3], &[0, 3, 0]);
    assert!(
        rejected[3] >= 1 && rejected[4] >= rejected[3],
        "never negative, never zero when rejected: {rejected:?}"
    );
    let peek = details(&mut conn, "XCLOAK.PEEK", "k", window, limit);
    assert!(peek[3] >= 1 && peek[4] >= 1, "{peek:?}");
    assert_eq!(entries(&mut conn, "k").len(), 3, "no entry lost");

    // Further back than the window: everything is in the future, all still counted.
    clock.shift(&mut conn, -20_000);
    let far = details(&mut conn, "XCLOAK.ALLOW", "k", window, limit);
    assert_eq!(&far[..3], &[0, 3, 0]);
    assert!(far[3] > 10_000 && far[4] > 10_000, "{far:?}");
    assert_eq!(entries(&mut conn, "k").len(), 3, "no entry lost");

    // Forward past every entry: they leave (they are outside the window now), nothing negative.
    clock.shift(&mut conn, 10_000);
    let later = details(&mut conn, "XCLOAK.ALLOW", "k", window, limit);
    assert_eq!(&later[..4], &[1, 3, 2, 0]);
    assert_eq!(later[4], window);
    assert_eq!(entries(&mut conn, "k").len(), 1);
    clock.shift(&mut conn, 0);
    let back = details(&mut conn, "XCLOAK.PEEK", "k", window, limit);
    assert!(back[3] >= 0 && back[4] > window, "{back:?}");
}

/// After a step back, an admission must not shorten the key's TTL below the
/// time its newest entry stays live (`reset_after_ms`): otherwise the key
/// expires with live entries in it and the window resets early.
#[test]
fn a_step_back_does_not_expire_live_entries_early() {
    let clock = Clock::install();
    let server = clock.server();
    let mut conn = server.client();
    let first = details(&mut conn, "XCLOAK.ALLOW", "k", 3_000, 3);
    assert_eq!(first[0], 1);
    clock.shift(&mut conn, -5_000);
    let (second, ttl) = with_pttl(&mut conn, details_command("XCLOAK.ALLOW", "k", 3_000, 3), "k");
    assert_eq!(second[0], 1);
    assert!(
        ttl >= second[4],
        "the key expires in {ttl} ms, its newest entry leaves the window in {} ms",
        second[4]
    );
}

/// The Lua fallback keeps the same rule: after a step back its admission must
/// not shorten the key's expiry either (it reads PTTL before its PEXPIREAT).
#[test]
fn the_lua_fallback_does_not_expire_live_entries_early_either() {
    const FALLBACK: &str = include_str!("../src/lua/xcloak_allow.lua");
    let clock = Clock::install();
    let server = clock.server();
    let mut conn = server.client();
    let eval = || {
        redis::cmd("EVAL")
            .arg(FALLBACK)
            .arg(1)
            .arg("k")
            .arg(3_000)
            .arg(3)
            .arg("DETAILS")
            .clone()
    };
    assert_eq!(eval().query::<Vec<i64>>(&mut conn).unwrap()[0], 1);
    clock.shift(&mut conn, -5_000);
    let (second, ttl) = with_pttl(&mut conn, eval(), "k");
    assert_eq!(second[0], 1);
    assert!(
        ttl >= second[4],
        "the key expires in {ttl} ms, its newest entry leaves the window in {} ms",
        second[4]
    );
}
