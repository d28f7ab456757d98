//! The calls of docs/clients.md, written once over a small I/O trait that the
//! async [`Limiter`](crate::Limiter) (tokio, over a [`Transport`](crate::Transport))
//! and the [blocking one](crate::blocking::Limiter) (a pool of
//! `redis::Connection`) implement: the fallback to the scripts per node, the
//! durable mode, the error policy, `acquire` and `allow_all`.
//!
//! Nothing here sends a call twice unless the server said it did not run it:
//! an unknown command (then the script), `NOSCRIPT` (then `EVAL` of the text),
//! an unknown `EVALSHA_RO` (Redis before 7.0: then `EVALSHA`).

use std::borrow::Cow;
use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::{Cmd, RedisError, RedisResult, Value};

use crate::cache::{BlockCache, Stats, DEFAULT_ENTRIES, MAX_ENTRIES};
use crate::clock::{acquire_step, default_random, AcquireStep, Clock};
use crate::decision::{Decision, MultiDecision, Via};
use crate::error::{Cause, Error, ErrorPolicy};
use crate::request::{Op, Refund, Request};
use crate::transport::{key_slot, SlotRange};

/// The bundled scripts: byte-identical copies of src/lua/ (scripts/sync-lua.sh
/// writes them, tests/conformance.rs at the repository root checks them).
pub const ALLOW_SCRIPT: &str = include_str!("../lua/xcloak_allow.lua");
pub const PEEK_SCRIPT: &str = include_str!("../lua/xcloak_peek.lua");
pub const REFUND_SCRIPT: &str = include_str!("../lua/xcloak_refund.lua");

/// When the bundled Lua script stands in for the module (docs/clients.md, "Fallback").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Fallback {
    /// The command first; a server that answers `unknown command` is served by
    /// the script from then on, probed again after the probe interval (default).
    #[default]
    Auto,
    /// The script from the first call (a managed service without the module).
    Always,
    /// The command only: an unknown command is raised as [`Error::Server`].
    Never,
}

/// Durable mode: an admission counts only once `replicas` replicas hold it:
/// `WAIT replicas timeout` after the reply of an admitting allow (and of a
/// refund), on the connection that carried the call. Rejections and peeks
/// send no `WAIT`; an allow always carries `STAMP`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Durable {
    pub replicas: u32,
    pub timeout: Duration,
}

pub(crate) type Random = Arc<dyn Fn() -> f64 + Send + Sync>;

#[derive(Clone)]
pub(crate) struct Config {
    pub prefix: String,
    pub fallback: Fallback,
    pub probe_interval: Duration,
    pub policy: ErrorPolicy,
    pub timeout: Duration,
    pub durable: Option<Durable>,
    pub replica_reads: bool,
    pub clock: Option<Arc<dyn Clock>>,
    pub random: Random,
    pub jitter_fraction: f64,
    /// The block cache's entries; 0: no cache.
    pub block_cache: usize,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            prefix: String::new(),
            fallback: Fallback::Auto,
            probe_interval: Duration::from_secs(60),
            policy: ErrorPolicy::Raise,
            timeout: Duration::from_secs(1),
            durable: None,
            replica_reads: false,
            clock: None,
            random: Arc::new(default_random()),
            jitter_fraction: 0.1,
            block_cache: DEFAULT_ENTRIES,
        }
    }
}

/// The largest duration the server takes, in milliseconds (2^53 − 1): the
/// bound of every duration option, so a deadline never overflows.
pub(crate) const MAX_MS: u64 = 9_007_199_254_740_991;

/// `name` must be from 1 ms to [`MAX_MS`] ms (and, `whole`, whole milliseconds).
pub(crate) fn check_duration(name: &str, duration: Duration, whole: bool) -> Result<(), Error> {
    let fits = duration >= Duration::from_millis(1) && duration <= Duration::from_millis(MAX_MS);
    let whole_ms = duration.subsec_nanos().is_multiple_of(1_000_000);
    if fits && (whole_ms || !whole) {
        return Ok(());
    }
    let what = if whole {
        "a whole number of milliseconds"
    } else {
        "a duration"
    };
    Err(Error::Argument {
        name: name.to_string(),
        message: format!("{name} must be {what} from 1 ms to {MAX_MS} ms, not {duration:?}"),
    })
}

