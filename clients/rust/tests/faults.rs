//! Outages and timeouts against real servers (docs/clients.md, "Errors"):
//! a paused server (SIGSTOP: the socket stays open, nothing answers) and a
//! stopped one go to the error policy within the limiter's timeout; a bad
//! argument is raised under every policy; and a call that timed out is never
//! sent again, by this crate or by the `redis` crate under it: after the
//! server resumes, `cmdstat_xcloak.allow` counts each timed-out ALLOW (and
//! REFUND) exactly once. Refunds and resets raise outages under every policy;
//! `ERR max number of clients reached` is an outage; a dropped call is not
//! sent again. Durable mode: WAIT after the reply of an admission (and of a
//! refund) on the same connection, none after a rejection or a peek
//! (`cmdstat_wait`); every allow carries STAMP, shown only if asked; a replica
//! that does not acknowledge sends the admission to the policy, and `deny`
//! refunds it.
mod support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::Cmd;
use support::{Replicated, Server};
use xcloak_client::{
    blocking, Cause, Error, ErrorPolicy, Limiter, Refund, Request, Standalone, Style, Transport, Unavailable, Via,
};

fn minute(key: &str, limit: u64) -> Request {
    Request::new(key, Duration::from_secs(60), limit)
}

fn is_timeout(error: &Error) -> bool {
    matches!(
        error,
        Error::Unavailable(Unavailable {
            cause: Cause::Timeout,
            ..
        })
    )
}

