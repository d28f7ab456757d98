"""acquire's algorithm (docs/clients.md, "acquire"), as a pure step.

Each turn makes one ``allow`` call; this decides what follows it: stop (and
why) or sleep how long. The sleep is the server's retry-after plus a jitter
that is only ever added (a client waking before retry-after is rejected
again), at least 1 ms, never past the deadline.
"""

from __future__ import annotations

import math
from typing import Callable, Optional, Tuple

from .decision import ERROR, Decision

ADMITTED, DEADLINE, NEVER, OUTAGE = "admitted", "deadline", "never", "error"


def next_step(decision: Decision, left_ms: int, jitter_fraction: float,
              random: Callable[[], float]) -> Tuple[Optional[str], Optional[int]]:
    """``(outcome, None)`` to stop, or ``(None, sleep_ms)`` to sleep and call again.
    ``random`` (uniform in [0, 1)) is drawn only when there is a jitter."""
    if decision.allowed:
        return ADMITTED if decision.via != ERROR else OUTAGE, None
    if decision.via == ERROR:
        return OUTAGE, None
    if decision.cost_exceeds_limit:
        return NEVER, None
    retry = decision.retry_after_ms
    if retry > left_ms:
        return DEADLINE, None
    jitter = math.floor(retry * jitter_fraction * random()) if jitter_fraction else 0
    return None, max(1, min(retry + jitter, left_ms))
