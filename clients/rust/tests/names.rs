//! The crate's public surface against names.tsv (the names table of
//! docs/clients.md, helpers' format: concept, name, note), both ways:
//! - every name in names.tsv (and every crate path a note names) is one of
//!   the paths below, each of which this file compiles a use of, so each
//!   exists with that spelling;
//! - every public item of the crate (lib.rs's `pub use`s and modules, the
//!   tower module's items, and the fields, variants and methods of the types
//!   the table is about, read from the sources as text) is named in
//!   names.tsv, or listed in NOT_IN_THE_TABLE with the reason;
//! - the concepts are the table's rows, in order.

use std::collections::BTreeSet;
use std::path::Path;

use redis::aio::ConnectionManager as Cm;
use xcloak_client::tower;
use xcloak_client::*;

/// `path` without whitespace and generic arguments: `Limiter::<Cm>::allow` is `Limiter::allow`.
fn plain(path: &str) -> String {
    let mut out = String::new();
    let mut depth = 0;
    for c in path.chars().filter(|c| !c.is_whitespace()) {
        match c {
            '<' => depth += 1,
            '>' => depth -= 1,
            _ if depth == 0 => out.push(c),
            _ => {}
        }
    }
    out.replace("::::", "::").trim_end_matches("::").to_string()
}

/// Each macro compiles a use of the item and yields its path as written.
macro_rules! item {
    // A method with `impl Trait` arguments: pinned by a function pointer type.
    ($path:path as $fn:ty) => {{
        let _ = $path as $fn;
        plain(stringify!($path))
    }};
    ($($path:tt)+) => {{
        let _ = $($path)+;
        plain(stringify!($($path)+))
    }};
}
macro_rules! ty {
    ($($ty:tt)+) => {{
        let _ = std::mem::size_of::<Option<Box<$($ty)+>>>();
        plain(stringify!($($ty)+))
    }};
}
macro_rules! trait_ {
    ($($tr:tt)+) => {{
        fn _uses(_: &dyn $($tr)+) {}
        plain(stringify!($($tr)+))
    }};
}
macro_rules! field {
    ($($ty:ident)::+ . $field:ident) => {{
        fn _uses(value: &$($ty)::+) { let _ = &value.$field; }
        format!("{}::{}", plain(stringify!($($ty)::+)), stringify!($field))
    }};
}

