//! What the crate costs, as ratios against a baseline in the same run
//! (`./bench.sh`; not a test: these machines are noisy, so nothing is asserted):
//!
//! 1. `Limiter::allow` against a raw `redis::cmd` of the same command
//!    (`XCLOAK.ALLOW key window limit DETAILS`) on the same kind of connection,
//!    one call in flight and 16 in flight, in alternating rounds on key sets of
//!    the same size so both sides find the same server work;
//! 2. an axum app behind `RateLimitLayer` against the same app without it,
//!    per request over one keep-alive HTTP/1.1 connection: the overhead per
//!    request (one Redis round trip and the headers).
#[path = "../tests/support/mod.rs"]
mod support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::routing::get;
use axum::Router;
use redis::aio::MultiplexedConnection;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use xcloak_client::tower::{HttpLimit, RateLimitLayer};
use xcloak_client::{Limiter, Request};

const KEYS: usize = 1000;
const ROUNDS: usize = 5;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// Which client sends the calls of a round.
#[derive(Clone, Copy, PartialEq)]
enum Side {
    /// `redis::cmd("XCLOAK.ALLOW")...query_async`: the baseline.
    Raw,
    /// The same, inside `tokio::time::timeout` (what the limiter's per-call
    /// timeout costs by itself).
    RawWithTimeout,
    /// `Limiter::allow`: the same command, read into a Decision.
    Limiter,
}

