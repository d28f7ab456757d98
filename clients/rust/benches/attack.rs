//! The attack bench of issue 32 (docs/clients.md, "Block cache"): a
//! credential-stuffing wave through the tower layer in a real axum server on
//! loopback, with the block cache on and off in the same run, against one
//! redis-server with the module (`./bench.sh attack`; not a test: nothing is
//! asserted but the counts, which are exact).
//!
//! - The attack: `ATTACK_IDENTITIES` identities (default 200), limit 10 per
//!   60 s each, each sent `ATTACK_ROUNDS` requests (default 1,000: 100x its
//!   limit), round-robin over the identities, keyed by an `x-id` header.
//! - Legitimate traffic beside it: `LEGIT_IDENTITIES` others (default 200),
//!   5 requests each (half their limit), spread evenly through the attack.
//! - `CONNECTIONS` keep-alive HTTP/1.1 connections (default 16) share the
//!   schedule in order. Each mode uses its own keys (`rl:on:*`, `rl:off:*`).
//!
//! The schedule runs in slices (`SLICES`, default 20), each served in turn
//! by the route without the layer, the layer with the cache off, and with it
//! on, in a rotating order, so a burst of the machine's load falls on all
//! three alike. Per mode: Redis calls per request and per attack request (INFO
//! commandstats `cmdstat_xcloak.allow` calls), server CPU per request
//! (commandstats usec, and the process's used_cpu_user + used_cpu_sys),
//! requests per second, p50 / p99 latency added against the same route
//! without the layer (the same schedule), over-admission (per identity, the
//! 200s seen against the server's own count, `ZCARD`, and against the
//! limit), legitimate requests rejected.
//!
//! Then, in the same process: a cached rejection (`Limiter::allow` on a
//! blocked key, cache on) against a server round trip (the same call with
//! the cache off), and the cache's memory per entry (100,000 entries, a
//! counting global allocator: the bytes freed when the limiter is dropped).
//! `XCLOAK_ATTACK_JSON=PATH` also writes the figures there, as JSON.
#[path = "../tests/support/mod.rs"]
mod support;

use std::alloc::{GlobalAlloc, Layout, System};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::{Duration, Instant};

use axum::routing::get;
use axum::Router;
use redis::aio::MultiplexedConnection;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use xcloak_client::tower::{HeaderKey, HttpLimit, RateLimitLayer};
use xcloak_client::{Limiter, Request, Via};

/// Counts the bytes live on the heap (the memory per entry section).
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every method forwards to the system allocator with the caller's
// arguments, unchanged; the counter is only arithmetic beside it.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's contract for `alloc` is System's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: `ptr` was allocated by `alloc` above, that is by System, with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(new_size as isize - layout.size() as isize, Ordering::Relaxed);
        // SAFETY: `ptr` was allocated by System with `layout`; the caller's contract is System's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const LIMIT: u64 = 10;
const WINDOW: Duration = Duration::from_secs(60);

