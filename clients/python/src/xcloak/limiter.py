"""``Limiter``: the contract (docs/clients.md) over redis-py's synchronous clients.

It takes a ``redis.Redis`` (a Sentinel-managed one from ``Sentinel.master_for``
too) or a ``redis.cluster.RedisCluster``, and talks to the servers through
connection pools of its own, made from the client's connection settings with
two changes: the limiter's ``timeout`` as the socket and connect timeout, and
**no retry**. redis-py 6 and later give every client ``Retry(backoff, 3)`` on
``ConnectionError`` and ``TimeoutError``: it would send an ``XCLOAK.ALLOW``
that timed out three more times, and each may be applied. The limiter's calls
are never retried once they may have been sent (known-unapplied ones are:
``NOSCRIPT``, ``MOVED``, an unknown command). The application's own commands
on the client keep the client's settings.
"""

from __future__ import annotations

import random as _random
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

import redis
import redis.sentinel
import redis.utils
from redis import exceptions as rex
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry

from . import _engine
from .decision import COMMAND, Decision, MultiDecision, from_reply
from .errors import UnavailableError, XcloakError
from .headers import headers as _headers
from . import acquire as _acquire

def _no_retry_kwargs(kwargs: dict, timeout: float) -> dict:
    """Connection settings without any retry, with the limiter's timeout."""
    out = dict(kwargs)
    out.pop("connection_pool", None)  # a Sentinel pool's proxy to its own pool
    out["retry"] = Retry(NoBackoff(), 0)
    if "retry_on_error" in out:
        out["retry_on_error"] = []
    if "retry_on_timeout" in out:
        out["retry_on_timeout"] = False
    out["socket_timeout"] = timeout
    out["socket_connect_timeout"] = timeout
    return out


def _readonly_on_connect(connection) -> None:
    """A replica connection: READONLY after the handshake (as redis-py's cluster does)."""
    connection.on_connect()
    connection.send_command("READONLY")
    if redis.utils.str_if_bytes(connection.read_response()) != "OK":
        raise rex.ConnectionError("READONLY command failed")


class _Node:
    __slots__ = ("name", "pool")

    def __init__(self, name: str, pool) -> None:
        self.name = name
        self.pool = pool


def _node_name(pool) -> str:
    service = getattr(pool, "service_name", None)
    if service:
        return f"sentinel:{service}"
    kw = pool.connection_kwargs
    if kw.get("path"):
        return f"unix:{kw['path']}"
    return f"{kw.get('host', 'localhost')}:{kw.get('port', 6379)}"


def _clone_pool(pool, timeout: float, readonly: bool = False):
    """A pool like ``pool`` (same class, server, credentials, TLS), without retries."""
    kwargs = _no_retry_kwargs(pool.connection_kwargs, timeout)
    if readonly:
        kwargs["redis_connect_func"] = _readonly_on_connect
    if isinstance(pool, redis.sentinel.SentinelConnectionPool):
        kwargs.pop("connection_pool_class", None)
        return redis.sentinel.SentinelConnectionPool(
            pool.service_name, pool.sentinel_manager, is_master=pool.is_master,
            check_connection=getattr(pool, "check_connection", False),
            connection_class=pool.connection_class, **kwargs)
    return redis.ConnectionPool(connection_class=pool.connection_class,
                                max_connections=pool.max_connections, **kwargs)


