"""What limits' moving window asks of a storage, shared by ``limits.py`` and
``aio/limits.py``: the answer to ``get_moving_window`` that a rejection's own
reply already holds.

Flask-Limiter and slowapi call ``get_window_stats`` (``get_moving_window``)
right after a hit, for their headers (slowapi from its exception handler, on
another thread than the hit). After an admission that takes a
``PEEK ... OLDEST``: the reply of ``XCLOAK.ALLOW`` has the count but not the
window's oldest entry. After a rejection of one unit with the window full,
the reply has both: the next unit fits when the oldest entry leaves, in
``retry_after`` ms, so the oldest entry is ``now + retry_after - window`` and
the count is the limit; and until that moment nothing can enter or leave the
window (every hit is rejected; only a refund or a clear could change it). So
the storage keeps that answer, for one ``get_moving_window`` of the same key,
limit and window within ``retry_after``, and sends nothing for it. The figure
is read on the client's clock, the one limits subtracts it from. At most
``SIZE`` answers are kept (the oldest go first), so a storage whose
``get_moving_window`` is never called keeps no more.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Optional, Tuple

from .decision import ERROR, Decision

SIZE = 1024
_Key = Tuple[str, int, float]


class Rejections:
    """The answers of recent rejections, by (key, limit, expiry): (oldest s, count, valid until ms)."""

    def __init__(self) -> None:
        self._answers: OrderedDict[_Key, Tuple[float, int, int]] = OrderedDict()
        self._lock = threading.Lock()

    def remember(self, key: str, limit: int, expiry: float, amount: int, d: Decision, now_ms: int) -> None:
        """After ``acquire_entry``: keep a full window's answer (and drop it after an admission)."""
        full = not d.allowed and d.via != ERROR and amount == 1 and d.remaining == 0 and d.retry_after_ms > 0
        with self._lock:
            if not full:
                self._answers.pop((key, limit, expiry), None)
                return
            oldest_ms = now_ms + d.retry_after_ms - d.window_ms
            self._answers[(key, limit, expiry)] = (oldest_ms / 1000, limit, now_ms + d.retry_after_ms)
            self._answers.move_to_end((key, limit, expiry))
            while len(self._answers) > SIZE:
                self._answers.popitem(last=False)

    def recall(self, key: str, limit: int, expiry: float, now_ms: int) -> Optional[Tuple[float, int]]:
        """``get_moving_window``'s answer from a rejection, once, within its retry_after; or None."""
        with self._lock:
            answer = self._answers.pop((key, limit, expiry), None)
        if answer is None or now_ms >= answer[2]:
            return None
        return answer[0], answer[1]

    def forget(self, key: Optional[str] = None) -> None:
        with self._lock:
            if key is None:
                self._answers.clear()
            else:
                for k in [k for k in self._answers if k[0] == key]:
                    del self._answers[k]
