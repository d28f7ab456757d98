//! No panic crosses into the server: a panic inside a handler becomes an error
//! reply, the server stays up, nothing is written, and the error is counted.
//!
//! The panic is triggered by the test-only cargo feature `fault-injection`
//! (a call on key `xcloak:fault:panic` panics inside the handler). `make test`
//! builds that module to `target/fault/libxcloak.so` (`make fault-module`);
//! `$XCLOAK_FAULT_MODULE` overrides the path. The shipped module has no trigger.
use crate::common;
use common::*;

const TRIGGER: &str = "xcloak:fault:panic";

fn errors(conn: &mut redis::Connection) -> i64 {
    info_field(conn, "xcloak", "xcloak_errors")
        .expect("INFO xcloak has xcloak_errors")
        .parse()
        .unwrap()
}

#[test]
fn a_panic_in_a_handler_becomes_an_error_reply_and_the_server_stays_up() {
    let module = fault_module();
    let mut server = ServerConfig::without_module()
        .arg("loadmodule", &module.display().to_string())
        .start();
    let mut conn = server.client();

    // Some state that must survive untouched, including a window under the trigger's name.
    for key in ["rl:a", "rl:b"] {
        for t in 0..3 {
            assert_eq!(allow_at(&mut conn, key, 86_400_000, 5, 1_700_000_000_000 + t), 1);
        }
    }
    // (Written directly: every module call on this name panics.)
    let _: i64 = redis::cmd("ZADD")
        .arg(TRIGGER)
        .arg(1_700_000_000_000i64)
        .arg("1700000000000000")
        .arg(1_700_000_000_001i64)
        .arg("1700000000001000")
        .arg(1_700_000_000_002i64)
        .arg("1700000000002000")
        .query(&mut conn)
        .unwrap();
    let before = digest(&mut conn);
    let errors_before = errors(&mut conn);

    const PANICS: i64 = 50;
    for i in 0..PANICS {
        let mut cmd = redis::cmd(if i % 2 == 0 { "XCLOAK.ALLOW" } else { "XCLOAK.PEEK" });
        cmd.arg(TRIGGER).arg(1000).arg(10);
        if i % 3 == 0 {
            cmd.arg("COST").arg(2).arg("NOW").arg(1_700_000_000_005i64);
        }
        let err = cmd
            .query::<redis::Value>(&mut conn)
            .expect_err("a panicking call must reply with an error");
        let text = format!("{} {}", err.code().unwrap_or("?"), err.detail().unwrap_or(""));
        assert!(
            text.starts_with("ERR ") && text.contains("internal error"),
            "reply: {text:?}"
        );
    }

    assert!(server.alive(), "server died:\n{}", server.log());
    // The reply says "see the server log": the panic's message must be there.
    assert!(
        eventually(std::time::Duration::from_secs(5), || server
            .log()
            .contains("xcloak: internal error")),
        "no panic message in the server log:\n{}",
        server.log()
    );
    let pong: String = redis::cmd("PING").query(&mut conn).unwrap();
    assert_eq!(pong, "PONG");
    assert_eq!(digest(&mut conn), before, "a panicking call wrote something");
    assert_eq!(
        errors(&mut conn) - errors_before,
        PANICS,
        "every internal error is counted in INFO xcloak"
    );

    // The same connection and other keys keep working, exactly.
    assert_eq!(allow_at(&mut conn, "rl:a", 86_400_000, 5, 1_700_000_000_010), 1);
    assert_eq!(allow_at(&mut conn, "rl:a", 86_400_000, 5, 1_700_000_000_011), 1);
    assert_eq!(allow_at(&mut conn, "rl:a", 86_400_000, 5, 1_700_000_000_012), 0);
    let peek: Vec<i64> = redis::cmd("XCLOAK.PEEK")
        .arg("rl:b")
        .arg(86_400_000)
        .arg(5)
        .arg("NOW")
        .arg(1_700_000_000_010i64)
        .query(&mut conn)
        .unwrap();
    assert_eq!(peek, [1, 5, 2, 0, 86_400_000 - 8]);
    assert_eq!(
        entries(&mut conn, TRIGGER).len(),
        3,
        "the trigger key's window is intact"
    );

    // A fresh connection works too (the panic left no server-side state behind).
    let mut other = server.client();
    assert_eq!(allow_at(&mut other, "rl:c", 1000, 1, 1_700_000_000_000), 1);
    assert!(server.alive());
}

#[test]
fn the_shipped_module_has_no_trigger() {
    // module_path() is the release build `make build` ships, without the feature.
    let server = Server::start();
    let mut conn = server.client();
    assert_eq!(allow_at(&mut conn, TRIGGER, 1000, 1, 1_700_000_000_000), 1);
    assert_eq!(allow_at(&mut conn, TRIGGER, 1000, 1, 1_700_000_000_001), 0);
}
