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
//! cargo run --example ratelimit -- redis://127.0.0.1:6379/ user:42 60000 3 4 [--cluster] [--keys K] [--peek]
//! 200 RateLimit-Limit: 3 | RateLimit-Remaining: 2 | RateLimit-Reset: 60 | via command
//! ...
//! 429 RateLimit-Limit: 3 | RateLimit-Remaining: 0 | RateLimit-Reset: 60 | Retry-After: 60 | via command
//! ```

use redis::cluster::{ClusterClient, ClusterConnection};
use redis::cluster_routing::{get_slot, Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{ConnectionLike, ErrorKind, RedisError, RedisResult, Script};

/// The portable fallback, compiled into the binary.
const FALLBACK_LUA: &str = include_str!("../../../src/lua/xcloak_allow.lua");

/// The reply of `XCLOAK.ALLOW ... DETAILS` (times in milliseconds).
#[derive(Debug)]
pub struct Details {
    pub allowed: bool,
    pub limit: i64,
    pub remaining: i64,
    /// 0 if allowed, -1 if the request can never fit (cost > limit).
    pub retry_after_ms: i64,
    pub reset_after_ms: i64,
}

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

    /// One request against `key`: at most `limit` per `window_ms`.
    pub fn check(&mut self, conn: &mut impl ConnectionLike, key: &str, window_ms: u64, limit: u64) -> RedisResult<(Details, Via)> {
        if self.via == Via::Command {
            let reply = redis::cmd("XCLOAK.ALLOW").arg(key).arg(window_ms).arg(limit).arg("DETAILS").query(conn);
            match reply {
                Ok(fields) => return Ok((details(fields), Via::Command)),
                // No module on this server: use the script from now on.
                Err(error) if is_unknown_command(&error) => self.via = Via::Script,
                Err(error) => return Err(error),
            }
        }
        let fields = self.script.key(key).arg(window_ms).arg(limit).arg("DETAILS").invoke(conn)?;
        Ok((details(fields), Via::Script))
    }
}

impl Default for Limiter {
    fn default() -> Self {
        Self::new()
    }
}

/// `XCLOAK.PEEK key window limit` on one server.
pub fn peek(conn: &mut impl ConnectionLike, key: &str, window_ms: u64, limit: u64) -> RedisResult<Details> {
    Ok(details(peek_cmd(key, window_ms, limit).query(conn)?))
}

/// `XCLOAK.PEEK` in cluster mode, on a replica of the key's primary (the
/// primary if the slot has none).
pub fn peek_replica(conn: &mut ClusterConnection, key: &str, window_ms: u64, limit: u64) -> RedisResult<Details> {
    let route = Route::new(get_slot(key.as_bytes()), SlotAddr::ReplicaOptional);
    let reply = conn.route_command(&peek_cmd(key, window_ms, limit), RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route)))?;
    Ok(details(redis::from_redis_value(&reply)?))
}

fn peek_cmd(key: &str, window_ms: u64, limit: u64) -> redis::Cmd {
    let mut cmd = redis::cmd("XCLOAK.PEEK");
    cmd.arg(key).arg(window_ms).arg(limit);
    cmd
}

fn details(fields: [i64; 5]) -> Details {
    let [allowed, limit, remaining, retry_after_ms, reset_after_ms] = fields;
    Details { allowed: allowed == 1, limit, remaining, retry_after_ms, reset_after_ms }
}

fn is_unknown_command(error: &RedisError) -> bool {
    error.kind() == ErrorKind::ResponseError && error.detail().is_some_and(|d| d.starts_with("unknown command"))
}

/// Status and headers of the HTTP response (draft-ietf-httpapi-ratelimit-headers
/// style; delta-seconds, rounded up so a client never comes back too early).
pub fn http_decision(details: &Details) -> (u16, Vec<(&'static str, String)>) {
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

/// The command line: URL KEY WINDOW_MS LIMIT CALLS [--cluster] [--keys K] [--peek].
struct Options {
    url: String,
    key: String,
    window_ms: u64,
    limit: u64,
    calls: u64,
    keys: u64,
    cluster: bool,
    peek: bool,
}

const USAGE: &str = "usage: ratelimit REDIS_URL KEY WINDOW_MS LIMIT CALLS [--cluster] [--keys K] [--peek]";

fn parse_args(args: impl Iterator<Item = String>) -> Result<Options, String> {
    let (mut keys, mut cluster, mut peek, mut positional) = (0, false, false, Vec::new());
    let mut args = args.peekable();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--cluster" => cluster = true,
            "--peek" => peek = true,
            "--keys" => {
                keys = args.next().and_then(|k| k.parse().ok()).filter(|&k| k > 0).ok_or("--keys needs a positive integer")?;
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
    let (window_ms, limit) = (options.window_ms, options.limit);
    for i in 0..options.calls {
        let key = if options.keys > 0 { format!("{}:{}", options.key, i % options.keys) } else { options.key.clone() };
        let (details, via) = match (&mut conn, options.peek) {
            (Conn::Single(c), false) => limiter.check(c, &key, window_ms, limit)?,
            (Conn::Cluster(c), false) => limiter.check(c, &key, window_ms, limit)?,
            (Conn::Single(c), true) => (peek(c, &key, window_ms, limit)?, Via::Command),
            (Conn::Cluster(c), true) => (peek_replica(c, &key, window_ms, limit)?, Via::Command),
        };
        let (status, headers) = http_decision(&details);
        let headers: Vec<String> = headers.iter().map(|(name, value)| format!("{name}: {value}")).collect();
        let via = if via == Via::Command { "command" } else { "script" };
        println!("{status} {} | via {via}", headers.join(" | "));
    }
    Ok(())
}
