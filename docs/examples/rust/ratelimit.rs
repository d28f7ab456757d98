//! Rate limiting an HTTP endpoint with XCLOAK.ALLOW, from Rust (`redis` crate).
//!
//! Asks `XCLOAK.ALLOW key window limit DETAILS` and turns the five fields into
//! the status and headers of an HTTP response. Where the server does not have
//! the module (a managed service), it answers "ERR unknown command": the
//! limiter then runs the portable Lua script instead (EVALSHA; `redis::Script`
//! loads it and retries when the server answers NOSCRIPT). Both keep the same
//! sorted set, so the switch changes nothing for the key.
//!
//! In cluster mode (`--cluster`, the crate's `ClusterClient`) the crate routes a
//! command it does not know by its first argument, which is the key of every
//! XCLOAK command. `--peek` asks `XCLOAK.PEEK` (writes nothing) instead; in
//! cluster mode it goes to a replica of the key's primary: the client is built
//! with `read_from_replicas()` (its connections send READONLY) and the call is
//! routed explicitly with `route_command` (the crate's list of read-only
//! commands is fixed). With `--keys K`, request i uses the key `KEY:<i mod K>`.
//!
//! ```text
//! cargo run --example ratelimit -- redis://127.0.0.1:6379/ user:42 60000 3 4 [--cluster] [--keys K] [--peek] [--tier WINDOW_MS:LIMIT]...
//! 200 RateLimit-Limit: 3 | RateLimit-Remaining: 2 | RateLimit-Reset: 60 | via command
//! ...
//! 429 RateLimit-Limit: 3 | RateLimit-Remaining: 0 | RateLimit-Reset: 60 | Retry-After: 60 | via command
//! ```
//!
//! Each `--tier WINDOW_MS:LIMIT` adds `TIER window limit` to the call: the
//! reply then has a sixth field, one `[window, limit, remaining,
//! retry_after_ms, reset_after_ms]` per tier, printed as the IETF
//! `RateLimit-Policy` and `RateLimit` fields with one policy per tier, named
//! by its window (docs/commands.md, "Several tiers"):
//!
//! ```text
//! 200 RateLimit-Policy: "60000ms";q=3;w=60, "3600000ms";q=5;w=3600 | RateLimit: "60000ms";r=2;t=60, "3600000ms";r=4;t=3600 | via command
//! ```

use redis::cluster::{ClusterClient, ClusterConnection};
use redis::cluster_routing::{get_slot, Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{ConnectionLike, ErrorKind, RedisError, RedisResult, Script};

/// The portable fallback, compiled into the binary.
const FALLBACK_LUA: &str = include_str!("../../../src/lua/xcloak_allow.lua");

/// The reply of `XCLOAK.ALLOW ... DETAILS` (times in milliseconds): the
/// binding tier's fields, then every tier's.
#[derive(Debug)]
pub struct Details {
    pub allowed: bool,
    pub limit: i64,
    pub remaining: i64,
    /// 0 if allowed, -1 if the request can never fit (cost > limit).
    pub retry_after_ms: i64,
    pub reset_after_ms: i64,
    /// One per tier, in the order given; empty when the call had no `TIER`.
    pub tiers: Vec<TierDetails>,
}

/// One tier of a reply to a call with `TIER`.
#[derive(Debug)]
pub struct TierDetails {
    pub window_ms: i64,
    pub limit: i64,
    pub remaining: i64,
    pub retry_after_ms: i64,
    pub reset_after_ms: i64,
}

/// `TIER window_ms limit`: one more window on the same key, in the same call.
pub type Tier = (u64, u64);

/// What answered: the module's command or the Lua fallback.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Via {
    Command,
    Script,
}

pub struct Limiter {
    script: Script,
    via: Via,
}

impl Limiter {
    pub fn new() -> Self {
        Limiter { script: Script::new(FALLBACK_LUA), via: Via::Command }
    }

    /// One request against `key`: at most `limit` per `window_ms`, and at
    /// most the limit of each of `tiers` per its window.
    pub fn check(&mut self, conn: &mut impl ConnectionLike, key: &str, window_ms: u64, limit: u64, tiers: &[Tier]) -> RedisResult<(Details, Via)> {
        if self.via == Via::Command {
            let reply = redis::cmd("XCLOAK.ALLOW").arg(key).arg(window_ms).arg(limit).arg(tier_args(tiers)).arg("DETAILS").query(conn);
            match reply {
                Ok(reply) => return Ok((details(&reply, tiers)?, Via::Command)),
                // No module on this server: use the script from now on.
                Err(error) if is_unknown_command(&error) => self.via = Via::Script,
                Err(error) => return Err(error),
            }
        }
        let reply = self.script.key(key).arg(window_ms).arg(limit).arg(tier_args(tiers)).arg("DETAILS").invoke(conn)?;
        Ok((details(&reply, tiers)?, Via::Script))
    }
}

