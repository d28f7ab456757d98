"""The asyncio twins of :mod:`xcloak.limits`, for ``limits.aio`` (slowapi's async
strategies, FastAPI apps): ``async+xcloak://``, ``async+xcloaks://``,
``async+xcloak+unix://``, ``async+xcloak+cluster://``, ``async+xcloak+sentinel://``.

They are limits' own asyncio Redis storages with redis.asyncio
(``implementation="redispy"``), the moving window on xcloak; same options.
"""

from __future__ import annotations

import time
from typing import Any, Dict, Optional, Tuple

from limits.aio.storage import RedisClusterStorage, RedisSentinelStorage, RedisStorage

from .. import _window
from ..decision import ERROR
from .limiter import AsyncLimiter

PREFIX = "LIMITS"


def _split(uri: str, options: Dict[str, Any]) -> Tuple[str, Dict[str, Any]]:
    from ..limits import split_options

    options.pop("implementation", None)  # always redis.asyncio
    return split_options(uri, options)


class AsyncMovingWindow:
    limiter: AsyncLimiter
    _rejections: _window.Rejections
    _xcloak_prefix: str

    def _bridge(self) -> Any:
        """limits' redis.asyncio bridge (its storage and replica clients; untyped there)."""
        return self.bridge  # type: ignore[attr-defined]

    def _xcloak_key(self, key: str) -> str:
        return f"{self._xcloak_prefix}:xcloak:{key}"

    async def acquire_entry(self, key: str, limit: int, expiry: int, amount: int = 1) -> bool:
        if amount > limit:
            return False
        d = await self.limiter.allow(self._xcloak_key(key), int(expiry * 1000), limit, cost=amount)
        self._rejections.remember(key, limit, expiry, amount, d, self.limiter.engine.wall_ms())
        return d.allowed

    async def get_moving_window(self, key: str, limit: int, expiry: int) -> Tuple[float, int]:
        known = self._rejections.recall(key, limit, expiry, self.limiter.engine.wall_ms())
        if known is not None:
            return known
        d = await self.limiter.peek(self._xcloak_key(key), int(expiry * 1000), limit, oldest=True)
        if d.via == ERROR:
            return time.time(), 0 if d.allowed else limit
        if d.oldest is None:
            return time.time(), 0
        return d.oldest / 1000, limit - d.remaining

    async def clear(self, key: str) -> None:
        self._rejections.forget(key)
        await super().clear(key)  # type: ignore[misc]
        await self.limiter.reset(self._xcloak_key(key))

    async def reset(self) -> Optional[int]:
        self._rejections.forget()
        if self.limiter.engine.cache is not None:
            self.limiter.engine.cache.clear()
        return await super().reset()  # type: ignore[misc, no-any-return]


class XcloakAsyncStorage(AsyncMovingWindow, RedisStorage):
    STORAGE_SCHEME = ["async+xcloak", "async+xcloaks", "async+xcloak+unix"]

    def __init__(self, uri: str, key_prefix: str = PREFIX, **options: Any) -> None:
        redis_uri, config = _split(uri, options)
        if config.pop("replica_reads"):
            raise ValueError("replica_reads: a single server has no replica to read (async+xcloak+cluster:// or "
                             "async+xcloak+sentinel://)")
        super().__init__(redis_uri, implementation="redispy", key_prefix=key_prefix, **options)
        self._xcloak_prefix = key_prefix
        self.limiter = AsyncLimiter(self._bridge().storage, **config)
        self._rejections = _window.Rejections()


class XcloakAsyncClusterStorage(AsyncMovingWindow, RedisClusterStorage):
    STORAGE_SCHEME = ["async+xcloak+cluster"]

    def __init__(self, uri: str, key_prefix: str = PREFIX, **options: Any) -> None:
        redis_uri, config = _split(uri, options)
        replica_reads = config.pop("replica_reads")
        super().__init__(redis_uri, implementation="redispy", key_prefix=key_prefix, **options)
        self._xcloak_prefix = key_prefix
        self.limiter = AsyncLimiter(self._bridge().storage, replica_reads=replica_reads, **config)
        self._rejections = _window.Rejections()


class XcloakAsyncSentinelStorage(AsyncMovingWindow, RedisSentinelStorage):
    STORAGE_SCHEME = ["async+xcloak+sentinel"]

    def __init__(self, uri: str, key_prefix: str = PREFIX, **options: Any) -> None:
        redis_uri, config = _split(uri, options)
        replica_reads = config.pop("replica_reads")
        super().__init__(redis_uri, implementation="redispy", key_prefix=key_prefix, **options)
        self._xcloak_prefix = key_prefix
        bridge = self._bridge()
        self.limiter = AsyncLimiter(bridge.storage, replica=bridge.storage_replica if replica_reads else None,
                                    **config)
        self._rejections = _window.Rejections()