/// Every path names.tsv may use, each compiled above.
fn surface() -> BTreeSet<String> {
    [
        ty!(Limiter<Cm>),
        ty!(blocking::Limiter),
        item!(Limiter::<Cm>::allow),
        item!(Limiter::<Cm>::peek),
        item!(Limiter::<Cm>::refund),
        item!(Limiter::<Cm>::reset),
        item!(Limiter::<Cm>::acquire),
        item!(Limiter::<Cm>::allow_all),
        item!(Limiter::<Cm>::with_on_error),
        item!(Decision::headers),
        item!(Decision::headers_named::<String>),
        item!(MultiDecision::headers),
        ty!(Decision),
        ty!(MultiDecision),
        ty!(TierState),
        ty!(Request),
        ty!(Refund),
        ty!(Tier),
        field!(Decision.allowed),
        field!(Decision.limit),
        field!(Decision.remaining),
        field!(Decision.retry_after),
        field!(Decision.reset_after),
        field!(Decision.cost_exceeds_limit),
        field!(Decision.window),
        field!(Decision.tier),
        field!(Decision.tiers),
        field!(Decision.stamp),
        field!(Decision.oldest),
        field!(Decision.via),
        field!(Decision.error),
        field!(MultiDecision.decisions),
        item!(MultiDecision::binding),
        field!(MultiDecision.binding_index),
        field!(MultiDecision.rejected),
        item!(Via::Command),
        item!(Via::Script),
        item!(Via::Error),
        item!(Via::Cache),
        item!(Builder::<Cm>::block_cache),
        item!(Limiter::<Cm>::stats),
        ty!(Stats),
        field!(Stats.cache_hits),
        field!(Stats.cache_entries),
        item!(Request::cost),
        item!(Request::tier),
        item!(Request::tiers as fn(Request, Vec<Tier>) -> Request),
        item!(Request::stamp),
        item!(Request::now),
        item!(Request::oldest),
        item!(Refund::cost),
        item!(Builder::<Cm>::prefix as fn(Builder<Cm>, String) -> Builder<Cm>),
        item!(Builder::<Cm>::fallback),
        item!(Builder::<Cm>::on_error),
        item!(Builder::<Cm>::timeout),
        item!(Builder::<Cm>::probe_interval),
        item!(Builder::<Cm>::durable),
        item!(Builder::<Cm>::replica_reads),
        item!(Builder::<Cm>::clock as fn(Builder<Cm>, VirtualClock) -> Builder<Cm>),
        ty!(Durable),
        field!(Durable.replicas),
        field!(Durable.timeout),
        trait_!(Clock),
        item!(ErrorPolicy::Raise),
        item!(ErrorPolicy::Allow),
        item!(ErrorPolicy::Deny),
        item!(Fallback::Auto),
        item!(Fallback::Always),
        item!(Fallback::Never),
        ty!(Style),
        item!(Style::Ietf),
        item!(Style::Legacy),
        item!(Style::Both),
        ty!(Error),
        item!(Error::Server {
            code: String::new(),
            message: String::new()
        })
        .replace("{code:String::new(),message:String::new()}", ""),
        item!(Error::Argument {
            name: String::new(),
            message: String::new()
        })
        .replace("{name:String::new(),message:String::new()}", ""),
        item!(Error::Unavailable),
        ty!(Unavailable),
        ty!(Cause),
        item!(Cause::NotReplicated {
            acknowledged: 0,
            wanted: 0
        })
        .replace("{acknowledged:0,wanted:0}", ""),
        ty!(tower::RateLimitLayer<Cm>),
        ty!(tower::RateLimit<(), Cm, tower::PeerIp>),
        ty!(tower::HttpLimit),
        item!(tower::RateLimitLayer::<Cm>::key::<tower::HeaderKey>),
        trait_!(tower::KeyExtractor),
        ty!(tower::PeerIp),
        ty!(tower::HeaderKey),
        item!(tower::PeerIp::trust_proxies as fn(tower::PeerIp, [&'static str; 1]) -> Result<tower::PeerIp, Error>),
        item!(tower::HttpLimit::skip_successful),
        item!(tower::HttpLimit::skip_failed),
    ]
    .into_iter()
    .collect()
}

/// A clock type for `Builder::clock`'s generic argument.
struct VirtualClock;
impl Clock for VirtualClock {
    fn now_ms(&self) -> u64 {
        0
    }
    fn sleep(&self, _: std::time::Duration) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + '_>> {
        Box::pin(async {})
    }
}

/// Public items that are not a concept of the table, and why.
const NOT_IN_THE_TABLE: &[(&str, &str)] = &[
    ("Limiter::new", "the constructor"),
    ("Limiter::builder", "the constructor of the options (the option rows)"),
    (
        "Limiter::transport",
        "the transport it sends through, Rust-only (Transport)",
    ),
    ("Builder::build", "ends the builder (Rust has no optional arguments)"),
    ("Builder::build_blocking", "ends the builder into a blocking::Limiter"),
    (
        "Builder::random",
        "the random source of acquire's jitter, for tests (the contract's `random`)",
    ),
    (
        "Builder::jitter_fraction",
        "acquire's jitter fraction (docs/clients.md, acquire)",
    ),
    ("redis", "the redis crate, re-exported"),
    (
        "Transport",
        "how the async Limiter sends: one impl per redis connection type, Rust-only",
    ),
    ("Standalone", "a Transport for any single-server redis connection"),
    ("SlotRange", "a cluster's slot map, of Transport"),
    (
        "cluster_client",
        "a redis cluster client set with retries(0) (docs/clients.md, no retry)",
    ),
    (
        "acquire_step",
        "the pure core of acquire, public for callers who drive the commands",
    ),
    ("AcquireStep", "acquire_step's answer"),
    ("Request::new", "the constructor"),
    ("Request::allow_command", "the pure core: the canonical command"),
    ("Request::peek_command", "the pure core: the canonical command"),
    (
        "Request::key",
        "the call's key (a positional argument in every language)",
    ),
    ("Request::window", "the call's window (positional)"),
    ("Request::limit", "the call's limit (positional)"),
    ("Tier::new", "a tier's constructor"),
    ("Tier::window", "a tier's window"),
    ("Tier::limit", "a tier's limit"),
    ("Refund::new", "the constructor: key and stamp (positional)"),
    ("Refund::command", "the pure core: the canonical command"),
    ("Refund::key", "the refund's key (positional)"),
    ("Refund::stamp", "the refund's stamp (positional)"),
    ("Decision::from_reply", "the pure core: a reply into a Decision"),
    (
        "Decision::from_peek_reply",
        "the pure core: a peek's reply into a Decision",
    ),
    ("Decision::from_error", "the pure core: what the error policy answers"),
    (
        "MultiDecision::from_decisions",
        "the pure core: decisions into a MultiDecision",
    ),
    (
        "MultiDecision::allowed",
        "MultiDecision's verdict (docs/clients.md, allow_all)",
    ),
    (
        "MultiDecision::retry_after",
        "the binding decision's (docs/clients.md, allow_all)",
    ),
    ("MultiDecision::headers_named", "headers.names of a MultiDecision"),
    ("TierState::window", "a tier's fields, as Decision's"),
    ("TierState::limit", "a tier's fields, as Decision's"),
    ("TierState::remaining", "a tier's fields, as Decision's"),
    ("TierState::retry_after", "a tier's fields, as Decision's"),
    ("TierState::reset_after", "a tier's fields, as Decision's"),
    (
        "Error::Client",
        "a reply of a shape the contract does not have, or a client library error",
    ),
    ("Error::message", "the server's message verbatim"),
    ("Error::is_unavailable", "whether the error policy would answer it"),
    ("Unavailable::cause", "why there was no answer"),
    ("Unavailable::message", "what happened, for logs"),
    ("Cause::Timeout", "an outage's cause"),
    ("Cause::Connection", "an outage's cause"),
    ("Cause::Server", "an outage's cause"),
    ("ALLOW_SCRIPT", "the bundled Lua script (docs/clients.md, Fallback)"),
    ("PEEK_SCRIPT", "the bundled Lua script"),
    ("REFUND_SCRIPT", "the bundled Lua script"),
    (
        "ceil_seconds",
        "the headers' rounding, public for callers who write their own",
    ),
    ("policy_name", "a policy's default name in the headers"),
    ("RATELIMIT", "a header name"),
    ("RATELIMIT_POLICY", "a header name"),
    ("RATELIMIT_LIMIT", "a header name"),
    ("RATELIMIT_REMAINING", "a header name"),
    ("RATELIMIT_RESET", "a header name"),
    ("tower::BoxError", "the layer's error type, as tower's own layers"),
    ("tower::KeyError", "a request without a key"),
    ("tower::Or", "KeyExtractor::or's extractor"),
    ("tower::RateLimitBody", "the response body of the layer's service"),
    (
        "tower::RateLimitLayer::new",
        "the constructor: the limiter and the limits",
    ),
    ("tower::RateLimitLayer::style", "headers.style of the middleware"),
    ("tower::HttpLimit::new", "the constructor: window and limit"),
    (
        "tower::HttpLimit::name",
        "the limit's name, in its keys rl:<name>:<key> (docs/clients.md, Middleware)",
    ),
    ("tower::HttpLimit::tier", "call.tiers of the middleware"),
    ("tower::HttpLimit::cost", "call.cost of the middleware"),
    ("tower::HttpLimit::names", "headers.names of the middleware"),
    ("tower::PeerIp::new", "the default key's constructor"),
    (
        "tower::PeerIp::from_extension",
        "the peer address from a framework's own extension type",
    ),
    ("tower::HeaderKey::new", "a header key's constructor"),
];

fn source(file: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(file)).unwrap()
}

fn ident(text: &str) -> &str {
    let end = text
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(text.len());
    &text[..end]
}

/// The crate's public items, read from the sources as text: lib.rs's
/// `pub use` / `pub mod` / `pub fn`, the tower module's items, and the
/// fields, variants and methods of every public type of the sources.
fn public_items() -> BTreeSet<String> {
    let mut items = BTreeSet::new();
    let lib = source("src/lib.rs");
    let mut rest = lib.as_str();
    while let Some(at) = rest.find("\npub ") {
        rest = &rest[at + 5..];
        let statement = &rest[..rest.find([';', '{', '(']).unwrap()];
        if let Some(used) = statement.strip_prefix("use ") {
            // `use a::{b, c}` (the braces are cut: read to the `;`) or `use redis`.
            let full = &rest[..rest.find(';').unwrap()];
            let full = full.strip_prefix("use ").unwrap_or(used);
            match full.split_once('{') {
                Some((_, names)) => {
                    for name in names.trim_end_matches('}').split(',') {
                        let name = name.trim();
                        if !name.is_empty() {
                            items.insert(name.to_string());
                        }
                    }
                }
                None => {
                    items.insert(full.rsplit("::").next().unwrap().trim().to_string());
                }
            }
        } else if let Some(module) = statement.strip_prefix("mod ") {
            items.insert(ident(module.trim()).to_string());
        } else if let Some(function) = statement.strip_prefix("fn ") {
            items.insert(ident(function).to_string());
        }
    }
    for (file, prefix) in [
        ("src/tower.rs", "tower::"),
        ("src/blocking.rs", "blocking::"),
        ("src/limiter.rs", ""),
        ("src/decision.rs", ""),
        ("src/error.rs", ""),
        ("src/request.rs", ""),
        ("src/headers.rs", ""),
        ("src/engine.rs", ""),
        ("src/cache.rs", ""),
    ] {
        let text = source(file);
        let mut owner: Option<String> = None;
        for line in text.lines() {
            if line.starts_with('}') {
                owner = None;
                continue;
            }
            for keyword in ["pub struct ", "pub enum ", "pub trait ", "pub type "] {
                // (trimmed: a type may be declared inside a macro, as RateLimitBody)
                if let Some(name) = line.trim_start().strip_prefix(keyword) {
                    let name = format!("{prefix}{}", ident(name));
                    items.insert(name.clone());
                    owner = (!line.ends_with(';')).then_some(name);
                }
            }
            if let Some(rest) = line.strip_prefix("impl") {
                // `impl<T> Name<T> {`, not `impl Trait for Name {`.
                let rest = rest.trim_start();
                let rest = if rest.starts_with('<') {
                    &rest[plain_end(rest)..]
                } else {
                    rest
                };
                if !line.contains(" for ") && line.ends_with('{') {
                    let name = ident(rest.trim_start());
                    // The blocking builder is the crate's Builder.
                    let prefix = if name == "Builder" { "" } else { prefix };
                    // Only a public type's members (not the crate's own Engine's).
                    owner = Some(format!("{prefix}{name}")).filter(|o| items.contains(o));
                }
            }
            let Some(owner) = &owner else { continue };
            let member = if let Some(m) = line.strip_prefix("    pub fn ") {
                Some(ident(m))
            } else if let Some(m) = line.strip_prefix("    pub async fn ") {
                Some(ident(m))
            } else if let Some(m) = line.strip_prefix("    pub const fn ") {
                Some(ident(m))
            } else if let Some(m) = line.strip_prefix("    pub ") {
                // A field: `    pub name: Type,`.
                let name = ident(m);
                m[name.len()..].starts_with(':').then_some(name)
            } else if let Some(m) = line.strip_prefix("    ") {
                // An enum's variant: `    Name,` / `    Name { .. }` / `    Name(..)`.
                let name = ident(m);
                let variant = name.starts_with(|c: char| c.is_ascii_uppercase())
                    && (m[name.len()..].starts_with([',', ' ', '(']) || m.len() == name.len());
                variant.then_some(name)
            } else {
                None
            };
            if let Some(member) = member.filter(|m| !m.is_empty()) {
                items.insert(format!("{owner}::{member}"));
            }
        }
    }
    items
}

/// Where `<...>` at the start of `text` ends.
fn plain_end(text: &str) -> usize {
    let mut depth = 0;
    for (i, c) in text.char_indices() {
        match c {
            '<' => depth += 1,
            '>' => {
                depth -= 1;
                if depth == 0 {
                    return i + 1;
                }
            }
            _ => {}
        }
    }
    text.len()
}

struct Table {
    concepts: Vec<String>,
    names: BTreeSet<String>,
    /// The crate paths the notes name in backticks.
    mentioned: BTreeSet<String>,
}

fn table() -> Table {
    let text = source("names.tsv");
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("concept\tname\tnote"));
    let mut table = Table {
        concepts: Vec::new(),
        names: BTreeSet::new(),
        mentioned: BTreeSet::new(),
    };
    for line in lines {
        let fields: Vec<&str> = line.split('\t').collect();
        assert_eq!(fields.len(), 3, "names.tsv: three fields: {line:?}");
        let (concept, name, note) = (fields[0], fields[1], fields[2]);
        table.concepts.push(concept.to_string());
        if name == "-" {
            assert!(!note.is_empty(), "{concept}: `-` needs a note saying why");
        } else {
            table.names.insert(name.to_string());
        }
        for (i, quoted) in note.split('`').enumerate() {
            let path = quoted
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':');
            if i % 2 == 1 && path && !quoted.starts_with("std::") {
                table.mentioned.insert(quoted.to_string());
            }
        }
    }
    table
}