fn env(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

#[derive(Clone, Copy)]
enum Who {
    Attack(usize),
    Legit(usize),
}

/// The attack round-robin, the legitimate requests spread evenly through it.
fn schedule(attackers: usize, rounds: usize, legit: usize, per_legit: usize) -> Vec<Who> {
    let attack = attackers * rounds;
    let legit_total = legit * per_legit;
    let mut out = Vec::with_capacity(attack + legit_total);
    let mut next_legit = 0;
    for i in 0..attack {
        while next_legit < legit_total && next_legit * attack / legit_total.max(1) <= i {
            out.push(Who::Legit(next_legit % legit));
            next_legit += 1;
        }
        out.push(Who::Attack(i % attackers));
    }
    out
}

async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", support::free_port()))
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

fn app() -> Router {
    Router::new().route("/", get(|| async { "ok" }))
}

async fn limited(limiter: Limiter<MultiplexedConnection>, name: &str) -> SocketAddr {
    let layer = RateLimitLayer::new(limiter, [HttpLimit::new(WINDOW, LIMIT).name(name)])
        .unwrap()
        .key(HeaderKey::new("x-id"));
    serve(
        app().layer(
            tower::ServiceBuilder::new()
                .layer(axum::error_handling::HandleErrorLayer::new(|_: axum::BoxError| async {
                    axum::http::StatusCode::INTERNAL_SERVER_ERROR
                }))
                .layer(layer),
        ),
    )
    .await
}

/// One response: who sent it, its status, its latency in microseconds.
type Outcome = (Who, u16, f64);

/// The schedule over `connections` keep-alive connections, each taking every
/// `connections`-th request in order.
async fn drive(addr: SocketAddr, plan: &[Who], connections: usize, tag: &str) -> (Vec<Outcome>, Duration) {
    let plan = std::sync::Arc::new(plan.to_vec());
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..connections {
        let (plan, tag) = (plan.clone(), tag.to_string());
        tasks.push(tokio::spawn(async move {
            let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
            stream.set_nodelay(true).unwrap();
            let mut stream = BufReader::new(stream);
            let mut out = Vec::with_capacity(plan.len() / connections + 1);
            let mut line = String::new();
            for who in plan.iter().skip(c).step_by(connections) {
                let id = match who {
                    Who::Attack(i) => format!("{tag}a{i}"),
                    Who::Legit(i) => format!("{tag}l{i}"),
                };
                let sent = Instant::now();
                stream
                    .get_mut()
                    .write_all(format!("GET / HTTP/1.1\r\nHost: bench\r\nx-id: {id}\r\n\r\n").as_bytes())
                    .await
                    .unwrap();
                let (mut status, mut length) = (0u16, 0usize);
                loop {
                    line.clear();
                    stream.read_line(&mut line).await.unwrap();
                    if line == "\r\n" {
                        break;
                    }
                    if let Some(rest) = line.strip_prefix("HTTP/1.1 ") {
                        status = rest[..3].parse().unwrap();
                    } else if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length: ") {
                        length = v.trim().parse().unwrap();
                    }
                }
                let mut body = vec![0; length];
                stream.read_exact(&mut body).await.unwrap();
                out.push((*who, status, sent.elapsed().as_secs_f64() * 1e6));
            }
            out
        }));
    }
    let mut outcomes = Vec::with_capacity(plan.len());
    for task in tasks {
        outcomes.extend(task.await.unwrap());
    }
    (outcomes, started.elapsed())
}

fn latencies(outcomes: &[Outcome]) -> Vec<f64> {
    let mut v: Vec<f64> = outcomes.iter().map(|o| o.2).collect();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v
}

/// `used_cpu_user + used_cpu_sys` of the server, in microseconds.
fn server_cpu_us(server: &support::Server) -> f64 {
    let info = server.info("cpu");
    let f = |name| support::field(&info, name).unwrap().parse::<f64>().unwrap();
    (f("used_cpu_user") + f("used_cpu_sys")) * 1e6
}

/// (calls, usec) of `cmdstat_xcloak.allow`.
fn allow_stats(server: &support::Server) -> (u64, u64) {
    let info = server.info("commandstats");
    let line = info
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_xcloak.allow:"))
        .unwrap_or("calls=0,usec=0");
    let field = |name: &str| {
        line.split(',')
            .find_map(|f| f.strip_prefix(name))
            .map_or(0, |v| v.parse().unwrap())
    };
    (field("calls="), field("usec="))
}

struct Params {
    attackers: usize,
    rounds: usize,
    legit: usize,
    per_legit: usize,
    connections: usize,
}

/// What one way of serving the schedule gave, summed over its slices.
#[derive(Default)]
struct Tally {
    outcomes: Vec<Outcome>,
    elapsed: Duration,
    /// `cmdstat_xcloak.allow` calls and usec, and the server process's CPU (us).
    calls: u64,
    usec: u64,
    cpu: f64,
}

/// Serves `slice` through `addr` and adds it to `tally`, with the server's
/// counters taken before and after (the slices of the three ways run one at
/// a time, so each delta is that way's).
async fn run_slice(server: &support::Server, addr: SocketAddr, slice: &[Who], connections: usize, tally: &mut Tally) {
    let (calls, usec) = allow_stats(server);
    let cpu = server_cpu_us(server);
    let (outcomes, elapsed) = drive(addr, slice, connections, "").await;
    let (calls_after, usec_after) = allow_stats(server);
    tally.cpu += server_cpu_us(server) - cpu;
    tally.calls += calls_after - calls;
    tally.usec += usec_after - usec;
    tally.elapsed += elapsed;
    tally.outcomes.extend(outcomes);
}

