//! The two kinds of errors of docs/clients.md, never confused: the server
//! refused the call ([`Error::Server`], raised whatever the error policy), or
//! there was no answer ([`Error::Unavailable`], which the error policy answers).

use std::fmt;

use redis::RedisError;

/// Everything a call can fail with.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// The server refused the call: an argument out of range (its text names
    /// it), `WRONGTYPE`, `NOPERM`, or an unknown command under
    /// `Fallback::Never`. `message` is the server's, verbatim, code first:
    /// `ERR window must be an integer from 1 to 9007199254740991 (milliseconds)`.
    /// Never swallowed: a bad argument is a bug in the caller.
    Server { code: String, message: String },
    /// No answer: the error policy `raise`. The call may or may not have been
    /// applied, and it was not sent again.
    Unavailable(Unavailable),
    /// An argument refused before anything was sent (a window that is not a
    /// whole number of milliseconds).
    Argument { name: String, message: String },
    /// A reply of a shape the contract does not have (not an xcloak server?), or
    /// a client library error that is not an outage (its configuration).
    Client(String),
}

/// An outage or a timeout: what the error policy answers. A `Decision` with
/// `via = Via::Error` carries it in `error`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unavailable {
    pub cause: Cause,
    /// What happened, for logs.
    pub message: String,
}

/// Why there was no answer.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Cause {
    /// The limiter's timeout (or the connection's own) passed first.
    Timeout,
    /// A connection refused, reset or closed.
    Connection,
    /// A server that can't serve now: `LOADING`, `BUSY`, `MASTERDOWN`,
    /// `CLUSTERDOWN`, `TRYAGAIN`, `READONLY`, `NOREPLICAS`, `OOM`, or `ERR`
    /// for `ERR max number of clients reached`.
    Server { code: String },
    /// Durable mode: `WAIT` counted fewer replicas than asked.
    NotReplicated { acknowledged: u64, wanted: u32 },
}

/// Server error codes that mean "can't serve now", not "you asked wrongly".
const UNAVAILABLE_CODES: [&str; 8] = [
    "LOADING",
    "BUSY",
    "MASTERDOWN",
    "CLUSTERDOWN",
    "TRYAGAIN",
    "READONLY",
    "NOREPLICAS",
    "OOM",
];

/// The one `ERR` that is an outage: the server is at `maxclients` (it then
/// closes the connection; nothing was applied).
const MAX_CLIENTS: &str = "max number of clients reached";

impl Error {
    /// The server's message verbatim for [`Error::Server`], else the error's text.
    pub fn message(&self) -> String {
        match self {
            Error::Server { message, .. } => message.clone(),
            other => other.to_string(),
        }
    }

    /// Whether this is an outage or a timeout (the error policy's business).
    pub fn is_unavailable(&self) -> bool {
        matches!(self, Error::Unavailable(_))
    }

    pub(crate) fn unavailable(cause: Cause, message: impl Into<String>) -> Error {
        Error::Unavailable(Unavailable {
            cause,
            message: message.into(),
        })
    }

    /// Sorts a `redis` error into the contract's two kinds.
    pub(crate) fn from_redis(error: &RedisError) -> Error {
        if let Some(code) = error.code() {
            let message = match error.detail() {
                Some(detail) if !detail.is_empty() => format!("{code} {detail}"),
                _ => code.to_string(),
            };
            if UNAVAILABLE_CODES.contains(&code)
                || (code == "ERR" && error.detail().is_some_and(|d| d.starts_with(MAX_CLIENTS)))
            {
                return Error::unavailable(Cause::Server { code: code.to_string() }, message);
            }
            return Error::Server {
                code: code.to_string(),
                message,
            };
        }
        if error.is_timeout() {
            return Error::unavailable(Cause::Timeout, error.to_string());
        }
        use redis::ErrorKind as K;
        match error.kind() {
            K::Io | K::Parse | K::ClusterConnectionNotFound => Error::unavailable(Cause::Connection, error.to_string()),
            _ if error.is_io_error() || error.is_connection_dropped() || error.is_connection_refusal() => {
                Error::unavailable(Cause::Connection, error.to_string())
            }
            _ => Error::Client(error.to_string()),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Server { message, .. } => f.write_str(message),
            Error::Unavailable(unavailable) => unavailable.fmt(f),
            Error::Argument { message, .. } => f.write_str(message),
            Error::Client(message) => write!(f, "xcloak client: {message}"),
        }
    }
}

impl fmt::Display for Unavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match &self.cause {
            Cause::Timeout => "timeout",
            Cause::Connection => "connection",
            Cause::Server { .. } => "server unavailable",
            Cause::NotReplicated { .. } => "not replicated",
        };
        write!(f, "xcloak unavailable ({what}): {}", self.message)
    }
}

impl std::error::Error for Error {}
impl std::error::Error for Unavailable {}

impl From<Unavailable> for Error {
    fn from(unavailable: Unavailable) -> Error {
        Error::Unavailable(unavailable)
    }
}

/// What to answer when there is no answer (docs/clients.md, "Errors").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ErrorPolicy {
    /// Return [`Error::Unavailable`] with the cause (the default).
    #[default]
    Raise,
    /// Fail open: a `Decision` with `allowed = true`, `via = Via::Error`.
    Allow,
    /// Fail closed: a `Decision` with `allowed = false`, `via = Via::Error`.
    Deny,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(text: &str) -> RedisError {
        let parsed = redis::parse_redis_value(format!("-{text}\r\n").as_bytes()).unwrap();
        parsed.extract_error().unwrap_err()
    }

    #[test]
    fn a_refusal_keeps_the_servers_text_and_an_outage_code_goes_to_the_policy() {
        let refusal = Error::from_redis(&server(
            "ERR window must be an integer from 1 to 9007199254740991 (milliseconds)",
        ));
        assert_eq!(
            refusal,
            Error::Server {
                code: "ERR".into(),
                message: "ERR window must be an integer from 1 to 9007199254740991 (milliseconds)".into()
            }
        );
        assert_eq!(
            refusal.to_string(),
            "ERR window must be an integer from 1 to 9007199254740991 (milliseconds)"
        );
        let wrongtype = Error::from_redis(&server(
            "WRONGTYPE Operation against a key holding the wrong kind of value",
        ));
        assert!(matches!(&wrongtype, Error::Server { code, .. } if code == "WRONGTYPE"));
        for code in UNAVAILABLE_CODES {
            let error = Error::from_redis(&server(&format!("{code} try later")));
            assert_eq!(
                error,
                Error::unavailable(Cause::Server { code: code.into() }, format!("{code} try later")),
                "{code}"
            );
        }
        let full = Error::from_redis(&server("ERR max number of clients reached"));
        assert_eq!(
            full,
            Error::unavailable(
                Cause::Server { code: "ERR".into() },
                "ERR max number of clients reached"
            )
        );
        let reset = RedisError::from(std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset"));
        assert!(matches!(
            Error::from_redis(&reset),
            Error::Unavailable(Unavailable {
                cause: Cause::Connection,
                ..
            })
        ));
        let timeout = RedisError::from(std::io::Error::new(std::io::ErrorKind::TimedOut, "slow"));
        assert!(matches!(
            Error::from_redis(&timeout),
            Error::Unavailable(Unavailable {
                cause: Cause::Timeout,
                ..
            })
        ));
    }
}
