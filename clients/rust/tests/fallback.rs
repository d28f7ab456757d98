//! The fallback (docs/clients.md, "Fallback") against real servers: the
//! first call to a server without the module is sent once as the command,
//! once as EVALSHA (NOSCRIPT) and once as EVAL, and applied once; the server is
//! then served by EVALSHA alone; a MODULE LOAD is picked up after the probe
//! interval; `Never` raises the unknown command; peeks use EVALSHA_RO; a
//! compact window can't be read by the script and WRONGTYPE is raised, even
//! under a fail-open policy.
mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::{Cmd, Value};
use support::Server;
use xcloak_client::{Error, ErrorPolicy, Fallback, Limiter, Refund, Request, Transport, Via};

#[derive(Clone)]
struct Recording {
    conn: redis::aio::MultiplexedConnection,
    log: Arc<Mutex<Vec<String>>>,
}

impl Transport for Recording {
    fn send<'a>(
        &'a self,
        key: &'a [u8],
        read: bool,
        cmds: &'a [Cmd],
    ) -> impl std::future::Future<Output = redis::RedisResult<Vec<Value>>> + Send + 'a {
        for cmd in cmds {
            let name = cmd.args_iter().next().map(|a| match a {
                redis::Arg::Simple(b) => String::from_utf8_lossy(b).into_owned(),
                _ => String::new(),
            });
            self.log.lock().unwrap().push(name.unwrap_or_default());
        }
        self.conn.send(key, read, cmds)
    }
}

impl Recording {
    async fn new(server: &Server) -> Recording {
        Recording {
            conn: server.client().get_multiplexed_async_connection().await.unwrap(),
            log: Arc::default(),
        }
    }
    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.log.lock().unwrap())
    }
}

fn minute(key: &str, limit: u64) -> Request {
    Request::new(key, Duration::from_secs(60), limit)
}

#[tokio::test]
async fn an_unknown_command_moves_the_server_to_the_script_once_and_applies_nothing_twice() {
    let server = Server::without_module();
    let transport = Recording::new(&server).await;
    let limiter = Limiter::new(transport.clone());
    let first = limiter.allow(&minute("k", 3)).await.unwrap();
    assert_eq!((first.allowed, first.remaining, first.via), (true, 2, Via::Script));
    // The command (unknown: nothing applied), the cached script (NOSCRIPT), its text.
    assert_eq!(transport.take(), ["XCLOAK.ALLOW", "EVALSHA", "EVAL"]);
    assert_eq!(server.entries("k"), 1, "the first call was applied exactly once");
    for remaining in [1, 0] {
        let d = limiter.allow(&minute("k", 3)).await.unwrap();
        assert_eq!((d.remaining, d.via), (remaining, Via::Script));
        assert_eq!(transport.take(), ["EVALSHA"], "no second probe within the interval");
    }
    let refused = limiter.allow(&minute("k", 3)).await.unwrap();
    assert!(!refused.allowed && refused.retry_after.is_some_and(|r| r > Duration::ZERO));
    assert_eq!(server.entries("k"), 3);
    assert_eq!(transport.take(), ["EVALSHA"]);
    // A SCRIPT FLUSH (or a restart) costs one EVAL, not an error.
    let _: () = redis::cmd("SCRIPT").arg("FLUSH").query(&mut server.conn()).unwrap();
    limiter.peek(&minute("k", 3)).await.unwrap();
    let read_only = if support::server_version() >= (7, 0) {
        ["EVALSHA_RO", "EVAL_RO"]
    } else {
        ["EVALSHA", "EVAL"]
    };
    assert_eq!(transport.take(), read_only);
    assert_eq!(
        limiter
            .refund(&Refund::new("k", refused.stamp.unwrap_or(0)))
            .await
            .unwrap(),
        0
    );
    assert_eq!(
        transport.take(),
        ["EVALSHA", "EVAL"],
        "the refund script, not cached yet"
    );
}

#[tokio::test]
async fn a_module_loaded_later_is_picked_up_after_the_probe_interval() {
    let server = Server::without_module();
    let transport = Recording::new(&server).await;
    let limiter = Limiter::builder(transport.clone())
        .probe_interval(Duration::from_millis(400))
        .build()
        .unwrap();
    assert_eq!(limiter.allow(&minute("p", 10)).await.unwrap().via, Via::Script);
    let _: () = redis::cmd("MODULE")
        .arg("LOAD")
        .arg(support::module_path().display().to_string())
        .query(&mut server.conn())
        .unwrap();
    transport.take();
    // Within the interval the script still answers, on the same window.
    let d = limiter.allow(&minute("p", 10)).await.unwrap();
    assert_eq!((d.via, d.remaining), (Via::Script, 8));
    assert_eq!(transport.take(), ["EVALSHA"]);
    tokio::time::sleep(Duration::from_millis(450)).await;
    let d = limiter.allow(&minute("p", 10)).await.unwrap();
    assert_eq!(
        (d.via, d.remaining),
        (Via::Command, 7),
        "the probe found the module, on the script's window"
    );
    assert_eq!(transport.take(), ["XCLOAK.ALLOW"]);
    let d = limiter.allow(&minute("p", 10)).await.unwrap();
    assert_eq!(d.via, Via::Command);
    assert_eq!(transport.take(), ["XCLOAK.ALLOW"], "the node stays on the command");
    assert_eq!(server.entries("p"), 4);
}