/// The table's column for one way (`name` the limit's name, its keys'
/// `rl:<name>:*`), `bare` the latencies of the route without the layer.
fn column(
    server: &support::Server,
    name: &str,
    tally: &Tally,
    limiter: &Limiter<MultiplexedConnection>,
    p: &Params,
    bare: &[f64],
) -> (Vec<String>, serde_json::Value) {
    let outcomes = &tally.outcomes;
    let requests = outcomes.len() as f64;
    let attack_requests = (p.attackers * p.rounds) as f64;
    let legit_requests = (p.legit * p.per_legit) as u64;
    let mut admitted = vec![0u64; p.attackers];
    let (mut attack_rejected, mut legit_rejected) = (0u64, 0u64);
    let mut other = std::collections::BTreeMap::<u16, u64>::new();
    for (who, status, _) in outcomes {
        match (who, status) {
            (Who::Attack(i), 200) => admitted[*i] += 1,
            (Who::Attack(_), 429) => attack_rejected += 1,
            (Who::Legit(_), 200) => {}
            (Who::Legit(_), 429) => legit_rejected += 1,
            // 500: the layer's error (ErrorPolicy::Raise), the limiter's 1 s timeout.
            (_, status) => *other.entry(*status).or_default() += 1,
        }
    }
    // Over-admission, against the server's own count of each window.
    let mut check = server.conn();
    let (mut over, mut mismatched) = (0u64, 0u64);
    for (i, seen) in admitted.iter().enumerate() {
        let held: u64 = redis::cmd("ZCARD")
            .arg(format!("rl:{name}:a{i}"))
            .query(&mut check)
            .unwrap();
        over += held.max(*seen).saturating_sub(LIMIT);
        mismatched += u64::from(held != *seen);
    }
    let stats = limiter.stats();
    let lat = latencies(outcomes);
    let (p50, p99) = (percentile(&lat, 0.5), percentile(&lat, 0.99));
    let (b50, b99) = (percentile(bare, 0.5), percentile(bare, 0.99));
    let attack_calls = tally.calls.saturating_sub(legit_requests) as f64 / attack_requests;
    let json = serde_json::json!({
        "calls_per_request": tally.calls as f64 / requests,
        "calls_per_attack_request": attack_calls,
        "cache_answered_share": stats.cache_hits as f64 / attack_rejected.max(1) as f64,
        "server_usec_per_request": tally.usec as f64 / requests,
        "server_process_usec_per_request": tally.cpu / requests,
        "rps": requests / tally.elapsed.as_secs_f64(),
        "p50_ms": (p50 - b50) / 1000.0,
        "p99_ms": (p99 - b99) / 1000.0,
        "overadmitted": over,
        "legit_rejected": legit_rejected,
        "other_statuses": other.values().sum::<u64>(),
    });
    let column = vec![
        format!("{:.4}", tally.calls as f64 / requests),
        format!("{attack_calls:.4}"),
        format!(
            "{:.1}% ({} of {attack_rejected})",
            100.0 * stats.cache_hits as f64 / attack_rejected.max(1) as f64,
            stats.cache_hits
        ),
        format!("{:.3}", tally.usec as f64 / requests),
        format!("{:.2}", tally.cpu / requests),
        format!("{:.0}", requests / tally.elapsed.as_secs_f64()),
        format!("{p50:.0} / {p99:.0} ({:+.0} / {:+.0})", p50 - b50, p99 - b99),
        format!("{over} ({mismatched} windows differ from the 200s seen)"),
        format!("{legit_rejected} of {legit_requests}"),
        format!("{other:?}"),
        format!("{:.1}", tally.elapsed.as_secs_f64()),
    ];
    (column, json)
}

