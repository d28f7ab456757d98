"""``AsyncLimiter``: the same calls as :class:`xcloak.Limiter`, over redis.asyncio.

Same operations (``xcloak._engine``), same pools-without-retry design, driven
with ``await``. The limiter's timeout bounds every round trip
(``asyncio.wait_for``); a cancelled task disconnects the connection it was
using (the reply of a call already sent is never read by the next call).
"""

from __future__ import annotations

import asyncio
import random as _random
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

import redis.asyncio
import redis.asyncio.sentinel
import redis.utils
from redis import exceptions as rex
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from .. import _engine
from .. import acquire as _acquire
from ..decision import Decision, MultiDecision
from ..errors import UnavailableError, XcloakError
from ..headers import headers as _headers
from ..limiter import Pipeline as _SyncPipeline, _node_name, _wait_ms


def _no_retry_kwargs(kwargs: dict, timeout: float) -> dict:
    out = dict(kwargs)
    out.pop("connection_pool", None)
    out["retry"] = Retry(NoBackoff(), 0)
    if "retry_on_error" in out:
        out["retry_on_error"] = []
    if "retry_on_timeout" in out:
        out["retry_on_timeout"] = False
    out["socket_timeout"] = timeout
    out["socket_connect_timeout"] = timeout
    return out


async def _readonly_on_connect(connection) -> None:
    await connection.on_connect()
    await connection.send_command("READONLY")
    if redis.utils.str_if_bytes(await connection.read_response()) != "OK":
        raise rex.ConnectionError("READONLY command failed")


def _clone_pool(pool, timeout: float, readonly: bool = False):
    kwargs = _no_retry_kwargs(pool.connection_kwargs, timeout)
    if readonly:
        kwargs["redis_connect_func"] = _readonly_on_connect
    if isinstance(pool, redis.asyncio.sentinel.SentinelConnectionPool):
        return redis.asyncio.sentinel.SentinelConnectionPool(
            pool.service_name, pool.sentinel_manager, is_master=pool.is_master,
            check_connection=getattr(pool, "check_connection", False),
            connection_class=pool.connection_class, **kwargs)
    return redis.asyncio.ConnectionPool(connection_class=pool.connection_class,
                                        max_connections=pool.max_connections, **kwargs)


class _Node:
    __slots__ = ("name", "pool")

    def __init__(self, name: str, pool) -> None:
        self.name = name
        self.pool = pool


class _Transport:
    def __init__(self, client, replica, timeout: float) -> None:
        self.client = client
        self.timeout = timeout
        self.cluster = isinstance(client, RedisCluster)
        self._pools: Dict[str, Any] = {}
        self._initialized = False
        if not self.cluster:
            self._primary = _Node(_node_name(client.connection_pool), _clone_pool(client.connection_pool, timeout))
            self._replica = (_Node(_node_name(replica.connection_pool) + ":replica",
                                   _clone_pool(replica.connection_pool, timeout)) if replica is not None else None)

    async def locate(self, key: str, readonly: bool) -> _Node:
        if not self.cluster:
            return self._replica if readonly and self._replica is not None else self._primary
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
            kwargs = _no_retry_kwargs(node.connection_kwargs, self.timeout)
            if replica:
                kwargs["redis_connect_func"] = _readonly_on_connect
            pool = self._pools[name] = redis.asyncio.ConnectionPool(connection_class=node.connection_class, **kwargs)
        return _Node(node.name, pool)

    async def refresh(self) -> None:
        if self.cluster:
            await self.client.nodes_manager.initialize()

    async def exchange(self, node: _Node, commands, deadline: float, held):
        conn = held
        try:
            left = deadline - time.monotonic()
            if left <= 0:
                raise rex.TimeoutError(f"xcloak: no reply within the limiter's timeout ({self.timeout} s)")
            return await asyncio.wait_for(self._exchange(node, commands, conn), left)
        except asyncio.TimeoutError as error:
            raise rex.TimeoutError(f"xcloak: no reply within the limiter's timeout ({self.timeout} s)") from error

    async def _exchange(self, node: _Node, commands, conn):
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
            return conn, replies
        except BaseException:
            # Also on cancellation: a reply left unread must never be read as the next call's.
            await conn.disconnect()
            await node.pool.release(conn)
            raise

    async def release(self, node: _Node, conn) -> None:
        await node.pool.release(conn)

    async def close(self) -> None:
        pools = list(self._pools.values())
        if not self.cluster:
            pools.append(self._primary.pool)
            if self._replica is not None:
                pools.append(self._replica.pool)
        for pool in pools:
            await pool.disconnect()


