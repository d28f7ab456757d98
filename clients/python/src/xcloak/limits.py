"""limits storages on xcloak: Flask-Limiter and slowapi switch with one string.

Importing this module registers, the way limits registers every storage (a
class with ``STORAGE_SCHEME``):

==========================  ===========================================
``xcloak://host:port/db``   redis.Redis (``xcloaks://`` with TLS)
``xcloak+unix:///path``     a Unix socket
``xcloak+cluster://h:p,..`` redis.cluster.RedisCluster
``xcloak+sentinel://h:p,../service``  Sentinel (``Sentinel.master_for``)
``async+xcloak://`` ...     the same four for ``limits.aio`` (redis.asyncio)
==========================  ===========================================

The **moving window** strategy (limits' exact sliding log) runs on
``XCLOAK.ALLOW`` (``acquire_entry``) and ``XCLOAK.PEEK ... OLDEST``
(``get_moving_window``: the window's oldest live entry and its count), one
O(log n) call each, with the bundled Lua fallback where the server has no
module. The fixed-window and sliding-window-counter strategies keep limits'
own Redis code (these classes are limits' ``RedisStorage`` family).

Moving-window keys are ``<key_prefix>:xcloak:<key>`` (limits' own are lists
under ``<key_prefix>:<key>``), so a switch from ``redis://`` on a live server
never meets a key of the other layout; ``clear`` and ``reset`` remove both.

Options (keyword arguments, e.g. Flask-Limiter's ``RATELIMIT_STORAGE_OPTIONS``,
or the URI's query string): ``on_error`` (``raise``, ``allow``, ``deny``),
``timeout`` (milliseconds or a timedelta, default 1000), ``fallback`` (``auto``,
``always``, ``never``), ``probe_interval`` (milliseconds or a timedelta),
``replica_reads`` (``get_moving_window`` on a replica: cluster and Sentinel),
``block_cache`` (entries of the limiter's block cache, default 10,000, 0 off:
a rejected ``hit`` is answered again without a call until its ``retry_after``
passes), and as a keyword argument only ``clock`` (an :class:`xcloak.Clock`: its time is
sent as ``NOW``, for tests that freeze time, since the window otherwise runs on
the server's clock). They are checked when the storage is built (Flask-Limiter: ``init_app``).

A ``limit`` above the server's cap (``xcloak.max-limit``, 1,000,000 by default
and always through the script) is refused by the server at the first hit of
that limit, with ``XcloakError("ERR limit must be an integer from 0 to
1000000")``, under every ``on_error``: limits gives a storage no limit before
its first hit.
"""

from __future__ import annotations

import time
import urllib.parse
from typing import Any, Dict, Optional, Tuple

from limits.storage import RedisClusterStorage, RedisSentinelStorage, RedisStorage

from . import _window
from .decision import ERROR
from .limiter import Limiter

OPTIONS = ("on_error", "timeout", "fallback", "probe_interval", "replica_reads", "clock", "block_cache")
SCHEMES = {"xcloak": "redis", "xcloaks": "rediss", "xcloak+unix": "redis+unix",
           "xcloak+cluster": "redis+cluster", "xcloak+sentinel": "redis+sentinel"}


def _flag(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"{name} must be true or false (got {value!r})")


def _ms(name: str, value: Any) -> Any:
    """A duration option: from the URI a string of whole milliseconds; as a
    keyword argument what the limiter takes (an int of ms or a timedelta)."""
    if isinstance(value, str):
        if not value.isdigit():
            raise ValueError(f"{name} must be a whole number of milliseconds (got {value!r} in the storage URI)")
        return int(value)
    return value


def split_options(uri: str, options: Dict[str, Any]) -> Tuple[str, Dict[str, Any]]:
    """limits' URI in redis form, and xcloak's options taken out of the query
    string and of ``options`` (redis-py would refuse them)."""
    parsed = urllib.parse.urlsplit(uri)
    scheme = parsed.scheme
    prefix = "async+" if scheme.startswith("async+") else ""
    base = scheme[len(prefix):]
    if base not in SCHEMES:
        raise ValueError(f"not an xcloak storage URI: {uri}")
    query = urllib.parse.parse_qsl(parsed.query, keep_blank_values=True)
    ours = {name: options.pop(name) for name in OPTIONS if name in options}
    rest = []
    for name, value in query:
        if name in OPTIONS:
            ours.setdefault(name, value)
        else:
            rest.append((name, value))
    # urlsplit keeps the netloc as written (several hosts for a cluster or Sentinel).
    redis_uri = urllib.parse.urlunsplit((prefix + SCHEMES[base], parsed.netloc, parsed.path,
                                         urllib.parse.urlencode(rest), parsed.fragment))
    if "://" not in redis_uri:  # urlunsplit drops an empty netloc's slashes
        redis_uri = redis_uri.replace(":", "://", 1)
    config: Dict[str, Any] = {}
    if "on_error" in ours:
        config["on_error"] = str(ours["on_error"])
    if "fallback" in ours:
        config["fallback"] = str(ours["fallback"])
    if "timeout" in ours:
        config["timeout"] = _ms("timeout", ours["timeout"])
    if "probe_interval" in ours:
        config["probe_interval"] = _ms("probe_interval", ours["probe_interval"])
    if "block_cache" in ours:
        entries = ours["block_cache"]
        if isinstance(entries, str):
            if not entries.isdigit():
                raise ValueError(f"block_cache must be an integer from 0 (off) to 1,000,000 entries (got {entries!r} "
                                 f"in the storage URI)")
            config["block_cache"] = int(entries)
        else:
            config["block_cache"] = entries  # the limiter checks its type and range
    if "clock" in ours:  # a keyword argument only: an xcloak.Clock (tests that freeze time)
        if isinstance(ours["clock"], str):
            raise ValueError("clock is an xcloak.Clock, passed as a keyword argument (storage options), "
                             "not in the URI")
        config["clock"] = ours["clock"]
    config["replica_reads"] = _flag("replica_reads", ours.get("replica_reads", False))
    return redis_uri, config