/// Microseconds per `allow` on a key that is blocked: answered by the
/// cache (`cached`), or by the server (a limiter with the cache off).
async fn cached_against_round_trip(server: &support::Server) -> (f64, f64) {
    let conn = server.client().get_multiplexed_async_connection().await.unwrap();
    let on = Limiter::new(conn.clone());
    let off = Limiter::builder(conn).block_cache(0).build().unwrap();
    let request = Request::new("blocked", WINDOW, 1);
    on.allow(&request).await.unwrap();
    assert_eq!(on.allow(&request).await.unwrap().via, Via::Command);
    let (mut cached, mut sent) = (Vec::new(), Vec::new());
    for _ in 0..5 {
        let n = 100_000;
        let started = Instant::now();
        for _ in 0..n {
            let d = on.allow(&request).await.unwrap();
            assert_eq!(d.via, Via::Cache);
        }
        cached.push(started.elapsed().as_secs_f64() * 1e6 / n as f64);
        let n = 2_000;
        let started = Instant::now();
        for _ in 0..n {
            let d = off.allow(&request).await.unwrap();
            assert_eq!(d.via, Via::Command);
        }
        sent.push(started.elapsed().as_secs_f64() * 1e6 / n as f64);
    }
    cached.sort_by(|a, b| a.partial_cmp(b).unwrap());
    sent.sort_by(|a, b| a.partial_cmp(b).unwrap());
    (cached[2], sent[2])
}