#[test]
fn every_name_in_names_tsv_is_public_with_that_spelling() {
    let (table, surface) = (table(), surface());
    let missing: Vec<_> = table
        .names
        .iter()
        .chain(&table.mentioned)
        .filter(|n| !surface.contains(*n))
        .collect();
    assert!(missing.is_empty(), "in names.tsv, not in the crate: {missing:?}");
    let unnamed: Vec<_> = surface
        .iter()
        .filter(|n| !table.names.contains(*n) && !table.mentioned.contains(*n))
        .collect();
    assert!(unnamed.is_empty(), "compiled here, not in names.tsv: {unnamed:?}");
}

#[test]
fn every_public_item_is_in_names_tsv_or_said_why_not() {
    let table = table();
    let named: BTreeSet<&String> = table.names.iter().chain(&table.mentioned).collect();
    // A type is named when a name is the type or one of its members.
    let is_named = |item: &str| named.iter().any(|n| *n == item || n.starts_with(&format!("{item}::")));
    let exempt: BTreeSet<&str> = NOT_IN_THE_TABLE.iter().map(|(item, _)| *item).collect();
    let items = public_items();
    // blocking::Limiter has the async Limiter's calls, same names (see the Limiter row).
    let same_as_async = |item: &str| {
        item.strip_prefix("blocking::Limiter::")
            .is_some_and(|call| items.contains(&format!("Limiter::{call}")))
    };
    let missing: Vec<_> = items
        .iter()
        .filter(|item| !is_named(item) && !exempt.contains(item.as_str()) && !same_as_async(item))
        .collect();
    assert!(
        missing.is_empty(),
        "public, but neither in names.tsv nor in NOT_IN_THE_TABLE: {missing:?}"
    );
    // NOT_IN_THE_TABLE holds public items only, and none that the table names.
    for item in &exempt {
        assert!(
            items.contains(*item),
            "NOT_IN_THE_TABLE: {item} is not public (or not found)"
        );
        assert!(!is_named(item), "NOT_IN_THE_TABLE: {item} is in names.tsv");
    }
}

