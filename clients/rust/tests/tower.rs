//! The tower layer in a real axum server on loopback, driven over HTTP/1.1
//! from distinct loopback addresses (127.0.0.x, so each is its own client):
//! limits and tiers, 429 with the contract's headers and headers on allowed
//! responses, several limits all or nothing, skip_successful / skip_failed by
//! a refund after the response, the error
//! policy against a paused and a stopped server, the key extractors (the
//! default: the peer address from axum's ConnectInfo), configuration refused
//! when the layer is built, and the commands sent per request (one
//! `XCLOAK.ALLOW` per limit, nothing else).
mod support;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use axum::error_handling::HandleErrorLayer;
use axum::extract::ConnectInfo;
use axum::http::StatusCode;
use axum::routing::get;
use axum::{BoxError, Extension, Router};
use support::Server;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use xcloak_client::tower::{HeaderKey, HttpLimit, KeyExtractor, PeerIp, RateLimitLayer};
use xcloak_client::{Error, ErrorPolicy, Limiter, MultiDecision, Style, Transport};

struct Reply {
    status: u16,
    headers: BTreeMap<String, String>,
    body: String,
}

/// One request over a new connection from `from` (a loopback address).
async fn get_from(server: SocketAddr, from: &str, path: &str, headers: &[(&str, &str)]) -> Reply {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::new(from.parse().unwrap(), 0)).unwrap();
    let mut stream = socket.connect(server).await.unwrap();
    let mut request = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.unwrap();
    let text = String::from_utf8(raw).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let mut lines = head.lines();
    let status = lines.next().unwrap().split(' ').nth(1).unwrap().parse().unwrap();
    let headers = lines
        .filter_map(|l| l.split_once(": "))
        .map(|(k, v)| (k.to_ascii_lowercase(), v.to_string()))
        .collect();
    Reply {
        status,
        headers,
        body: body.to_string(),
    }
}

/// An axum app behind `layer`: `/` answers 200, `/fail` 401; errors the
/// layer raises are answered 500 with their text by HandleErrorLayer. Served
/// with axum's ConnectInfo.
async fn serve<T: Transport, K: KeyExtractor>(layer: RateLimitLayer<T, K>) -> SocketAddr {
    serve_with(layer, true).await
}

/// `serve`, with or without `into_make_service_with_connect_info`.
async fn serve_with<T: Transport, K: KeyExtractor>(layer: RateLimitLayer<T, K>, connect_info: bool) -> SocketAddr {
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .route("/fail", get(|| async { (StatusCode::UNAUTHORIZED, "no") }))
        .route(
            "/seen",
            get(|Extension(m): Extension<MultiDecision>| async move { format!("remaining {}", m.binding().remaining) }),
        )
        .layer(
            tower::ServiceBuilder::new()
                .layer(HandleErrorLayer::new(|e: BoxError| async move {
                    (StatusCode::INTERNAL_SERVER_ERROR, format!("raised: {e}"))
                }))
                .layer(layer),
        );
    let listener = loop {
        if let Ok(l) = tokio::net::TcpListener::bind(("127.0.0.1", support::free_port())).await {
            break l;
        }
    };
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        if connect_info {
            axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>())
                .await
                .unwrap()
        } else {
            axum::serve(listener, app.into_make_service()).await.unwrap()
        }
    });
    addr
}

/// The peer from a framework's own extension type (here axum's, which the
/// default reads too).
fn peer() -> PeerIp {
    PeerIp::from_extension(|c: &ConnectInfo<SocketAddr>| c.0)
}

async fn limiter(server: &Server) -> Limiter<redis::aio::ConnectionManager> {
    Limiter::new(redis::aio::ConnectionManager::new(server.client()).await.unwrap())
}