/// Bytes per entry of a limiter's cache holding `entries` rejections of
/// 24-byte keys (with `tiers` tiers after the positional one): the bytes
/// freed when the limiter, and so its cache, is dropped.
async fn memory_per_entry(server: &support::Server, entries: usize, tiers: usize) -> f64 {
    let conn = server.client().get_multiplexed_async_connection().await.unwrap();
    let request = move |i: usize| {
        let mut r = Request::new(format!("memory:{tiers}:{i:015}"), WINDOW, 1);
        for t in 0..tiers {
            r = r.tier(WINDOW * (t as u32 + 2), 5);
        }
        r
    };
    assert_eq!(request(0).key.len(), 24);
    // Fill every window first (pipelined), so each limiter call is a rejection.
    for chunk in (0..entries).collect::<Vec<_>>().chunks(1000) {
        let mut pipe = redis::pipe();
        for &i in chunk {
            pipe.add_command(request(i).allow_command().unwrap()).ignore();
        }
        let _: () = pipe.query_async(&mut conn.clone()).await.unwrap();
    }
    let limiter = Limiter::builder(conn.clone()).block_cache(entries).build().unwrap();
    let tasks: Vec<_> = (0..16)
        .map(|t| {
            let limiter = limiter.clone();
            tokio::spawn(async move {
                for i in (t..entries).step_by(16) {
                    assert_eq!(limiter.allow(&request(i)).await.unwrap().via, Via::Command);
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(limiter.stats().cache_entries, entries);
    let before = LIVE.load(Ordering::SeqCst);
    drop(limiter);
    let freed = before - LIVE.load(Ordering::SeqCst);
    freed as f64 / entries as f64
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let p = Params {
        attackers: env("ATTACK_IDENTITIES", 200),
        rounds: env("ATTACK_ROUNDS", 1000),
        legit: env("LEGIT_IDENTITIES", 200),
        per_legit: 5,
        connections: env("CONNECTIONS", 16),
    };
    let server = support::Server::start();
    println!(
        "xcloak-client attack bench: server {:?}, module {}",
        support::server_version(),
        support::module_path().display()
    );
    println!(
        "{} attack identities x {} requests (limit {LIMIT} per {}s: {}x), {} legitimate identities x {} requests, {} connections",
        p.attackers,
        p.rounds,
        WINDOW.as_secs(),
        p.rounds as u64 / LIMIT,
        p.legit,
        p.per_legit,
        p.connections
    );
    let plan = schedule(p.attackers, p.rounds, p.legit, p.per_legit);
    let bare_addr = serve(app()).await;
    let mut limiters = Vec::new();
    for block_cache in [0, 10_000] {
        let conn = server.client().get_multiplexed_async_connection().await.unwrap();
        limiters.push(Limiter::builder(conn).block_cache(block_cache).build().unwrap());
    }
    let (off, on) = (limiters[0].clone(), limiters[1].clone());
    let ways = [
        bare_addr,
        limited(off.clone(), "off").await,
        limited(on.clone(), "on").await,
    ];
    // Warm up every server and connection path once (keys of their own).
    for addr in ways {
        drive(addr, &plan[..2000.min(plan.len())], p.connections, "w").await;
    }
    // The schedule in slices, each served by the three ways in a rotating
    // order: a burst of the machine's load falls on all three alike.
    let slices = env("SLICES", 20);
    let mut tallies: [Tally; 3] = Default::default();
    let started = Instant::now();
    for s in 0..slices {
        let slice = &plan[s * plan.len() / slices..(s + 1) * plan.len() / slices];
        for k in 0..3 {
            let way = (s + k) % 3;
            run_slice(&server, ways[way], slice, p.connections, &mut tallies[way]).await;
        }
    }
    // Every identity's admissions must still be in its window when counted.
    let spent = started.elapsed();
    println!(
        "the slices took {:.1} s{}",
        spent.as_secs_f64(),
        if spent >= WINDOW {
            ": longer than the window, so a window may have slid and admitted again (not over-admission): scale down"
        } else {
            ", inside one window"
        }
    );
    let bare = latencies(&tallies[0].outcomes);
    println!(
        "without the layer: {:.0} requests/s, p50 {:.0} us, p99 {:.0} us",
        bare.len() as f64 / tallies[0].elapsed.as_secs_f64(),
        percentile(&bare, 0.5),
        percentile(&bare, 0.99)
    );
    let (off, off_json) = column(&server, "off", &tallies[1], &off, &p, &bare);
    let (on, on_json) = column(&server, "on", &tallies[2], &on, &p, &bare);
    let rows = [
        "Redis calls per request",
        "Redis calls per attack request",
        "attack rejections answered by the cache",
        "server CPU per request, commandstats (us)",
        "server CPU per request, process (us)",
        "requests per second",
        "latency p50 / p99 (us), and added to the route's without the layer",
        "over-admission",
        "legitimate requests rejected",
        "other statuses (status: count)",
        "time serving (s)",
    ];
    println!("\n| | cache off | cache on |\n|---|---|---|");
    for (i, row) in rows.iter().enumerate() {
        println!("| {row} | {} | {} |", off[i], on[i]);
    }
    let (cached, sent) = cached_against_round_trip(&server).await;
    println!(
        "\nallow on a blocked key, one in flight: cached {:.3} us, server round trip {:.1} us: {:.4}x",
        cached,
        sent,
        cached / sent
    );
    let mut bytes = Vec::new();
    for tiers in [0, 2] {
        bytes.push(memory_per_entry(&server, 100_000, tiers).await);
        println!(
            "memory per entry, 24-byte key, {tiers} tiers after the positional one: {:.0} bytes (100,000 entries)",
            bytes[bytes.len() - 1]
        );
    }
    // The figures in the shape every package's attack bench writes
    // (scripts/bench's block-cache section reads them).
    if let Ok(path) = std::env::var("XCLOAK_ATTACK_JSON") {
        let shell = |cmd: &str| {
            let out = std::process::Command::new("sh").args(["-c", cmd]).output().unwrap();
            String::from_utf8_lossy(&out.stdout).trim().to_string()
        };
        let out = serde_json::json!({
            "package": "rust",
            "middleware": "xcloak_client::tower::RateLimitLayer (axum 0.8, hyper 1)",
            "when": shell("date -u +%Y-%m-%dT%H:%M:%SZ"),
            "load": shell("cut -d' ' -f1 /proc/loadavg").parse::<f64>().unwrap_or(-1.0),
            "scale": {
                "identities": p.attackers,
                "attack_per_identity": p.rounds,
                "legit_identities": p.legit,
                "legit_per_identity": p.per_legit,
                "requests": plan.len(),
                "rounds": 1,
                "slices": slices,
                "connections": p.connections,
            },
            "on": on_json,
            "off": off_json,
            "cached_ns": cached * 1000.0,
            "roundtrip_ns": sent * 1000.0,
            "cached_vs_roundtrip": cached / sent,
            "bytes_per_entry": bytes[0],
            "bytes_per_entry_2_tiers": bytes[1],
        });
        std::fs::write(&path, serde_json::to_string_pretty(&out).unwrap()).unwrap();
        println!("written to {path}");
    }
}
