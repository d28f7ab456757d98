//! What a [`Limiter`](crate::Limiter) sends its calls through: one file's
//! worth of the `redis` crate, behind one small trait.
//!
//! Implemented for `redis::aio::MultiplexedConnection`,
//! `redis::aio::ConnectionManager` (feature `connection-manager`),
//! `redis::cluster_async::ClusterConnection` (feature `cluster`), and any other
//! single-server `redis::aio::ConnectionLike` wrapped in [`Standalone`].
//! Implement it to add tracing or metrics around the calls.
//!
//! **No retry of a call that may have been applied.** These transports send
//! each command once. `MultiplexedConnection` never re-sends. A
//! `ConnectionManager` reconnects in the background after a dropped
//! connection and returns the error of the call that was in flight; it does
//! not send it again (its retries are for connecting). A cluster connection
//! retries a request after an I/O error or its own response timeout, which
//! would send an ALLOW again: build it with `.retries(0)`
//! ([`cluster_client`](crate::cluster_client) does), and this transport then
//! follows `MOVED` and `ASK` itself (nothing was applied). Tests in
//! `tests/faults.rs` and `tests/cluster.rs` count the server's calls behind a
//! paused server to prove it.

use std::future::Future;

use redis::{Cmd, RedisResult, Value};

/// A slot range of a cluster and the address of its primary (`CLUSTER SLOTS`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotRange {
    pub start: u16,
    pub end: u16,
    /// `host:port` of the primary.
    pub node: String,
}

/// A way to send commands to the node that serves a key.
pub trait Transport: Send + Sync + 'static {
    /// Sends `cmds` in one pipeline to the node serving `key` (with `read`, a
    /// replica may answer), once, and returns one reply per command. A server
    /// error may come back as a `Value::ServerError` reply or as the `Err`.
    fn send<'a>(
        &'a self,
        key: &'a [u8],
        read: bool,
        cmds: &'a [Cmd],
    ) -> impl Future<Output = RedisResult<Vec<Value>>> + Send + 'a;

    /// Sends `cmd` to the primary serving `key`, once, and when its reply is
    /// in and `then(&reply)` gives a command, sends that one after it **on the
    /// same connection** (the node that answered, after any redirection), once:
    /// durable mode's `WAIT`, which waits for its connection's last write, sent
    /// only after a reply that wrote. Returns the reply and the follow-up's
    /// result (`None` when `then` gave none).
    ///
    /// The default sends both through [`send`](Transport::send), which is the
    /// same connection for a single server's multiplexed connection or
    /// connection manager. A wrapper around a cluster connection should
    /// forward this method to it.
    fn send_then<'a>(
        &'a self,
        key: &'a [u8],
        cmd: &'a Cmd,
        then: &'a (dyn Fn(&Value) -> Option<Cmd> + Send + Sync + 'a),
    ) -> impl Future<Output = RedisResult<(Value, Option<RedisResult<Value>>)>> + Send + 'a {
        async move {
            let reply = first(self.send(key, false, std::slice::from_ref(cmd)).await?)?;
            let follow = match then(&reply) {
                Some(next) => Some(self.send(key, false, std::slice::from_ref(&next)).await.and_then(first)),
                None => None,
            };
            Ok((reply, follow))
        }
    }

    /// A cluster's slot map, for the fallback's per-node choice; `None` (the
    /// default) for a single server.
    fn slot_map(&self) -> impl Future<Output = RedisResult<Option<Vec<SlotRange>>>> + Send + '_ {
        async { Ok(None) }
    }
}

/// The one reply of a one-command send.
fn first(replies: Vec<Value>) -> RedisResult<Value> {
    replies
        .into_iter()
        .next()
        .ok_or_else(|| redis::RedisError::from((redis::ErrorKind::UnexpectedReturnType, "no reply")))
}

/// Any single-server connection of the `redis` crate.
#[derive(Clone, Debug)]
pub struct Standalone<C>(pub C);