#[tokio::test]
async fn a_limit_with_tiers_answers_429_with_the_contracts_headers() {
    let redis = Server::start();
    let limit = HttpLimit::new(Duration::from_secs(60), 3)
        .name("api")
        .tier(Duration::from_secs(3600), 5);
    let app = serve(RateLimitLayer::new(limiter(&redis).await, [limit]).unwrap()).await;
    for remaining in [2, 1, 0] {
        let r = get_from(app, "127.0.0.2", "/", &[]).await;
        assert_eq!((r.status, r.body.as_str()), (200, "ok"));
        assert_eq!(
            r.headers["ratelimit-policy"],
            r#""3-in-60s";q=3;w=60, "5-in-3600s";q=5;w=3600"#
        );
        assert_eq!(
            r.headers["ratelimit"],
            format!(
                r#""3-in-60s";r={remaining};t=60, "5-in-3600s";r={};t=3600"#,
                remaining + 2
            )
        );
        assert!(!r.headers.contains_key("retry-after"));
    }
    let r = get_from(app, "127.0.0.2", "/", &[]).await;
    assert_eq!((r.status, r.body.as_str()), (429, "Too Many Requests\n"));
    let retry: u64 = r.headers["retry-after"].parse().unwrap();
    assert!((1..=60).contains(&retry), "{retry}");
    assert!(
        r.headers["ratelimit"].starts_with(r#""3-in-60s";r=0;t="#),
        "{:?}",
        r.headers
    );
    // The handler sees the request's own result (axum: Extension<MultiDecision>).
    let seen = get_from(app, "127.0.0.24", "/seen", &[]).await;
    assert_eq!((seen.status, seen.body.as_str()), (200, "remaining 2"));
    // Another client has its own window; the refused request recorded nothing.
    assert_eq!(get_from(app, "127.0.0.3", "/", &[]).await.status, 200);
    assert_eq!(
        (redis.entries("rl:api:127.0.0.2"), redis.entries("rl:api:127.0.0.3")),
        (3, 1)
    );
}

#[tokio::test]
async fn several_limits_are_all_or_nothing() {
    let redis = Server::start();
    let limits = [
        HttpLimit::new(Duration::from_secs(60), 10)
            .name("minute")
            .names(["per-minute"]),
        HttpLimit::new(Duration::from_secs(60), 2)
            .name("burst")
            .names(["burst"]),
    ];
    let app = serve(
        RateLimitLayer::new(limiter(&redis).await, limits)
            .unwrap()
            .style(Style::Both),
    )
    .await;
    for _ in 0..2 {
        let r = get_from(app, "127.0.0.4", "/", &[]).await;
        assert_eq!(r.status, 200);
        assert_eq!(
            r.headers["ratelimit-policy"],
            r#""per-minute";q=10;w=60, "burst";q=2;w=60"#
        );
    }
    let r = get_from(app, "127.0.0.4", "/", &[]).await;
    assert_eq!(r.status, 429);
    // The binding (rejecting) limit's legacy fields.
    assert_eq!(
        (
            r.headers["ratelimit-limit"].as_str(),
            r.headers["ratelimit-remaining"].as_str()
        ),
        ("2", "0")
    );
    // The minute limit admitted the third request, then it was refunded.
    assert_eq!(
        (
            redis.entries("rl:minute:127.0.0.4"),
            redis.entries("rl:burst:127.0.0.4")
        ),
        (2, 2)
    );
    assert_eq!(redis.calls("xcloak.refund"), 1);
}

#[tokio::test]
async fn skip_successful_counts_only_failures_by_a_refund_after_the_response() {
    let redis = Server::start();
    let login = HttpLimit::new(Duration::from_secs(60), 3)
        .name("login")
        .skip_successful();
    let app = serve(RateLimitLayer::new(limiter(&redis).await, [login]).unwrap()).await;
    for _ in 0..5 {
        let r = get_from(app, "127.0.0.5", "/", &[]).await;
        // The headers are the admission's: one taken, before the refund.
        assert_eq!(
            (r.status, r.headers["ratelimit"].as_str()),
            (200, r#""3-in-60s";r=2;t=60"#)
        );
        assert!(
            support::eventually(Duration::from_secs(5), || redis.entries("rl:login:127.0.0.5") == 0),
            "refunded after the response"
        );
    }
    for _ in 0..3 {
        assert_eq!(get_from(app, "127.0.0.5", "/fail", &[]).await.status, 401);
    }
    let r = get_from(app, "127.0.0.5", "/fail", &[]).await;
    assert_eq!(r.status, 429, "three failures fill the window");
    assert_eq!(
        get_from(app, "127.0.0.5", "/", &[]).await.status,
        429,
        "and a success is refused too"
    );
    assert_eq!(
        (redis.calls("xcloak.refund"), redis.entries("rl:login:127.0.0.5")),
        (5, 3)
    );
}

#[tokio::test]
async fn skip_failed_refunds_the_failures() {
    let redis = Server::start();
    let api = HttpLimit::new(Duration::from_secs(60), 2).name("api").skip_failed();
    let app = serve(RateLimitLayer::new(limiter(&redis).await, [api]).unwrap()).await;
    for _ in 0..4 {
        assert_eq!(get_from(app, "127.0.0.6", "/fail", &[]).await.status, 401);
        assert!(support::eventually(Duration::from_secs(5), || redis
            .entries("rl:api:127.0.0.6")
            == 0));
    }
    assert_eq!(get_from(app, "127.0.0.6", "/", &[]).await.status, 200);
    assert_eq!(get_from(app, "127.0.0.6", "/", &[]).await.status, 200);
    assert_eq!(get_from(app, "127.0.0.6", "/", &[]).await.status, 429);
}

/// The argument an Error::Argument names.
fn refused(result: Result<impl Sized, Error>) -> (String, String) {
    match result {
        Err(Error::Argument { name, message }) => (name, message),
        Err(other) => panic!("not an argument error: {other:?}"),
        Ok(_) => panic!("accepted"),
    }
}

#[tokio::test]
async fn a_bad_configuration_is_refused_when_the_layer_is_built_whatever_the_policy() {
    let redis = Server::start();
    // Under `allow`, an outage serves the request: a configuration error must not.
    let open = limiter(&redis).await.with_on_error(ErrorPolicy::Allow);
    let minute = |limit| HttpLimit::new(Duration::from_secs(60), limit);
    let layer = |limits: Vec<HttpLimit>| RateLimitLayer::new(open.clone(), limits);
    let cases: Vec<(Vec<HttpLimit>, &str, &str)> = vec![
        (
            vec![HttpLimit::new(Duration::ZERO, 10)],
            "window",
            "from 1 ms to 9007199254740991 ms",
        ),
        (
            vec![HttpLimit::new(Duration::from_micros(1500), 10)],
            "window",
            "whole number of milliseconds",
        ),
        (
            vec![HttpLimit::new(Duration::from_millis(9_007_199_254_740_992), 10)],
            "window",
            "9007199254740991",
        ),
        (vec![minute(0)], "limit", "at least 1"),
        (vec![minute(3).cost(5)], "cost", "from 1 to 3"),
        (vec![minute(3).cost(0)], "cost", "from 1 to 3"),
        (
            vec![minute(10).tier(Duration::from_secs(3600), 2).cost(3)],
            "cost",
            "from 1 to 2",
        ),
        (
            vec![minute(10).tier(Duration::from_secs(3600), 0)],
            "limit of TIER 1",
            "at least 1",
        ),
        (
            vec![minute(10).tier(Duration::ZERO, 5)],
            "window of TIER 1",
            "from 1 ms",
        ),
        (
            vec![(0..16).fold(minute(10), |l, i| l.tier(Duration::from_secs(61 + i), 10))],
            "tier",
            "at most 15",
        ),
        (
            vec![minute(10).tier(Duration::from_secs(3600), 20).names(["one"])],
            "names",
            "one name per tier (2)",
        ),
        (vec![minute(10).name("")], "name", "must not be empty"),
        (vec![minute(10), minute(20)], "name", "two limits are named \"http\""),
        (vec![], "limits", "at least one"),
    ];
    for (limits, name, range) in cases {
        let what = format!("{limits:?}");
        let (refused_name, message) = refused(layer(limits));
        assert_eq!(refused_name, name, "{what}: {message}");
        assert!(message.contains(range), "{what}: {message}");
    }
    // In range: accepted, and nothing was sent for any of the above.
    assert!(layer(vec![minute(10)
        .tier(Duration::from_secs(3600), 20)
        .cost(10)
        .names(["m", "h"])])
    .is_ok());
    assert_eq!(redis.calls("xcloak.allow"), 0);
}

#[tokio::test]
async fn the_default_key_is_the_peer_address_and_without_one_the_error_names_the_fix() {
    let redis = Server::start();
    let shared = limiter(&redis).await;
    let layer = || {
        RateLimitLayer::new(
            shared.clone(),
            [HttpLimit::new(Duration::from_secs(60), 2).name("peer")],
        )
        .unwrap()
    };
    // Served with ConnectInfo: no `.key(...)`, each address its own window.
    let with_info = serve(layer()).await;
    assert_eq!(get_from(with_info, "127.0.0.21", "/", &[]).await.status, 200);
    assert_eq!(get_from(with_info, "127.0.0.22", "/", &[]).await.status, 200);
    assert_eq!(
        (redis.entries("rl:peer:127.0.0.21"), redis.entries("rl:peer:127.0.0.22")),
        (1, 1)
    );
    // Served without it: a 500 whose text names the method that fixes it.
    let without = serve_with(layer(), false).await;
    let r = get_from(without, "127.0.0.23", "/", &[]).await;
    assert_eq!(r.status, 500);
    assert!(
        r.body.contains("into_make_service_with_connect_info::<SocketAddr>()")
            && r.body.contains("RateLimitLayer::key"),
        "{}",
        r.body
    );
    assert_eq!(redis.calls("xcloak.allow"), 2, "a request without a key sends nothing");
}

/// The commands the server ran since the last reset, by name, without the
/// test's own INFO and CONFIG RESETSTAT.
fn commands_run(redis: &Server) -> BTreeMap<String, u64> {
    redis
        .info("commandstats")
        .lines()
        .filter_map(|line| {
            let (name, stats) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = stats.split(',').find_map(|f| f.strip_prefix("calls="))?.parse().ok()?;
            (!matches!(name, "info" | "config|resetstat")).then(|| (name.to_string(), calls))
        })
        .collect()
}

#[tokio::test]
async fn a_request_sends_one_allow_per_limit_and_nothing_else() {
    let redis = Server::start();
    let one = serve(
        RateLimitLayer::new(
            limiter(&redis).await,
            [HttpLimit::new(Duration::from_secs(60), 1000).name("one")],
        )
        .unwrap(),
    )
    .await;
    let two = serve(
        RateLimitLayer::new(
            limiter(&redis).await,
            [
                HttpLimit::new(Duration::from_secs(60), 1000).name("a"),
                HttpLimit::new(Duration::from_secs(3600), 1000).name("b"),
            ],
        )
        .unwrap(),
    )
    .await;
    // The connections' own setup (CLIENT SETINFO, HELLO) is before the count.
    assert_eq!(get_from(one, "127.0.0.31", "/", &[]).await.status, 200);
    assert_eq!(get_from(two, "127.0.0.31", "/", &[]).await.status, 200);
    redis.reset_stats();
    for _ in 0..20 {
        assert_eq!(get_from(one, "127.0.0.32", "/", &[]).await.status, 200);
    }
    assert_eq!(commands_run(&redis), BTreeMap::from([("xcloak.allow".to_string(), 20)]));
    redis.reset_stats();
    for _ in 0..20 {
        assert_eq!(get_from(two, "127.0.0.33", "/", &[]).await.status, 200);
    }
    assert_eq!(commands_run(&redis), BTreeMap::from([("xcloak.allow".to_string(), 40)]));
}

#[tokio::test]
async fn the_error_policy_answers_a_paused_and_a_stopped_server() {
    let mut redis = Server::start();
    let raise = Limiter::builder(redis::aio::ConnectionManager::new(redis.client()).await.unwrap())
        .timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    let limit = || [HttpLimit::new(Duration::from_secs(60), 100).name("api")];
    let raising = serve(RateLimitLayer::new(raise.clone(), limit()).unwrap()).await;
    let open = serve(RateLimitLayer::new(raise.with_on_error(ErrorPolicy::Allow), limit()).unwrap()).await;
    let closed = serve(RateLimitLayer::new(raise.with_on_error(ErrorPolicy::Deny), limit()).unwrap()).await;
    assert_eq!(get_from(open, "127.0.0.8", "/", &[]).await.status, 200);
    for (stop, what) in [(false, "paused"), (true, "stopped")] {
        if stop {
            redis.stop();
        } else {
            redis.pause();
        }
        let r = get_from(raising, "127.0.0.8", "/", &[]).await;
        assert_eq!(r.status, 500, "{what}: raise lets the framework answer");
        assert!(r.body.starts_with("raised: xcloak unavailable"), "{what}: {}", r.body);
        let r = get_from(open, "127.0.0.8", "/", &[]).await;
        assert_eq!(
            (r.status, r.body.as_str()),
            (200, "ok"),
            "{what}: allow serves the request"
        );
        assert!(!r.headers.contains_key("ratelimit"), "{what}: without headers");
        let r = get_from(closed, "127.0.0.8", "/", &[]).await;
        assert_eq!(r.status, 503, "{what}: deny");
        if !stop {
            redis.resume();
        }
    }
}

#[tokio::test]
async fn a_bad_limit_is_raised_whatever_the_policy() {
    let redis = Server::start();
    let open = limiter(&redis).await.with_on_error(ErrorPolicy::Allow);
    let app =
        serve(RateLimitLayer::new(open, [HttpLimit::new(Duration::from_secs(60), 2_000_000).name("api")]).unwrap())
            .await;
    let r = get_from(app, "127.0.0.9", "/", &[]).await;
    assert_eq!(
        (r.status, r.body.as_str()),
        (500, "raised: ERR limit must be an integer from 0 to 1000000")
    );
}

#[tokio::test]
async fn keys_from_a_header_and_from_behind_trusted_proxies() {
    let redis = Server::start();
    let by_header = serve(
        RateLimitLayer::new(
            limiter(&redis).await,
            [HttpLimit::new(Duration::from_secs(60), 5).name("key")],
        )
        .unwrap()
        .key(HeaderKey::new("x-api-key")),
    )
    .await;
    assert_eq!(
        get_from(by_header, "127.0.0.10", "/", &[("x-api-key", "k-1")])
            .await
            .status,
        200
    );
    assert_eq!(
        get_from(by_header, "127.0.0.11", "/", &[("x-api-key", "k-1")])
            .await
            .status,
        200
    );
    assert_eq!(redis.entries("rl:key:k-1"), 2, "one key across addresses");
    let r = get_from(by_header, "127.0.0.10", "/", &[]).await;
    assert_eq!(r.status, 500, "no key: the layer raises");
    assert!(r.body.contains("no x-api-key header"), "{}", r.body);

    let proxied = PeerIp::new().trust_proxies(["127.0.0.0/8"]).unwrap();
    let behind = serve(
        RateLimitLayer::new(
            limiter(&redis).await,
            [HttpLimit::new(Duration::from_secs(60), 5).name("ip")],
        )
        .unwrap()
        .key(proxied),
    )
    .await;
    let forwarded = [("x-forwarded-for", "198.51.100.1, 203.0.113.5")];
    assert_eq!(get_from(behind, "127.0.0.12", "/", &forwarded).await.status, 200);
    assert_eq!(redis.entries("rl:ip:203.0.113.5"), 1, "the rightmost untrusted address");
    // Not behind the trusted proxy list: the header is ignored.
    let direct = serve(
        RateLimitLayer::new(
            limiter(&redis).await,
            [HttpLimit::new(Duration::from_secs(60), 5).name("ip2")],
        )
        .unwrap()
        .key(peer()),
    )
    .await;
    assert_eq!(get_from(direct, "127.0.0.13", "/", &forwarded).await.status, 200);
    assert_eq!(redis.entries("rl:ip2:127.0.0.13"), 1);
}

/// The inner service of the hyper test: 200 "hello".
#[derive(Clone)]
struct Hello;

impl tower::Service<http::Request<hyper::body::Incoming>> for Hello {
    type Response = http::Response<http_body_util::Full<bytes::Bytes>>;
    type Error = std::convert::Infallible;
    type Future = std::future::Ready<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: http::Request<hyper::body::Incoming>) -> Self::Future {
        std::future::ready(Ok(http::Response::new(http_body_util::Full::new(
            bytes::Bytes::from_static(b"hello"),
        ))))
    }
}

/// The same layer under plain hyper (no axum): the connection loop puts the
/// peer's address where `PeerIp::new()` reads it, a `SocketAddr` extension.
#[tokio::test]
async fn the_layer_serves_plain_hyper() {
    use tower::Layer;
    let redis = Server::start();
    let layer = RateLimitLayer::new(limiter(&redis).await, [HttpLimit::new(Duration::from_secs(60), 1)]).unwrap();
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", support::free_port()))
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (stream, peer) = listener.accept().await.unwrap();
            let service = layer.layer(Hello);
            let with_peer =
                tower::ServiceBuilder::new().map_request(move |mut request: http::Request<hyper::body::Incoming>| {
                    request.extensions_mut().insert(peer);
                    request
                });
            let service = hyper_util::service::TowerToHyperService::new(with_peer.service(service));
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service),
            );
        }
    });
    let r = get_from(addr, "127.0.0.14", "/", &[]).await;
    assert_eq!(
        (r.status, r.body.as_str(), r.headers["ratelimit"].as_str()),
        (200, "hello", r#""1-in-60s";r=0;t=60"#)
    );
    let r = get_from(addr, "127.0.0.14", "/", &[]).await;
    assert_eq!(r.status, 429);
    assert_eq!(redis.entries("rl:http:127.0.0.14"), 1);
}