class _Transport:
    """Where a key lives and how its commands are sent, for one client."""

    def __init__(self, client, replica, timeout: float) -> None:
        self.client = client
        self.timeout = timeout
        self.cluster = isinstance(client, RedisCluster)
        self._pools: Dict[str, Any] = {}
        self._lock = threading.Lock()
        if not self.cluster:
            self._primary = _Node(_node_name(client.connection_pool), _clone_pool(client.connection_pool, timeout))
            self._replica = (_Node(_node_name(replica.connection_pool) + ":replica",
                                   _clone_pool(replica.connection_pool, timeout)) if replica is not None else None)

    def locate(self, key: str, readonly: bool) -> _Node:
        if not self.cluster:
            return self._replica if readonly and self._replica is not None else self._primary
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
                    pool = self._pools[name] = _clone_pool(source, self.timeout, readonly=replica)
        return _Node(node.name, pool)

    def refresh(self) -> None:
        if self.cluster:
            self.client.nodes_manager.initialize()

    def exchange(self, node: _Node, commands, deadline: float, held):
        """Sends ``commands`` pipelined on one connection and reads every reply
        (an error reply as its exception). Any other failure disconnects the
        connection and is raised: nothing is sent again."""
        conn = held if held is not None else node.pool.get_connection()
        try:
            conn.send_packed_command(conn.pack_commands(commands))
            replies = []
            for _ in commands:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise rex.TimeoutError(f"xcloak: no reply within the limiter's timeout ({self.timeout} s)")
                try:
                    replies.append(conn.read_response(timeout=left))
                except rex.ResponseError as error:
                    replies.append(error)
            return conn, replies
        except BaseException:
            conn.disconnect()
            node.pool.release(conn)
            raise

    def release(self, node: _Node, conn) -> None:
        node.pool.release(conn)

    def close(self) -> None:
        pools = list(self._pools.values())
        if not self.cluster:
            pools.append(self._primary.pool)
            if self._replica is not None:
                pools.append(self._replica.pool)
        for pool in pools:
            pool.disconnect()