impl Config {
    /// Every option in its range (docs/clients.md: configuration is refused
    /// when it is built, never at the first call).
    pub(crate) fn check(&self) -> Result<(), Error> {
        check_duration("timeout", self.timeout, false)?;
        check_duration("probe_interval", self.probe_interval, false)?;
        if let Some(durable) = self.durable {
            if durable.replicas == 0 {
                return Err(Error::Argument {
                    name: "durable.replicas".into(),
                    message: "durable.replicas must be from 1 to 4294967295, not 0 (WAIT 0 waits for nothing)".into(),
                });
            }
            check_duration("durable.timeout", durable.timeout, true)?;
        }
        if !(0.0..=1.0).contains(&self.jitter_fraction) {
            return Err(Error::Argument {
                name: "jitter_fraction".into(),
                message: format!("jitter_fraction must be from 0 to 1, not {}", self.jitter_fraction),
            });
        }
        if self.block_cache > MAX_ENTRIES {
            return Err(Error::Argument {
                name: "block_cache".into(),
                message: format!(
                    "block_cache must be from 0 (no cache) to {MAX_ENTRIES} entries, not {}",
                    self.block_cache
                ),
            });
        }
        Ok(())
    }
}

struct Script {
    code: &'static str,
    sha: String,
}

impl Script {
    fn new(code: &'static str) -> Script {
        Script {
            code,
            sha: redis::Script::new(code).get_hash().to_string(),
        }
    }
}

/// What the fallback knows about one node (a primary's address, its
/// replicas as a group, or the one server).
#[derive(Default)]
struct NodeState {
    /// Served by the script since then (re-probed after the probe interval).
    script_since: Option<Instant>,
    /// `EVALSHA_RO` is unknown there (Redis before 7.0): peeks use `EVALSHA`.
    no_read_only_scripts: bool,
}

enum Topology {
    Single,
    Cluster(Arc<Vec<SlotRange>>),
    /// `CLUSTER SLOTS` failed: the choice is made per slot instead.
    Unknown,
}

/// The fallback's state and the block cache, shared by every limiter made
/// from one another (`Limiter::with_on_error`).
pub(crate) struct Shared {
    allow: Script,
    peek: Script,
    refund: Script,
    /// Some node is served by the script: only then does a call look up its node.
    any_script: AtomicBool,
    nodes: Mutex<HashMap<String, NodeState>>,
    topology: Mutex<Option<(Instant, Arc<Topology>)>>,
    /// `None` when off. Locked for a lookup or a record, never across a call.
    cache: Option<Mutex<BlockCache>>,
    /// The origin of the cache's monotonic times.
    origin: Instant,
}

impl Shared {
    /// The state of a new limiter with a block cache of `block_cache` entries (0: none).
    pub(crate) fn new(block_cache: usize) -> Shared {
        Shared {
            allow: Script::new(ALLOW_SCRIPT),
            peek: Script::new(PEEK_SCRIPT),
            refund: Script::new(REFUND_SCRIPT),
            any_script: AtomicBool::new(false),
            nodes: Mutex::new(HashMap::new()),
            topology: Mutex::new(None),
            cache: (block_cache > 0).then(|| Mutex::new(BlockCache::new(block_cache))),
            origin: Instant::now(),
        }
    }

    pub(crate) fn stats(&self) -> Stats {
        self.cache.as_ref().map_or_else(Stats::default, |c| lock(c).stats())
    }

