"""The canonical commands (docs/clients.md, "Canonical command"), pure.

``XCLOAK.ALLOW key window limit [TIER w l]... [COST c] [NOW t] DETAILS [STAMP]``,
``XCLOAK.PEEK key window limit [TIER w l]... [COST c] [NOW t] [OLDEST]`` and
``XCLOAK.REFUND key stamp [COST c]``: every argument a string, in that order.
Through the fallback the same arguments follow ``EVALSHA <sha> 1``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import List, Optional, Sequence, Tuple, TypedDict, Union

from .errors import XcloakError

#: A duration: a :class:`datetime.timedelta` or an ``int`` of milliseconds.
Duration = Union[timedelta, int]
#: Extra tiers after the positional one: ``[(window, limit), ...]``.
Tiers = Sequence[Tuple[Duration, int]]


class _RequestFields(TypedDict):
    key: str
    window: Duration
    limit: int


class AllowAllRequest(_RequestFields, total=False):
    """One request of ``allow_all``: ``{"key", "window", "limit"}``, and
    ``"cost"`` and ``"tiers"`` when needed. Any other field is refused."""

    cost: int
    tiers: Tiers


#: The largest integer every language's clients and the server agree on (2^53 - 1).
MAX_MS = 9_007_199_254_740_991


def _ms(value: object, name: str) -> int:
    """Whole milliseconds of a duration, or the TypeError/ValueError text's cause."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be a datetime.timedelta or an int of milliseconds, not a bool ({value!r})")
    if isinstance(value, int):
        return value
    if isinstance(value, timedelta):
        micros = (value.days * 86_400 + value.seconds) * 1_000_000 + value.microseconds
        if micros % 1000:
            raise ValueError(f"{name} must be a whole number of milliseconds (got {value!r})")
        return micros // 1000
    if isinstance(value, float):
        raise TypeError(f"{name} must be a datetime.timedelta or an int of milliseconds, not a float ({value!r}): "
                        f"a bare number is milliseconds everywhere in xcloak; for seconds write "
                        f"timedelta(seconds={value!r})")
    raise TypeError(f"{name} must be a datetime.timedelta or an int of milliseconds, not {type(value).__name__}")


def to_ms(value: Duration, name: str) -> int:
    """A call's duration argument in whole milliseconds. Its type and a
    fraction of a millisecond are refused here (an :class:`XcloakError`); the
    range is the server's check, so its text is the same everywhere."""
    try:
        return _ms(value, name)
    except (TypeError, ValueError) as error:
        raise XcloakError(str(error)) from None


def duration_ms(value: Duration, name: str, low: int, high: int = MAX_MS, unit: str = "") -> int:
    """A configured duration in whole milliseconds, from ``low`` to ``high``:
    ``TypeError`` for a float, a bool or another type, ``ValueError`` out of
    range, each naming the argument and its range."""
    ms = _ms(value, name)
    if not low <= ms <= high:
        raise ValueError(f"{name} must be from {low} to {high} milliseconds{unit} (a datetime.timedelta or an int "
                         f"of milliseconds; got {value!r})")
    return ms


def config_int(value: object, name: str, low: int, high: int) -> int:
    """A configured integer from ``low`` to ``high`` (``TypeError`` / ``ValueError`` naming it)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int from {low} to {high}, not {type(value).__name__} ({value!r})")
    if not low <= value <= high:
        raise ValueError(f"{name} must be an integer from {low} to {high} (got {value!r})")
    return value


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


#: The largest ``limit`` the bundled script takes, and the module's default
#: ``xcloak.max-limit`` (a module loaded with a larger ``MAX-LIMIT`` takes more
#: through the calls, never through the script).
MAX_LIMIT = 1_000_000
MAX_COST = 1_000_000
#: ``TIER`` pairs after the positional one (16 tiers in all).
MAX_EXTRA_TIERS = 15


def limit_config(window: Duration, limit: int, cost: int, tiers: Optional[Tiers]
                 ) -> Tuple[int, int, int, List[Tuple[int, int]]]:
    """A limit configured once and used for every request (the ASGI ``Limit``):
    checked when it is built, with the server's ranges at their defaults, so a
    bad one is refused at startup, not at the first request."""
    window_ms = duration_ms(window, "window", 1)
    limit = config_int(limit, "limit", 0, MAX_LIMIT)
    cost = config_int(cost, "cost", 1, MAX_COST)
    pairs = list(tiers or ())
    if len(pairs) > MAX_EXTRA_TIERS:
        raise ValueError(f"tiers: at most {MAX_EXTRA_TIERS} pairs after the positional one (16 tiers in all), "
                         f"got {len(pairs)}")
    out = []
    for number, pair in enumerate(pairs, start=1):
        try:
            tier_window, tier_limit = pair
        except (TypeError, ValueError):
            raise TypeError(f"tier {number} must be a (window, limit) pair, not {pair!r}") from None
        out.append((duration_ms(tier_window, f"window of TIER {number}", 1),
                    config_int(tier_limit, f"limit of TIER {number}", 0, MAX_LIMIT)))
    return window_ms, limit, cost, out
