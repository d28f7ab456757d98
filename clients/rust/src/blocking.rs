//! The same calls without an async runtime, over `redis::Client`: the
//! limiter keeps a small pool of `redis::Connection`s, and bounds each call by
//! its timeout through the socket's read and write timeouts. A connection
//! that timed out or failed is dropped, never reused (its late reply would
//! answer the next call), and the call is not sent again.
//!
//! ```no_run
//! use std::time::Duration;
//! use xcloak_client::{blocking::Limiter, Request};
//!
//! let limiter = Limiter::new(redis::Client::open("redis://127.0.0.1/").unwrap());
//! let decision = limiter.allow(&Request::new("user:42", Duration::from_secs(60), 100)).unwrap();
//! println!("{}", if decision.allowed { "200" } else { "429" });
//! ```

use std::future::Future;
use std::pin::pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use redis::{Cmd, ConnectionLike, RedisResult, Value};

use crate::cache::Stats;
use crate::decision::{Decision, MultiDecision};
use crate::engine::{timeout_error, Config, Engine, Io, Shared, Then};
use crate::error::{Error, ErrorPolicy};
use crate::limiter::Builder;
use crate::request::{Refund, Request};
use crate::transport::SlotRange;

struct Pool {
    client: redis::Client,
    idle: Mutex<Vec<redis::Connection>>,
}

/// Idle connections kept for reuse; more are opened under concurrency.
const MAX_IDLE: usize = 16;

impl Pool {
    fn send(&self, cmds: &[Cmd], deadline: Instant) -> RedisResult<Vec<Value>> {
        self.with_connection(deadline, |conn| request(conn, cmds))
    }

    /// `cmd`, then what `then` makes of its reply, on the same connection.
    fn send_then(
        &self,
        cmd: &Cmd,
        then: &Then<'_>,
        deadline: Instant,
    ) -> RedisResult<(Value, Option<RedisResult<Value>>)> {
        self.with_connection(deadline, |conn| {
            let reply = conn.req_command(cmd)?;
            let follow = then(&reply).map(|next| conn.req_command(&next));
            // A follow-up that failed without a server's answer leaves the
            // connection out of step: the caller's result says so, and the
            // connection is dropped.
            match follow {
                Some(Err(error)) if error.code().is_none() => Err(error),
                follow => Ok((reply, follow)),
            }
        })
    }

    /// Runs `f` on a connection of the pool (or a new one), bounded by
    /// `deadline`, and keeps the connection only if it is in step.
    fn with_connection<R>(
        &self,
        deadline: Instant,
        f: impl FnOnce(&mut redis::Connection) -> RedisResult<R>,
    ) -> RedisResult<R> {
        let left = |deadline: Instant| {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                Err(timeout_error())
            } else {
                Ok(left)
            }
        };
        let idle = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let mut conn = match idle {
            Some(conn) => conn,
            None => self.client.get_connection_with_timeout(left(deadline)?)?,
        };
        let timeout = left(deadline)?;
        conn.set_read_timeout(Some(timeout))?;
        conn.set_write_timeout(Some(timeout))?;
        let result = f(&mut conn);
        // A server's error leaves the connection in step; anything else (a
        // timeout, a reset) may not: drop it.
        let healthy = match &result {
            Ok(_) => true,
            Err(error) => error.code().is_some(),
        };
        if healthy && conn.is_open() {
            let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
            if idle.len() < MAX_IDLE {
                idle.push(conn);
            }
        }
        result
    }
}

fn request(conn: &mut redis::Connection, cmds: &[Cmd]) -> RedisResult<Vec<Value>> {
    if let [cmd] = cmds {
        return conn.req_command(cmd).map(|reply| vec![reply]);
    }
    let mut pipe = redis::pipe();
    for cmd in cmds {
        pipe.add_command(cmd.clone());
    }
    conn.req_packed_commands(&pipe.get_packed_pipeline(), 0, cmds.len())
}

struct BlockingIo<'a>(&'a Pool);