    /// The time on the cache's monotonic clock.
    fn mono(&self) -> Duration {
        self.origin.elapsed()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// What follows a reply on its connection: `Some(WAIT ...)` after a write.
pub(crate) type Then<'t> = dyn Fn(&Value) -> Option<Cmd> + Send + Sync + 't;

/// The I/O an [`Engine`] needs. `deadline` bounds the whole exchange.
pub(crate) trait Io: Sync {
    fn send(
        &self,
        key: &[u8],
        read: bool,
        cmds: &[Cmd],
        deadline: Instant,
    ) -> impl Future<Output = RedisResult<Vec<Value>>> + Send;
    /// `cmd` to the primary serving `key`, then, once its reply is in,
    /// `then(&reply)` on the same connection (see [`Transport::send_then`](crate::Transport::send_then)).
    fn send_then(
        &self,
        key: &[u8],
        cmd: &Cmd,
        then: &Then<'_>,
        deadline: Instant,
    ) -> impl Future<Output = RedisResult<(Value, Option<RedisResult<Value>>)>> + Send;
    fn slot_map(&self, deadline: Instant) -> impl Future<Output = RedisResult<Option<Vec<SlotRange>>>> + Send;
    fn sleep(&self, duration: Duration) -> impl Future<Output = ()> + Send;
}

/// The timeout error the I/O layers return when the deadline passes first.
pub(crate) fn timeout_error() -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        "no reply within the limiter's timeout",
    ))
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Path {
    Command,
    Script,
    /// The script's node, after the probe interval: the command again.
    Probe,
}

/// The arguments after the key.
#[derive(Clone, Copy)]
enum Args<'r> {
    Window(&'r Request, Op),
    Refund(&'r Refund),
}

impl Args<'_> {
    fn write(self, cmd: &mut Cmd) -> Result<(), Error> {
        match self {
            Args::Window(request, op) => request.write_args(op, cmd),
            Args::Refund(refund) => {
                refund.write_args(cmd);
                Ok(())
            }
        }
    }
}

struct Exchange {
    reply: Value,
    via: Via,
    /// In durable mode, the reply of the `WAIT` sent after a reply that wrote;
    /// `None` when nothing was written (a rejection) or not durable.
    wait: Option<RedisResult<Value>>,
}

/// A server error reply as `Err`.
fn server_error_as_err(value: Value) -> RedisResult<Value> {
    match value {
        Value::ServerError(error) => Err(error.into()),
        value => Ok(value),
    }
}

/// Whether a reply to `op` wrote: an admission (`allowed` is 1), or a
/// refund's count. Only then does durable mode send `WAIT`.
fn wrote(op: Op, reply: &Value) -> bool {
    match (op, reply) {
        (Op::Allow { .. }, Value::Array(items)) => items.first() == Some(&Value::Int(1)),
        (Op::Refund, Value::Int(_)) => true,
        _ => false,
    }
}

fn is_unknown_command(error: &RedisError) -> bool {
    error.code() == Some("ERR") && error.detail().is_some_and(|d| d.starts_with("unknown command"))
}

pub(crate) struct Engine<'a, I> {
    pub io: I,
    pub config: &'a Config,
    pub shared: &'a Shared,
}