#[tokio::test]
async fn a_probe_that_finds_no_module_costs_one_round_trip_per_interval() {
    let server = Server::without_module();
    let transport = Recording::new(&server).await;
    let limiter = Limiter::builder(transport.clone())
        .probe_interval(Duration::from_millis(200))
        .build()
        .unwrap();
    limiter.allow(&minute("q", 10)).await.unwrap();
    transport.take();
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert_eq!(limiter.allow(&minute("q", 10)).await.unwrap().via, Via::Script);
    assert_eq!(transport.take(), ["XCLOAK.ALLOW", "EVALSHA"]);
    assert_eq!(limiter.allow(&minute("q", 10)).await.unwrap().via, Via::Script);
    assert_eq!(transport.take(), ["EVALSHA"]);
    assert_eq!(server.entries("q"), 3);
}

#[tokio::test]
async fn never_raises_the_unknown_command_and_always_skips_it() {
    let server = Server::without_module();
    let never = Limiter::builder(server.client().get_multiplexed_async_connection().await.unwrap())
        .fallback(Fallback::Never)
        .on_error(ErrorPolicy::Allow)
        .build()
        .unwrap();
    let error = never.allow(&minute("n", 3)).await.unwrap_err();
    assert!(
        matches!(&error, Error::Server { code, message } if code == "ERR" && message.starts_with("ERR unknown command 'XCLOAK.ALLOW'")),
        "{error:?}"
    );
    let transport = Recording::new(&server).await;
    let always = Limiter::builder(transport.clone())
        .fallback(Fallback::Always)
        .build()
        .unwrap();
    assert_eq!(always.allow(&minute("n", 3)).await.unwrap().via, Via::Script);
    assert_eq!(transport.take(), ["EVALSHA", "EVAL"]);
    let with_module = Server::start();
    let transport = Recording::new(&with_module).await;
    let always = Limiter::builder(transport.clone())
        .fallback(Fallback::Always)
        .build()
        .unwrap();
    assert_eq!(
        always.allow(&minute("n", 3)).await.unwrap().via,
        Via::Script,
        "Always uses the script even where the module is"
    );
    assert_eq!(with_module.calls("xcloak.allow"), 0);
}

#[tokio::test]
async fn the_script_refuses_a_compact_window_and_the_policy_never_swallows_it() {
    let server = Server::start_with(true, &["STORAGE", "compact"]);
    let mut conn = server.conn();
    let _: i64 = redis::cmd("XCLOAK.ALLOW")
        .arg("c")
        .arg(60000)
        .arg(3)
        .query(&mut conn)
        .unwrap();
    assert_eq!(
        redis::cmd("TYPE").arg("c").query::<String>(&mut conn).unwrap(),
        "xcloaklog"
    );
    let script = Limiter::builder(server.client().get_multiplexed_async_connection().await.unwrap())
        .fallback(Fallback::Always)
        .on_error(ErrorPolicy::Allow)
        .build()
        .unwrap();
    let error = script.allow(&minute("c", 3)).await.unwrap_err();
    assert_eq!(
        error,
        Error::Server {
            code: "WRONGTYPE".into(),
            message: "WRONGTYPE Operation against a key holding the wrong kind of value".into()
        }
    );
    // The module reads it.
    let command = Limiter::new(server.client().get_multiplexed_async_connection().await.unwrap());
    assert_eq!(command.allow(&minute("c", 3)).await.unwrap().remaining, 1);
}

#[test]
fn the_blocking_limiter_falls_back_and_probes_the_same_way() {
    let server = Server::without_module();
    let limiter = xcloak_client::blocking::Limiter::builder(server.client())
        .probe_interval(Duration::from_millis(300))
        .build_blocking()
        .unwrap();
    assert_eq!(limiter.allow(&minute("b", 5)).unwrap().via, Via::Script);
    assert_eq!(limiter.allow(&minute("b", 5)).unwrap().via, Via::Script);
    let _: () = redis::cmd("MODULE")
        .arg("LOAD")
        .arg(support::module_path().display().to_string())
        .query(&mut server.conn())
        .unwrap();
    std::thread::sleep(Duration::from_millis(350));
    let d = limiter.allow(&minute("b", 5)).unwrap();
    assert_eq!((d.via, d.remaining), (Via::Command, 2));
    assert_eq!(server.calls("xcloak.allow"), 1);
    assert_eq!(server.entries("b"), 3);
}
