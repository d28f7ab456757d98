"""``Limiter``: the contract (docs/clients.md) over redis-py's synchronous clients.

It takes a ``redis.Redis`` (a Sentinel-managed one from ``Sentinel.master_for``
too) or a ``redis.cluster.RedisCluster``. The calls are the engine's operations
(``_engine``) run by the one driver (``_driver.drive``) on the sync transport
(``_transport``: connection pools of the limiter's own, without retry).
``aio/limiter.py`` is this file with ``await``.
"""

from __future__ import annotations

import time
from typing import Any, Generator, List, Mapping, Optional, Sequence, Tuple, Union

from . import _engine
from . import commands as cmd
from ._driver import Base, drive
from ._engine import Direct
from ._transport import Transport
from .commands import Duration, Tiers
from .decision import Decision, MultiDecision, from_reply
from .errors import UnavailableError


class Limiter(Base):
    """The contract's calls over a redis-py client (docs/clients.md).

    ``client``: ``redis.Redis``, ``Sentinel.master_for(...)`` or
    ``redis.cluster.RedisCluster``. Every duration is a ``datetime.timedelta``
    or an ``int`` of milliseconds. Options, checked here (a bad one raises
    ``TypeError`` / ``ValueError`` naming it and its range):

    - ``prefix``: put before every key (default none);
    - ``fallback``: ``"auto"`` (the command, the bundled Lua script where the
      server answers "unknown command", per node, re-probed every
      ``probe_interval``, default 60,000 ms), ``"always"`` (the script) or ``"never"``;
    - ``on_error``: ``"raise"`` (default), ``"allow"`` (fail open) or ``"deny"``
      (fail closed), for outages and timeouts only;
    - ``timeout``: per call (default 1,000 ms), whatever the client's own;
    - ``replica_reads``: ``peek`` reads a replica (cluster: the key's slot's
      replica; Sentinel: pass ``replica=sentinel.slave_for(name)``);
    - ``durable``: ``Durable(replicas=N, timeout=T)``: ``WAIT`` after admissions;
    - ``clock``, ``jitter_fraction``, ``random``: acquire's, and for replays;
    - ``block_cache``: the block cache's entries (default 10,000; 0 turns it
      off; an int up to 1,000,000): a key the server rejected with a wait is
      rejected again without a call (``via == "cache"``) until that wait has
      passed (docs/clients.md, "Block cache"); ``stats`` counts its answers.
    """

    _transport_class = Transport

    def _run(self, op: Generator[Any, Any, Any]) -> Any:
        """Runs one operation: the driver's steps, called on the transport."""
        transport = self._transport
        steps = drive(self.engine, transport, op)
        answer: Any = None
        failure: Optional[BaseException] = None
        while True:
            try:
                step = steps.send(answer) if failure is None else steps.throw(failure)
            except StopIteration as stop:
                return stop.value
            try:
                answer, failure = getattr(transport, step[0])(*step[1:]), None
            except BaseException as error:  # the driver's to map (an outage) or raise
                answer, failure = None, error

    def _sleep(self, ms: int) -> None:
        clock = self.engine.clock
        if clock is not None:
            clock.sleep(ms)
        else:
            time.sleep(ms / 1000)

    def _direct(self, direct: Union[Direct, Decision, None]) -> Optional[Decision]:
        """The hot path (``_engine.Direct``): one exchange, no generator; None: the whole way."""
        if direct is None or isinstance(direct, Decision):  # the whole way, or the block cache's answer
            return direct
        try:
            _, (reply,) = self._transport.exchange(direct.node, direct.commands, direct.deadline(), None, False)
        except BaseException as error:
            return direct.failed(error)
        return direct.decision(reply)

    # ------------------------------------------------------------ the calls

    def allow(self, key: str, window: Duration, limit: int, cost: int = 1, tiers: Optional[Tiers] = None,
              stamp: bool = False, now: Optional[int] = None) -> Decision:
        """One request of ``cost`` units against ``key``: admitted if every tier has room."""
        decision = self._direct(self.engine.direct("allow", self._transport.fixed(False), key, window, limit, cost,
                                                   tiers, now, stamp))
        if decision is not None:
            return decision
        return self._run(self.engine.allow(key, window, limit, cost, tiers, stamp, now))  # type: ignore[no-any-return]

    def peek(self, key: str, window: Duration, limit: int, cost: int = 1, tiers: Optional[Tiers] = None,
             now: Optional[int] = None, oldest: bool = False) -> Decision:
        """What ``allow`` would decide now, recording nothing (on a replica with
        ``replica_reads``). ``oldest``: also the oldest live entry (``Decision.oldest``)."""
        decision = self._direct(self.engine.direct("peek", self._transport.fixed(self.engine.replica_reads), key,
                                                   window, limit, cost, tiers, now, oldest))
        if decision is not None:
            return decision
        return self._run(self.engine.peek(key, window, limit, cost, tiers, now, oldest))  # type: ignore[no-any-return]

    def refund(self, key: str, stamp: int, cost: int = 1) -> int:
        """Gives back up to ``cost`` units of the admission stamped ``stamp``;
        returns how many entries it removed."""
        return self._run(self.engine.refund(key, stamp, cost))  # type: ignore[no-any-return]

    def reset(self, key: str) -> bool:
        """Deletes one identity's window; whether there was one."""
        return self._run(self.engine.reset(key))  # type: ignore[no-any-return]

    def allow_all(self, requests: Sequence[Mapping[str, Any]], stamp: bool = False,
                  now: Optional[int] = None) -> MultiDecision:
        """All or nothing over several keys (``AllowAllRequest``: ``{"key", "window",
        "limit", "cost"?, "tiers"?}``, no other field), in order; a rejection
        refunds the earlier admissions."""
        return self._run(self.engine.allow_all(requests, stamp, now))  # type: ignore[no-any-return]

    def acquire(self, key: str, window: Duration, limit: int, cost: int = 1, tiers: Optional[Tiers] = None,
                max_wait: Duration = 1000) -> Decision:
        """Waits until admitted or ``max_wait`` (a timedelta or ms, default 1,000)
        passes, sleeping the server's retry-after plus jitter, never busy-polling."""
        loop = self.engine.acquire(key, window, limit, cost, tiers, max_wait)
        answer: Any = None
        while True:
            try:
                kind, ms = loop.send(answer)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
            if kind == "allow":
                answer = self.allow(key, window, limit, cost, tiers)
            else:
                self._sleep(ms)

    def pipeline(self) -> Pipeline:
        """Batches calls into one round trip per node (``with limiter.pipeline() as p``).
        Not in durable mode: its admissions would be reported before ``WAIT``."""
        _engine.refuse_durable_pipeline(self.engine)
        return Pipeline(self)

    def close(self) -> None:
        """Closes the limiter's own connections (not the client's)."""
        self._transport.close()