class Limiter:
    """The contract's calls over a redis-py client (docs/clients.md).

    ``client``: ``redis.Redis``, ``Sentinel.master_for(...)`` or
    ``redis.cluster.RedisCluster``. Options:

    - ``prefix``: put before every key (default none);
    - ``fallback``: ``"auto"`` (the command, the bundled Lua script where the
      server answers "unknown command", per node, re-probed every
      ``probe_interval`` seconds), ``"always"`` (the script) or ``"never"``;
    - ``on_error``: ``"raise"`` (default), ``"allow"`` (fail open) or ``"deny"``
      (fail closed), for outages and timeouts only;
    - ``timeout``: seconds per call (default 1), whatever the client's own;
    - ``replica_reads``: ``peek`` reads a replica (cluster: the key's slot's
      replica; Sentinel: pass ``replica=sentinel.slave_for(name)``);
    - ``durable``: ``Durable(replicas=N, timeout_ms=T)``: ``WAIT`` after admissions;
    - ``clock``, ``jitter_fraction``, ``random``: acquire's, and for replays.
    """

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

    # ------------------------------------------------------------ driver

    def _run(self, op):
        """Carries out an operation's requests; an outage is thrown back into it."""
        transport = self._transport
        deadline = time.monotonic() + self.engine.timeout
        held = None  # (node, connection) kept for a WAIT
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
                        answer = transport.locate(request.key, request.readonly)
                    elif isinstance(request, _engine.Send):
                        conn = None
                        if held is not None:
                            if held[0].pool is request.node.pool:
                                conn = held[1]
                            else:
                                transport.release(*held)
                            held = None
                        if request.commands[0][0] == "WAIT":  # its own budget (docs/clients.md, Durable mode)
                            deadline = time.monotonic() + self.engine.wait_budget()
                        conn, answer = transport.exchange(request.node, request.commands, deadline, conn)
                        if request.hold or self.engine.durable is not None:
                            held = (request.node, conn)
                        else:
                            transport.release(request.node, conn)
                    else:
                        transport.refresh()
                        answer = None
                except rex.AuthenticationError as error:
                    raise XcloakError(_engine.server_text(error)) from error
                except rex.ResponseError as error:  # e.g. NOPERM on the handshake
                    failure = _engine.refusal(error)
                except (rex.RedisError, OSError) as error:
                    if not _engine.is_outage(error) and not isinstance(error, rex.RedisClusterException):
                        raise
                    failure = UnavailableError(f"xcloak: {type(error).__name__}: {error}", error)
                    failure.__cause__ = error
        finally:
            if held is not None:
                transport.release(*held)

    # ------------------------------------------------------------ the calls

    def allow(self, key: str, window, limit: int, cost: int = 1, tiers=None, stamp: bool = False,
              now: Optional[int] = None) -> Decision:
        """One request of ``cost`` units against ``key``: admitted if every tier has room."""
        engine = self.engine
        transport = self._transport
        if not transport.cluster and engine.durable is None and engine.mode_of(transport._primary.name) == COMMAND:
            # The hot path (one server answered by the module): the same call
            # as the engine's, without its generator round trips.
            key, window_ms, limit, tiers_ms, cost, now_ms = engine.window_request(key, window, limit, cost, tiers, now)
            node = transport._primary
            try:
                conn, (reply,) = transport.exchange(
                    node, (("XCLOAK.ALLOW", key, *_engine.cmd.allow_args(window_ms, limit, tiers_ms, cost, now_ms, stamp)),),
                    time.monotonic() + engine.timeout, None)
            except rex.AuthenticationError as error:
                raise XcloakError(_engine.server_text(error)) from error
            except (rex.RedisError, OSError) as error:
                if isinstance(error, rex.ResponseError) or not _engine.is_outage(error):
                    raise
                failure = UnavailableError(f"xcloak: {type(error).__name__}: {error}", error)
                failure.__cause__ = error
                return engine.policy(failure, window_ms, limit)
            transport.release(node, conn)
            if not isinstance(reply, rex.ResponseError):
                return from_reply(reply, window_ms, bool(tiers_ms), stamp=stamp)
            if not _engine.is_unknown_command(reply):
                refused = _engine.refusal(reply)
                if isinstance(refused, UnavailableError):
                    return engine.policy(refused, window_ms, limit)
                raise refused
            # "unknown command" applied nothing: the engine's path takes the script
        return self._run(engine.allow(key, window, limit, cost, tiers, stamp, now))

    def peek(self, key: str, window, limit: int, cost: int = 1, tiers=None, now: Optional[int] = None,
             oldest: bool = False) -> Decision:
        """What ``allow`` would decide now, recording nothing (on a replica with
        ``replica_reads``). ``oldest``: also the oldest live entry (``Decision.oldest_ms``)."""
        return self._run(self.engine.peek(key, window, limit, cost, tiers, now, oldest))

    def refund(self, key: str, stamp: int, cost: int = 1) -> int:
        """Gives back up to ``cost`` units of the admission stamped ``stamp``;
        returns how many entries it removed."""
        return self._run(self.engine.refund(key, stamp, cost))

    def reset(self, key: str) -> bool:
        """Deletes one identity's window; whether there was one."""
        return self._run(self.engine.reset(key))

    def allow_all(self, requests: Sequence[dict], stamp: bool = False, now: Optional[int] = None) -> MultiDecision:
        """All or nothing over several keys (``{"key", "window", "limit", "cost"?, "tiers"?}``
        each), in order; a rejection refunds the earlier admissions."""
        return self._run(self.engine.allow_all(requests, stamp, now))

    def acquire(self, key: str, window, limit: int, cost: int = 1, tiers=None,
                max_wait: Any = 1.0) -> Decision:
        """Waits until admitted or ``max_wait`` (seconds, or a timedelta) passes,
        sleeping the server's retry-after plus jitter, never busy-polling."""
        max_wait_ms = _wait_ms(max_wait)
        clock = self.engine.clock
        now = clock.now_ms if clock else (lambda: int(time.time() * 1000))
        sleep = clock.sleep if clock else (lambda ms: time.sleep(ms / 1000))
        deadline = now() + max_wait_ms
        while True:
            decision = self.allow(key, window, limit, cost, tiers)
            _, sleep_ms = _acquire.next_step(decision, deadline - now(), self.engine.jitter_fraction,
                                            self.engine.random)
            if sleep_ms is None:
                return decision
            sleep(sleep_ms)

    def pipeline(self) -> "Pipeline":
        """Batches calls into one round trip per node (``with limiter.pipeline() as p``).
        Not in durable mode: its admissions would be reported before ``WAIT``."""
        _engine.refuse_durable_pipeline(self.engine)
        return Pipeline(self)

    @staticmethod
    def headers(decision, style: str = "ietf", names=None) -> Dict[str, str]:
        return _headers(decision, style, names)

    def close(self) -> None:
        """Closes the limiter's own connections (not the client's)."""
        self._transport.close()


