//! Rate limiting an HTTP endpoint with XCLOAK.ALLOW, from Rust (`redis` crate).
//!
//! Asks `XCLOAK.ALLOW key window limit DETAILS` and turns the five fields into
//! the status and headers of an HTTP response. Where the server does not have
//! the module (a managed service), it answers "ERR unknown command": the
//! limiter then runs the portable Lua script instead (EVALSHA; `redis::Script`
//! loads it and retries when the server answers NOSCRIPT). Both keep the same
//! sorted set, so the switch changes nothing for the key.
//!
//! ```text
//! cargo run --example ratelimit -- redis://127.0.0.1:6379/ user:42 60000 3 4
//! 200 RateLimit-Limit: 3 | RateLimit-Remaining: 2 | RateLimit-Reset: 60 | via command
//! ...
//! 429 RateLimit-Limit: 3 | RateLimit-Remaining: 0 | RateLimit-Reset: 60 | Retry-After: 60 | via command
//! ```

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

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, key, window_ms, limit, calls] = args.as_slice() else {
        return Err("usage: ratelimit REDIS_URL KEY WINDOW_MS LIMIT CALLS".into());
    };
    let mut conn = redis::Client::open(url.as_str())?.get_connection()?;
    let mut limiter = Limiter::new();
    for _ in 0..calls.parse::<u32>()? {
        let (details, via) = limiter.check(&mut conn, key, window_ms.parse()?, limit.parse()?)?;
        let (status, headers) = http_decision(&details);
        let headers: Vec<String> = headers.iter().map(|(name, value)| format!("{name}: {value}")).collect();
        let via = if via == Via::Command { "command" } else { "script" };
        println!("{status} {} | via {via}", headers.join(" | "));
    }
    Ok(())
}
