"""What limits' moving window asks of a storage, shared by ``limits.py`` and
``aio/limits.py``: the answer to ``get_moving_window`` that a rejection's own
reply already holds.

Flask-Limiter and slowapi call ``get_window_stats`` (``get_moving_window``)
right after a hit, for their headers. After an admission that takes a
``PEEK ... OLDEST``: the reply of ``XCLOAK.ALLOW`` has the count but not the
window's oldest entry. After a rejection of one unit with the window full,
the reply has both: the next unit fits when the oldest entry leaves, in
``retry_after`` ms, so the oldest entry is ``now + retry_after - window`` and
the count is the limit; and until that moment nothing can enter or leave the
window (short of a refund or a clear). So the storage keeps that answer, for
the next ``get_moving_window`` of the same key, limit and window in the same
thread or task, within ``retry_after``, and sends nothing for it. The figure
is read on the client's clock, the one limits subtracts it from.
"""

from __future__ import annotations

import contextvars
from typing import Optional, Tuple

from .decision import ERROR, Decision

# (storage id, key, limit, expiry, oldest in seconds, count, valid until in unix ms)
_Entry = Tuple[int, str, int, float, float, int, int]
_LAST: contextvars.ContextVar[Optional[_Entry]] = contextvars.ContextVar("xcloak_last_rejection", default=None)


def remember(storage: object, key: str, limit: int, expiry: float, amount: int, d: Decision, now_ms: int) -> None:
    """After ``acquire_entry``: keep a full window's answer, forget any other."""
    if d.allowed or d.via == ERROR or amount != 1 or d.remaining != 0 or d.retry_after_ms <= 0:
        _LAST.set(None)
        return
    oldest_ms = now_ms + d.retry_after_ms - d.window_ms
    _LAST.set((id(storage), key, limit, expiry, oldest_ms / 1000, limit, now_ms + d.retry_after_ms))


def recall(storage: object, key: str, limit: int, expiry: float, now_ms: int) -> Optional[Tuple[float, int]]:
    """``get_moving_window``'s answer from the last rejection, once, or None."""
    entry = _LAST.get()
    if entry is None:
        return None
    _LAST.set(None)
    if entry[:4] != (id(storage), key, limit, expiry) or now_ms >= entry[6]:
        return None
    return entry[4], entry[5]


def forget() -> None:
    _LAST.set(None)
