"""``AsyncLimiter``: ``xcloak/limiter.py`` over redis.asyncio, with ``await``.

The same engine's operations, run by the same driver (``_driver.drive``); the
steps are awaited on the asyncio transport (``aio/_transport``). Cancelling a
task is not an outage: ``asyncio.CancelledError`` comes out, never a decision
of the error policy.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any, Generator, List, Mapping, Optional, Sequence, Union

from .. import _engine
from .._driver import Base, drive
from .._engine import Direct
from ..commands import Duration, Tiers
from ..decision import Decision, MultiDecision
from ..errors import UnavailableError
from ..limiter import Pipeline
from ._transport import Transport


class AsyncLimiter(Base):
    """:class:`xcloak.Limiter`'s calls, awaited, over ``redis.asyncio.Redis``,
    ``redis.asyncio.RedisCluster`` or ``redis.asyncio.Sentinel.master_for(...)``.
    Same options. ``acquire`` is cancellation-safe: a cancelled wait recorded
    nothing."""

    _transport_class = Transport

    async def _run(self, op: Generator[Any, Any, Any]) -> Any:
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
                answer, failure = await getattr(transport, step[0])(*step[1:]), None
            except BaseException as error:
                answer, failure = None, error

    async def _sleep(self, ms: int) -> None:
        clock = self.engine.clock
        if clock is not None:
            result = clock.sleep(ms)
            if inspect.isawaitable(result):
                await result
        else:
            await asyncio.sleep(ms / 1000)

    async def _direct(self, direct: Union[Direct, Decision, None]) -> Optional[Decision]:
        if direct is None or isinstance(direct, Decision):  # the whole way, or the block cache's answer
            return direct
        try:
            _, (reply,) = await self._transport.exchange(direct.node, direct.commands, direct.deadline(), None, False)
        except BaseException as error:
            return direct.failed(error)
        return direct.decision(reply)

    async def allow(self, key: str, window: Duration, limit: int, cost: int = 1, tiers: Optional[Tiers] = None,
                    stamp: bool = False, now: Optional[int] = None) -> Decision:
        decision = await self._direct(self.engine.direct("allow", self._transport.fixed(False), key, window, limit,
                                                         cost, tiers, now, stamp))
        if decision is not None:
            return decision
        return await self._run(self.engine.allow(key, window, limit, cost, tiers, stamp, now))  # type: ignore[no-any-return]

    async def peek(self, key: str, window: Duration, limit: int, cost: int = 1, tiers: Optional[Tiers] = None,
                   now: Optional[int] = None, oldest: bool = False) -> Decision:
        decision = await self._direct(self.engine.direct("peek", self._transport.fixed(self.engine.replica_reads), key,
                                                         window, limit, cost, tiers, now, oldest))
        if decision is not None:
            return decision
        return await self._run(self.engine.peek(key, window, limit, cost, tiers, now, oldest))  # type: ignore[no-any-return]

    async def refund(self, key: str, stamp: int, cost: int = 1) -> int:
        return await self._run(self.engine.refund(key, stamp, cost))  # type: ignore[no-any-return]

    async def reset(self, key: str) -> bool:
        return await self._run(self.engine.reset(key))  # type: ignore[no-any-return]

    async def allow_all(self, requests: Sequence[Mapping[str, Any]], stamp: bool = False,
                        now: Optional[int] = None) -> MultiDecision:
        return await self._run(self.engine.allow_all(requests, stamp, now))  # type: ignore[no-any-return]

    async def acquire(self, key: str, window: Duration, limit: int, cost: int = 1, tiers: Optional[Tiers] = None,
                      max_wait: Duration = 1000) -> Decision:
        loop = self.engine.acquire(key, window, limit, cost, tiers, max_wait)
        answer: Any = None
        while True:
            try:
                kind, ms = loop.send(answer)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
            if kind == "allow":
                answer = await self.allow(key, window, limit, cost, tiers)
            else:
                await self._sleep(ms)

    def pipeline(self) -> AsyncPipeline:
        """As Limiter.pipeline: not in durable mode."""
        _engine.refuse_durable_pipeline(self.engine)
        return AsyncPipeline(self)

    async def close(self) -> None:
        await self._transport.close()


class AsyncPipeline(Pipeline):
    """:class:`xcloak.limiter.Pipeline`, with ``await p.execute()``."""

    async def __aenter__(self) -> AsyncPipeline:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.entries.clear()

    async def execute(self) -> List[Any]:  # type: ignore[override]
        entries, policy_args = self._take()
        if not entries:
            return []
        limiter = self.limiter
        assert isinstance(limiter, AsyncLimiter)
        try:
            results = await limiter._run(limiter.engine.pipeline(entries))
        except UnavailableError as error:
            results = [error] * len(entries)
        return limiter.engine.pipeline_results(results, policy_args)