/// The rows of docs/clients.md's names table, in order (helpers' names.md).
const CONCEPTS: &str =
    "Limiter, AsyncLimiter, Limiter.allow, Limiter.peek, Limiter.refund, Limiter.reset, Limiter.acquire,
Limiter.allow_all, headers, Decision, MultiDecision, TierState, AllowAllRequest,
Decision.allowed, Decision.limit, Decision.remaining, Decision.retry_after, Decision.reset_after,
Decision.cost_exceeds_limit, Decision.window, Decision.tier, Decision.tiers, Decision.stamp, Decision.oldest,
Decision.via, Decision.error, MultiDecision.decisions, MultiDecision.binding, MultiDecision.rejected,
Via.command, Via.script, Via.error,
call.cost, call.tiers, call.stamp, call.now, call.oldest, call.max_wait,
option.prefix, option.fallback, option.on_error, option.timeout, option.probe_interval, option.durable,
option.durable.replicas, option.durable.timeout, option.replica_reads, option.clock,
ErrorPolicy.raise, ErrorPolicy.allow, ErrorPolicy.deny, Fallback.auto, Fallback.always, Fallback.never,
headers.style, headers.names, Style.ietf, Style.legacy, Style.both,
XcloakError, UnavailableError, NotReplicated,
middleware, middleware.limit, middleware.key, middleware.trust_proxies, middleware.skip_successful,
middleware.skip_failed, middleware.request_result,
option.block_cache, Limiter.stats, Stats, Stats.cache_hits, Stats.cache_entries, Via.cache";

#[test]
fn the_concepts_are_the_tables_rows_in_order() {
    let expected: Vec<String> = CONCEPTS.split(',').map(|c| c.trim().to_string()).collect();
    assert_eq!(table().concepts, expected);
}
