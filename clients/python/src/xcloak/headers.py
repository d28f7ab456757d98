"""HTTP header fields from a Decision (docs/clients.md, "Headers"). Pure.

- ``ietf`` (default): ``RateLimit-Policy`` and ``RateLimit`` of
  draft-ietf-httpapi-ratelimit-headers, one policy per tier, in order;
- ``legacy``: the draft-06 ``RateLimit-Limit`` / ``-Remaining`` / ``-Reset``
  of the binding tier;
- ``both``: the two sets.

A rejection with a wait adds ``Retry-After``. Seconds always round up.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Union

from .decision import ERROR, Decision, MultiDecision, tier_rows

STYLES = ("ietf", "legacy", "both")


def seconds(ms: int) -> int:
    """Whole seconds, rounded up: rounding down sends a client back too early."""
    return (ms + 999) // 1000


def default_name(window_ms: int, limit: int) -> str:
    """``<limit>-in-<s>s`` for a whole number of seconds, else ``<limit>-in-<ms>ms``."""
    if window_ms % 1000 == 0:
        return f"{limit}-in-{window_ms // 1000}s"
    return f"{limit}-in-{window_ms}ms"


def headers(
    decision: Union[Decision, MultiDecision],
    style: str = "ietf",
    names: Optional[Sequence[Any]] = None,
) -> Dict[str, str]:
    """The header fields of ``decision``: ``names`` is one policy name per tier
    (for a :class:`MultiDecision`, one list per request sent). A decision of
    the error policy has none."""
    if style not in STYLES:
        raise ValueError(f"style must be one of {', '.join(STYLES)} (got {style!r})")
    if isinstance(decision, MultiDecision):
        if decision.via == ERROR:
            return {}
        decisions = list(decision.decisions)
        binding = decision.binding
        names_per = list(names) if names is not None else [None] * len(decisions)
        names_per += [None] * (len(decisions) - len(names_per))
    else:
        if decision.via == ERROR:
            return {}
        decisions, binding, names_per = [decision], decision, [names]
    policy: List[str] = []
    state: List[str] = []
    for d, tier_names in zip(decisions, names_per):
        rows = tier_rows(d)
        if tier_names is None:
            tier_names = [default_name(t.window_ms, t.limit) for t in rows]
        if len(tier_names) != len(rows):
            raise ValueError(f"names: {len(tier_names)} given for {len(rows)} tiers")
        policy += [f'"{n}";q={t.limit};w={seconds(t.window_ms)}' for n, t in zip(tier_names, rows)]
        state += [f'"{n}";r={t.remaining};t={seconds(t.reset_after_ms)}' for n, t in zip(tier_names, rows)]
    out: Dict[str, str] = {}
    if style in ("ietf", "both"):
        out["RateLimit-Policy"] = ", ".join(policy)
        out["RateLimit"] = ", ".join(state)
    if style in ("legacy", "both"):
        out["RateLimit-Limit"] = str(binding.limit)
        out["RateLimit-Remaining"] = str(binding.remaining)
        out["RateLimit-Reset"] = str(seconds(binding.reset_after_ms))
    if not binding.allowed and binding.retry_after_ms > 0:
        out["Retry-After"] = str(max(1, seconds(binding.retry_after_ms)))
    return out
