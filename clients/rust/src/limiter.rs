//! The async limiter (tokio) and its builder.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::{Cmd, RedisResult, Value};

use crate::cache::Stats;
use crate::clock::Clock;
use crate::decision::{Decision, MultiDecision};
use crate::engine::{timeout_error, Config, Durable, Engine, Fallback, Io, Shared, Then};
use crate::error::{Error, ErrorPolicy};
use crate::request::{Refund, Request};
use crate::transport::{SlotRange, Transport};

/// Exact sliding-window limits on Redis: `XCLOAK.ALLOW` where the module is
/// loaded, the bundled Lua script where it is not.
///
/// Cheap to clone (it shares the transport and the fallback's state). Every
/// call is bounded by the limiter's timeout (default 1 s) and answered by its
/// error policy (default [`ErrorPolicy::Raise`]) when there is no answer in time.
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use xcloak_client::{Limiter, Request};
///
/// let conn = redis::Client::open("redis://127.0.0.1/")?.get_connection_manager().await?;
/// let limiter = Limiter::new(conn);
/// let decision = limiter.allow(&Request::new("user:42", Duration::from_secs(60), 100)).await?;
/// if !decision.allowed {
///     println!("retry in {:?}", decision.retry_after);
/// }
/// # Ok(()) }
/// ```
pub struct Limiter<T> {
    transport: Arc<T>,
    config: Arc<Config>,
    shared: Arc<Shared>,
}

impl<T> Clone for Limiter<T> {
    fn clone(&self) -> Self {
        Limiter {
            transport: self.transport.clone(),
            config: self.config.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl<T> std::fmt::Debug for Limiter<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Limiter")
            .field("prefix", &self.config.prefix)
            .field("fallback", &self.config.fallback)
            .field("on_error", &self.config.policy)
            .field("timeout", &self.config.timeout)
            .field("durable", &self.config.durable)
            .field("replica_reads", &self.config.replica_reads)
            .field("block_cache", &self.config.block_cache)
            .finish_non_exhaustive()
    }
}

/// Configures a [`Limiter`] (or a [`blocking::Limiter`](crate::blocking::Limiter)).
///
/// The options are checked when the limiter is built: [`Builder::build`]
/// returns [`Error::Argument`] naming the option and its range, before
/// anything is sent. Every duration is a `std::time::Duration`.
pub struct Builder<T> {
    transport: T,
    config: Config,
}

impl<T> Builder<T> {
    /// Put before every key (default empty).
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.config.prefix = prefix.into();
        self
    }

    /// When the script stands in for the module (default [`Fallback::Auto`]).
    pub fn fallback(mut self, fallback: Fallback) -> Self {
        self.config.fallback = fallback;
        self
    }

    /// How long a node stays on the script before the command is tried again
    /// (default 60 s, at least 1 ms): a later `MODULE LOAD` is picked up within it.
    pub fn probe_interval(mut self, interval: Duration) -> Self {
        self.config.probe_interval = interval;
        self
    }

    /// What an outage or a timeout answers (default [`ErrorPolicy::Raise`]).
    /// Never an argument or configuration error: those are always returned.
    pub fn on_error(mut self, policy: ErrorPolicy) -> Self {
        self.config.policy = policy;
        self
    }

