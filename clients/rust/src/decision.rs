//! The pure core: a reply becomes a [`Decision`], several become a
//! [`MultiDecision`]. No I/O here; the conformance vectors drive it without a
//! server (tests/vectors.rs).

use std::time::Duration;

use redis::Value;

use crate::error::{Error, Unavailable};
use crate::request::Request;

/// Who decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Via {
    /// The module's command.
    Command,
    /// The bundled Lua script (a server without the module).
    Script,
    /// The error policy: there was no answer ([`Decision::error`] says why).
    Error,
    /// The block cache: a rejection the server gave this key moments ago,
    /// counted down, without a call ([`Builder::block_cache`](crate::Builder::block_cache)).
    Cache,
}

/// One tier of a decision made with tiers, in the order given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TierState {
    pub window: Duration,
    pub limit: u64,
    pub remaining: u64,
    /// `None` when the request can never fit in this tier (its cost is above the limit).
    pub retry_after: Option<Duration>,
    pub reset_after: Duration,
}

/// The reply of `XCLOAK.ALLOW ... DETAILS [STAMP]` or `XCLOAK.PEEK`, read into
/// one value (docs/clients.md, "Decision"). The binding tier is the one that
/// decided: the only one that refused, or the tightest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// Admitted (a peek: would be admitted now).
    pub allowed: bool,
    /// The binding tier's limit.
    pub limit: u64,
    /// The binding tier's remaining units, never below 0.
    pub remaining: u64,
    /// Zero when allowed; else the wait until the request fits in every tier
    /// if nothing else is admitted meanwhile. `None` when it can never fit:
    /// see `cost_exceeds_limit`.
    pub retry_after: Option<Duration>,
    /// Until the binding tier's window is empty.
    pub reset_after: Duration,
    /// The cost is above a tier's limit: it can never be admitted. Answer with
    /// a client error; don't retry.
    pub cost_exceeds_limit: bool,
    /// The binding tier's window.
    pub window: Duration,
    /// The binding tier's index: 0 for the positional pair, *i* for the *i*-th tier.
    pub tier: usize,
    /// With tiers only (else empty): every tier, in the order given.
    pub tiers: Vec<TierState>,
    /// With `stamp`: the admission's stamp, the handle `refund` takes; `None`
    /// when rejected or not asked.
    pub stamp: Option<u64>,
    /// A peek with `oldest`: the stamp (unix ms) of the oldest entry live in
    /// the binding tier's window, where a moving window starts; `None` when
    /// that window is empty or not asked.
    pub oldest: Option<u64>,
    pub via: Via,
    /// With `via = Via::Error`: the outage or timeout that the policy answered.
    pub error: Option<Unavailable>,
}

impl Decision {
    /// Reads the reply to `request` sent as [`Request::allow_command`]
    /// (`XCLOAK.ALLOW ... DETAILS`, with `STAMP` when `request.stamp`), or
    /// through the allow script, which answers the same.
    pub fn from_reply(reply: &Value, request: &Request, via: Via) -> Result<Decision, Error> {
        Decision::read(reply, request, via, Last::Stamp)
    }

    /// Reads the reply to `request` sent as [`Request::peek_command`]
    /// (`XCLOAK.PEEK`, with `OLDEST` when `request.oldest`), or through the
    /// peek script.
    pub fn from_peek_reply(reply: &Value, request: &Request, via: Via) -> Result<Decision, Error> {
        Decision::read(reply, request, via, Last::Oldest)
    }

