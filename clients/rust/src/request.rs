//! What a call asks: the key, the windows and their limits, the cost, and the
//! options; and the canonical command it becomes (docs/clients.md, "Calls").

use std::time::Duration;

use redis::Cmd;

use crate::error::Error;

/// One more window on the same key, checked in the same call: `TIER window limit`.
///
/// Tier 0 is the request's own `window` and `limit`; tier *i* is the *i*-th of
/// [`Request::tiers`]. A request is admitted only when it fits in every tier.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Tier {
    pub window: Duration,
    pub limit: u64,
}

impl Tier {
    pub const fn new(window: Duration, limit: u64) -> Tier {
        Tier { window, limit }
    }
}

/// One call on one key: `allow`, `peek` or `acquire` take it as it is, and
/// [`Limiter::allow_all`](crate::Limiter::allow_all) takes several.
///
/// ```
/// use std::time::Duration;
/// use xcloak_client::Request;
///
/// // 5 a minute and 20 an hour for alice's logins, with the stamp that a refund takes.
/// let login = Request::new("login:alice", Duration::from_secs(60), 5)
///     .tier(Duration::from_secs(3600), 20)
///     .stamp();
/// assert_eq!(login.tiers.len(), 1);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// The window's key, after the limiter's prefix. One call touches one key,
    /// so it is Cluster-safe without a hash tag.
    pub key: String,
    /// Tier 0's window, a whole number of milliseconds.
    pub window: Duration,
    /// Tier 0's limit: at most this many units per `window`.
    pub limit: u64,
    /// The tiers after the positional one, in order.
    pub tiers: Vec<Tier>,
    /// Units this request takes (default 1, then not sent).
    pub cost: u64,
    /// Ask for the admission's stamp (`STAMP`), the handle [`refund`](crate::Limiter::refund) takes.
    /// An `allow` option (also `acquire`'s and `allow_all`'s): a peek refuses it
    /// with [`Error::Argument`] naming `stamp`.
    pub stamp: bool,
    /// Ask for the oldest entry live in the binding tier's window (`OLDEST`),
    /// the Decision's `oldest`. A `peek` option: `allow`, `acquire` and
    /// `allow_all` refuse it with [`Error::Argument`] naming `oldest`.
    pub oldest: bool,
    /// The server's notion of now, in unix milliseconds (`NOW`), for replays and
    /// tests. `None` (the default) lets the server's clock decide; a limiter built
    /// with a [`Clock`](crate::Clock) fills it from that clock.
    pub now: Option<u64>,
}

impl Request {
    /// At most `limit` units of cost per `window` on `key`.
    pub fn new(key: impl Into<String>, window: Duration, limit: u64) -> Request {
        Request {
            key: key.into(),
            window,
            limit,
            tiers: Vec::new(),
            cost: 1,
            stamp: false,
            oldest: false,
            now: None,
        }
    }

    /// Adds a tier: also at most `limit` per `window` on the same key.
    pub fn tier(mut self, window: Duration, limit: u64) -> Request {
        self.tiers.push(Tier { window, limit });
        self
    }

    /// Sets every tier after the positional one.
    pub fn tiers(mut self, tiers: impl IntoIterator<Item = Tier>) -> Request {
        self.tiers = tiers.into_iter().collect();
        self
    }

    /// This request takes `cost` units (default 1).
    pub fn cost(mut self, cost: u64) -> Request {
        self.cost = cost;
        self
    }

    /// Asks for the admission's stamp (the Decision's `stamp`).
    pub fn stamp(mut self) -> Request {
        self.stamp = true;
        self
    }

    /// Asks a peek for the stamp of the oldest entry live in the binding
    /// tier's window, where a moving window starts (the Decision's `oldest`).
    pub fn oldest(mut self) -> Request {
        self.oldest = true;
        self
    }

    /// Decides at `now_ms` (unix milliseconds) instead of the server's clock.
    pub fn now(mut self, now_ms: u64) -> Request {
        self.now = Some(now_ms);
        self
    }

    /// The canonical `XCLOAK.ALLOW key window limit [TIER w l]... [COST c] [NOW t] DETAILS [STAMP]`,
    /// byte for byte what a [`Limiter`](crate::Limiter) sends (without its prefix).
    /// Refuses a window that is not a whole number of milliseconds, and `oldest` (a peek's).
    pub fn allow_command(&self) -> Result<Cmd, Error> {
        let mut cmd = redis::cmd("XCLOAK.ALLOW");
        cmd.arg(&self.key);
        self.write_args(Op::Allow { stamp: self.stamp }, &mut cmd)?;
        Ok(cmd)
    }