    /// The bound of each call, whatever the connection's own settings
    /// (default 1 s, at least 1 ms). A durable call is bounded by this plus
    /// the durable timeout (see [`Builder::durable`]).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.config.timeout = timeout;
        self
    }

    /// Durable mode: an admission counts once `replicas` (at least 1) replicas
    /// hold it (`WAIT replicas timeout` after its reply, on the same
    /// connection), else it goes to the error policy; under `Deny` it is also
    /// refunded. `timeout` is the WAIT's, whole milliseconds, at least 1 ms
    /// (`WAIT` with 0 would block for ever), and adds to the call's own: a
    /// durable admission takes at most `timeout` (the limiter's) + this
    /// `timeout`. Every allow then carries `STAMP` (shown in the Decision only
    /// if asked); rejections and peeks send no `WAIT`.
    pub fn durable(mut self, replicas: u32, timeout: Duration) -> Self {
        self.config.durable = Some(Durable { replicas, timeout });
        self
    }

    /// In a cluster, send `peek`s to a replica of the key's primary. The
    /// cluster client must read from replicas too (its connections send
    /// `READONLY`): [`cluster_client`](crate::cluster_client) with `true`, or
    /// `ClusterClientBuilder::read_routing_strategy`.
    pub fn replica_reads(mut self, replica_reads: bool) -> Self {
        self.config.replica_reads = replica_reads;
        self
    }

    /// A clock: calls send `NOW` from it and `acquire` sleeps through it.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.config.clock = Some(Arc::new(clock));
        self
    }

    /// The uniform source in [0, 1) of `acquire`'s jitter.
    pub fn random(mut self, random: impl Fn() -> f64 + Send + Sync + 'static) -> Self {
        self.config.random = Arc::new(random);
        self
    }

    /// At most this fraction (from 0 to 1) of the retry-after is added to
    /// each of `acquire`'s sleeps (default 0.1).
    pub fn jitter_fraction(mut self, fraction: f64) -> Self {
        self.config.jitter_fraction = fraction;
        self
    }

    /// The block cache's size, in entries (default 10,000; 0 turns it off; at
    /// most 1,000,000, else [`Builder::build`] refuses it). After a rejection
    /// with a retry-after, the same request on the same key (same window,
    /// limit and tiers, a cost at least as large and within every limit) is
    /// rejected without a call
    /// until that retry-after has passed: `via = Via::Cache`, `retry_after`
    /// counting down. It never admits, and never answers a `peek` or a call
    /// with `now` (or through a [`Clock`]). A `refund` or `reset` of a key
    /// through this limiter drops its entry first; a refund made by another
    /// process can leave a request rejected here, for at most that
    /// retry-after, that the server would now admit. Least recently used
    /// entries are evicted first; see [`Limiter::stats`].
    pub fn block_cache(mut self, entries: usize) -> Self {
        self.config.block_cache = entries;
        self
    }

    /// The transport and the checked options.
    pub(crate) fn into_parts(self) -> Result<(T, Config), Error> {
        self.config.check()?;
        Ok((self.transport, self.config))
    }

    pub(crate) fn with(transport: T) -> Builder<T> {
        Builder {
            transport,
            config: Config::default(),
        }
    }
}

impl<T: Transport> Builder<T> {
    /// The limiter, or [`Error::Argument`] naming the first option out of
    /// its range (`timeout`, `probe_interval`, `durable.replicas`,
    /// `durable.timeout`, `jitter_fraction`, `block_cache`).
    pub fn build(self) -> Result<Limiter<T>, Error> {
        let (transport, config) = self.into_parts()?;
        Ok(Limiter {
            transport: Arc::new(transport),
            shared: Arc::new(Shared::new(config.block_cache)),
            config: Arc::new(config),
        })
    }
}

/// The transport, bounded by the tokio timer.
struct AsyncIo<'a, T>(&'a T);

impl<T: Transport> Io for AsyncIo<'_, T> {
    async fn send(&self, key: &[u8], read: bool, cmds: &[Cmd], deadline: Instant) -> RedisResult<Vec<Value>> {
        match tokio::time::timeout_at(deadline.into(), self.0.send(key, read, cmds)).await {
            Ok(result) => result,
            Err(_elapsed) => Err(timeout_error()),
        }
    }

    async fn send_then(
        &self,
        key: &[u8],
        cmd: &Cmd,
        then: &Then<'_>,
        deadline: Instant,
    ) -> RedisResult<(Value, Option<RedisResult<Value>>)> {
        match tokio::time::timeout_at(deadline.into(), self.0.send_then(key, cmd, then)).await {
            Ok(result) => result,
            Err(_elapsed) => Err(timeout_error()),
        }
    }

    async fn slot_map(&self, deadline: Instant) -> RedisResult<Option<Vec<SlotRange>>> {
        match tokio::time::timeout_at(deadline.into(), self.0.slot_map()).await {
            Ok(result) => result,
            Err(_elapsed) => Err(timeout_error()),
        }
    }

    async fn sleep(&self, duration: Duration) {
        tokio::time::sleep(duration).await
    }
}

