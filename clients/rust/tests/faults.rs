//! Outages and timeouts against real servers (docs/clients.md, "Errors"):
//! a paused server (SIGSTOP: the socket stays open, nothing answers) and a
//! stopped one go to the error policy within the limiter's timeout; a bad
//! argument is raised under every policy; and a call that timed out is never
//! sent again, by this crate or by the `redis` crate under it: after the
//! server resumes, `cmdstat_xcloak.allow` counts each timed-out ALLOW (and
//! REFUND) exactly once. Durable mode: WAIT on the same connection, a replica
//! that does not acknowledge sends the admission to the policy, and `deny`
//! refunds it.
mod support;

use std::time::{Duration, Instant};

use redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use support::{Replicated, Server};
use xcloak_client::{blocking, Cause, Error, Limiter, Policy, Request, Standalone, Style, Transport, Unavailable, Via};

fn minute(key: &str, limit: u64) -> Request {
    Request::new(key, Duration::from_secs(60), limit)
}

fn is_timeout(error: &Error) -> bool {
    matches!(error, Error::Unavailable(Unavailable { cause: Cause::Timeout, .. }))
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
    let refund = limiter.refund("once", stamp, 1).await.unwrap_err();
    assert!(refund.is_unavailable(), "{what}: {refund:?}");
    let waited = started.elapsed();
    server.resume();
    // Time for anything queued or retried to arrive and run.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let after = (server.calls("xcloak.allow"), server.calls("xcloak.refund"));
    assert_eq!((after.0 - before.0, after.1 - before.1), (1, 1), "{what}: each timed-out call ran once (waited {waited:?})");
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
    let limiter = Limiter::builder(conn).timeout(Duration::from_millis(300)).build();
    paused_calls_run_once(&server, &limiter, "MultiplexedConnection").await;
}

#[tokio::test]
async fn a_timed_out_call_is_never_sent_again_connection_manager() {
    // The manager's own defaults: its response timeout (500 ms) is longer than the limiter's.
    let server = Server::start();
    let manager = ConnectionManager::new(server.client()).await.unwrap();
    let limiter = Limiter::builder(manager).timeout(Duration::from_millis(300)).build();
    paused_calls_run_once(&server, &limiter, "ConnectionManager (default config)").await;

    // Its response timeout first (100 ms, under the limiter's 1 s): the manager
    // reports the timeout, reconnects in the background, and still sends nothing again.
    let server = Server::start();
    let config = ConnectionManagerConfig::new().set_response_timeout(Some(Duration::from_millis(100))).set_number_of_retries(10);
    let manager = ConnectionManager::new_with_config(server.client(), config).await.unwrap();
    let limiter = Limiter::new(manager);
    paused_calls_run_once(&server, &limiter, "ConnectionManager (100 ms response timeout, 10 reconnect retries)").await;
}

#[test]
fn a_timed_out_call_is_never_sent_again_blocking() {
    let server = Server::start();
    let limiter = blocking::Limiter::builder(server.client()).timeout(Duration::from_millis(300)).build_blocking();
    let stamp = limiter.allow(&minute("once", 100).stamp()).unwrap().stamp.unwrap();
    server.pause();
    assert!(is_timeout(&limiter.allow(&minute("once", 100)).unwrap_err()));
    assert!(limiter.refund("once", stamp, 1).unwrap_err().is_unavailable());
    server.resume();
    std::thread::sleep(Duration::from_millis(1000));
    // Each ran once. The REFUND went on a new connection: the pool had
    // dropped the one whose ALLOW timed out (this client sends no handshake
    // command, so the new connection is up while the server is paused).
    assert_eq!((server.calls("xcloak.allow"), server.calls("xcloak.refund")), (2, 1));
    // The timed-out connections were dropped: the next call is answered in step.
    let d = limiter.allow(&minute("fresh", 100)).unwrap();
    assert_eq!((d.allowed, d.remaining), (true, 99), "a fresh connection, not a late reply of `once`");
}