    fn read(reply: &Value, request: &Request, via: Via, last: Last) -> Result<Decision, Error> {
        let bad = || {
            Error::Client(format!(
                "an xcloak reply is five integers, a tier list and a stamp or the oldest entry, not {reply:?}"
            ))
        };
        let Value::Array(items) = reply else { return Err(bad()) };
        if items.len() < 5 {
            return Err(bad());
        }
        let mut fields = [0i64; 5];
        for (field, item) in fields.iter_mut().zip(&items[..5]) {
            *field = int(item).ok_or_else(bad)?;
        }
        let mut rest = items[5..].iter();
        let mut next = rest.next();
        let mut tiers = Vec::new();
        if let Some(Value::Array(per_tier)) = next {
            for tier in per_tier {
                let Value::Array(tier) = tier else { return Err(bad()) };
                let t: Vec<i64> = tier
                    .iter()
                    .map(int)
                    .collect::<Option<_>>()
                    .filter(|t: &Vec<i64>| t.len() == 5)
                    .ok_or_else(bad)?;
                tiers.push(TierState {
                    window: ms(t[0]).ok_or_else(bad)?,
                    limit: u64::try_from(t[1]).map_err(|_| bad())?,
                    remaining: u64::try_from(t[2].max(0)).map_err(|_| bad())?,
                    retry_after: ms(t[3]),
                    reset_after: ms(t[4]).ok_or_else(bad)?,
                });
            }
            next = rest.next();
        }
        // The last element: ALLOW's stamp with STAMP, PEEK's oldest entry with OLDEST (−1: none).
        let last_value = match next {
            Some(value) => u64::try_from(int(value).ok_or_else(bad)?).ok(),
            None => None,
        };
        let (stamp, oldest) = match last {
            Last::Stamp => (last_value, None),
            Last::Oldest => (None, last_value),
        };
        let [allowed, limit, remaining, retry_after_ms, reset_after_ms] =
            [fields[0], fields[1], fields[2], fields[3], fields[4]];
        // The reply gives the binding tier's fields but not its index: the first
        // tier with the same four, since the server breaks ties to the earliest.
        let tier = tiers
            .iter()
            .position(|t| {
                t.limit as i64 == limit
                    && t.remaining as i64 == remaining.max(0)
                    && t.retry_after.map_or(-1, |d| d.as_millis() as i64) == retry_after_ms
                    && t.reset_after.as_millis() as i64 == reset_after_ms
            })
            .unwrap_or(0);
        let window = tiers.get(tier).map_or(request.window, |t| t.window);
        Ok(Decision {
            allowed: allowed == 1,
            limit: u64::try_from(limit).map_err(|_| bad())?,
            remaining: u64::try_from(remaining.max(0)).map_err(|_| bad())?,
            retry_after: ms(retry_after_ms),
            reset_after: ms(reset_after_ms).ok_or_else(bad)?,
            cost_exceeds_limit: retry_after_ms == -1,
            window,
            tier,
            tiers,
            stamp,
            oldest,
            via,
            error: None,
        })
    }

    /// What the error policy answers for `request` (docs/clients.md): `allowed`
    /// by the policy, tier 0's limit and window as asked, everything else empty.
    pub fn from_error(request: &Request, allowed: bool, error: Unavailable) -> Decision {
        Decision {
            allowed,
            limit: request.limit,
            remaining: 0,
            retry_after: Some(Duration::ZERO),
            reset_after: Duration::ZERO,
            cost_exceeds_limit: false,
            window: request.window,
            tier: 0,
            tiers: Vec::new(),
            stamp: None,
            oldest: None,
            via: Via::Error,
            error: Some(error),
        }
    }

    /// The binding tier's `(window, limit, remaining, reset_after)` and every
    /// tier's, as the headers list them: one per tier, or the positional pair.
    pub(crate) fn policies(&self) -> Vec<(Duration, u64, u64, Duration)> {
        if self.tiers.is_empty() {
            vec![(self.window, self.limit, self.remaining, self.reset_after)]
        } else {
            self.tiers
                .iter()
                .map(|t| (t.window, t.limit, t.remaining, t.reset_after))
                .collect()
        }
    }
}

/// What the element after the tiers is.
#[derive(Clone, Copy)]
enum Last {
    Stamp,
    Oldest,
}

fn int(value: &Value) -> Option<i64> {
    match value {
        Value::Int(n) => Some(*n),
        _ => None,
    }
}

/// Milliseconds from the reply; `None` for the never-fits −1.
fn ms(value: i64) -> Option<Duration> {
    u64::try_from(value).ok().map(Duration::from_millis)
}

/// The outcome of [`Limiter::allow_all`](crate::Limiter::allow_all): one
/// request against several identities, all or nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MultiDecision {
    pub allowed: bool,
    /// One per request sent, in order; a refunded request's decision still
    /// shows its own admission. Requests after a rejection are not sent.
    pub decisions: Vec<Decision>,
    /// The index of the request that rejected.
    pub rejected: Option<usize>,
    /// The index in `decisions` of the binding decision ([`MultiDecision::binding`]):
    /// the rejecting one, or when all are admitted the one with the fewest
    /// `remaining` (ties: the earliest).
    pub binding_index: usize,
}