/// Pauses `server`, sends one ALLOW and one REFUND through `limiter` (each
/// must time out), resumes it, and checks that the server ran each once.
async fn paused_calls_run_once<T: Transport>(server: &Server, limiter: &Limiter<T>, what: &str) {
    let warm = limiter.allow(&minute("once", 100).stamp()).await.unwrap();
    let stamp = warm.stamp.unwrap();
    let before = (server.calls("xcloak.allow"), server.calls("xcloak.refund"));
    server.pause();
    let started = Instant::now();
    let error = limiter.allow(&minute("once", 100)).await.unwrap_err();
    assert!(is_timeout(&error) || error.is_unavailable(), "{what}: {error:?}");
    let refund = limiter.refund(&Refund::new("once", stamp)).await.unwrap_err();
    assert!(refund.is_unavailable(), "{what}: {refund:?}");
    let waited = started.elapsed();
    server.resume();
    // Time for anything queued or retried to arrive and run.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let after = (server.calls("xcloak.allow"), server.calls("xcloak.refund"));
    assert_eq!(
        (after.0 - before.0, after.1 - before.1),
        (1, 1),
        "{what}: each timed-out call ran once (waited {waited:?})"
    );
    // Each call was answered by the policy within about the timeout, not by a hang.
    assert!(waited < Duration::from_secs(5), "{what}: {waited:?}");
    // And the limiter goes on (the connection, or a new one).
    let next = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match limiter.allow(&minute("once", 100)).await {
                Ok(d) => return d,
                Err(e) if e.is_unavailable() => tokio::time::sleep(Duration::from_millis(100)).await,
                Err(e) => panic!("{what}: {e}"),
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{what}: no answer after the resume"));
    assert!(next.allowed, "{what}");
    println!("{what}: ALLOW and REFUND timed out after {waited:?} together, each ran once on the resumed server");
}

#[tokio::test]
async fn a_timed_out_call_is_never_sent_again_multiplexed() {
    let server = Server::start();
    let conn: MultiplexedConnection = server.client().get_multiplexed_async_connection().await.unwrap();
    let limiter = Limiter::builder(conn)
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    paused_calls_run_once(&server, &limiter, "MultiplexedConnection").await;
}

#[tokio::test]
async fn a_timed_out_call_is_never_sent_again_connection_manager() {
    // The manager's own defaults: its response timeout (500 ms) is longer than the limiter's.
    let server = Server::start();
    let manager = ConnectionManager::new(server.client()).await.unwrap();
    let limiter = Limiter::builder(manager)
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    paused_calls_run_once(&server, &limiter, "ConnectionManager (default config)").await;

    // Its response timeout first (100 ms, under the limiter's 1 s): the manager
    // reports the timeout, reconnects in the background, and still sends nothing again.
    let server = Server::start();
    let config = ConnectionManagerConfig::new()
        .set_response_timeout(Some(Duration::from_millis(100)))
        .set_number_of_retries(10);
    let manager = ConnectionManager::new_with_config(server.client(), config)
        .await
        .unwrap();
    let limiter = Limiter::new(manager);
    paused_calls_run_once(
        &server,
        &limiter,
        "ConnectionManager (100 ms response timeout, 10 reconnect retries)",
    )
    .await;
}

#[test]
fn a_timed_out_call_is_never_sent_again_blocking() {
    let server = Server::start();
    let limiter = blocking::Limiter::builder(server.client())
        .timeout(Duration::from_millis(300))
        .build_blocking()
        .unwrap();
    let stamp = limiter.allow(&minute("once", 100).stamp()).unwrap().stamp.unwrap();
    server.pause();
    assert!(is_timeout(&limiter.allow(&minute("once", 100)).unwrap_err()));
    assert!(limiter
        .refund(&Refund::new("once", stamp))
        .unwrap_err()
        .is_unavailable());
    server.resume();
    std::thread::sleep(Duration::from_millis(1000));
    // Each ran once. The REFUND went on a new connection: the pool had
    // dropped the one whose ALLOW timed out (this client sends no handshake
    // command, so the new connection is up while the server is paused).
    assert_eq!((server.calls("xcloak.allow"), server.calls("xcloak.refund")), (2, 1));
    // The timed-out connections were dropped: the next call is answered in step.
    let d = limiter.allow(&minute("fresh", 100)).unwrap();
    assert_eq!(
        (d.allowed, d.remaining),
        (true, 99),
        "a fresh connection, not a late reply of `once`"
    );
}

#[tokio::test]
async fn a_paused_server_goes_to_the_policy() {
    let server = Server::start();
    let manager = ConnectionManager::new(server.client()).await.unwrap();
    let raise = Limiter::builder(manager)
        .timeout(Duration::from_millis(250))
        .build()
        .unwrap();
    let (open, closed) = (
        raise.with_on_error(ErrorPolicy::Allow),
        raise.with_on_error(ErrorPolicy::Deny),
    );
    raise.allow(&minute("p", 5)).await.unwrap();
    server.pause();
    let request = minute("p", 5).tier(Duration::from_secs(3600), 50);
    let error = raise.allow(&request).await.unwrap_err();
    assert!(is_timeout(&error), "{error:?}");
    for (limiter, allowed) in [(&open, true), (&closed, false)] {
        let d = limiter.allow(&request).await.unwrap();
        assert_eq!(
            (d.allowed, d.via, d.limit, d.window, d.remaining, d.tier),
            (allowed, Via::Error, 5, Duration::from_secs(60), 0, 0)
        );
        assert!(d.tiers.is_empty() && d.stamp.is_none());
        assert!(
            matches!(
                &d.error,
                Some(Unavailable {
                    cause: Cause::Timeout,
                    ..
                })
            ),
            "{:?}",
            d.error
        );
        assert!(d.headers(Style::Both).is_empty(), "a policy decision has no headers");
        let peek = limiter.peek(&request).await.unwrap();
        assert_eq!((peek.allowed, peek.via), (allowed, Via::Error));
        // A refund and a reset have no Decision to fail open or closed: raised.
        let refund = limiter.refund(&Refund::new("p", 1)).await.unwrap_err();
        assert!(
            matches!(
                &refund,
                Error::Unavailable(Unavailable {
                    cause: Cause::Timeout,
                    ..
                })
            ),
            "{refund:?}"
        );
        let reset = limiter.reset("p").await.unwrap_err();
        assert!(
            matches!(
                &reset,
                Error::Unavailable(Unavailable {
                    cause: Cause::Timeout,
                    ..
                })
            ),
            "{reset:?}"
        );
    }
    server.resume();
}

#[tokio::test]
async fn a_stopped_server_goes_to_the_policy_and_a_restart_is_picked_up() {
    let mut server = Server::start();
    let manager = ConnectionManager::new(server.client()).await.unwrap();
    let raise = Limiter::builder(manager)
        .timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    let open = raise.with_on_error(ErrorPolicy::Allow);
    assert!(raise.allow(&minute("s", 5)).await.unwrap().allowed);
    server.stop();
    let error = raise.allow(&minute("s", 5)).await.unwrap_err();
    assert!(matches!(&error, Error::Unavailable(_)), "{error:?}");
    let d = open.allow(&minute("s", 5)).await.unwrap();
    assert_eq!((d.allowed, d.via), (true, Via::Error));
    server.restart();
    let back = tokio::time::timeout(Duration::from_secs(15), async {
        loop {
            if let Ok(d) = raise.allow(&minute("s", 5)).await {
                return d;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("the manager reconnects");
    assert_eq!(
        (back.via, back.remaining),
        (Via::Command, 4),
        "a fresh server: its first admission"
    );
}

#[tokio::test]
async fn a_bad_argument_is_raised_under_every_policy() {
    let server = Server::start();
    let conn = server.client().get_multiplexed_async_connection().await.unwrap();
    for policy in [ErrorPolicy::Raise, ErrorPolicy::Allow, ErrorPolicy::Deny] {
        let limiter = Limiter::builder(conn.clone()).on_error(policy).build().unwrap();
        let error = limiter.allow(&minute("bad", 1_000_001)).await.unwrap_err();
        assert_eq!(
            error,
            Error::Server {
                code: "ERR".into(),
                message: "ERR limit must be an integer from 0 to 1000000".into()
            },
            "{policy:?}"
        );
        let error = limiter.peek(&minute("bad", 3).cost(0)).await.unwrap_err();
        assert_eq!(
            error.to_string(),
            "ERR COST must be an integer from 1 to 1000000",
            "{policy:?}"
        );
        // Refused before anything is sent: a window of a fraction of a millisecond.
        let error = limiter
            .allow(&Request::new("bad", Duration::from_micros(2500), 3))
            .await
            .unwrap_err();
        assert!(
            matches!(&error, Error::Argument { name, .. } if name == "window"),
            "{error:?}"
        );
    }
    let blocking = blocking::Limiter::builder(server.client())
        .on_error(ErrorPolicy::Allow)
        .build_blocking()
        .unwrap();
    assert!(matches!(
        blocking.allow(&minute("bad", 1_000_001)),
        Err(Error::Server { .. })
    ));
    assert_eq!(
        server.calls("xcloak.allow"),
        4,
        "the window errors were sent; the fractional one was not"
    );
}

#[tokio::test]
async fn a_server_at_maxmemory_is_an_outage_not_a_refusal() {
    let server = Server::start();
    let conn = server.client().get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg("1")
        .query(&mut server.conn())
        .unwrap();
    let limiter = Limiter::new(conn);
    let error = limiter.allow(&minute("oom", 3)).await.unwrap_err();
    assert!(
        matches!(&error, Error::Unavailable(Unavailable { cause: Cause::Server { code }, .. }) if code == "OOM"),
        "{error:?}"
    );
    let d = limiter
        .with_on_error(ErrorPolicy::Allow)
        .allow(&minute("oom", 3))
        .await
        .unwrap();
    assert_eq!((d.allowed, d.via), (true, Via::Error));
    // A peek writes nothing and is still answered.
    assert!(limiter.peek(&minute("oom", 3)).await.unwrap().allowed);
}

/// A transport that records each send (one pipeline) as a list of commands.
#[derive(Clone)]
struct Sends {
    conn: MultiplexedConnection,
    log: Arc<Mutex<Vec<Vec<String>>>>,
}

impl Transport for Sends {
    fn send<'a>(
        &'a self,
        key: &'a [u8],
        read: bool,
        cmds: &'a [Cmd],
    ) -> impl std::future::Future<Output = redis::RedisResult<Vec<redis::Value>>> + Send + 'a {
        let text = |cmd: &Cmd| {
            cmd.args_iter()
                .map(|a| {
                    if let redis::Arg::Simple(b) = a {
                        String::from_utf8_lossy(b).into_owned()
                    } else {
                        String::new()
                    }
                })
                .collect::<Vec<_>>()
                .join(" ")
        };
        self.log.lock().unwrap().push(cmds.iter().map(text).collect());
        self.conn.send(key, read, cmds)
    }
}

impl Sends {
    fn take(&self) -> Vec<Vec<String>> {
        std::mem::take(&mut *self.log.lock().unwrap())
    }
}

fn sends(lines: &[&[&str]]) -> Vec<Vec<String>> {
    lines
        .iter()
        .map(|send| send.iter().map(|c| c.to_string()).collect())
        .collect()
}

#[tokio::test]
async fn durable_mode_waits_after_an_admission_only_and_a_deny_refunds_what_it_did_not_get() {
    let pair = Replicated::start();
    let conn = pair.primary.client().get_multiplexed_async_connection().await.unwrap();
    let recorded = Sends {
        conn,
        log: Arc::default(),
    };
    let durable = Limiter::builder(recorded.clone())
        .durable(1, Duration::from_millis(300))
        .timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    // An admission carries STAMP, shown only if asked; WAIT follows its reply, in a send of its own.
    let d = durable.allow(&minute("d", 3)).await.unwrap();
    assert_eq!(
        (d.allowed, d.via, d.stamp),
        (true, Via::Command, None),
        "STAMP sent, not shown"
    );
    assert_eq!(
        recorded.take(),
        sends(&[&["XCLOAK.ALLOW d 60000 3 DETAILS STAMP"], &["WAIT 1 300"]])
    );
    assert_eq!(pair.primary.calls("wait"), 1, "WAIT after the admission");
    let asked = durable.allow(&minute("d", 3).stamp()).await.unwrap();
    assert!(asked.allowed && asked.stamp.is_some(), "asked, it is shown: {asked:?}");
    // A refund's reply is followed by WAIT too.
    assert_eq!(
        durable.refund(&Refund::new("d", asked.stamp.unwrap())).await.unwrap(),
        1
    );
    assert_eq!(
        recorded.take()[2..],
        sends(&[&[&format!("XCLOAK.REFUND d {}", asked.stamp.unwrap())], &["WAIT 1 300"]])
    );
    assert_eq!(pair.primary.calls("wait"), 3);

    // The replica stops acknowledging: an admission goes to the policy.
    pair.replica.pause();
    let error = durable.allow(&minute("d", 3)).await.unwrap_err();
    assert!(
        matches!(
            &error,
            Error::Unavailable(Unavailable {
                cause: Cause::NotReplicated {
                    acknowledged: 0,
                    wanted: 1
                },
                ..
            })
        ),
        "{error:?}"
    );
    assert_eq!(pair.primary.entries("d"), 2, "under raise the admission stands");
    let open = durable
        .with_on_error(ErrorPolicy::Allow)
        .allow(&minute("d", 3))
        .await
        .unwrap();
    assert_eq!((open.allowed, open.via, open.stamp), (true, Via::Error, None));
    assert!(
        matches!(
            &open.error,
            Some(Unavailable {
                cause: Cause::NotReplicated { .. },
                ..
            })
        ),
        "{:?}",
        open.error
    );
    assert_eq!(pair.primary.entries("d"), 3);
    // Deny refunds it by the stamp the caller did not ask for.
    let closed = durable
        .with_on_error(ErrorPolicy::Deny)
        .allow(&minute("d2", 3))
        .await
        .unwrap();
    assert_eq!((closed.allowed, closed.via), (false, Via::Error));
    assert_eq!(
        pair.primary.entries("d2"),
        0,
        "deny refunded the admission it turned away"
    );
    recorded.take();
    // A rejection and a peek wrote nothing: no WAIT, so no wait for the paused replica.
    let waits = pair.primary.calls("wait");
    let started = Instant::now();
    let rejected = durable.allow(&minute("d", 3)).await.unwrap();
    let peek = durable.peek(&minute("d", 3)).await.unwrap();
    let took = started.elapsed();
    assert_eq!(
        (rejected.allowed, rejected.via, peek.allowed),
        (false, Via::Command, false)
    );
    assert_eq!(pair.primary.calls("wait"), waits, "a rejection and a peek send no WAIT");
    assert_eq!(
        recorded.take(),
        sends(&[&["XCLOAK.ALLOW d 60000 3 DETAILS STAMP"], &["XCLOAK.PEEK d 60000 3"]])
    );
    println!("durable, replica paused: a rejection and a peek answered in {took:?} (WAIT timeout 300 ms)");

    // The blocking limiter: the same, on one connection of its pool.
    let blocking = blocking::Limiter::builder(pair.primary.client())
        .durable(1, Duration::from_millis(300))
        .build_blocking()
        .unwrap();
    let waits = pair.primary.calls("wait");
    assert!(!blocking.allow(&minute("d", 3)).unwrap().allowed);
    assert_eq!(pair.primary.calls("wait"), waits, "blocking: a rejection sends no WAIT");
    let closed = blocking
        .with_on_error(ErrorPolicy::Deny)
        .allow(&minute("b", 3))
        .unwrap();
    assert_eq!(
        (closed.allowed, closed.via, pair.primary.entries("b")),
        (false, Via::Error, 0),
        "blocking: deny refunded it"
    );
    assert_eq!(pair.primary.calls("wait"), waits + 1);
    pair.replica.resume();
    let d = blocking.allow(&minute("b", 3)).unwrap();
    assert_eq!(
        (d.allowed, d.via, d.stamp),
        (true, Via::Command, None),
        "blocking: replicated"
    );
    assert!(support::eventually(Duration::from_secs(10), || pair
        .replica
        .entries("d")
        == 3
        && pair.replica.entries("b") == 1));
}

/// A connection to `server` opened when it is at `maxclients` (its first
/// reply is `ERR max number of clients reached`).
#[tokio::test]
async fn a_server_at_max_clients_is_an_outage_not_a_refusal() {
    let server = Server::start_with(true, &["--maxclients", "4"]);
    let mut held: Vec<redis::Connection> = Vec::new();
    while held.len() < 4 {
        let Ok(mut conn) = server.client().get_connection() else {
            break;
        };
        if redis::cmd("PING").query::<String>(&mut conn).is_err() {
            break;
        }
        held.push(conn);
    }
    assert_eq!(held.len(), 4, "the server holds 4 clients");
    let full = blocking::Limiter::builder(server.client())
        .timeout(Duration::from_millis(500))
        .build_blocking()
        .unwrap();
    let error = full.allow(&minute("full", 3)).unwrap_err();
    assert!(error.is_unavailable(), "{error:?}");
    println!("at maxclients: {error}");
    for (policy, allowed) in [(ErrorPolicy::Allow, true), (ErrorPolicy::Deny, false)] {
        let d = full.with_on_error(policy).allow(&minute("full", 3)).unwrap();
        assert_eq!((d.allowed, d.via), (allowed, Via::Error), "{policy:?}");
    }
    drop(held);
    // The server frees the held clients once it reads their close; until
    // then a new connection is refused as well, so the count is read when
    // one is accepted.
    let mut entries = None;
    let accepted = support::eventually(Duration::from_secs(10), || {
        let read = server
            .client()
            .get_connection()
            .and_then(|mut conn| redis::cmd("ZCARD").arg("full").query::<u64>(&mut conn));
        entries = read.ok();
        entries.is_some()
    });
    assert!(
        accepted,
        "the server accepts clients again once the held ones are closed"
    );
    assert_eq!(entries, Some(0), "no call at maxclients recorded anything");
}

#[tokio::test]
async fn a_dropped_acquire_records_nothing_and_stops() {
    let server = Server::start();
    let conn = server.client().get_multiplexed_async_connection().await.unwrap();
    let limiter = Limiter::new(conn);
    let full = Request::new("acq", Duration::from_secs(2), 1);
    assert!(limiter.allow(&full).await.unwrap().allowed);
    // Waits about 2 s for the window; cancelled after 300 ms.
    let cancelled = tokio::time::timeout(
        Duration::from_millis(300),
        limiter.acquire(&full, Duration::from_secs(10)),
    )
    .await;
    assert!(cancelled.is_err(), "still waiting when dropped");
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(
        server.calls("xcloak.allow"),
        2,
        "one rejected ALLOW, nothing after the drop"
    );
    assert_eq!(server.entries("acq"), 1, "a cancelled wait recorded nothing");
    // Not cancelled, it waits the server's figure and is admitted.
    let d = limiter.acquire(&full, Duration::from_secs(10)).await.unwrap();
    assert!(d.allowed);
}

/// The caller drops an `allow` already sent (its own timeout, a client gone):
/// nothing is returned, and the server may still admit it (recorded but
/// unreported, as with a timeout). It is not sent again, and the connection
/// stays in step: the late reply answers no later call.
#[tokio::test]
async fn a_dropped_call_may_be_recorded_but_is_never_sent_again() {
    let server = Server::start();
    let conn = server.client().get_multiplexed_async_connection().await.unwrap();
    let limiter = Limiter::builder(conn)
        .timeout(Duration::from_secs(5))
        .on_error(ErrorPolicy::Deny)
        .build()
        .unwrap();
    assert_eq!(limiter.allow(&minute("drop", 10)).await.unwrap().remaining, 9);
    server.pause();
    let dropped = tokio::time::timeout(Duration::from_millis(200), limiter.allow(&minute("drop", 10))).await;
    assert!(
        dropped.is_err(),
        "the caller's cancellation returns nothing: {dropped:?}"
    );
    server.resume();
    let next = limiter.allow(&minute("drop", 10)).await.unwrap();
    assert_eq!(
        (next.via, next.remaining),
        (Via::Command, 7),
        "the dropped call was admitted; this reply is this call's"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        (server.calls("xcloak.allow"), server.entries("drop")),
        (3, 3),
        "each call ran once"
    );
}

/// Loses the reply to one ALLOW through `proxy` (the server ran it) and
/// checks that `limiter` answered by its policy and sent nothing again.
async fn lost_reply_runs_once<T: Transport>(server: &Server, proxy: &support::Proxy, limiter: Limiter<T>, what: &str) {
    let limiter = limiter.with_on_error(ErrorPolicy::Deny);
    let key = format!("lost:{what}");
    let before = server.calls("xcloak.allow");
    proxy.lose_next_allow_reply();
    let d = limiter.allow(&minute(&key, 10)).await.unwrap();
    assert_eq!(
        (d.allowed, d.via),
        (false, Via::Error),
        "{what}: deny answered the lost reply"
    );
    assert!(
        matches!(
            &d.error,
            Some(Unavailable {
                cause: Cause::Connection,
                ..
            })
        ),
        "{what}: {:?}",
        d.error
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        server.calls("xcloak.allow") - before,
        1,
        "{what}: applied once, never sent again"
    );
    assert_eq!(server.entries(&key), 1, "{what}");
}

#[tokio::test]
async fn a_lost_reply_is_not_answered_by_sending_the_allow_again() {
    // The server runs the ALLOW; the reply and the connection are lost.
    let server = Server::start();
    let proxy = support::Proxy::start(server.port).await;
    let client = redis::Client::open(format!("redis://127.0.0.1:{}/", proxy.port)).unwrap();
    let manager = ConnectionManager::new(client.clone()).await.unwrap();
    lost_reply_runs_once(&server, &proxy, Limiter::new(manager.clone()), "ConnectionManager").await;
    // The manager reconnects for the next call.
    assert!(Limiter::new(manager).allow(&minute("after", 10)).await.unwrap().allowed);
    let multiplexed = client.get_multiplexed_async_connection().await.unwrap();
    lost_reply_runs_once(
        &server,
        &proxy,
        Limiter::new(Standalone(multiplexed)),
        "Standalone(MultiplexedConnection)",
    )
    .await;
}
