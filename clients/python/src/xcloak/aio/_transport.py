"""``xcloak/_transport.py`` over redis.asyncio: the same steps, awaited.

The limiter's timeout bounds every exchange (``asyncio.wait_for``); a
cancelled task disconnects the connection it was using, so the reply of a call
already sent is never read as the next call's.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import redis.asyncio
import redis.asyncio.sentinel
import redis.utils
from redis import exceptions as rex
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from .._driver import Node, clone_pool, no_retry_kwargs, node_name
from .._transport import check_client


async def _readonly_on_connect(connection: Any) -> None:
    await connection.on_connect()
    await connection.send_command("READONLY")
    if redis.utils.str_if_bytes(await connection.read_response()) != "OK":
        raise rex.ConnectionError("READONLY command failed")


def _clone(pool: Any, timeout_s: float) -> Any:
    return clone_pool(pool, timeout_s, Retry(NoBackoff(), 0), redis.asyncio.ConnectionPool,
                      redis.asyncio.sentinel.SentinelConnectionPool)


class Transport:
    """The steps for one client: ``redis.asyncio.Redis`` (Sentinel's ``master_for`` too) or ``RedisCluster``."""

    def __init__(self, client: Any, replica: Any, timeout_s: float) -> None:
        self.client = client
        self.timeout_s = timeout_s
        self.cluster = check_client(client, replica, sync=False)
        self._pools: Dict[str, Any] = {}
        self._initialized = False
        self._primary: Optional[Node] = None
        self._replica: Optional[Node] = None
        if not self.cluster:
            self._primary = Node(node_name(client.connection_pool), _clone(client.connection_pool, timeout_s))
            if replica is not None:
                self._replica = Node(node_name(replica.connection_pool) + ":replica",
                                     _clone(replica.connection_pool, timeout_s))

    def fixed(self, readonly: bool) -> Optional[Node]:
        if readonly and self._replica is not None:
            return self._replica
        return self._primary

    async def locate(self, key: str, readonly: bool) -> Node:
        if not self._initialized:
            await self.client.initialize()  # the slot map get_node_from_key reads
            self._initialized = True
        node = self.client.get_node_from_key(key, replica=True) if readonly else None
        replica = node is not None
        if node is None:
            node = self.client.get_node_from_key(key)
        name = node.name + (":replica" if replica else "")
        pool = self._pools.get(name)
        if pool is None:
            kwargs = no_retry_kwargs(node.connection_kwargs, self.timeout_s, Retry(NoBackoff(), 0))
            if replica:
                kwargs["redis_connect_func"] = _readonly_on_connect
            pool = self._pools[name] = redis.asyncio.ConnectionPool(connection_class=node.connection_class, **kwargs)
        return Node(node.name, pool)

    async def refresh(self) -> None:
        if self.cluster:
            await self.client.nodes_manager.initialize()

    async def exchange(self, node: Node, commands: Sequence[Tuple[Any, ...]], deadline: float, conn: Any,
                       keep: bool) -> Tuple[Any, List[Any]]:
        try:
            left = deadline - time.monotonic()
            if left <= 0:
                raise rex.TimeoutError(f"xcloak: no reply within the limiter's timeout ({self.timeout_s} s)")
            return await asyncio.wait_for(self._exchange(node, commands, conn, keep), left)
        except asyncio.TimeoutError as error:
            raise rex.TimeoutError(f"xcloak: no reply within the limiter's timeout ({self.timeout_s} s)") from error

    async def _exchange(self, node: Node, commands: Sequence[Tuple[Any, ...]], conn: Any,
                        keep: bool) -> Tuple[Any, List[Any]]:
        if conn is None:
            conn = await node.pool.get_connection()
        try:
            await conn.send_packed_command(conn.pack_commands(commands))
            replies = []
            for _ in commands:
                try:
                    replies.append(await conn.read_response())
                except rex.ResponseError as error:
                    replies.append(error)
        except BaseException:
            # Also on cancellation: a reply left unread must never be read as the next call's.
            await conn.disconnect()
            await node.pool.release(conn)
            raise
        if keep:
            return conn, replies
        await node.pool.release(conn)
        return None, replies

    async def release(self, node: Node, conn: Any) -> None:
        await node.pool.release(conn)

    async def close(self) -> None:
        pools = list(self._pools.values())
        pools += [n.pool for n in (self._primary, self._replica) if n is not None]
        for pool in pools:
            await pool.disconnect()
