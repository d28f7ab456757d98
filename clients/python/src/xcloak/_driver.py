"""The driver, written once for ``Limiter`` and ``AsyncLimiter``.

The engine's operations (``_engine``) yield what they need: ``Locate``,
``Send``, ``Refresh``. :func:`drive` turns them into steps for a transport,
tuples ``(method, *args)``:

- ``("locate", key, readonly)`` -> a :class:`Node` (asked only of a cluster:
  a single server's node is known without I/O, :meth:`fixed`);
- ``("exchange", node, commands, deadline, conn, keep)`` -> ``(conn, replies)``:
  the commands pipelined on ``conn`` (or a pooled connection), one reply each
  (an error reply as its exception), the connection kept for the next step
  when ``keep`` (a ``WAIT`` must follow its write on the same connection),
  else released;
- ``("release", node, conn)``, ``("refresh",)``.

It keeps the call's deadline (the limiter's timeout, then a durable ``WAIT``'s
own budget), the held connection, and the mapping of a step's failure: a
connection error or timeout is thrown into the operation as
:class:`UnavailableError` (nothing is sent again: it may have been applied),
a server's error reply as the package's, a wrong password raised.

``Limiter._run`` calls the steps' methods on ``_transport.Transport``
(redis-py); ``AsyncLimiter._run`` awaits them on ``aio/_transport.Transport``
(redis.asyncio). That is all the two differ in. The pools both transports make
(the client's settings without any retry) are built here too.
"""

from __future__ import annotations

import random as _random
import time
from typing import Any, Callable, Dict, Generator, Optional, Tuple

from ._cache import DEFAULT_ENTRIES, Stats
from ._engine import Clock, Durable, Engine, Locate, Send, failure_of
from .commands import Duration

Step = Tuple[Any, ...]


class Node:
    """A server as the transport reaches it: its name (the fallback's state is
    per name) and the limiter's own pool of connections to it."""

    __slots__ = ("name", "pool")

    def __init__(self, name: str, pool: Any) -> None:
        self.name = name
        self.pool = pool


def node_name(pool: Any) -> str:
    service = getattr(pool, "service_name", None)
    if service:
        return f"sentinel:{service}"
    kw = pool.connection_kwargs
    if kw.get("path"):
        return f"unix:{kw['path']}"
    return f"{kw.get('host', 'localhost')}:{kw.get('port', 6379)}"


def no_retry_kwargs(kwargs: Dict[str, Any], timeout_s: float, retry: Any) -> Dict[str, Any]:
    """Connection settings without any retry (``retry``: redis-py's ``Retry(NoBackoff(), 0)``
    of the sync or the asyncio flavour), with the limiter's timeout."""
    out = dict(kwargs)
    out.pop("connection_pool", None)  # a Sentinel pool's proxy to its own pool
    out["retry"] = retry
    if "retry_on_error" in out:
        out["retry_on_error"] = []
    if "retry_on_timeout" in out:
        out["retry_on_timeout"] = False
    out["socket_timeout"] = timeout_s
    out["socket_connect_timeout"] = timeout_s
    return out


def clone_pool(pool: Any, timeout_s: float, retry: Any, pool_class: Any, sentinel_pool_class: Any,
               readonly_connect: Optional[Callable[..., Any]] = None) -> Any:
    """A pool like ``pool`` (same class, server, credentials, TLS), without retries."""
    kwargs = no_retry_kwargs(pool.connection_kwargs, timeout_s, retry)
    if readonly_connect is not None:
        kwargs["redis_connect_func"] = readonly_connect
    if isinstance(pool, sentinel_pool_class):
        kwargs.pop("connection_pool_class", None)
        return sentinel_pool_class(
            pool.service_name, pool.sentinel_manager, is_master=pool.is_master,
            check_connection=getattr(pool, "check_connection", False),
            connection_class=pool.connection_class, **kwargs)
    return pool_class(connection_class=pool.connection_class, max_connections=pool.max_connections, **kwargs)


def drive(engine: Engine, transport: Any, op: Generator[Any, Any, Any]) -> Generator[Step, Any, Any]:
    """One call of the limiter: ``op``'s requests as transport steps (see the module)."""
    deadline = time.monotonic() + engine.timeout_s
    durable = engine.durable is not None
    held: Optional[Tuple[Node, Any]] = None  # (node, connection) kept for a WAIT
    answer: Any = None
    failure: Optional[BaseException] = None
    try:
        while True:
            try:
                request = op.send(answer) if failure is None else op.throw(failure)
            except StopIteration as stop:
                result = stop.value
                break
            failure = None
            try:
                if request.__class__ is Send:
                    conn = None
                    if held is not None:
                        if held[0].pool is request.node.pool:
                            conn = held[1]
                        else:
                            yield ("release", *held)
                        held = None
                    if request.commands[0][0] == "WAIT":  # its own budget (docs/clients.md, Durable mode)
                        deadline = time.monotonic() + engine.wait_budget()
                    keep = request.hold or durable
                    conn, answer = yield ("exchange", request.node, request.commands, deadline, conn, keep)
                    if keep:
                        held = (request.node, conn)
                elif request.__class__ is Locate:
                    answer = transport.fixed(request.readonly)
                    if answer is None:
                        answer = yield ("locate", request.key, request.readonly)
                else:
                    yield ("refresh",)
                    answer = None
            except BaseException as error:  # a step's failure (failure_of raises what is no outage)
                failure = failure_of(error)
    except GeneratorExit:
        raise
    except BaseException:
        if held is not None:
            node, conn = held
            held = None
            yield ("release", node, conn)
        raise
    if held is not None:
        yield ("release", *held)
    return result


class Base:
    """What ``Limiter`` and ``AsyncLimiter`` share: their options, checked when
    the limiter is built (docs/clients.md; the package README, "The API")."""

    _transport_class: Any

    def __init__(self, client: Any, *, prefix: str = "", fallback: str = "auto", on_error: str = "raise",
                 timeout: Duration = 1000, probe_interval: Duration = 60_000, replica_reads: bool = False,
                 replica: Any = None, durable: Optional[Durable] = None, clock: Optional[Clock] = None,
                 jitter_fraction: float = 0.1, random: Callable[[], float] = _random.random,
                 block_cache: int = DEFAULT_ENTRIES) -> None:
        self.client = client
        self.engine = Engine(prefix=prefix, fallback=fallback, on_error=on_error, timeout=timeout,
                             probe_interval=probe_interval, replica_reads=replica_reads or replica is not None,
                             durable=durable, clock=clock, jitter_fraction=jitter_fraction, random=random,
                             block_cache=block_cache)
        self._transport = self._transport_class(client, replica, self.engine.timeout_s)

    @property
    def stats(self) -> Stats:
        """The block cache's counters: ``cache_hits`` (calls it answered, each
        a round trip saved) and ``cache_entries`` (held now)."""
        return self.engine.stats()