class Pipeline:
    """``allow`` / ``peek`` / ``refund`` / ``reset`` queued, then sent by
    ``execute()`` in one round trip per node; the fallback still applies per
    entry. ``execute`` returns one result per call, in order: a Decision, a
    count, a bool. An argument error raises the first entry's XcloakError
    (after every entry ran); an outage goes to the limiter's policy."""

    def __init__(self, limiter: Base) -> None:
        self.limiter = limiter
        self.entries: List[_engine.Entry] = []
        self._policy_args: List[Optional[Tuple[int, int]]] = []

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.entries.clear()

    def __len__(self) -> int:
        return len(self.entries)

    def allow(self, key: str, window: Duration, limit: int, cost: int = 1, tiers: Optional[Tiers] = None,
              stamp: bool = False, now: Optional[int] = None) -> Pipeline:
        engine = self.limiter.engine
        key, window_ms, limit, tiers_ms, cost, now_ms = engine.window_request(key, window, limit, cost, tiers, now)
        args = cmd.allow_args(window_ms, limit, tiers_ms, cost, now_ms, stamp)
        tiered = bool(tiers_ms)
        self.entries.append(_engine.Entry("allow", key, args,
                                          lambda r, via: from_reply(r, window_ms, tiered, stamp=stamp, via=via)))
        self._policy_args.append((window_ms, limit))
        return self

    def peek(self, key: str, window: Duration, limit: int, cost: int = 1, tiers: Optional[Tiers] = None,
             now: Optional[int] = None, oldest: bool = False) -> Pipeline:
        engine = self.limiter.engine
        key, window_ms, limit, tiers_ms, cost, now_ms = engine.window_request(key, window, limit, cost, tiers, now)
        args = cmd.peek_args(window_ms, limit, tiers_ms, cost, now_ms, oldest)
        tiered = bool(tiers_ms)
        self.entries.append(_engine.Entry("peek", key, args,
                                          lambda r, via: from_reply(r, window_ms, tiered, oldest=oldest, via=via)))
        self._policy_args.append((window_ms, limit))
        return self

    def refund(self, key: str, stamp: int, cost: int = 1) -> Pipeline:
        engine = self.limiter.engine
        args = cmd.refund_args(cmd.integer(stamp, "stamp"), cmd.integer(cost, "cost"))
        self.entries.append(_engine.Entry("refund", engine.prefix + key, args, lambda r, via: int(r)))
        self._policy_args.append(None)
        return self

    def reset(self, key: str) -> Pipeline:
        self.entries.append(_engine.Entry("reset", self.limiter.engine.prefix + key, [], lambda r, via: int(r) == 1))
        self._policy_args.append(None)
        return self

    def _take(self) -> Tuple[List[_engine.Entry], List[Optional[Tuple[int, int]]]]:
        entries, policy_args = self.entries, self._policy_args
        self.entries, self._policy_args = [], []
        return entries, policy_args

    def execute(self) -> List[Any]:
        entries, policy_args = self._take()
        if not entries:
            return []
        limiter = self.limiter
        assert isinstance(limiter, Limiter)
        try:
            results = limiter._run(limiter.engine.pipeline(entries))
        except UnavailableError as error:
            results = [error] * len(entries)
        return limiter.engine.pipeline_results(results, policy_args)