#[tokio::test]
async fn a_paused_server_goes_to_the_policy() {
    let server = Server::start();
    let manager = ConnectionManager::new(server.client()).await.unwrap();
    let raise = Limiter::builder(manager).timeout(Duration::from_millis(250)).build();
    let (open, closed) = (raise.with_policy(Policy::Allow), raise.with_policy(Policy::Deny));
    raise.allow(&minute("p", 5)).await.unwrap();
    server.pause();
    let request = minute("p", 5).tier(Duration::from_secs(3600), 50);
    let error = raise.allow(&request).await.unwrap_err();
    assert!(is_timeout(&error), "{error:?}");
    for (limiter, allowed) in [(&open, true), (&closed, false)] {
        let d = limiter.allow(&request).await.unwrap();
        assert_eq!((d.allowed, d.via, d.limit, d.window, d.remaining, d.tier), (allowed, Via::Error, 5, Duration::from_secs(60), 0, 0));
        assert!(d.tiers.is_empty() && d.stamp.is_none());
        assert!(matches!(&d.error, Some(Unavailable { cause: Cause::Timeout, .. })), "{:?}", d.error);
        assert!(d.headers(Style::Both).is_empty(), "a policy decision has no headers");
        let peek = limiter.peek(&request).await.unwrap();
        assert_eq!((peek.allowed, peek.via), (allowed, Via::Error));
    }
    server.resume();
}

#[tokio::test]
async fn a_stopped_server_goes_to_the_policy_and_a_restart_is_picked_up() {
    let mut server = Server::start();
    let manager = ConnectionManager::new(server.client()).await.unwrap();
    let raise = Limiter::builder(manager).timeout(Duration::from_millis(500)).build();
    let open = raise.with_policy(Policy::Allow);
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
    assert_eq!((back.via, back.remaining), (Via::Command, 4), "a fresh server: its first admission");
}

#[tokio::test]
async fn a_bad_argument_is_raised_under_every_policy() {
    let server = Server::start();
    let conn = server.client().get_multiplexed_async_connection().await.unwrap();
    for policy in [Policy::Raise, Policy::Allow, Policy::Deny] {
        let limiter = Limiter::builder(conn.clone()).policy(policy).build();
        let error = limiter.allow(&minute("bad", 1_000_001)).await.unwrap_err();
        assert_eq!(error, Error::Server { code: "ERR".into(), message: "ERR limit must be an integer from 0 to 1000000".into() }, "{policy:?}");
        let error = limiter.peek(&minute("bad", 3).cost(0)).await.unwrap_err();
        assert_eq!(error.to_string(), "ERR COST must be an integer from 1 to 1000000", "{policy:?}");
        // Refused before anything is sent: a window of a fraction of a millisecond.
        let error = limiter.allow(&Request::new("bad", Duration::from_micros(2500), 3)).await.unwrap_err();
        assert!(matches!(&error, Error::Argument { name, .. } if name == "window"), "{error:?}");
    }
    let blocking = blocking::Limiter::builder(server.client()).policy(Policy::Allow).build_blocking();
    assert!(matches!(blocking.allow(&minute("bad", 1_000_001)), Err(Error::Server { .. })));
    assert_eq!(server.calls("xcloak.allow"), 4, "the window errors were sent; the fractional one was not");
}

#[tokio::test]
async fn a_server_at_maxmemory_is_an_outage_not_a_refusal() {
    let server = Server::start();
    let conn = server.client().get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::cmd("CONFIG").arg("SET").arg("maxmemory").arg("1").query(&mut server.conn()).unwrap();
    let limiter = Limiter::new(conn);
    let error = limiter.allow(&minute("oom", 3)).await.unwrap_err();
    assert!(matches!(&error, Error::Unavailable(Unavailable { cause: Cause::Server { code }, .. }) if code == "OOM"), "{error:?}");
    let d = limiter.with_policy(Policy::Allow).allow(&minute("oom", 3)).await.unwrap();
    assert_eq!((d.allowed, d.via), (true, Via::Error));
    // A peek writes nothing and is still answered.
    assert!(limiter.peek(&minute("oom", 3)).await.unwrap().allowed);
}