class MovingWindow:
    """The moving window on XCLOAK.ALLOW / XCLOAK.PEEK ... OLDEST (sync)."""

    limiter: Limiter
    _rejections: _window.Rejections
    key_prefix: str

    def _xcloak_key(self, key: str) -> str:
        return f"{self.key_prefix}:xcloak:{key}"

    def acquire_entry(self, key: str, limit: int, expiry: int, amount: int = 1) -> bool:
        if amount > limit:
            return False  # can never fit (limits' own storages answer the same without a call)
        d = self.limiter.allow(self._xcloak_key(key), int(expiry * 1000), limit, cost=amount)
        self._rejections.remember(key, limit, expiry, amount, d, self.limiter.engine.wall_ms())
        return d.allowed

    def get_moving_window(self, key: str, limit: int, expiry: int) -> Tuple[float, int]:
        """(start of the window: its oldest live entry, in seconds; live entries).
        Right after a rejection of this key, from its reply (``_window``)."""
        known = self._rejections.recall(key, limit, expiry, self.limiter.engine.wall_ms())
        if known is not None:
            return known
        d = self.limiter.peek(self._xcloak_key(key), int(expiry * 1000), limit, oldest=True)
        if d.via == ERROR:
            # The error policy: fail open reads as an empty window, fail closed as a full one.
            return time.time(), 0 if d.allowed else limit
        if d.oldest is None:
            return time.time(), 0
        return d.oldest / 1000, limit - d.remaining

    def clear(self, key: str) -> None:
        self._rejections.forget(key)
        super().clear(key)  # type: ignore[misc]  # limits' counters of this key
        self.limiter.reset(self._xcloak_key(key))

    def reset(self) -> Optional[int]:
        self._rejections.forget()
        if self.limiter.engine.cache is not None:  # every window goes: so does every cached rejection
            self.limiter.engine.cache.clear()
        return super().reset()  # type: ignore[misc, no-any-return]


class XcloakStorage(MovingWindow, RedisStorage):
    """``xcloak://``, ``xcloaks://``, ``xcloak+unix://``: limits' RedisStorage, with the moving window on xcloak."""

    STORAGE_SCHEME = ["xcloak", "xcloaks", "xcloak+unix"]

    def __init__(self, uri: str, **options: Any) -> None:
        redis_uri, config = split_options(uri, options)
        if config.pop("replica_reads"):
            raise ValueError("replica_reads: a single server has no replica to read (xcloak+cluster:// or "
                             "xcloak+sentinel://)")
        super().__init__(redis_uri, **options)
        self.limiter = Limiter(self.storage, **config)
        self._rejections = _window.Rejections()


class XcloakClusterStorage(MovingWindow, RedisClusterStorage):
    """``xcloak+cluster://host:port,host:port``: limits' RedisClusterStorage, with the moving window on xcloak."""

    STORAGE_SCHEME = ["xcloak+cluster"]

    def __init__(self, uri: str, **options: Any) -> None:
        redis_uri, config = split_options(uri, options)
        replica_reads = config.pop("replica_reads")
        super().__init__(redis_uri, **options)
        self.limiter = Limiter(self.storage, replica_reads=replica_reads, **config)
        self._rejections = _window.Rejections()


class XcloakSentinelStorage(MovingWindow, RedisSentinelStorage):
    """``xcloak+sentinel://host:port,host:port/service``: limits' RedisSentinelStorage, the moving window on xcloak."""

    STORAGE_SCHEME = ["xcloak+sentinel"]

    def __init__(self, uri: str, **options: Any) -> None:
        redis_uri, config = split_options(uri, options)
        replica_reads = config.pop("replica_reads")
        super().__init__(redis_uri, **options)
        self.limiter = Limiter(self.storage, replica=self.storage_slave if replica_reads else None, **config)
        self._rejections = _window.Rejections()


# The asyncio twins register with limits when this module is imported.
from .aio.limits import XcloakAsyncClusterStorage, XcloakAsyncSentinelStorage, XcloakAsyncStorage  # noqa: E402

__all__ = [
    "XcloakStorage", "XcloakClusterStorage", "XcloakSentinelStorage",
    "XcloakAsyncStorage", "XcloakAsyncClusterStorage", "XcloakAsyncSentinelStorage",
]