impl Default for Limiter {
    fn default() -> Self {
        Self::new()
    }
}

/// `XCLOAK.PEEK key window limit [TIER window limit]...` on one server.
pub fn peek(conn: &mut impl ConnectionLike, key: &str, window_ms: u64, limit: u64, tiers: &[Tier]) -> RedisResult<Details> {
    details(&peek_cmd(key, window_ms, limit, tiers).query(conn)?, tiers)
}

/// `XCLOAK.PEEK` in cluster mode, on a replica of the key's primary (the
/// primary if the slot has none).
pub fn peek_replica(conn: &mut ClusterConnection, key: &str, window_ms: u64, limit: u64, tiers: &[Tier]) -> RedisResult<Details> {
    let route = Route::new(get_slot(key.as_bytes()), SlotAddr::ReplicaOptional);
    let cmd = peek_cmd(key, window_ms, limit, tiers);
    details(&conn.route_command(&cmd, RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route)))?, tiers)
}

fn peek_cmd(key: &str, window_ms: u64, limit: u64, tiers: &[Tier]) -> redis::Cmd {
    let mut cmd = redis::cmd("XCLOAK.PEEK");
    cmd.arg(key).arg(window_ms).arg(limit).arg(tier_args(tiers));
    cmd
}

fn tier_args(tiers: &[Tier]) -> Vec<String> {
    tiers.iter().flat_map(|(window_ms, limit)| ["TIER".to_string(), window_ms.to_string(), limit.to_string()]).collect()
}

/// Five integers, or with `TIER` six fields: the sixth has one
/// `[window, limit, remaining, retry_after_ms, reset_after_ms]` per tier.
fn details(reply: &redis::Value, tiers: &[Tier]) -> RedisResult<Details> {
    let ([allowed, limit, remaining, retry_after_ms, reset_after_ms], per_tier) = if tiers.is_empty() {
        (redis::from_redis_value::<[i64; 5]>(reply)?, Vec::new())
    } else {
        let (a, l, r, retry, reset, per_tier): (i64, i64, i64, i64, i64, Vec<[i64; 5]>) = redis::from_redis_value(reply)?;
        ([a, l, r, retry, reset], per_tier)
    };
    let tiers = per_tier
        .into_iter()
        .map(|[window_ms, limit, remaining, retry_after_ms, reset_after_ms]| TierDetails { window_ms, limit, remaining, retry_after_ms, reset_after_ms })
        .collect();
    Ok(Details { allowed: allowed == 1, limit, remaining, retry_after_ms, reset_after_ms, tiers })
}

fn is_unknown_command(error: &RedisError) -> bool {
    error.kind() == ErrorKind::ResponseError && error.detail().is_some_and(|d| d.starts_with("unknown command"))
}

