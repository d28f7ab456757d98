"""The canonical commands (docs/clients.md, "Canonical command"), pure.

``XCLOAK.ALLOW key window limit [TIER w l]... [COST c] [NOW t] DETAILS [STAMP]``,
``XCLOAK.PEEK key window limit [TIER w l]... [COST c] [NOW t] [OLDEST]`` and
``XCLOAK.REFUND key stamp [COST c]``: every argument a string, in that order.
Through the fallback the same arguments follow ``EVALSHA <sha> 1``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import List, Optional, Sequence, Tuple, Union

from .errors import XcloakError

#: A duration: a :class:`datetime.timedelta` or an ``int`` of milliseconds.
Duration = Union[timedelta, int]
#: Extra tiers after the positional one: ``[(window, limit), ...]``.
Tiers = Sequence[Tuple[Duration, int]]


def to_ms(value: Duration, name: str) -> int:
    """Whole milliseconds of a duration; a fraction of a millisecond is refused
    here (every range check is the server's, so its text is the same everywhere)."""
    if isinstance(value, bool):
        raise XcloakError(f"{name} must be a duration (datetime.timedelta) or an int of milliseconds, not a bool")
    if isinstance(value, int):
        return value
    if isinstance(value, timedelta):
        micros = (value.days * 86_400 + value.seconds) * 1_000_000 + value.microseconds
        if micros % 1000:
            raise XcloakError(f"{name} must be a whole number of milliseconds (got {value!r})")
        return micros // 1000
    raise XcloakError(f"{name} must be a duration (datetime.timedelta) or an int of milliseconds, not {type(value).__name__}")


def integer(value: int, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise XcloakError(f"{name} must be an int, not {type(value).__name__}")
    return value


def tiers_ms(tiers: Optional[Tiers]) -> List[Tuple[int, int]]:
    out = []
    for number, pair in enumerate(tiers or (), start=1):
        try:
            window, limit = pair
        except (TypeError, ValueError):
            raise XcloakError(f"tier {number} must be a (window, limit) pair, not {pair!r}") from None
        out.append((to_ms(window, f"window of TIER {number}"), integer(limit, f"limit of TIER {number}")))
    return out


def window_args(
    window_ms: int, limit: int, tiers: Sequence[Tuple[int, int]], cost: int, now_ms: Optional[int]
) -> List[str]:
    """The arguments after the key that ALLOW and PEEK share."""
    args = [str(window_ms), str(limit)]
    for tier_window, tier_limit in tiers:
        args += ["TIER", str(tier_window), str(tier_limit)]
    if cost != 1:
        args += ["COST", str(cost)]
    if now_ms is not None:
        args += ["NOW", str(now_ms)]
    return args


def allow_args(window_ms: int, limit: int, tiers: Sequence[Tuple[int, int]], cost: int, now_ms: Optional[int],
               stamp: bool) -> List[str]:
    return window_args(window_ms, limit, tiers, cost, now_ms) + (["DETAILS", "STAMP"] if stamp else ["DETAILS"])


def peek_args(window_ms: int, limit: int, tiers: Sequence[Tuple[int, int]], cost: int, now_ms: Optional[int],
              oldest: bool) -> List[str]:
    return window_args(window_ms, limit, tiers, cost, now_ms) + (["OLDEST"] if oldest else [])


def refund_args(stamp: int, cost: int) -> List[str]:
    return [str(stamp)] + (["COST", str(cost)] if cost != 1 else [])