#[tokio::test]
async fn a_cached_rejection_answers_429_with_the_same_headers_and_no_call() {
    let redis = Server::start();
    let limit = HttpLimit::new(Duration::from_secs(60), 2)
        .name("bc")
        .tier(Duration::from_secs(3600), 10);
    let limiter = limiter(&redis).await;
    let app = serve(RateLimitLayer::new(limiter.clone(), [limit]).unwrap()).await;
    for _ in 0..2 {
        assert_eq!(get_from(app, "127.0.0.41", "/", &[]).await.status, 200);
    }
    let server = get_from(app, "127.0.0.41", "/", &[]).await;
    let calls = redis.calls("xcloak.allow");
    let cached = get_from(app, "127.0.0.41", "/", &[]).await;
    assert_eq!(redis.calls("xcloak.allow"), calls, "the cached rejection sent a call");
    assert_eq!(limiter.stats().cache_hits, 1);
    assert_eq!((server.status, cached.status), (429, 429));
    assert_eq!(cached.body, server.body);
    let names = |r: &Reply| r.headers.keys().filter(|k| *k != "date").cloned().collect::<Vec<_>>();
    assert_eq!(names(&cached), names(&server));
    assert_eq!(cached.headers["ratelimit-policy"], server.headers["ratelimit-policy"]);
    // Retry-After counts down from the server's (whole seconds, rounded up).
    let retry = |r: &Reply| r.headers["retry-after"].parse::<u64>().unwrap();
    assert!((1..=retry(&server)).contains(&retry(&cached)), "{:?}", cached.headers);
    assert!(
        cached.headers["ratelimit"].starts_with(r#""2-in-60s";r=0;t="#),
        "{:?}",
        cached.headers
    );
    // Another client is not blocked by it.
    assert_eq!(get_from(app, "127.0.0.42", "/", &[]).await.status, 200);
}