class AsyncLimiter:
    """:class:`xcloak.Limiter`'s calls, awaited, over ``redis.asyncio.Redis``,
    ``redis.asyncio.RedisCluster`` or ``redis.asyncio.Sentinel.master_for(...)``.
    Same options. ``acquire`` is cancellation-safe: a cancelled wait recorded
    nothing."""

    def __init__(self, client, *, prefix: str = "", fallback: str = "auto", on_error: str = "raise",
                 timeout: float = 1.0, probe_interval: float = 60.0, replica_reads: bool = False,
                 replica=None, durable: Optional[_engine.Durable] = None, clock: Optional[_engine.Clock] = None,
                 jitter_fraction: float = 0.1, random: Callable[[], float] = _random.random) -> None:
        self.client = client
        self.engine = _engine.Engine(prefix=prefix, fallback=fallback, on_error=on_error, timeout=timeout,
                                     probe_interval=probe_interval,
                                     replica_reads=replica_reads or replica is not None, durable=durable,
                                     clock=clock, jitter_fraction=jitter_fraction, random=random)
        self._transport = _Transport(client, replica, timeout)

    async def _run(self, op):
        transport = self._transport
        deadline = time.monotonic() + self.engine.timeout
        held = None
        answer: Any = None
        failure: Optional[BaseException] = None
        try:
            while True:
                try:
                    request = op.throw(failure) if failure is not None else op.send(answer)
                except StopIteration as stop:
                    return stop.value
                failure = None
                try:
                    if isinstance(request, _engine.Locate):
                        answer = await transport.locate(request.key, request.readonly)
                    elif isinstance(request, _engine.Send):
                        conn = None
                        if held is not None:
                            if held[0].pool is request.node.pool:
                                conn = held[1]
                            else:
                                await transport.release(*held)
                            held = None
                        if request.commands[0][0] == "WAIT":  # its own budget (docs/clients.md, Durable mode)
                            deadline = time.monotonic() + self.engine.wait_budget()
                        conn, answer = await transport.exchange(request.node, request.commands, deadline, conn)
                        if request.hold or self.engine.durable is not None:
                            held = (request.node, conn)
                        else:
                            await transport.release(request.node, conn)
                    else:
                        await transport.refresh()
                        answer = None
                except rex.AuthenticationError as error:
                    raise XcloakError(_engine.server_text(error)) from error
                except rex.ResponseError as error:
                    failure = _engine.refusal(error)
                except (rex.RedisError, OSError) as error:
                    if not _engine.is_outage(error) and not isinstance(error, rex.RedisClusterException):
                        raise
                    failure = UnavailableError(f"xcloak: {type(error).__name__}: {error}", error)
                    failure.__cause__ = error
        finally:
            if held is not None:
                await transport.release(*held)

    async def allow(self, key: str, window, limit: int, cost: int = 1, tiers=None, stamp: bool = False,
                    now: Optional[int] = None) -> Decision:
        return await self._run(self.engine.allow(key, window, limit, cost, tiers, stamp, now))

    async def peek(self, key: str, window, limit: int, cost: int = 1, tiers=None, now: Optional[int] = None,
                   oldest: bool = False) -> Decision:
        return await self._run(self.engine.peek(key, window, limit, cost, tiers, now, oldest))

    async def refund(self, key: str, stamp: int, cost: int = 1) -> int:
        return await self._run(self.engine.refund(key, stamp, cost))

    async def reset(self, key: str) -> bool:
        return await self._run(self.engine.reset(key))

    async def allow_all(self, requests: Sequence[dict], stamp: bool = False,
                        now: Optional[int] = None) -> MultiDecision:
        return await self._run(self.engine.allow_all(requests, stamp, now))

    async def acquire(self, key: str, window, limit: int, cost: int = 1, tiers=None,
                      max_wait: Any = 1.0) -> Decision:
        max_wait_ms = _wait_ms(max_wait)
        clock = self.engine.clock
        now = clock.now_ms if clock else (lambda: int(time.time() * 1000))
        deadline = now() + max_wait_ms
        while True:
            decision = await self.allow(key, window, limit, cost, tiers)
            _, sleep_ms = _acquire.next_step(decision, deadline - now(), self.engine.jitter_fraction,
                                            self.engine.random)
            if sleep_ms is None:
                return decision
            if clock:
                result = clock.sleep(sleep_ms)
                if asyncio.iscoroutine(result):
                    await result
            else:
                await asyncio.sleep(sleep_ms / 1000)

    def pipeline(self) -> "AsyncPipeline":
        """As Limiter.pipeline: not in durable mode."""
        _engine.refuse_durable_pipeline(self.engine)
        return AsyncPipeline(self)

    @staticmethod
    def headers(decision, style: str = "ietf", names=None) -> Dict[str, str]:
        return _headers(decision, style, names)

    async def close(self) -> None:
        await self._transport.close()


class AsyncPipeline(_SyncPipeline):
    """:class:`xcloak.limiter.Pipeline`, with ``await p.execute()``."""

    async def __aenter__(self) -> "AsyncPipeline":
        return self

    async def __aexit__(self, *exc) -> None:
        self.entries.clear()

    async def execute(self) -> List[Any]:  # type: ignore[override]
        entries, policy_args = self.entries, self._policy_args
        self.entries, self._policy_args = [], []
        if not entries:
            return []
        engine = self.limiter.engine
        try:
            results = await self.limiter._run(engine.pipeline(entries))
        except UnavailableError as error:
            results = [error] * len(entries)
        out = []
        for result, args in zip(results, policy_args):
            if isinstance(result, UnavailableError):
                if args is None or engine.on_error == "raise":
                    raise result
                result = engine.policy(result, *args)
            elif isinstance(result, XcloakError):
                raise result
            out.append(result)
        return out