impl MultiDecision {
    /// The outcome of `decisions`, sent in order until the first rejection.
    pub fn from_decisions(decisions: Vec<Decision>) -> MultiDecision {
        let rejected = decisions.iter().position(|d| !d.allowed);
        let binding_index = rejected.unwrap_or_else(|| {
            // min_by_key returns the first of equal minima: ties go to the earliest.
            decisions
                .iter()
                .enumerate()
                .min_by_key(|(_, d)| d.remaining)
                .map_or(0, |(i, _)| i)
        });
        MultiDecision {
            allowed: rejected.is_none() && !decisions.is_empty(),
            decisions,
            rejected,
            binding_index,
        }
    }

    /// The binding decision: the rejecting one, or when all are admitted the
    /// one with the fewest `remaining` (ties: the earliest).
    pub fn binding(&self) -> &Decision {
        &self.decisions[self.binding_index]
    }

    /// The binding decision's `retry_after`.
    pub fn retry_after(&self) -> Option<Duration> {
        self.binding().retry_after
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(text: &str) -> Value {
        redis::parse_redis_value(text.as_bytes()).unwrap()
    }

    #[test]
    fn a_tie_binds_the_earliest_tier_and_minus_one_is_never_fits() {
        let request = Request::new("k", Duration::from_secs(1), 2).tier(Duration::from_secs(60), 2);
        // Both tiers full with the same figures: tier 0 binds.
        let tied = reply("*6\r\n:0\r\n:2\r\n:0\r\n:500\r\n:500\r\n*2\r\n*5\r\n:1000\r\n:2\r\n:0\r\n:500\r\n:500\r\n*5\r\n:60000\r\n:2\r\n:0\r\n:500\r\n:500\r\n");
        let d = Decision::from_reply(&tied, &request, Via::Command).unwrap();
        assert_eq!((d.tier, d.window), (0, Duration::from_secs(1)));
        // Only the second matches: it binds, and the window is its own.
        let second = reply("*6\r\n:0\r\n:2\r\n:0\r\n:900\r\n:900\r\n*2\r\n*5\r\n:1000\r\n:2\r\n:1\r\n:0\r\n:500\r\n*5\r\n:60000\r\n:2\r\n:0\r\n:900\r\n:900\r\n");
        let d = Decision::from_reply(&second, &request, Via::Script).unwrap();
        assert_eq!((d.tier, d.window, d.via), (1, Duration::from_secs(60), Via::Script));
        let never = reply("*6\r\n:0\r\n:2\r\n:2\r\n:-1\r\n:0\r\n:-1\r\n");
        let d = Decision::from_reply(
            &never,
            &Request::new("k", Duration::from_secs(1), 2).cost(3).stamp(),
            Via::Command,
        )
        .unwrap();
        assert_eq!((d.retry_after, d.cost_exceeds_limit, d.stamp), (None, true, None));
        assert!(Decision::from_reply(&Value::Int(1), &request, Via::Command).is_err());
        // A peek's last element is the oldest entry (−1: none), never a stamp.
        let peek = reply("*6\r\n:0\r\n:3\r\n:0\r\n:59800\r\n:59900\r\n:1700000000100\r\n");
        let d = Decision::from_peek_reply(
            &peek,
            &Request::new("k", Duration::from_secs(60), 3).oldest().stamp(),
            Via::Command,
        )
        .unwrap();
        assert_eq!((d.oldest, d.stamp), (Some(1_700_000_000_100), None));
        let empty = reply("*6\r\n:1\r\n:3\r\n:3\r\n:0\r\n:0\r\n:-1\r\n");
        assert_eq!(
            Decision::from_peek_reply(
                &empty,
                &Request::new("k", Duration::from_secs(60), 3).oldest(),
                Via::Command
            )
            .unwrap()
            .oldest,
            None
        );
    }

    #[test]
    fn the_binding_decision_is_the_rejection_or_the_fewest_remaining() {
        let d = |allowed: bool, remaining: u64| Decision {
            allowed,
            remaining,
            ..Decision::from_error(
                &Request::new("k", Duration::from_secs(1), 9),
                true,
                Unavailable {
                    cause: crate::Cause::Timeout,
                    message: String::new(),
                },
            )
        };
        assert_eq!(
            MultiDecision::from_decisions(vec![d(true, 3), d(true, 1), d(true, 1)]).binding_index,
            1
        );
        let m = MultiDecision::from_decisions(vec![d(true, 0), d(false, 2)]);
        assert_eq!((m.allowed, m.rejected, m.binding_index), (false, Some(1), 1));
    }
}
