//! Rate limiting an HTTP endpoint from Rust with the `xcloak-client` crate
//! (clients/rust), over the `redis` crate.
//!
//! `Limiter::allow` sends `XCLOAK.ALLOW key window limit [TIER w l]... DETAILS`
//! and returns a `Decision`; `Decision::headers` turns it into the response's
//! header fields. Where the server does not have the module (a managed
//! service) it answers "ERR unknown command": the limiter then runs the
//! bundled Lua script instead (EVALSHA, loaded on NOSCRIPT), on the same
//! sorted set, so the switch changes nothing for the key.
//!
//! In cluster mode (`--cluster`) the limiter routes every call to its key's
//! primary itself (`redis::cluster_async`, built by `xcloak_client::cluster_client`
//! with `retries(0)`, so a call that may have run is never sent again).
//! `--peek` asks `XCLOAK.PEEK` (writes nothing) instead; in cluster mode it
//! goes to a replica of the key's primary (`replica_reads`). With
//! `--keys K`, request i uses the key `KEY:<i mod K>`.
//!
//! ```text
//! cargo run -p xcloak-client --features cluster --example ratelimit -- redis://127.0.0.1:6379/ user:42 60000 3 4 [--cluster] [--keys K] [--peek] [--tier WINDOW_MS:LIMIT]...
//! 200 RateLimit-Limit: 3 | RateLimit-Remaining: 2 | RateLimit-Reset: 60 | via command
//! ...
//! 429 RateLimit-Limit: 3 | RateLimit-Remaining: 0 | RateLimit-Reset: 60 | Retry-After: 60 | via command
//! ```
//!
//! Each `--tier WINDOW_MS:LIMIT` adds `TIER window limit` to the call; the
//! lines then carry the IETF `RateLimit-Policy` and `RateLimit` fields, one
//! policy per tier, named by its window (docs/commands.md, "Several tiers"):
//!
//! ```text
//! 200 RateLimit-Policy: "60000ms";q=3;w=60, "3600000ms";q=5;w=3600 | RateLimit: "60000ms";r=2;t=60, "3600000ms";r=4;t=3600 | via command
//! ```

use std::time::Duration;

use xcloak_client::{Decision, Limiter, Request, Style, Transport, Via};

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
    tiers: Vec<(u64, u64)>,
}

const USAGE: &str =
    "usage: ratelimit REDIS_URL KEY WINDOW_MS LIMIT CALLS [--cluster] [--keys K] [--peek] [--tier WINDOW_MS:LIMIT]...";

fn parse_args(args: impl Iterator<Item = String>) -> Result<Options, String> {
    let (mut keys, mut cluster, mut peek, mut positional, mut tiers) = (0, false, false, Vec::new(), Vec::new());
    let mut args = args.peekable();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--cluster" => cluster = true,
            "--peek" => peek = true,
            "--keys" => {
                keys = args
                    .next()
                    .and_then(|k| k.parse().ok())
                    .filter(|&k| k > 0)
                    .ok_or("--keys needs a positive integer")?;
            }
            "--tier" => {
                let tier = args.next().and_then(|t| {
                    t.split_once(':')
                        .and_then(|(w, l)| Some((w.parse().ok()?, l.parse().ok()?)))
                });
                tiers.push(tier.ok_or("--tier needs WINDOW_MS:LIMIT, e.g. --tier 3600000:100")?);
            }
            _ if arg.starts_with("--") => return Err(format!("unknown option {arg}\n{USAGE}")),
            _ => positional.push(arg),
        }
    }
    let [url, key, window_ms, limit, calls] = <[String; 5]>::try_from(positional).map_err(|_| USAGE.to_string())?;
    let number = |name: &str, text: &str| {
        text.parse::<u64>()
            .map_err(|_| format!("{name} must be a non-negative integer, not {text:?}"))
    };
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

/// `200 Name: value | ... | via command`: the status, the header fields in
/// the order a reader expects, and who answered.
fn line(decision: &Decision, tiers: &[(u64, u64)]) -> String {
    let (style, names) = if tiers.is_empty() {
        (
            Style::Legacy,
            vec![
                "RateLimit-Limit",
                "RateLimit-Remaining",
                "RateLimit-Reset",
                "Retry-After",
            ],
        )
    } else {
        (Style::Ietf, vec!["RateLimit-Policy", "RateLimit", "Retry-After"])
    };
    // Each policy named by its window: "60000ms", "3600000ms".
    let policy_names: Vec<String> = decision
        .tiers
        .iter()
        .map(|t| format!("{}ms", t.window.as_millis()))
        .collect();
    let headers = decision.headers_named(style, &policy_names);
    let fields: Vec<String> = names
        .iter()
        .filter_map(|name| headers.get(*name).map(|v| format!("{name}: {}", v.to_str().unwrap())))
        .collect();
    let via = match decision.via {
        Via::Command => "command",
        Via::Script => "script",
        Via::Error => "error",
        Via::Cache => "cache",
    };
    format!(
        "{} {} | via {via}",
        if decision.allowed { 200 } else { 429 },
        fields.join(" | ")
    )
}

async fn run<T: Transport>(limiter: Limiter<T>, options: &Options) -> Result<(), xcloak_client::Error> {
    for i in 0..options.calls {
        let key = if options.keys > 0 {
            format!("{}:{}", options.key, i % options.keys)
        } else {
            options.key.clone()
        };
        let mut request = Request::new(key, Duration::from_millis(options.window_ms), options.limit);
        for &(window_ms, limit) in &options.tiers {
            request = request.tier(Duration::from_millis(window_ms), limit);
        }
        let decision = if options.peek {
            limiter.peek(&request).await?
        } else {
            limiter.allow(&request).await?
        };
        println!("{}", line(&decision, &options.tiers));
    }
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let options = parse_args(std::env::args().skip(1))?;
    if options.cluster {
        // The URL's user and password apply to every node.
        let client = xcloak_client::cluster_client([options.url.as_str()], options.peek).build()?;
        let limiter = Limiter::builder(client.get_async_connection().await?)
            .replica_reads(options.peek)
            .build()?;
        run(limiter, &options).await?;
    } else {
        let conn = redis::Client::open(options.url.as_str())?
            .get_connection_manager()
            .await?;
        run(Limiter::new(conn), &options).await?;
    }
    Ok(())
}