impl Io for BlockingIo<'_> {
    async fn send(&self, _key: &[u8], _read: bool, cmds: &[Cmd], deadline: Instant) -> RedisResult<Vec<Value>> {
        self.0.send(cmds, deadline)
    }

    async fn send_then(
        &self,
        _key: &[u8],
        cmd: &Cmd,
        then: &Then<'_>,
        deadline: Instant,
    ) -> RedisResult<(Value, Option<RedisResult<Value>>)> {
        self.0.send_then(cmd, then, deadline)
    }

    async fn slot_map(&self, _deadline: Instant) -> RedisResult<Option<Vec<SlotRange>>> {
        Ok(None)
    }

    async fn sleep(&self, duration: Duration) {
        std::thread::sleep(duration)
    }
}

/// Runs a future on this thread. The blocking I/O's futures are ready at
/// their first poll; a caller's clock may return one that is not, so the
/// thread parks until it is woken.
fn block_on<F: Future>(future: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut future = pin!(future);
    loop {
        if let Poll::Ready(output) = future.as_mut().poll(&mut cx) {
            return output;
        }
        std::thread::park();
    }
}

/// A limiter over a single server, without an async runtime. `Sync`: share
/// it between threads; each call takes a connection from its pool.
pub struct Limiter {
    pool: Arc<Pool>,
    config: Arc<Config>,
    shared: Arc<Shared>,
}

impl Clone for Limiter {
    fn clone(&self) -> Self {
        Limiter {
            pool: self.pool.clone(),
            config: self.config.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl Builder<redis::Client> {
    /// The blocking limiter (over `redis::Client`), or [`Error::Argument`]
    /// naming the first option out of its range (see [`Builder::build`]).
    pub fn build_blocking(self) -> Result<Limiter, Error> {
        let (client, config) = self.into_parts()?;
        Ok(Limiter {
            pool: Arc::new(Pool {
                client,
                idle: Mutex::new(Vec::new()),
            }),
            shared: Arc::new(Shared::new(config.block_cache)),
            config: Arc::new(config),
        })
    }
}

impl Limiter {
    /// A limiter with the defaults (see [`crate::Limiter::new`]).
    pub fn new(client: redis::Client) -> Limiter {
        let config = Config::default();
        Limiter {
            pool: Arc::new(Pool {
                client,
                idle: Mutex::new(Vec::new()),
            }),
            shared: Arc::new(Shared::new(config.block_cache)),
            config: Arc::new(config),
        }
    }

    /// Configure it: `blocking::Limiter::builder(client).timeout(..).build_blocking()?`.
    pub fn builder(client: redis::Client) -> Builder<redis::Client> {
        Builder::with(client)
    }

    /// The same limiter with another error policy.
    pub fn with_on_error(&self, policy: ErrorPolicy) -> Limiter {
        let mut config = (*self.config).clone();
        config.policy = policy;
        Limiter {
            pool: self.pool.clone(),
            config: Arc::new(config),
            shared: self.shared.clone(),
        }
    }

    fn engine(&self) -> Engine<'_, BlockingIo<'_>> {
        Engine {
            io: BlockingIo(&self.pool),
            config: &self.config,
            shared: &self.shared,
        }
    }

    /// See [`crate::Limiter::stats`].
    pub fn stats(&self) -> Stats {
        self.shared.stats()
    }

    /// See [`crate::Limiter::allow`].
    pub fn allow(&self, request: &Request) -> Result<Decision, Error> {
        block_on(self.engine().allow(request))
    }

    /// See [`crate::Limiter::peek`].
    pub fn peek(&self, request: &Request) -> Result<Decision, Error> {
        block_on(self.engine().peek(request))
    }

    /// See [`crate::Limiter::refund`].
    pub fn refund(&self, refund: &Refund) -> Result<u64, Error> {
        block_on(self.engine().refund(refund))
    }

    /// See [`crate::Limiter::reset`].
    pub fn reset(&self, key: &str) -> Result<bool, Error> {
        block_on(self.engine().reset(key))
    }

    /// See [`crate::Limiter::acquire`]; sleeps this thread.
    pub fn acquire(&self, request: &Request, max_wait: Duration) -> Result<Decision, Error> {
        block_on(self.engine().acquire(request, max_wait))
    }

    /// See [`crate::Limiter::allow_all`].
    pub fn allow_all(&self, requests: &[Request]) -> Result<MultiDecision, Error> {
        block_on(self.engine().allow_all(requests))
    }
}
