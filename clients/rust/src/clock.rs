//! Time for `acquire` and for replays: the system's (the default: the server's
//! clock decides, sleeps are real) or one the caller gives, such as a virtual
//! clock in tests. And `acquire`'s plan, pure: sleep how long, or stop.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use crate::decision::{Decision, Via};

/// A clock for [`Limiter`](crate::Limiter): calls send `NOW` from it, and
/// `acquire` measures its deadline and sleeps through it.
///
/// A virtual clock advances by each sleep and returns at once, so a test of
/// `acquire` runs in no time and sees every sleep (the conformance vectors'
/// `acquire` cases run that way).
pub trait Clock: Send + Sync + 'static {
    /// Now, in unix milliseconds (sent as `NOW`).
    fn now_ms(&self) -> u64;
    /// Waits `duration` (a virtual clock: advances by it).
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn Future<Output = ()> + Send + '_>>;
}

/// What `acquire` does after a rejected [`Decision`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AcquireStep {
    /// Sleep this long, then ask again.
    Sleep(Duration),
    /// Return the decision: it was admitted, or answered by the error policy.
    Done,
    /// Return it: the request can never fit (`cost_exceeds_limit`).
    Never,
    /// Return it: it can't fit before the deadline.
    Deadline,
}

/// docs/clients.md, "acquire": after `decision`, with `left` until the
/// deadline, the next step. `jitter_fraction` of the retry-after is added at
/// most, scaled by a uniform draw in [0, 1) that `draw` makes only when it
/// sleeps with a jitter; jitter is added, never subtracted, and every sleep is
/// at least 1 ms and never past the deadline.
pub fn acquire_step(
    decision: &Decision,
    left: Duration,
    jitter_fraction: f64,
    draw: impl FnOnce() -> f64,
) -> AcquireStep {
    if decision.allowed || decision.via == Via::Error {
        return AcquireStep::Done;
    }
    let Some(retry_after) = decision.retry_after.filter(|_| !decision.cost_exceeds_limit) else {
        return AcquireStep::Never;
    };
    if retry_after > left {
        return AcquireStep::Deadline;
    }
    let retry_ms = retry_after.as_millis() as u64;
    let jitter_ms = if jitter_fraction > 0.0 {
        (retry_ms as f64 * jitter_fraction * draw()).floor() as u64
    } else {
        0
    };
    let left_ms = left.as_millis() as u64;
    AcquireStep::Sleep(Duration::from_millis(
        retry_ms.saturating_add(jitter_ms).min(left_ms).max(1),
    ))
}

/// A uniform draw in [0, 1) for the jitter, from a xorshift seeded by the
/// process's random hasher state (no dependency for a jitter).
pub(crate) fn default_random() -> impl Fn() -> f64 + Send + Sync + 'static {
    use std::collections::hash_map::RandomState;
    use std::hash::BuildHasher;
    use std::sync::atomic::{AtomicU64, Ordering};
    let seed = RandomState::new().hash_one(std::time::SystemTime::now()) | 1;
    let state = AtomicU64::new(seed);
    move || {
        let mut x = state.load(Ordering::Relaxed);
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        state.store(x, Ordering::Relaxed);
        (x >> 11) as f64 / (1u64 << 53) as f64
    }
}
