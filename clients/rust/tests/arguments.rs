//! Bad input and bad configuration are refused with an argument error naming
//! the argument and its range, before anything is sent, whatever the error
//! policy (docs/clients.md, "Arguments" and "Errors"): the Builder's options
//! at `build()`, and an option that a call does not take (`oldest` on
//! `allow`, `stamp` on `peek`) at the call, never ignored.
mod support;

use std::time::Duration;

use support::Server;
use xcloak_client::{blocking, Error, ErrorPolicy, Limiter, Request};

/// The argument an Error::Argument names, and its message.
fn refused<T>(result: Result<T, Error>) -> (String, String) {
    match result {
        Err(Error::Argument { name, message }) => (name, message),
        Err(other) => panic!("not an argument error: {other:?}"),
        Ok(_) => panic!("accepted"),
    }
}

#[tokio::test]
async fn the_builder_refuses_an_option_out_of_range_when_built() {
    let redis = Server::start();
    let conn = redis::aio::ConnectionManager::new(redis.client()).await.unwrap();
    // Under `allow`, an outage admits: a configuration error must be refused still.
    let builder = || Limiter::builder(conn.clone()).on_error(ErrorPolicy::Allow);
    let ms = Duration::from_millis;
    let cases = [
        (
            refused(builder().timeout(Duration::ZERO).build()),
            "timeout",
            "from 1 ms to 9007199254740991 ms",
        ),
        (
            refused(builder().timeout(Duration::MAX).build()),
            "timeout",
            "from 1 ms",
        ),
        (
            refused(builder().probe_interval(Duration::ZERO).build()),
            "probe_interval",
            "from 1 ms",
        ),
        (
            refused(builder().durable(0, ms(100)).build()),
            "durable.replicas",
            "from 1 to 4294967295",
        ),
        (
            refused(builder().durable(1, Duration::ZERO).build()),
            "durable.timeout",
            "from 1 ms",
        ),
        (
            refused(builder().durable(1, Duration::from_micros(1500)).build()),
            "durable.timeout",
            "whole number of milliseconds",
        ),
        (
            refused(builder().jitter_fraction(-0.1).build()),
            "jitter_fraction",
            "from 0 to 1",
        ),
        (
            refused(builder().jitter_fraction(1.5).build()),
            "jitter_fraction",
            "from 0 to 1",
        ),
        (
            refused(builder().jitter_fraction(f64::NAN).build()),
            "jitter_fraction",
            "from 0 to 1",
        ),
    ];
    for ((name, message), want, range) in cases {
        assert_eq!(name, want, "{message}");
        assert!(message.starts_with(want) && message.contains(range), "{message}");
    }
    // The blocking limiter's builder checks the same options.
    let (name, _) = refused(
        blocking::Limiter::builder(redis.client())
            .timeout(Duration::ZERO)
            .build_blocking(),
    );
    assert_eq!(name, "timeout");
    // At the edges of the ranges: built.
    builder()
        .timeout(ms(1))
        .probe_interval(ms(1))
        .durable(1, ms(1))
        .jitter_fraction(1.0)
        .build()
        .unwrap();
    builder().jitter_fraction(0.0).build().unwrap();
    assert_eq!(redis.calls("xcloak.allow") + redis.calls("wait"), 0);
}

#[tokio::test]
async fn an_option_that_the_call_does_not_take_is_refused_not_ignored() {
    let redis = Server::start();
    let open = Limiter::new(redis::aio::ConnectionManager::new(redis.client()).await.unwrap())
        .with_on_error(ErrorPolicy::Allow);
    let minute = |key: &str| Request::new(key, Duration::from_secs(60), 3);
    let oldest = refused(open.allow(&minute("a").oldest()).await);
    assert_eq!(oldest.0, "oldest");
    assert_eq!(oldest.1, "oldest is a peek option: allow takes no oldest");
    assert_eq!(
        refused(open.acquire(&minute("a").oldest(), Duration::from_secs(1)).await).0,
        "oldest"
    );
    let stamp = refused(open.peek(&minute("a").stamp()).await);
    assert_eq!(stamp.0, "stamp");
    assert!(stamp.1.starts_with("stamp is an allow option"), "{}", stamp.1);
    // allow_all checks every request before it sends the first: nothing admitted, nothing to refund.
    let all = [minute("b"), minute("c").oldest()];
    assert_eq!(refused(open.allow_all(&all).await).0, "oldest");
    assert_eq!(redis.entries("b"), 0);
    let blocking = blocking::Limiter::new(redis.client()).with_on_error(ErrorPolicy::Deny);
    assert_eq!(refused(blocking.allow(&minute("d").oldest())).0, "oldest");
    assert_eq!(refused(blocking.peek(&minute("d").stamp())).0, "stamp");
    assert_eq!(
        (redis.calls("xcloak.allow"), redis.calls("xcloak.peek")),
        (0, 0),
        "nothing was sent"
    );
    // Each call with its own options goes through.
    assert!(open.allow(&minute("e").stamp()).await.unwrap().stamp.is_some());
    assert!(open.peek(&minute("e").oldest()).await.unwrap().oldest.is_some());
}