/// Status and headers of the HTTP response (draft-ietf-httpapi-ratelimit-headers
/// style; delta-seconds, rounded up so a client never comes back too early).
pub fn http_decision(details: &Details) -> (u16, Vec<(&'static str, String)>) {
    if !details.tiers.is_empty() {
        return policy_decision(details);
    }
    let seconds = |ms: i64| ((ms + 999) / 1000).to_string();
    let mut headers = vec![
        ("RateLimit-Limit", details.limit.to_string()),
        ("RateLimit-Remaining", details.remaining.to_string()),
        ("RateLimit-Reset", seconds(details.reset_after_ms)),
    ];
    if details.allowed {
        return (200, headers);
    }
    // -1: this request is larger than the limit and will never fit: no Retry-After.
    if details.retry_after_ms >= 0 {
        headers.push(("Retry-After", seconds(details.retry_after_ms)));
    }
    (429, headers)
}

/// With several tiers, draft-ietf-httpapi-ratelimit-headers-09: one policy per
/// tier in `RateLimit-Policy` (quota, window) and in `RateLimit` (remaining,
/// seconds until it is back), named by its window; `Retry-After` is the
/// binding tier's.
fn policy_decision(details: &Details) -> (u16, Vec<(&'static str, String)>) {
    let seconds = |ms: i64| (ms + 999) / 1000;
    let (mut policies, mut items) = (Vec::new(), Vec::new());
    for tier in &details.tiers {
        let name = format!("\"{}ms\"", tier.window_ms);
        policies.push(format!("{name};q={};w={}", tier.limit, seconds(tier.window_ms)));
        items.push(format!("{name};r={};t={}", tier.remaining, seconds(tier.reset_after_ms)));
    }
    let mut headers = vec![("RateLimit-Policy", policies.join(", ")), ("RateLimit", items.join(", "))];
    if details.allowed {
        return (200, headers);
    }
    // -1: this request is larger than a limit and will never fit: no Retry-After.
    if details.retry_after_ms > 0 {
        headers.push(("Retry-After", seconds(details.retry_after_ms).to_string()));
    }
    (429, headers)
}

/// The command line: URL KEY WINDOW_MS LIMIT CALLS [--cluster] [--keys K] [--peek] [--tier WINDOW_MS:LIMIT]...
struct Options {
    url: String,
    key: String,
    window_ms: u64,
    limit: u64,
    calls: u64,
    keys: u64,
    cluster: bool,
    peek: bool,
    tiers: Vec<Tier>,
}

const USAGE: &str = "usage: ratelimit REDIS_URL KEY WINDOW_MS LIMIT CALLS [--cluster] [--keys K] [--peek] [--tier WINDOW_MS:LIMIT]...";

fn parse_args(args: impl Iterator<Item = String>) -> Result<Options, String> {
    let (mut keys, mut cluster, mut peek, mut positional, mut tiers) = (0, false, false, Vec::new(), Vec::new());
    let mut args = args.peekable();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--cluster" => cluster = true,
            "--peek" => peek = true,
            "--keys" => {
                keys = args.next().and_then(|k| k.parse().ok()).filter(|&k| k > 0).ok_or("--keys needs a positive integer")?;
            }
            "--tier" => {
                let tier = args.next().and_then(|t| t.split_once(':').and_then(|(w, l)| Some((w.parse().ok()?, l.parse().ok()?))));
                tiers.push(tier.ok_or("--tier needs WINDOW_MS:LIMIT, e.g. --tier 3600000:100")?);
            }
            _ if arg.starts_with("--") => return Err(format!("unknown option {arg}\n{USAGE}")),
            _ => positional.push(arg),
        }
    }
    let [url, key, window_ms, limit, calls] = <[String; 5]>::try_from(positional).map_err(|_| USAGE.to_string())?;
    let number = |name: &str, text: &str| text.parse::<u64>().map_err(|_| format!("{name} must be a non-negative integer, not {text:?}"));
    Ok(Options {
        window_ms: number("WINDOW_MS", &window_ms)?,
        limit: number("LIMIT", &limit)?,
        calls: number("CALLS", &calls)?,
        url,
        key,
        keys,
        cluster,
        peek,
        tiers,
    })
}

/// One server, or a cluster (the URL's user and password apply to every node).
enum Conn {
    Single(redis::Connection),
    Cluster(ClusterConnection),
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let options = parse_args(std::env::args().skip(1))?;
    let mut conn = if options.cluster {
        let mut builder = ClusterClient::builder(vec![options.url.as_str()]);
        if options.peek {
            builder = builder.read_from_replicas();
        }
        Conn::Cluster(builder.build()?.get_connection()?)
    } else {
        Conn::Single(redis::Client::open(options.url.as_str())?.get_connection()?)
    };
    let mut limiter = Limiter::new();
    let (window_ms, limit, tiers) = (options.window_ms, options.limit, &options.tiers);
    for i in 0..options.calls {
        let key = if options.keys > 0 { format!("{}:{}", options.key, i % options.keys) } else { options.key.clone() };
        let (details, via) = match (&mut conn, options.peek) {
            (Conn::Single(c), false) => limiter.check(c, &key, window_ms, limit, tiers)?,
            (Conn::Cluster(c), false) => limiter.check(c, &key, window_ms, limit, tiers)?,
            (Conn::Single(c), true) => (peek(c, &key, window_ms, limit, tiers)?, Via::Command),
            (Conn::Cluster(c), true) => (peek_replica(c, &key, window_ms, limit, tiers)?, Via::Command),
        };
        let (status, headers) = http_decision(&details);
        let headers: Vec<String> = headers.iter().map(|(name, value)| format!("{name}: {value}")).collect();
        let via = if via == Via::Command { "command" } else { "script" };
        println!("{status} {} | via {via}", headers.join(" | "));
    }
    Ok(())
}
