"""The block cache (docs/clients.md, "Block cache"): rejections remembered in
the process, so a key the server has just turned away is turned away again
without a call until its ``retry_after`` has passed. Pure: no I/O, the
monotonic clock injected.

After a server rejection with ``retry_after_ms > 0``, an entry holds the key's
request shape (``sig``: window, limit, tiers), the rejected cost, the local
monotonic time taken just *before* the call was sent (``sent_at``: the server
computed ``retry_after`` at some later instant, so ``sent_at + retry_after`` is
never later than the true deadline: the cache can only be early) and the
server's decision. A later ``allow`` of the same key and shape, with a cost at
least as large, before that deadline, is answered by :meth:`BlockCache.lookup`
with a rejected ``Decision`` whose ``via`` is ``"cache"``, its durations
counted down. A sliding log can only open earlier through a refund or a
reset: the limiter's own drop the entry first (:meth:`BlockCache.forget`),
another process's may leave this one rejecting for at most that
``retry_after``.

Bounded: at most ``capacity`` entries, least recently used evicted first, an
expired entry dropped when met; each operation O(1) (an ``OrderedDict``).
Thread-safe: a ``threading.Lock`` held for a dict operation, never across a
call to the server (the limiter looks up, sends, then records), and never
across an ``await`` (the asyncio limiter uses it between awaits).
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Optional, Sequence, Tuple

from .decision import CACHE, COMMAND, SCRIPT, Decision, TierState

#: ``block_cache``'s default and its range.
DEFAULT_ENTRIES = 10_000
MAX_ENTRIES = 1_000_000

#: A request's shape: (window ms, limit, ((tier window ms, tier limit), ...)).
Sig = Tuple[int, int, Tuple[Tuple[int, int], ...]]


def monotonic_ms() -> float:
    """The cache's clock: local monotonic milliseconds (fractional)."""
    return time.monotonic() * 1000


def capacity(value: object) -> int:
    """``block_cache``: an int from 0 (off) to 1,000,000, refused when the limiter is built."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"block_cache must be an int from 0 (off) to {MAX_ENTRIES:,} entries, "
                        f"not {type(value).__name__} ({value!r})")
    if not 0 <= value <= MAX_ENTRIES:
        raise ValueError(f"block_cache must be an integer from 0 (off) to {MAX_ENTRIES:,} entries (got {value!r})")
    return value


@dataclass(frozen=True)
class Stats:
    """``limiter.stats``: ``cache_hits``, the calls the block cache answered
    since the limiter was built (each one a round trip saved); ``cache_entries``,
    the entries it holds now (expired ones not yet met included)."""

    cache_hits: int
    cache_entries: int


class _Entry:
    """One blocked key: the rejection's shape, cost, times and the server's fields."""

    __slots__ = ("sig", "cost", "sent_at", "deadline", "limit", "window_ms", "tier", "reset_after_ms", "tiers")

    def __init__(self, sig: Sig, cost: int, sent_at: float, decision: Decision) -> None:
        self.sig = sig
        self.cost = cost
        self.sent_at = sent_at
        self.deadline = sent_at + decision.retry_after_ms
        self.limit = decision.limit
        self.window_ms = decision.window_ms
        self.tier = decision.tier
        self.reset_after_ms = decision.reset_after_ms
        # Plain tuples, not TierState objects: a third of the memory of an entry with tiers.
        self.tiers = tuple((t.window_ms, t.limit, t.remaining, t.retry_after_ms, t.reset_after_ms)
                           for t in decision.tiers)


class BlockCache:
    """At most ``capacity`` (>= 1) blocked keys; ``monotonic`` returns local
    monotonic milliseconds (tests pass a virtual clock)."""

    def __init__(self, capacity: int, monotonic: Callable[[], float] = monotonic_ms) -> None:
        self.capacity = capacity
        self.monotonic = monotonic
        self.hits = 0
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def stats(self) -> Stats:
        return Stats(self.hits, len(self._entries))

    def lookup(self, key: str, sig: Sig, cost: int) -> Optional[Decision]:
        """The cached rejection of this request, or None (then send it, with
        ``sent_at`` = :attr:`monotonic` read before sending)."""
        entries = self._entries
        if key not in entries:  # the common miss, without the lock (a dict read is atomic)
            return None
        with self._lock:
            entry = entries.get(key)
            if entry is None:
                return None
            now = self.monotonic()
            if now >= entry.deadline:
                del entries[key]  # an expired entry is dropped when met
                return None
            if entry.sig != sig or cost < entry.cost:
                return None  # another shape or a smaller cost: sent (a rejection replaces the entry)
            if cost > min((sig[1], *(limit for _, limit in sig[2]))):
                return None  # above a tier's limit: it never fits, and the server's answer says so
            entries.move_to_end(key)
            self.hits += 1
        elapsed = math.floor(now - entry.sent_at)
        return Decision(
            allowed=False, limit=entry.limit, remaining=0,
            retry_after_ms=max(1, math.ceil(entry.deadline - now)),
            reset_after_ms=max(0, entry.reset_after_ms - elapsed),
            window_ms=entry.window_ms, tier=entry.tier,
            tiers=tuple(TierState(window, limit, remaining, max(0, retry - elapsed), max(0, reset - elapsed))
                        for window, limit, remaining, retry, reset in entry.tiers),
            via=CACHE)

    def record(self, key: str, sig: Sig, cost: int, sent_at: float, decision: Decision) -> None:
        """After the server's decision of an ``allow`` sent at ``sent_at``: a
        rejection with a wait is kept (replacing the key's entry), an
        admission drops the key's entry (the window opened), anything else
        (a never-fits rejection, the error policy's) changes nothing."""
        if decision.via != COMMAND and decision.via != SCRIPT:
            return
        if decision.allowed:
            if key in self._entries:
                self.forget(key)
            return
        if decision.retry_after_ms <= 0:
            return
        entry = _Entry(sig, cost, sent_at, decision)
        with self._lock:
            entries = self._entries
            entries[key] = entry
            entries.move_to_end(key)
            while len(entries) > self.capacity:
                entries.popitem(last=False)

    def forget(self, key: str) -> None:
        """Drops the key's entry (a refund or reset through this limiter, before it is sent)."""
        with self._lock:
            self._entries.pop(key, None)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


def sig_of(window_ms: int, limit: int, tiers_ms: Sequence[Tuple[int, int]]) -> Sig:
    return window_ms, limit, tuple(tiers_ms)