impl<T: Transport> Limiter<T> {
    /// A limiter with the defaults: no prefix, `Fallback::Auto`, 1 s timeout,
    /// `ErrorPolicy::Raise`, a block cache of 10,000 entries.
    pub fn new(transport: T) -> Limiter<T> {
        let config = Config::default();
        Limiter {
            transport: Arc::new(transport),
            shared: Arc::new(Shared::new(config.block_cache)),
            config: Arc::new(config),
        }
    }

    /// Configure it: `Limiter::builder(conn).timeout(..).on_error(..).build()?`.
    pub fn builder(transport: T) -> Builder<T> {
        Builder::with(transport)
    }

    /// The same limiter (connection, fallback state) with another error
    /// policy: a login endpoint fails closed, an API open.
    pub fn with_on_error(&self, policy: ErrorPolicy) -> Limiter<T> {
        let mut config = (*self.config).clone();
        config.policy = policy;
        Limiter {
            transport: self.transport.clone(),
            config: Arc::new(config),
            shared: self.shared.clone(),
        }
    }

    /// What the block cache did: the calls it answered, the entries it holds
    /// (shared with the limiters [`Limiter::with_on_error`] made).
    pub fn stats(&self) -> Stats {
        self.shared.stats()
    }

    /// The transport this limiter sends through.
    pub fn transport(&self) -> &T {
        &self.transport
    }

    fn engine(&self) -> Engine<'_, AsyncIo<'_, T>> {
        Engine {
            io: AsyncIo(&self.transport),
            config: &self.config,
            shared: &self.shared,
        }
    }

    /// `XCLOAK.ALLOW`: admits the request and records it, or rejects it and
    /// records nothing.
    pub async fn allow(&self, request: &Request) -> Result<Decision, Error> {
        self.engine().allow(request).await
    }

    /// `XCLOAK.PEEK`: what `allow` would decide now; records nothing. Goes to a
    /// replica with [`Builder::replica_reads`]. With [`Request::oldest`],
    /// the Decision's `oldest` is where the binding tier's moving window starts.
    pub async fn peek(&self, request: &Request) -> Result<Decision, Error> {
        self.engine().peek(request).await
    }

    /// `XCLOAK.REFUND key stamp [COST c]`: takes back an admission by the stamp
    /// its Decision carried ([`Refund::new`]`(key, stamp)`, with
    /// [`Refund::cost`] when the admission cost more than 1); returns how many
    /// entries it removed (0 when it already left the window). Outages are
    /// raised (no policy: nothing to decide).
    pub async fn refund(&self, refund: &Refund) -> Result<u64, Error> {
        self.engine().refund(refund).await
    }

    /// `DEL key`: forgets the window; whether one was there.
    pub async fn reset(&self, key: &str) -> Result<bool, Error> {
        self.engine().reset(key).await
    }

    /// Waits until admitted, with the server's own retry-after (plus jitter),
    /// never by polling, for at most `max_wait`; returns the last Decision.
    /// Dropping the future cancels the wait; a cancelled wait has recorded
    /// nothing, since only an admission records. A call already sent when the
    /// future is dropped may still be admitted: recorded, unreported, never
    /// sent again (as with a timeout).
    pub async fn acquire(&self, request: &Request, max_wait: Duration) -> Result<Decision, Error> {
        self.engine().acquire(request, max_wait).await
    }

    /// One request against several identities (different keys), all or
    /// nothing: admitted in order with `STAMP`; when request *j* rejects,
    /// requests before it are refunded and those after it are not sent.
    pub async fn allow_all(&self, requests: &[Request]) -> Result<MultiDecision, Error> {
        self.engine().allow_all(requests).await
    }
}