impl<I: Io> Engine<'_, I> {
    fn deadline(&self, durable: bool) -> Instant {
        let wait = if durable {
            self.config.durable.map_or(Duration::ZERO, |d| d.timeout)
        } else {
            Duration::ZERO
        };
        Instant::now() + self.config.timeout + wait
    }

    /// The request as sent: the prefix on its key, `NOW` from the clock; an
    /// option that `op` does not take is refused, never ignored.
    fn prepare<'r>(&self, request: &'r Request, op: Op) -> Result<Cow<'r, Request>, Error> {
        request.check_options(op)?;
        let stamp = match op {
            Op::Allow { stamp } => stamp,
            _ => false,
        };
        let clock_now = self
            .config
            .clock
            .as_ref()
            .filter(|_| request.now.is_none())
            .map(|c| c.now_ms());
        if self.config.prefix.is_empty() && clock_now.is_none() && request.stamp == stamp {
            return Ok(Cow::Borrowed(request));
        }
        let mut prepared = request.clone();
        prepared.key = format!("{}{}", self.config.prefix, request.key);
        prepared.now = request.now.or(clock_now);
        prepared.stamp = stamp;
        Ok(Cow::Owned(prepared))
    }

    fn policy(&self, request: &Request, result: Result<Decision, Error>) -> Result<Decision, Error> {
        match (result, self.config.policy) {
            (Err(Error::Unavailable(cause)), ErrorPolicy::Allow) => Ok(Decision::from_error(request, true, cause)),
            (Err(Error::Unavailable(cause)), ErrorPolicy::Deny) => Ok(Decision::from_error(request, false, cause)),
            (result, _) => result,
        }
    }

    pub async fn allow(&self, request: &Request) -> Result<Decision, Error> {
        // In durable mode an allow always carries STAMP (the `deny` path
        // refunds by it); the Decision shows it only if asked.
        let asked = request.stamp;
        let request = self.prepare(
            request,
            Op::Allow {
                stamp: asked || self.config.durable.is_some(),
            },
        )?;
        let result = self
            .allow_cached(&request, self.deadline(true))
            .await
            .map(|mut decision| {
                if !asked {
                    decision.stamp = None;
                }
                decision
            });
        self.policy(&request, result)
    }

    /// `allow_once` through the block cache: a request the cache holds a
    /// rejection for is answered without a call; the server's decision is
    /// recorded. A request with `NOW` (given, or from the limiter's clock)
    /// bypasses it: its time is not the cache's.
    async fn allow_cached(&self, request: &Request, deadline: Instant) -> Result<Decision, Error> {
        let Some(cache) = self.shared.cache.as_ref().filter(|_| request.now.is_none()) else {
            return self.allow_once(request, deadline).await;
        };
        let sent_at = self.shared.mono();
        let (hit, forgets) = {
            let mut cache = lock(cache);
            (cache.lookup(request, sent_at), cache.forgets())
        };
        if let Some(decision) = hit {
            return Ok(decision);
        }
        let result = self.allow_once(request, deadline).await;
        if let Ok(decision) = &result {
            lock(cache).record_since(request, decision, sent_at, forgets);
        }
        result
    }

    /// Drops `key`'s block cache entry (before a refund or a reset of it).
    fn forget(&self, key: &str) {
        if let Some(cache) = &self.shared.cache {
            lock(cache).forget(key);
        }
    }

    async fn allow_once(&self, request: &Request, deadline: Instant) -> Result<Decision, Error> {
        let op = Op::Allow { stamp: request.stamp };
        let exchange = self
            .exchange(op, &request.key, Args::Window(request, op), true, deadline)
            .await?;
        let decision = Decision::from_reply(&exchange.reply, request, exchange.via)?;
        let (Some(durable), true) = (self.config.durable, decision.allowed) else {
            return Ok(decision);
        };
        let (acknowledged, lost) = match exchange.wait {
            Some(Ok(Value::Int(n))) => (u64::try_from(n).unwrap_or(0), String::new()),
            // WAIT refused (NOPERM, a replica): the caller's configuration, raised.
            Some(Err(error)) if error.code().is_some() && !Error::from_redis(&error).is_unavailable() => {
                return Err(Error::from_redis(&error))
            }
            Some(Err(error)) => (0, format!(" ({error})")),
            other => (0, format!(" (WAIT answered {other:?})")),
        };
        if acknowledged >= u64::from(durable.replicas) {
            return Ok(decision);
        }
        if self.config.policy == ErrorPolicy::Deny {
            if let Some(stamp) = decision.stamp {
                // Best effort: a request turned away consumes nothing.
                let refund = Refund::new(&request.key, stamp).cost(request.cost);
                let _ = self
                    .refund_once(&request.key, &refund, false, self.deadline(false))
                    .await;
            }
        }
        Err(Error::unavailable(
            Cause::NotReplicated {
                acknowledged,
                wanted: durable.replicas,
            },
            format!(
                "not replicated: WAIT {} {} counted {acknowledged}{lost}",
                durable.replicas,
                durable.timeout.as_millis()
            ),
        ))
    }

    pub async fn peek(&self, request: &Request) -> Result<Decision, Error> {
        let request = self.prepare(request, Op::Peek)?;
        let deadline = self.deadline(false);
        let result = async {
            let exchange = self
                .exchange(
                    Op::Peek,
                    &request.key,
                    Args::Window(&request, Op::Peek),
                    false,
                    deadline,
                )
                .await?;
            Decision::from_peek_reply(&exchange.reply, &request, exchange.via)
        }
        .await;
        self.policy(&request, result)
    }

    pub async fn refund(&self, refund: &Refund) -> Result<u64, Error> {
        let key = format!("{}{}", self.config.prefix, refund.key);
        self.refund_once(&key, refund, true, self.deadline(true)).await
    }

    /// `refund` on `key` (the prefix already on it; `refund.key` is not read).
    async fn refund_once(&self, key: &str, refund: &Refund, wait: bool, deadline: Instant) -> Result<u64, Error> {
        // The window may open before the held deadline: never hold it past a refund.
        self.forget(key);
        let exchange = self
            .exchange(Op::Refund, key, Args::Refund(refund), wait, deadline)
            .await?;
        // A refund that was not replicated is lost in a failover: the window
        // stays conservative, so its WAIT figure raises nothing.
        match exchange.reply {
            Value::Int(n) if n >= 0 => Ok(n as u64),
            other => Err(Error::Client(format!("XCLOAK.REFUND answers a count, not {other:?}"))),
        }
    }

    pub async fn reset(&self, key: &str) -> Result<bool, Error> {
        let key = format!("{}{key}", self.config.prefix);
        self.forget(&key);
        let mut del = redis::cmd("DEL");
        del.arg(&key);
        let (reply, _) = self.send(&key, false, del, None, self.deadline(false)).await?;
        match reply {
            Ok(Value::Int(n)) => Ok(n > 0),
            Err(error) => Err(Error::from_redis(&error)),
            Ok(other) => Err(Error::Client(format!("DEL answers a count, not {other:?}"))),
        }
    }

    pub async fn acquire(&self, request: &Request, max_wait: Duration) -> Result<Decision, Error> {
        let clock = self.config.clock.as_deref();
        let (started_ms, started) = (clock.map(|c| c.now_ms()), Instant::now());
        loop {
            let decision = self.allow(request).await?;
            let waited = match (clock, started_ms) {
                (Some(clock), Some(start)) => Duration::from_millis(clock.now_ms().saturating_sub(start)),
                _ => started.elapsed(),
            };
            let left = max_wait.saturating_sub(waited);
            match acquire_step(&decision, left, self.config.jitter_fraction, || (self.config.random)()) {
                AcquireStep::Sleep(duration) => match clock {
                    Some(clock) => clock.sleep(duration).await,
                    None => self.io.sleep(duration).await,
                },
                _ => return Ok(decision),
            }
        }
    }

    pub async fn allow_all(&self, requests: &[Request]) -> Result<MultiDecision, Error> {
        // Every argument the client checks, before anything is sent: a bad
        // one at request j would otherwise follow admissions before it.
        for request in requests {
            request.allow_command()?;
        }
        let mut decisions: Vec<Decision> = Vec::with_capacity(requests.len());
        let mut sent: Vec<Cow<'_, Request>> = Vec::with_capacity(requests.len());
        for (j, request) in requests.iter().enumerate() {
            let request = self.prepare(request, Op::Allow { stamp: true })?;
            // A request the block cache holds a rejection for is rejected as
            // the server would: the admissions before it are refunded.
            let result = self.allow_cached(&request, self.deadline(true)).await;
            match result {
                Ok(decision) => {
                    let rejected = !decision.allowed;
                    decisions.push(decision);
                    sent.push(request);
                    if rejected {
                        self.refund_admitted(&sent, &decisions).await;
                        return Ok(MultiDecision::from_decisions(decisions));
                    }
                }
                Err(error) => {
                    self.refund_admitted(&sent, &decisions).await;
                    let Error::Unavailable(cause) = error else {
                        return Err(error);
                    };
                    let allowed = match self.config.policy {
                        ErrorPolicy::Raise => return Err(Error::Unavailable(cause)),
                        ErrorPolicy::Allow => true,
                        ErrorPolicy::Deny => false,
                    };
                    decisions.push(Decision::from_error(&request, allowed, cause));
                    return Ok(MultiDecision {
                        allowed,
                        decisions,
                        rejected: (!allowed).then_some(j),
                        binding_index: j,
                    });
                }
            }
        }
        Ok(MultiDecision::from_decisions(decisions))
    }

    /// Refunds every admission among `decisions`, in order, best effort: a
    /// refund that fails leaves the window conservative, never generous.
    async fn refund_admitted(&self, requests: &[Cow<'_, Request>], decisions: &[Decision]) {
        for (request, decision) in requests.iter().zip(decisions) {
            if let (true, Some(stamp)) = (decision.allowed, decision.stamp) {
                let refund = Refund::new(&request.key, stamp).cost(request.cost);
                let _ = self.refund_once(&request.key, &refund, true, self.deadline(true)).await;
            }
        }
    }

    /// Sends one call, by the command or by the script, and returns its reply.
    async fn exchange(
        &self,
        op: Op,
        key: &str,
        args: Args<'_>,
        wait: bool,
        deadline: Instant,
    ) -> Result<Exchange, Error> {
        let read = op == Op::Peek && self.config.replica_reads;
        // Durable mode: WAIT after a reply that wrote, on its connection.
        let wait_cmd = self.config.durable.filter(|_| wait && op != Op::Peek).map(|durable| {
            let mut wait = redis::cmd("WAIT");
            wait.arg(durable.replicas)
                .arg(u64::try_from(durable.timeout.as_millis()).unwrap_or(u64::MAX));
            wait
        });
        let then = wait_cmd.map(|wait| move |reply: &Value| wrote(op, reply).then(|| wait.clone()));
        let then = then.as_ref().map(|t| t as &Then<'_>);
        let path = self.path(key, read, deadline).await;
        if path != Path::Script {
            let mut cmd = redis::cmd(op.command());
            cmd.arg(key);
            args.write(&mut cmd)?;
            let (reply, wait) = self.send(key, read, cmd, then, deadline).await?;
            match reply {
                Ok(reply) => {
                    if path == Path::Probe {
                        self.mark(key, read, None, deadline).await;
                    }
                    return Ok(Exchange {
                        reply,
                        via: Via::Command,
                        wait,
                    });
                }
                // Nothing was applied: the script answers, here and from now on.
                Err(error) if self.config.fallback == Fallback::Auto && is_unknown_command(&error) => {
                    self.mark(key, read, Some(Instant::now()), deadline).await;
                }
                Err(error) => return Err(Error::from_redis(&error)),
            }
        }
        let script = match op {
            Op::Allow { .. } => &self.shared.allow,
            Op::Peek => &self.shared.peek,
            Op::Refund => &self.shared.refund,
        };
        let node = self.node_id(key, read, deadline).await;
        let mut read_only = op == Op::Peek && !self.node_flag(&node, |s| s.no_read_only_scripts);
        let mut by_text = false;
        loop {
            let mut cmd = match (by_text, read_only) {
                (false, false) => redis::cmd("EVALSHA"),
                (false, true) => redis::cmd("EVALSHA_RO"),
                (true, false) => redis::cmd("EVAL"),
                (true, true) => redis::cmd("EVAL_RO"),
            };
            cmd.arg(if by_text { script.code } else { script.sha.as_str() })
                .arg(1)
                .arg(key);
            args.write(&mut cmd)?;
            let (reply, wait) = self.send(key, read, cmd, then, deadline).await?;
            match reply {
                Ok(reply) => {
                    return Ok(Exchange {
                        reply,
                        via: Via::Script,
                        wait,
                    })
                }
                // Redis before 7.0 has no EVALSHA_RO: EVALSHA on that node from now on.
                Err(error) if read_only && is_unknown_command(&error) => {
                    self.nodes().entry(node.clone()).or_default().no_read_only_scripts = true;
                    read_only = false;
                }
                // Not cached there (a restart, SCRIPT FLUSH, a new node): the
                // text runs it once and caches it.
                Err(error)
                    if !by_text && error.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
                {
                    by_text = true
                }
                Err(error) => return Err(Error::from_redis(&error)),
            }
        }
    }

    /// Sends `cmd` once (and, with `then`, what follows its reply on the same
    /// connection). The reply, a server's refusal as `Err`; `Err` of the call
    /// for an outage.
    async fn send(
        &self,
        key: &str,
        read: bool,
        cmd: Cmd,
        then: Option<&Then<'_>>,
        deadline: Instant,
    ) -> Result<(RedisResult<Value>, Option<RedisResult<Value>>), Error> {
        let result = match then {
            Some(then) => self.io.send_then(key.as_bytes(), &cmd, then, deadline).await,
            None => self
                .io
                .send(key.as_bytes(), read, std::slice::from_ref(&cmd), deadline)
                .await
                .and_then(|replies| {
                    let reply = replies
                        .into_iter()
                        .next()
                        .ok_or_else(|| RedisError::from((redis::ErrorKind::UnexpectedReturnType, "no reply")))?;
                    Ok((reply, None))
                }),
        };
        match result {
            Ok((reply, wait)) => Ok((
                server_error_as_err(reply),
                wait.map(|w| w.and_then(server_error_as_err)),
            )),
            // A server's refusal of the command.
            Err(error) if error.code().is_some() => Ok((Err(error), None)),
            Err(error) => Err(Error::from_redis(&error)),
        }
    }

    fn nodes(&self) -> std::sync::MutexGuard<'_, HashMap<String, NodeState>> {
        self.shared
            .nodes
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn node_flag(&self, node: &str, flag: impl Fn(&NodeState) -> bool) -> bool {
        self.nodes().get(node).is_some_and(flag)
    }

    /// Command, script or probe for the node serving `key`.
    async fn path(&self, key: &str, read: bool, deadline: Instant) -> Path {
        match self.config.fallback {
            Fallback::Never => return Path::Command,
            Fallback::Always => return Path::Script,
            Fallback::Auto if !self.shared.any_script.load(Ordering::Acquire) => return Path::Command,
            Fallback::Auto => {}
        }
        let node = self.node_id(key, read, deadline).await;
        let mut nodes = self.nodes();
        match nodes.get_mut(&node).and_then(|state| state.script_since.as_mut()) {
            None => Path::Command,
            Some(since) if since.elapsed() >= self.config.probe_interval => {
                // This call probes; the others keep the script meanwhile.
                *since = Instant::now();
                Path::Probe
            }
            Some(_) => Path::Script,
        }
    }

    /// Records that the node of `key` is served by the script since
    /// `script_since`, or (`None`) by the command again.
    async fn mark(&self, key: &str, read: bool, script_since: Option<Instant>, deadline: Instant) {
        let node = self.node_id(key, read, deadline).await;
        let mut nodes = self.nodes();
        nodes.entry(node).or_default().script_since = script_since;
        let any = nodes.values().any(|state| state.script_since.is_some());
        self.shared.any_script.store(any, Ordering::Release);
    }

    /// Who serves `key`: the one server (`""`), a primary's address, the
    /// replicas of one (`"<primary> replicas"`), or a slot when the map can't be read.
    async fn node_id(&self, key: &str, read: bool, deadline: Instant) -> String {
        let topology = self.topology(deadline).await;
        let slot = key_slot(key.as_bytes());
        let node = match &*topology {
            Topology::Single => return String::new(),
            Topology::Unknown => format!("slot {slot}"),
            Topology::Cluster(ranges) => match ranges.iter().find(|r| (r.start..=r.end).contains(&slot)) {
                Some(range) => range.node.clone(),
                None => format!("slot {slot}"),
            },
        };
        if read {
            format!("{node} replicas")
        } else {
            node
        }
    }

    /// The slot map, read again after the probe interval (a node moves
    /// slots; a probe then sees the new owner).
    async fn topology(&self, deadline: Instant) -> Arc<Topology> {
        {
            let cached = self.shared.topology.lock().unwrap_or_else(|p| p.into_inner());
            if let Some((read_at, topology)) = cached.as_ref() {
                if matches!(**topology, Topology::Single) || read_at.elapsed() < self.config.probe_interval {
                    return topology.clone();
                }
            }
        }
        let topology = Arc::new(match self.io.slot_map(deadline).await {
            Ok(None) => Topology::Single,
            Ok(Some(ranges)) => Topology::Cluster(Arc::new(ranges)),
            Err(_) => Topology::Unknown,
        });
        *self.shared.topology.lock().unwrap_or_else(|p| p.into_inner()) = Some((Instant::now(), topology.clone()));
        topology
    }
}