    /// The canonical `XCLOAK.PEEK key window limit [TIER w l]... [COST c] [NOW t] [OLDEST]`.
    /// Refuses a window that is not a whole number of milliseconds, and `stamp` (an allow's).
    pub fn peek_command(&self) -> Result<Cmd, Error> {
        let mut cmd = redis::cmd("XCLOAK.PEEK");
        cmd.arg(&self.key);
        self.write_args(Op::Peek, &mut cmd)?;
        Ok(cmd)
    }

    /// Refuses the option that `op` does not take, rather than ignore it
    /// (docs/clients.md, "Arguments"): `oldest` on an allow, `stamp` on a peek.
    pub(crate) fn check_options(&self, op: Op) -> Result<(), Error> {
        let refused = match op {
            Op::Allow { .. } if self.oldest => Some(("oldest", "a peek option: allow takes no oldest")),
            Op::Peek if self.stamp => Some(("stamp", "an allow option: peek takes no stamp (it records nothing)")),
            _ => None,
        };
        match refused {
            Some((name, why)) => Err(Error::Argument {
                name: name.to_string(),
                message: format!("{name} is {why}"),
            }),
            None => Ok(()),
        }
    }

    /// Writes the arguments after the key, in the canonical order.
    pub(crate) fn write_args(&self, op: Op, cmd: &mut Cmd) -> Result<(), Error> {
        self.check_options(op)?;
        cmd.arg(whole_ms("window", self.window)?).arg(self.limit);
        for (i, tier) in self.tiers.iter().enumerate() {
            let name = format!("window of TIER {}", i + 1);
            cmd.arg("TIER").arg(whole_ms(&name, tier.window)?).arg(tier.limit);
        }
        if self.cost != 1 {
            cmd.arg("COST").arg(self.cost);
        }
        if let Some(now) = self.now {
            cmd.arg("NOW").arg(now);
        }
        match op {
            Op::Allow { stamp } => {
                cmd.arg("DETAILS");
                if stamp {
                    cmd.arg("STAMP");
                }
            }
            Op::Peek if self.oldest => {
                cmd.arg("OLDEST");
            }
            _ => {}
        }
        Ok(())
    }
}

/// A refund: `XCLOAK.REFUND key stamp [COST c]`, taking back an admission
/// by the stamp its Decision carried (docs/clients.md, "Calls").
///
/// ```
/// use xcloak_client::Refund;
///
/// // The admission cost 3: give back all three.
/// let refund = Refund::new("login:alice", 1_700_000_000_123).cost(3);
/// assert_eq!(refund.cost, 3);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refund {
    /// The window's key, after the limiter's prefix, as the admission's.
    pub key: String,
    /// The admission's stamp ([`Decision::stamp`](crate::Decision::stamp)).
    pub stamp: u64,
    /// Units to give back, at most the admission's cost (default 1, then not sent).
    pub cost: u64,
}

impl Refund {
    /// Gives back one unit of the admission stamped `stamp` on `key`.
    pub fn new(key: impl Into<String>, stamp: u64) -> Refund {
        Refund {
            key: key.into(),
            stamp,
            cost: 1,
        }
    }

    /// Gives back `cost` units (default 1): the admission's cost, to refund it whole.
    pub fn cost(mut self, cost: u64) -> Refund {
        self.cost = cost;
        self
    }

    /// The canonical `XCLOAK.REFUND key stamp [COST c]`, byte for byte what a
    /// [`Limiter`](crate::Limiter) sends (without its prefix).
    pub fn command(&self) -> Cmd {
        let mut cmd = redis::cmd("XCLOAK.REFUND");
        cmd.arg(&self.key);
        self.write_args(&mut cmd);
        cmd
    }

    pub(crate) fn write_args(&self, cmd: &mut Cmd) {
        cmd.arg(self.stamp);
        if self.cost != 1 {
            cmd.arg("COST").arg(self.cost);
        }
    }
}

/// Which of the three window commands a call is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    Allow { stamp: bool },
    Peek,
    Refund,
}

impl Op {
    pub(crate) fn command(self) -> &'static str {
        match self {
            Op::Allow { .. } => "XCLOAK.ALLOW",
            Op::Peek => "XCLOAK.PEEK",
            Op::Refund => "XCLOAK.REFUND",
        }
    }
}