async fn send_standalone<C: redis::aio::ConnectionLike>(mut conn: C, cmds: &[Cmd]) -> redis::RedisResult<Vec<Value>> {
    if let [cmd] = cmds {
        return Ok(vec![conn.req_packed_command(cmd).await?]);
    }
    let mut pipe = redis::pipe();
    for cmd in cmds {
        pipe.add_command(cmd.clone());
    }
    conn.req_packed_commands(&pipe, 0, cmds.len()).await
}

impl<C> Transport for Standalone<C>
where
    C: redis::aio::ConnectionLike + Clone + Send + Sync + 'static,
{
    fn send<'a>(
        &'a self,
        _key: &'a [u8],
        _read: bool,
        cmds: &'a [Cmd],
    ) -> impl Future<Output = RedisResult<Vec<Value>>> + Send + 'a {
        send_standalone(self.0.clone(), cmds)
    }
}

impl Transport for redis::aio::MultiplexedConnection {
    fn send<'a>(
        &'a self,
        _key: &'a [u8],
        _read: bool,
        cmds: &'a [Cmd],
    ) -> impl Future<Output = RedisResult<Vec<Value>>> + Send + 'a {
        send_standalone(self.clone(), cmds)
    }
}

#[cfg(feature = "connection-manager")]
impl Transport for redis::aio::ConnectionManager {
    fn send<'a>(
        &'a self,
        _key: &'a [u8],
        _read: bool,
        cmds: &'a [Cmd],
    ) -> impl Future<Output = RedisResult<Vec<Value>>> + Send + 'a {
        send_standalone(self.clone(), cmds)
    }
}

#[cfg(feature = "cluster")]
mod cluster {
    use super::*;
    use redis::cluster_async::ClusterConnection;
    use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
    use redis::{ErrorKind, RedisError, ServerErrorKind};

    /// Redirections followed for one call: a slot that moves twice during one
    /// call is an outage for that call.
    const MAX_REDIRECTS: usize = 3;

    fn redirect_of(result: &RedisResult<Vec<Value>>) -> Option<(ServerErrorKind, String, u16)> {
        let error: RedisError = match result {
            Err(error) => error.clone(),
            Ok(replies) => match replies.iter().find(|v| matches!(v, Value::ServerError(_))) {
                Some(Value::ServerError(error)) => error.clone().into(),
                _ => return None,
            },
        };
        let kind = match error.kind() {
            ErrorKind::Server(kind @ (ServerErrorKind::Moved | ServerErrorKind::Ask)) => kind,
            _ => return None,
        };
        // `MOVED <slot> <host>:<port>`: the address is the last colon's split (IPv6 hosts have colons).
        let (addr, _slot) = error.redirect_node()?;
        let (host, port) = addr.rsplit_once(':')?;
        Some((kind, host.to_string(), port.parse().ok()?))
    }

    /// Sends `cmds` to the node serving `key`, following `MOVED` and `ASK`
    /// (the node did not run the call); the result and the node that gave it.
    async fn routed(
        conn: &mut ClusterConnection,
        key: &[u8],
        read: bool,
        cmds: &[Cmd],
    ) -> (RedisResult<Vec<Value>>, SingleNodeRoutingInfo) {
        let slot_addr = if read {
            SlotAddr::ReplicaRequired
        } else {
            SlotAddr::Master
        };
        let mut route = SingleNodeRoutingInfo::SpecificNode(Route::with_key(key, slot_addr));
        let mut asking = false;
        for _ in 0..=MAX_REDIRECTS {
            let result = if cmds.len() == 1 && !asking {
                conn.route_command(cmds[0].clone(), RoutingInfo::SingleNode(route.clone()))
                    .await
                    .map(|v| vec![v])
            } else {
                let mut pipe = redis::pipe();
                if asking {
                    pipe.cmd("ASKING");
                }
                for cmd in cmds {
                    pipe.add_command(cmd.clone());
                }
                conn.route_pipeline(pipe, usize::from(asking), cmds.len(), route.clone())
                    .await
            };
            // MOVED and ASK: the node did not run the call. Go where it says.
            let Some((kind, host, port)) = redirect_of(&result) else {
                return (result, route);
            };
            asking = kind == ServerErrorKind::Ask;
            route = SingleNodeRoutingInfo::ByAddress { host, port };
        }
        (
            Err(RedisError::from((
                ErrorKind::Server(ServerErrorKind::TryAgain),
                "redirected more than 3 times",
            ))),
            route,
        )
    }

