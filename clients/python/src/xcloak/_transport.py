"""Where a key lives and how its commands are sent, over redis-py's sync clients.

The steps :func:`xcloak._driver.drive` yields, as methods; ``aio/_transport.py``
is the same over redis.asyncio. The limiter talks to the servers through
connection pools of its own, made from the client's settings with two changes:
its ``timeout`` as the socket and connect timeout, and **no retry** (redis-py
6+ retries every command three times on ``ConnectionError`` and
``TimeoutError``: an ``XCLOAK.ALLOW`` that timed out would be sent again, and
each may be applied).
"""

from __future__ import annotations

import threading
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import redis
import redis.asyncio
import redis.sentinel
import redis.utils
from redis import exceptions as rex
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry

from ._driver import Node, clone_pool, node_name


def _readonly_on_connect(connection: Any) -> None:
    """A replica connection: READONLY after the handshake (as redis-py's cluster does)."""
    connection.on_connect()
    connection.send_command("READONLY")
    if redis.utils.str_if_bytes(connection.read_response()) != "OK":
        raise rex.ConnectionError("READONLY command failed")


def _clone(pool: Any, timeout_s: float, readonly: bool = False) -> Any:
    return clone_pool(pool, timeout_s, Retry(NoBackoff(), 0), redis.ConnectionPool,
                      redis.sentinel.SentinelConnectionPool, _readonly_on_connect if readonly else None)


def check_client(client: Any, replica: Any, sync: bool) -> bool:
    """Whether ``client`` is a cluster; a client of the other flavour, or no
    client at all, is refused when the limiter is built."""
    ours = (redis.Redis, RedisCluster) if sync else (redis.asyncio.Redis, redis.asyncio.RedisCluster)
    theirs = (redis.asyncio.Redis, redis.asyncio.RedisCluster) if sync else (redis.Redis, RedisCluster)
    kind = "Limiter" if sync else "AsyncLimiter"
    for name, value in (("client", client), ("replica", replica)):
        if value is None and name == "replica":
            continue
        if isinstance(value, theirs):
            other = "AsyncLimiter" if sync else "Limiter"
            raise TypeError(f"{kind} {name} is a {type(value).__module__}.{type(value).__name__}: use {other}")
        if not isinstance(value, ours):
            raise TypeError(f"{kind} {name} must be a {' or '.join(f'{c.__module__}.{c.__name__}' for c in ours)}, "
                            f"not {type(value).__name__}")
    if replica is not None and isinstance(client, ours[1]):
        raise TypeError(f"{kind} replica is for a single server or Sentinel; a cluster's replicas are its own "
                        "(replica_reads=True)")
    return isinstance(client, ours[1])


class Transport:
    """The steps for one client: ``redis.Redis`` (Sentinel's ``master_for`` too) or ``RedisCluster``."""

    def __init__(self, client: Any, replica: Any, timeout_s: float) -> None:
        self.client = client
        self.timeout_s = timeout_s
        self.cluster = check_client(client, replica, sync=True)
        self._pools: Dict[str, Any] = {}
        self._lock = threading.Lock()
        self._primary: Optional[Node] = None
        self._replica: Optional[Node] = None
        if not self.cluster:
            self._primary = Node(node_name(client.connection_pool), _clone(client.connection_pool, timeout_s))
            if replica is not None:
                self._replica = Node(node_name(replica.connection_pool) + ":replica",
                                     _clone(replica.connection_pool, timeout_s))

    def fixed(self, readonly: bool) -> Optional[Node]:
        """A single server's node, known without I/O (None for a cluster: ``locate``)."""
        if readonly and self._replica is not None:
            return self._replica
        return self._primary

    def locate(self, key: str, readonly: bool) -> Node:
        node = self.client.get_node_from_key(key, replica=readonly) if readonly else None
        replica = node is not None
        if node is None:
            node = self.client.get_node_from_key(key)
        name = node.name + (":replica" if replica else "")
        pool = self._pools.get(name)
        if pool is None:
            with self._lock:
                pool = self._pools.get(name)
                if pool is None:
                    source = self.client.get_redis_connection(node).connection_pool
                    pool = self._pools[name] = _clone(source, self.timeout_s, readonly=replica)
        return Node(node.name, pool)

    def refresh(self) -> None:
        if self.cluster:
            self.client.nodes_manager.initialize()

    def exchange(self, node: Node, commands: Sequence[Tuple[Any, ...]], deadline: float, conn: Any,
                 keep: bool) -> Tuple[Any, List[Any]]:
        """Sends ``commands`` pipelined on one connection and reads every reply
        (an error reply as its exception). Any other failure disconnects the
        connection and is raised: nothing is sent again."""
        if conn is None:
            conn = node.pool.get_connection()
        try:
            conn.send_packed_command(conn.pack_commands(commands))
            replies = []
            for _ in commands:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise rex.TimeoutError(f"xcloak: no reply within the limiter's timeout ({self.timeout_s} s)")
                try:
                    replies.append(conn.read_response(timeout=left))
                except rex.ResponseError as error:
                    replies.append(error)
        except BaseException:
            conn.disconnect()
            node.pool.release(conn)
            raise
        if keep:
            return conn, replies
        node.pool.release(conn)
        return None, replies

    def release(self, node: Node, conn: Any) -> None:
        node.pool.release(conn)

    def close(self) -> None:
        pools = list(self._pools.values())
        pools += [n.pool for n in (self._primary, self._replica) if n is not None]
        for pool in pools:
            pool.disconnect()
