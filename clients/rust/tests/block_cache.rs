//! The block cache (docs/clients.md, "Block cache") against a real server
//! with the module, its calls counted by the server (INFO commandstats):
//! a rejection, then the same request rejected with no call (`via = Cache`,
//! retry_after counting down); the entry ends at its deadline; a larger cost
//! is cached and a smaller one sent; another shape (tiers) is sent; a refund
//! or reset through the limiter drops the entry; a peek, an explicit `now`
//! and a limiter with a clock bypass it; allow_all's blocked request costs no
//! call; the stats; off with 0 and refused above 1,000,000; the blocking
//! limiter; many tasks on one key admit exactly the limit; a paused server
//! is not asked about a cached key.
//!
//! A mutant caught: a hit that calls the server anyway, a cache that admits,
//! a retry_after not counted down, an entry kept past its deadline, a smaller
//! cost or another tier list answered from the cache, a refund or reset that
//! leaves the entry, a peek or NOW answered from it, stats that don't count.
mod support;

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use support::Server;
use xcloak_client::{blocking, Clock, Error, Limiter, Refund, Request, Stats, Via};

type Conn = redis::aio::MultiplexedConnection;

async fn limiter(server: &Server) -> Limiter<Conn> {
    Limiter::new(server.client().get_multiplexed_async_connection().await.unwrap())
}

fn minute(key: &str, limit: u64) -> Request {
    Request::new(key, Duration::from_secs(60), limit)
}

/// Spends `request`'s limit, then one server rejection, now cached.
async fn block(limiter: &Limiter<Conn>, request: &Request) {
    for _ in 0..request.limit / request.cost {
        assert!(limiter.allow(request).await.unwrap().allowed);
    }
    let d = limiter.allow(request).await.unwrap();
    assert_eq!((d.allowed, d.via), (false, Via::Command), "{d:?}");
}

#[tokio::test]
async fn a_cached_rejection_makes_no_call_and_counts_down() {
    let server = Server::start();
    let limiter = limiter(&server).await;
    let request = minute("k", 2).tier(Duration::from_secs(3600), 5);
    block(&limiter, &request).await;
    let first = limiter.allow(&request).await.unwrap();
    let calls = server.calls("xcloak.allow");
    assert_eq!(calls, 3);
    let mut last = first.clone();
    for _ in 0..20 {
        let d = limiter.allow(&request).await.unwrap();
        assert_eq!(
            (d.allowed, d.via, d.remaining, d.stamp, d.cost_exceeds_limit),
            (false, Via::Cache, 0, None, false)
        );
        // The server's figures, aged: never larger than the last answer's.
        assert!(d.retry_after <= last.retry_after && d.retry_after >= Some(Duration::from_millis(1)));
        assert!(d.reset_after <= last.reset_after);
        assert_eq!(
            (d.limit, d.window, d.tier, d.tiers.len()),
            (2, Duration::from_secs(60), 0, 2)
        );
        last = d;
    }
    assert_eq!(first.via, Via::Cache);
    assert_eq!(server.calls("xcloak.allow"), calls, "a cached rejection sent a call");
    assert_eq!(
        limiter.stats(),
        Stats {
            cache_hits: 21,
            cache_entries: 1
        }
    );
    // Headers as from the server: Retry-After from the counted-down retry_after.
    let headers = last.headers(xcloak_client::Style::Ietf);
    let retry: u64 = headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=60).contains(&retry), "{retry}");
    // A limiter made from it shares the cache; one built with 0 has none.
    assert_eq!(
        limiter
            .with_on_error(xcloak_client::ErrorPolicy::Deny)
            .allow(&request)
            .await
            .unwrap()
            .via,
        Via::Cache
    );
    let off = Limiter::builder(server.client().get_multiplexed_async_connection().await.unwrap())
        .block_cache(0)
        .build()
        .unwrap();
    for _ in 0..2 {
        assert_eq!(off.allow(&request).await.unwrap().via, Via::Command);
    }
    assert_eq!(off.stats(), Stats::default());
}

#[tokio::test]
async fn the_entry_ends_at_its_deadline() {
    let server = Server::start();
    let limiter = limiter(&server).await;
    let request = Request::new("short", Duration::from_millis(300), 1);
    block(&limiter, &request).await;
    // Await the cached deadline itself: each hit says how long is left.
    let mut hits = 0;
    let admitted = loop {
        let d = limiter.allow(&request).await.unwrap();
        if d.via != Via::Cache {
            break d;
        }
        hits += 1;
        assert!(hits < 100, "the entry outlived its deadline");
        tokio::time::sleep(d.retry_after.unwrap()).await;
    };
    assert!(hits >= 1);
    // The first call after the deadline went to the server; the window's
    // oldest entry may outlive the cached deadline by the call's latency.
    assert_eq!(admitted.via, Via::Command);
    assert_eq!(limiter.stats().cache_entries, usize::from(!admitted.allowed));
}