#[tokio::test]
async fn durable_mode_waits_for_the_replica_and_a_deny_refunds_what_it_did_not_get() {
    let pair = Replicated::start();
    let conn = pair.primary.client().get_multiplexed_async_connection().await.unwrap();
    let durable = Limiter::builder(conn).durable(1, Duration::from_millis(300)).timeout(Duration::from_secs(1)).build();
    let d = durable.allow(&minute("d", 3)).await.unwrap();
    assert_eq!((d.allowed, d.via), (true, Via::Command));
    assert_eq!(pair.primary.calls("wait"), 1, "WAIT pipelined after the admission");
    // The replica stops acknowledging: the admission goes to the policy.
    pair.replica.pause();
    let error = durable.allow(&minute("d", 3)).await.unwrap_err();
    assert!(matches!(&error, Error::Unavailable(Unavailable { cause: Cause::NotReplicated { acknowledged: 0, wanted: 1 }, .. })), "{error:?}");
    assert_eq!(pair.primary.entries("d"), 2, "under raise the admission stands");
    let open = durable.with_policy(Policy::Allow).allow(&minute("d", 3)).await.unwrap();
    assert_eq!((open.allowed, open.via), (true, Via::Error));
    assert_eq!(pair.primary.entries("d"), 3);
    let closed = durable.with_policy(Policy::Deny).allow(&minute("d2", 3)).await.unwrap();
    assert_eq!((closed.allowed, closed.via), (false, Via::Error));
    assert_eq!(pair.primary.entries("d2"), 0, "deny refunded the admission it turned away");
    // A rejection's WAIT figure changes nothing: it wrote nothing.
    let rejected = durable.allow(&minute("d", 3)).await.unwrap();
    assert_eq!((rejected.allowed, rejected.via), (false, Via::Command));
    pair.replica.resume();
    assert!(support::eventually(Duration::from_secs(10), || pair.replica.entries("d") == 3));
}

#[tokio::test]
async fn a_dropped_acquire_records_nothing_and_stops() {
    let server = Server::start();
    let conn = server.client().get_multiplexed_async_connection().await.unwrap();
    let limiter = Limiter::new(conn);
    let full = Request::new("acq", Duration::from_secs(2), 1);
    assert!(limiter.allow(&full).await.unwrap().allowed);
    // Waits about 2 s for the window; cancelled after 300 ms.
    let cancelled = tokio::time::timeout(Duration::from_millis(300), limiter.acquire(&full, Duration::from_secs(10))).await;
    assert!(cancelled.is_err(), "still waiting when dropped");
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(server.calls("xcloak.allow"), 2, "one rejected ALLOW, nothing after the drop");
    assert_eq!(server.entries("acq"), 1, "a cancelled wait recorded nothing");
    // Not cancelled, it waits the server's figure and is admitted.
    let d = limiter.acquire(&full, Duration::from_secs(10)).await.unwrap();
    assert!(d.allowed);
}

/// Loses the reply to one ALLOW through `proxy` (the server ran it) and
/// checks that `limiter` answered by its policy and sent nothing again.
async fn lost_reply_runs_once<T: Transport>(server: &Server, proxy: &support::Proxy, limiter: Limiter<T>, what: &str) {
    let limiter = limiter.with_policy(Policy::Deny);
    let key = format!("lost:{what}");
    let before = server.calls("xcloak.allow");
    proxy.lose_next_allow_reply();
    let d = limiter.allow(&minute(&key, 10)).await.unwrap();
    assert_eq!((d.allowed, d.via), (false, Via::Error), "{what}: deny answered the lost reply");
    assert!(matches!(&d.error, Some(Unavailable { cause: Cause::Connection, .. })), "{what}: {:?}", d.error);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(server.calls("xcloak.allow") - before, 1, "{what}: applied once, never sent again");
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
    lost_reply_runs_once(&server, &proxy, Limiter::new(Standalone(multiplexed)), "Standalone(MultiplexedConnection)").await;
}