async fn round(
    side: Side,
    conn: &MultiplexedConnection,
    limiter: &Limiter<MultiplexedConnection>,
    prefix: &str,
    calls: usize,
    in_flight: usize,
) -> f64 {
    let started = Instant::now();
    let mut tasks = Vec::new();
    for t in 0..in_flight {
        let (mut conn, limiter, prefix) = (conn.clone(), limiter.clone(), prefix.to_string());
        tasks.push(tokio::spawn(async move {
            for i in (t..calls).step_by(in_flight) {
                let key = format!("{prefix}:{}", i % KEYS);
                match side {
                    Side::Raw => {
                        let reply: redis::Value = redis::cmd("XCLOAK.ALLOW")
                            .arg(&key)
                            .arg(60_000)
                            .arg(1_000_000)
                            .arg("DETAILS")
                            .query_async(&mut conn)
                            .await
                            .unwrap();
                        std::hint::black_box(reply);
                    }
                    Side::RawWithTimeout => {
                        let mut cmd = redis::cmd("XCLOAK.ALLOW");
                        cmd.arg(&key).arg(60_000).arg(1_000_000).arg("DETAILS");
                        let call = cmd.query_async::<redis::Value>(&mut conn);
                        std::hint::black_box(
                            tokio::time::timeout(Duration::from_secs(1), call)
                                .await
                                .unwrap()
                                .unwrap(),
                        );
                    }
                    Side::Limiter => {
                        let d = limiter
                            .allow(&Request::new(key, Duration::from_secs(60), 1_000_000))
                            .await
                            .unwrap();
                        std::hint::black_box(d);
                    }
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    started.elapsed().as_secs_f64() * 1e6 / calls as f64
}

async fn raw_round(conn: &MultiplexedConnection, prefix: &str, calls: usize, in_flight: usize) -> Duration {
    let limiter = Limiter::new(conn.clone());
    Duration::from_secs_f64(round(Side::Raw, conn, &limiter, prefix, calls, in_flight).await * calls as f64 / 1e6)
}

async fn allow_against_raw(server: &support::Server) {
    let conn = server.client().get_multiplexed_async_connection().await.unwrap();
    let limiter = Limiter::new(conn.clone());
    let sides = [
        (Side::Raw, "raw"),
        (Side::RawWithTimeout, "tmo"),
        (Side::Limiter, "lim"),
    ];
    for (in_flight, calls) in [(1, 3000), (16, 20000)] {
        for (side, name) in sides {
            round(side, &conn, &limiter, &format!("{name}{in_flight}"), KEYS, 1).await;
        }
        // Per round, each side once, in a rotating order; the ratios are taken
        // within a round (the machine's load drifts between rounds).
        let mut per_call: Vec<[f64; 3]> = Vec::new();
        for r in 0..3 * ROUNDS {
            let mut times = [0.0; 3];
            for k in 0..3 {
                let s = (r + k) % 3;
                let (side, name) = sides[s];
                times[s] = round(side, &conn, &limiter, &format!("{name}{in_flight}"), calls, in_flight).await;
            }
            per_call.push(times);
        }
        let of = |i: usize| median(per_call.iter().map(|t| t[i]).collect());
        let ratio = |i: usize| median(per_call.iter().map(|t| t[i] / t[0]).collect());
        println!(
            "allow, {in_flight:>2} in flight: raw redis::cmd {:6.2} us/call; in tokio::time::timeout {:6.2} ({:.3}x); Limiter::allow {:6.2} ({:.3}x)",
            of(0),
            of(1),
            ratio(1),
            of(2),
            ratio(2)
        );
    }
}

async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", support::free_port()))
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>())
            .await
            .unwrap()
    });
    addr
}

/// `requests` GETs over one keep-alive connection; microseconds per request.
async fn http_round(addr: SocketAddr, requests: usize) -> f64 {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.set_nodelay(true).unwrap();
    let mut stream = BufReader::new(stream);
    let started = Instant::now();
    for _ in 0..requests {
        stream
            .get_mut()
            .write_all(b"GET / HTTP/1.1\r\nHost: bench\r\n\r\n")
            .await
            .unwrap();
        let mut length = 0;
        loop {
            let mut line = String::new();
            stream.read_line(&mut line).await.unwrap();
            if line == "\r\n" {
                break;
            }
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length: ") {
                length = v.trim().parse().unwrap();
            }
        }
        let mut body = vec![0; length];
        stream.read_exact(&mut body).await.unwrap();
    }
    started.elapsed().as_secs_f64() * 1e6 / requests as f64
}

async fn layer_against_none(server: &support::Server) {
    let app = || Router::new().route("/", get(|| async { "ok" }));
    let bare = serve(app()).await;
    let limiter = Limiter::new(redis::aio::ConnectionManager::new(server.client()).await.unwrap());
    let layer = RateLimitLayer::new(
        limiter,
        [HttpLimit::new(Duration::from_secs(60), 1_000_000).name("bench")],
    )
    .unwrap()
    .key(xcloak_client::tower::PeerIp::from_extension(
        |c: &axum::extract::ConnectInfo<SocketAddr>| c.0,
    ));
    let limited = serve(
        app().layer(
            tower::ServiceBuilder::new()
                .layer(axum::error_handling::HandleErrorLayer::new(|_: axum::BoxError| async {
                    axum::http::StatusCode::INTERNAL_SERVER_ERROR
                }))
                .layer(layer),
        ),
    )
    .await;
    http_round(bare, 500).await;
    http_round(limited, 500).await;
    let conn = server.client().get_multiplexed_async_connection().await.unwrap();
    let (calls, mut rounds) = (2000, Vec::new());
    // Per round, in a rotating order: the bare app, the limited app, and a raw
    // XCLOAK.ALLOW round trip (what the layer adds at the least).
    for r in 0..3 * ROUNDS {
        let mut t = [0.0; 3];
        for k in 0..3 {
            let i = (r + k) % 3;
            t[i] = match i {
                0 => http_round(bare, calls).await,
                1 => http_round(limited, calls).await,
                _ => raw_round(&conn, "rtt", calls, 1).await.as_secs_f64() * 1e6 / calls as f64,
            };
        }
        rounds.push(t);
    }
    let of = |i: usize| median(rounds.iter().map(|t| t[i]).collect());
    let added = median(rounds.iter().map(|t| t[1] - t[0]).collect());
    let own = median(rounds.iter().map(|t| t[1] - t[0] - t[2]).collect());
    println!(
        "axum, 1 connection: without the layer {:6.2} us/request, with it {:6.2} ({:.2}x): +{added:.2} us per request, of which one XCLOAK.ALLOW round trip {:.2} us and the layer's own work {own:.2} us",
        of(0),
        of(1),
        median(rounds.iter().map(|t| t[1] / t[0]).collect()),
        of(2)
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let server = support::Server::start();
    println!(
        "xcloak-client overhead, server {:?}, module {}",
        support::server_version(),
        support::module_path().display()
    );
    allow_against_raw(&server).await;
    layer_against_none(&server).await;
}
