//! Exact sliding-window rate limiting on Redis, shared by every instance of a
//! service: the xcloak Redis module's `XCLOAK.ALLOW` where it
//! is loaded, its bundled Lua script where it can't be (managed services),
//! over the `redis` crate; and a `tower::Layer` for axum, tonic and hyper.
//!
//! ```no_run
//! # #[cfg(feature = "axum")] mod doc { async fn f() -> Result<(), Box<dyn std::error::Error>> {
//! use std::{net::SocketAddr, time::Duration};
//! use axum::{error_handling::HandleErrorLayer, http::StatusCode, routing::get, BoxError, Router};
//! use xcloak_client::{tower::{HttpLimit, RateLimitLayer}, Limiter};
//!
//! let limiter = Limiter::new(xcloak_client::redis::Client::open("redis://127.0.0.1/")?.get_connection_manager().await?);
//! // The key is the client's address, from axum's ConnectInfo (feature `axum`).
//! let limit = RateLimitLayer::new(limiter, [HttpLimit::new(Duration::from_secs(60), 100)])?;
//! let answer = |e: BoxError| async move { (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()) };
//! let app = Router::new().route("/", get(|| async { "hello" })).layer((HandleErrorLayer::new(answer), limit));
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//! axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await?;
//! # Ok(()) } }
//! ```
//!
//! Each client gets 100 requests a minute, counted exactly (a sliding log,
//! not a fixed window), across every instance behind the load balancer.
//! Allowed responses carry `RateLimit-Policy` / `RateLimit`; the 101st gets
//! `429 Too Many Requests` with `Retry-After`.
//!
//! # How it is built
//!
//! The core is pure: [`Request`] becomes the canonical command,
//! [`Decision::from_reply`] (and [`Decision::from_peek_reply`]) turns a reply into a [`Decision`],
//! [`Decision::headers`] a decision into an `http::HeaderMap`, and
//! [`acquire_step`] plans `acquire`'s sleeps; the conformance vectors of
//! docs/clients.md drive it without a server. The calls (`allow`, `peek`,
//! `refund`, `reset`, `acquire`, `allow_all`), the per-node fallback to the
//! scripts and the error policy are written once (`engine`), over a
//! [`Transport`] for the async [`Limiter`] and a connection pool for
//! [`blocking::Limiter`]. The block cache (`cache`, pure, behind a mutex
//! the engine never holds across a call) answers the repeats of a rejection
//! locally until its retry-after has passed ([`Builder::block_cache`],
//! [`Limiter::stats`]). The tower layer (feature `tower`) sits on top.
//!
//! # Errors
//!
//! The server's refusal of a call (a bad argument, `WRONGTYPE`, `NOPERM`) is
//! [`Error::Server`] with its message verbatim, whatever the error policy: it
//! is a bug in the caller. An outage or a timeout is [`Error::Unavailable`],
//! or under [`ErrorPolicy::Allow`] / [`ErrorPolicy::Deny`] (set by
//! [`Builder::on_error`]) a Decision with `via = Via::Error`. An argument or
//! configuration error is [`Error::Argument`], returned at once (a bad
//! configuration by [`Builder::build`] and `RateLimitLayer::new`). A call
//! that may have reached the server is never sent again (see [`Transport`]
//! for what that asks of a cluster client).
//!
//! # Units
//!
//! Every duration is a `std::time::Duration` (windows, timeouts, waits);
//! windows and the durable timeout are sent as whole milliseconds.
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod blocking;
mod cache;
mod clock;
mod decision;
mod engine;
mod error;
mod headers;
mod limiter;
mod request;
#[cfg(feature = "tower")]
#[cfg_attr(docsrs, doc(cfg(feature = "tower")))]
pub mod tower;
mod transport;

/// The `redis` crate this one is built on (1.x), for its `Client`: no version
/// of your own to keep in step.
pub use redis;

pub use cache::Stats;
pub use clock::{acquire_step, AcquireStep, Clock};
pub use decision::{Decision, MultiDecision, TierState, Via};
pub use engine::{Durable, Fallback, ALLOW_SCRIPT, PEEK_SCRIPT, REFUND_SCRIPT};
pub use error::{Cause, Error, ErrorPolicy, Unavailable};
pub use headers::{
    ceil_seconds, policy_name, Style, RATELIMIT, RATELIMIT_LIMIT, RATELIMIT_POLICY, RATELIMIT_REMAINING,
    RATELIMIT_RESET,
};
pub use limiter::{Builder, Limiter};
pub use request::{Refund, Request, Tier};
pub use transport::{SlotRange, Standalone, Transport};

/// A cluster client builder set for a limiter: `retries(0)`, so the client
/// never sends a call again after an I/O error or a timeout (it may have been
/// applied; the [`Transport`] follows `MOVED` and `ASK` itself), and, with
/// `replica_reads`, reads routed to replicas (their connections send
/// `READONLY`; pair it with [`Builder::replica_reads`]).
///
/// ```no_run
/// # async fn run() -> redis::RedisResult<()> {
/// let cluster = xcloak_client::cluster_client(["redis://127.0.0.1:7000/"], true).build()?;
/// let limiter = xcloak_client::Limiter::builder(cluster.get_async_connection().await?)
///     .replica_reads(true)
///     .build()
///     .expect("valid options");
/// # Ok(()) }
/// ```
#[cfg(feature = "cluster")]
#[cfg_attr(docsrs, doc(cfg(feature = "cluster")))]
pub fn cluster_client<T: redis::IntoConnectionInfo>(
    nodes: impl IntoIterator<Item = T>,
    replica_reads: bool,
) -> redis::cluster::ClusterClientBuilder {
    let builder = redis::cluster::ClusterClientBuilder::new(nodes).retries(0);
    if replica_reads {
        builder.read_routing_strategy(redis::cluster_read_routing::RandomReplicaStrategy)
    } else {
        builder
    }
}