#[tokio::test]
async fn a_larger_cost_is_cached_a_smaller_one_and_other_tiers_are_sent() {
    let server = Server::start();
    let limiter = limiter(&server).await;
    let request = minute("c", 4).cost(2);
    block(&limiter, &request).await;
    let calls = server.calls("xcloak.allow");
    assert_eq!(limiter.allow(&request.clone().cost(3)).await.unwrap().via, Via::Cache);
    assert_eq!(server.calls("xcloak.allow"), calls);
    let smaller = limiter.allow(&request.clone().cost(1)).await.unwrap();
    assert_eq!((smaller.allowed, smaller.via), (false, Via::Command));
    // The smaller cost's rejection replaced the entry: cost 1 is cached now.
    assert_eq!(limiter.allow(&request.clone().cost(1)).await.unwrap().via, Via::Cache);
    let tiered = request.clone().tier(Duration::from_secs(3600), 100);
    assert_eq!(limiter.allow(&tiered).await.unwrap().via, Via::Command);
    assert_eq!(limiter.allow(&minute("c", 5)).await.unwrap().via, Via::Command);
    assert_eq!(server.calls("xcloak.allow"), calls + 3);
}

#[tokio::test]
async fn a_refund_or_a_reset_through_the_limiter_drops_the_entry() {
    let server = Server::start();
    let limiter = limiter(&server).await;
    let request = minute("r", 1).stamp();
    let admitted = limiter.allow(&request).await.unwrap();
    assert!(limiter.allow(&request).await.unwrap().via == Via::Command);
    assert_eq!(limiter.allow(&request).await.unwrap().via, Via::Cache);
    assert_eq!(
        limiter
            .refund(&Refund::new("r", admitted.stamp.unwrap()))
            .await
            .unwrap(),
        1
    );
    assert_eq!(limiter.stats().cache_entries, 0);
    let d = limiter.allow(&request).await.unwrap();
    assert_eq!((d.allowed, d.via), (true, Via::Command));
    assert_eq!(limiter.allow(&request).await.unwrap().via, Via::Command);
    assert_eq!(limiter.allow(&request).await.unwrap().via, Via::Cache);
    assert!(limiter.reset("r").await.unwrap());
    let d = limiter.allow(&request).await.unwrap();
    assert_eq!((d.allowed, d.via), (true, Via::Command));
    // With a prefix: the entry is the prefixed key's.
    let prefixed = Limiter::builder(server.client().get_multiplexed_async_connection().await.unwrap())
        .prefix("p:")
        .build()
        .unwrap();
    block(&prefixed, &minute("r", 1)).await;
    assert_eq!(prefixed.allow(&minute("r", 1)).await.unwrap().via, Via::Cache);
    prefixed.reset("r").await.unwrap();
    assert_eq!(prefixed.allow(&minute("r", 1)).await.unwrap().via, Via::Command);
}

/// A clock at a fixed unix time.
struct Fixed(u64);
impl Clock for Fixed {
    fn now_ms(&self) -> u64 {
        self.0
    }
    fn sleep(&self, _: Duration) -> Pin<Box<dyn std::future::Future<Output = ()> + Send + '_>> {
        Box::pin(async {})
    }
}

#[tokio::test]
async fn a_peek_an_explicit_now_and_a_clock_bypass_it() {
    let server = Server::start();
    let limiter = limiter(&server).await;
    let request = minute("b", 1);
    block(&limiter, &request).await;
    let (allows, peeks) = (server.calls("xcloak.allow"), server.calls("xcloak.peek"));
    let peek = limiter.peek(&request).await.unwrap();
    assert_eq!((peek.allowed, peek.via), (false, Via::Command));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    // An hour later by NOW: the server admits; the cache is not asked.
    let later = limiter.allow(&request.clone().now(now + 3_600_000)).await.unwrap();
    assert_eq!((later.allowed, later.via), (true, Via::Command));
    let clocked = Limiter::builder(server.client().get_multiplexed_async_connection().await.unwrap())
        .clock(Fixed(now + 7_200_000))
        .build()
        .unwrap();
    for _ in 0..2 {
        let d = clocked.allow(&minute("b2", 1)).await.unwrap();
        assert_eq!(d.via, Via::Command);
    }
    assert_eq!(clocked.stats(), Stats::default());
    assert_eq!(
        (server.calls("xcloak.allow"), server.calls("xcloak.peek")),
        (allows + 3, peeks + 1)
    );
    assert_eq!(limiter.stats().cache_hits, 0);
}