    impl Transport for ClusterConnection {
        fn send<'a>(
            &'a self,
            key: &'a [u8],
            read: bool,
            cmds: &'a [Cmd],
        ) -> impl Future<Output = RedisResult<Vec<Value>>> + Send + 'a {
            let mut conn = self.clone();
            async move { routed(&mut conn, key, read, cmds).await.0 }
        }

        /// The follow-up goes to the node that answered (its one connection
        /// of this client), after a redirection too.
        fn send_then<'a>(
            &'a self,
            key: &'a [u8],
            cmd: &'a Cmd,
            then: &'a (dyn Fn(&Value) -> Option<Cmd> + Send + Sync + 'a),
        ) -> impl Future<Output = RedisResult<(Value, Option<RedisResult<Value>>)>> + Send + 'a {
            let mut conn = self.clone();
            async move {
                let (result, route) = routed(&mut conn, key, false, std::slice::from_ref(cmd)).await;
                let reply = first(result?)?;
                let follow = match then(&reply) {
                    Some(next) => Some(conn.route_command(next, RoutingInfo::SingleNode(route)).await),
                    None => None,
                };
                Ok((reply, follow))
            }
        }

        fn slot_map(&self) -> impl Future<Output = RedisResult<Option<Vec<SlotRange>>>> + Send + '_ {
            let mut conn = self.clone();
            async move {
                let slots = conn
                    .route_command(
                        redis::cmd("CLUSTER").arg("SLOTS").clone(),
                        RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
                    )
                    .await?;
                let bad = || RedisError::from((ErrorKind::UnexpectedReturnType, "CLUSTER SLOTS: unexpected reply"));
                let Value::Array(ranges) = slots.extract_error()? else {
                    return Err(bad());
                };
                let mut map = Vec::with_capacity(ranges.len());
                for range in ranges {
                    let Value::Array(parts) = range else { return Err(bad()) };
                    let int = |v: &Value| match v {
                        Value::Int(n) => u16::try_from(*n).ok(),
                        _ => None,
                    };
                    let (Some(start), Some(end), Some(Value::Array(primary))) =
                        (parts.first().and_then(int), parts.get(1).and_then(int), parts.get(2))
                    else {
                        return Err(bad());
                    };
                    let host = match primary.first() {
                        Some(Value::BulkString(bytes)) => String::from_utf8_lossy(bytes).into_owned(),
                        Some(Value::SimpleString(text)) => text.clone(),
                        _ => return Err(bad()),
                    };
                    let port = primary.get(1).and_then(int).ok_or_else(bad)?;
                    map.push(SlotRange {
                        start,
                        end,
                        node: format!("{host}:{port}"),
                    });
                }
                Ok(Some(map))
            }
        }
    }
}

/// The cluster slot of `key` (CRC16/XMODEM of the key or of its `{hash tag}`, mod 16384).
pub(crate) fn key_slot(key: &[u8]) -> u16 {
    let tagged = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            key[open + 1..]
                .iter()
                .position(|&b| b == b'}')
                .map(|len| &key[open + 1..open + 1 + len])
        })
        .filter(|tag| !tag.is_empty())
        .unwrap_or(key);
    let mut crc: u16 = 0;
    for &byte in tagged {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

#[cfg(test)]
mod tests {
    #[test]
    fn key_slots_match_the_cluster_spec() {
        // Redis Cluster specification examples and `CLUSTER KEYSLOT` answers.
        assert_eq!(super::key_slot(b"123456789"), 12739);
        assert_eq!(super::key_slot(b"foo"), 12182);
        assert_eq!(super::key_slot(b"{user1000}.following"), super::key_slot(b"user1000"));
        assert_ne!(super::key_slot(b"foo{}{bar}"), super::key_slot(b"bar"));
        assert_eq!(super::key_slot(b"foo{{bar}}zap"), super::key_slot(b"{bar"));
    }
}