def _wait_ms(max_wait) -> int:
    from datetime import timedelta

    if isinstance(max_wait, timedelta):
        return int(max_wait.total_seconds() * 1000)
    return int(float(max_wait) * 1000)


class Pipeline:
    """``allow`` / ``peek`` / ``refund`` / ``reset`` queued, then sent by
    ``execute()`` in one round trip per node; the fallback still applies per
    entry. ``execute`` returns one result per call, in order: a Decision, a
    count, a bool. An argument error raises the first entry's XcloakError
    (after every entry ran); an outage goes to the limiter's policy."""

    def __init__(self, limiter: Limiter) -> None:
        self.limiter = limiter
        self.entries: List[_engine.Entry] = []
        self._policy_args: List[Any] = []

    def __enter__(self) -> "Pipeline":
        return self

    def __exit__(self, *exc) -> None:
        self.entries.clear()

    def __len__(self) -> int:
        return len(self.entries)

    def allow(self, key: str, window, limit: int, cost: int = 1, tiers=None, stamp: bool = False,
              now: Optional[int] = None) -> "Pipeline":
        engine = self.limiter.engine
        key, window_ms, limit, tiers_ms, cost, now_ms = engine.window_request(key, window, limit, cost, tiers, now)
        args = _engine.cmd.allow_args(window_ms, limit, tiers_ms, cost, now_ms, stamp)
        tiered = bool(tiers_ms)
        self.entries.append(_engine.Entry("allow", key, args,
                                          lambda r, via: from_reply(r, window_ms, tiered, stamp=stamp, via=via)))
        self._policy_args.append((window_ms, limit))
        return self

    def peek(self, key: str, window, limit: int, cost: int = 1, tiers=None, now: Optional[int] = None,
             oldest: bool = False) -> "Pipeline":
        engine = self.limiter.engine
        key, window_ms, limit, tiers_ms, cost, now_ms = engine.window_request(key, window, limit, cost, tiers, now)
        args = _engine.cmd.peek_args(window_ms, limit, tiers_ms, cost, now_ms, oldest)
        tiered = bool(tiers_ms)
        self.entries.append(_engine.Entry("peek", key, args,
                                          lambda r, via: from_reply(r, window_ms, tiered, oldest=oldest, via=via)))
        self._policy_args.append((window_ms, limit))
        return self

    def refund(self, key: str, stamp: int, cost: int = 1) -> "Pipeline":
        engine = self.limiter.engine
        args = _engine.cmd.refund_args(_engine.cmd.integer(stamp, "stamp"), _engine.cmd.integer(cost, "cost"))
        self.entries.append(_engine.Entry("refund", engine.prefix + key, args, lambda r, via: int(r)))
        self._policy_args.append(None)
        return self

    def reset(self, key: str) -> "Pipeline":
        self.entries.append(_engine.Entry("reset", self.limiter.engine.prefix + key, [], lambda r, via: int(r) == 1))
        self._policy_args.append(None)
        return self

    def execute(self) -> List[Any]:
        entries, policy_args = self.entries, self._policy_args
        self.entries, self._policy_args = [], []
        if not entries:
            return []
        engine = self.limiter.engine
        try:
            results = self.limiter._run(engine.pipeline(entries))
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