#[tokio::test]
async fn allow_all_with_a_blocked_identity_first_makes_no_call() {
    let server = Server::start();
    let limiter = limiter(&server).await;
    let (ip, account) = (minute("ip", 1), minute("acct", 5));
    block(&limiter, &ip).await;
    let calls = server.calls("xcloak.allow");
    let m = limiter.allow_all(&[ip.clone(), account.clone()]).await.unwrap();
    assert_eq!((m.allowed, m.rejected, m.binding().via), (false, Some(0), Via::Cache));
    assert_eq!(server.calls("xcloak.allow"), calls);
    // Blocked second: the first is admitted by the server, then refunded.
    let m = limiter.allow_all(&[account.clone(), ip.clone()]).await.unwrap();
    assert_eq!((m.allowed, m.rejected, m.binding().via), (false, Some(1), Via::Cache));
    assert_eq!(server.calls("xcloak.allow"), calls + 1);
    assert_eq!(server.calls("xcloak.refund"), 1);
    assert_eq!(server.entries("acct"), 0);
}

#[tokio::test]
async fn acquire_sleeps_a_cached_rejection_locally() {
    let server = Server::start();
    let limiter = limiter(&server).await;
    let request = Request::new("a", Duration::from_millis(200), 1);
    block(&limiter, &request).await;
    let calls = server.calls("xcloak.allow");
    let d = limiter.acquire(&request, Duration::from_secs(5)).await.unwrap();
    assert!(d.allowed);
    // Its first turn was the cache's; every call it sent was after the deadline.
    assert!(limiter.stats().cache_hits >= 1);
    assert!(server.calls("xcloak.allow") > calls);
}

#[test]
fn the_blocking_limiter_has_it_and_a_bad_size_is_refused_when_built() {
    let server = Server::start();
    let limiter = blocking::Limiter::new(server.client());
    let request = minute("bl", 1);
    assert!(limiter.allow(&request).unwrap().allowed);
    assert_eq!(limiter.allow(&request).unwrap().via, Via::Command);
    let calls = server.calls("xcloak.allow");
    assert_eq!(limiter.allow(&request).unwrap().via, Via::Cache);
    assert_eq!(server.calls("xcloak.allow"), calls);
    assert_eq!(limiter.stats().cache_hits, 1);
    let Err(refused) = blocking::Limiter::builder(server.client())
        .block_cache(1_000_001)
        .build_blocking()
    else {
        panic!("block_cache(1_000_001) was built")
    };
    assert!(
        matches!(&refused, Error::Argument { name, message } if name == "block_cache" && message.contains("from 0") && message.contains("1000000")),
        "{refused:?}"
    );
    assert!(blocking::Limiter::builder(server.client())
        .block_cache(1_000_000)
        .build_blocking()
        .is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_tasks_on_one_key_admit_exactly_the_limit() {
    let server = Server::start();
    let limiter = limiter(&server).await;
    let admitted = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..32 {
        let (limiter, admitted) = (limiter.clone(), admitted.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..25 {
                if limiter.allow(&minute("hot", 10)).await.unwrap().allowed {
                    admitted.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    // Counted by the server: its window holds exactly the admissions.
    assert_eq!((admitted.load(Ordering::Relaxed), server.entries("hot")), (10, 10));
    let stats = limiter.stats();
    assert_eq!(
        stats.cache_hits + server.calls("xcloak.allow"),
        800,
        "every call answered once"
    );
    assert!(stats.cache_hits >= 700, "{stats:?}");
}

#[tokio::test]
async fn an_outage_does_not_reach_a_cached_key() {
    let server = Server::start();
    let limiter = Limiter::builder(server.client().get_multiplexed_async_connection().await.unwrap())
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let request = minute("o", 1);
    block(&limiter, &request).await;
    server.pause();
    // Sent, this call would time out: the paused server is never asked.
    let d = limiter.allow(&request).await;
    let other = limiter.allow(&minute("o2", 1)).await;
    server.resume();
    assert_eq!(d.unwrap().via, Via::Cache);
    assert!(matches!(other, Err(Error::Unavailable(_))), "{other:?}");
}