/// A duration as whole milliseconds; the client's one argument check
/// (docs/clients.md): every range check is the server's, so its error text is
/// the same in every language and through the fallback. A duration beyond
/// u64 milliseconds is sent as u64::MAX, which the server refuses by name.
pub(crate) fn whole_ms(name: &str, duration: Duration) -> Result<u64, Error> {
    if !duration.subsec_nanos().is_multiple_of(1_000_000) {
        return Err(Error::Argument {
            name: name.to_string(),
            message: format!("{name} must be a whole number of milliseconds, not {duration:?}"),
        });
    }
    Ok(u64::try_from(duration.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(cmd: &Cmd) -> Vec<String> {
        cmd.args_iter()
            .map(|a| match a {
                redis::Arg::Simple(b) => String::from_utf8_lossy(b).into_owned(),
                _ => "<not simple>".into(),
            })
            .collect()
    }

    #[test]
    fn the_canonical_order_is_tiers_cost_now_details_stamp() {
        let request = Request::new("k", Duration::from_secs(1), 3)
            .tier(Duration::from_secs(60), 5)
            .cost(2)
            .now(7);
        // OLDEST is a peek's, last; STAMP an allow's.
        assert_eq!(
            args(&request.clone().oldest().peek_command().unwrap()),
            [
                "XCLOAK.PEEK",
                "k",
                "1000",
                "3",
                "TIER",
                "60000",
                "5",
                "COST",
                "2",
                "NOW",
                "7",
                "OLDEST"
            ]
        );
        // Each refuses the other's option, by name, rather than ignore it.
        for (error, name) in [
            (request.clone().oldest().allow_command().unwrap_err(), "oldest"),
            (request.clone().stamp().peek_command().unwrap_err(), "stamp"),
        ] {
            assert!(
                matches!(&error, Error::Argument { name: n, .. } if n == name),
                "{error:?}"
            );
        }
        assert_eq!(
            args(&request.clone().stamp().allow_command().unwrap()),
            [
                "XCLOAK.ALLOW",
                "k",
                "1000",
                "3",
                "TIER",
                "60000",
                "5",
                "COST",
                "2",
                "NOW",
                "7",
                "DETAILS",
                "STAMP"
            ]
        );
        assert_eq!(
            args(&request.peek_command().unwrap()),
            [
                "XCLOAK.PEEK",
                "k",
                "1000",
                "3",
                "TIER",
                "60000",
                "5",
                "COST",
                "2",
                "NOW",
                "7"
            ]
        );
        // A cost of 1 is the default and is not sent.
        assert_eq!(
            args(
                &Request::new("k", Duration::from_millis(5), 1)
                    .cost(1)
                    .peek_command()
                    .unwrap()
            ),
            ["XCLOAK.PEEK", "k", "5", "1"]
        );
        assert_eq!(args(&Refund::new("k", 9).command()), ["XCLOAK.REFUND", "k", "9"]);
        assert_eq!(
            args(&Refund::new("k", 9).cost(4).command()),
            ["XCLOAK.REFUND", "k", "9", "COST", "4"]
        );
    }

    #[test]
    fn a_window_of_a_fraction_of_a_millisecond_is_refused_by_name() {
        let error = Request::new("k", Duration::from_micros(1500), 3)
            .allow_command()
            .unwrap_err();
        assert!(
            matches!(&error, Error::Argument { name, .. } if name == "window"),
            "{error:?}"
        );
        let error = Request::new("k", Duration::from_secs(1), 3)
            .tier(Duration::from_nanos(1), 1)
            .allow_command()
            .unwrap_err();
        assert!(
            matches!(&error, Error::Argument { name, .. } if name == "window of TIER 1"),
            "{error:?}"
        );
        // Whole milliseconds, however large, go to the server, which checks the range.
        assert_eq!(
            whole_ms("window", Duration::from_millis(9_007_199_254_740_992)).unwrap(),
            9_007_199_254_740_992
        );
        assert_eq!(
            whole_ms("window", Duration::MAX).unwrap_err().to_string(),
            format!("window must be a whole number of milliseconds, not {:?}", Duration::MAX)
        );
        assert_eq!(whole_ms("window", Duration::from_secs(u64::MAX)).unwrap(), u64::MAX);
    }
}
