"""The Decision (docs/clients.md, "Decision"): a reply read into one value. Pure.

``XCLOAK.ALLOW ... DETAILS [STAMP]`` and ``XCLOAK.PEEK ... [OLDEST]`` reply
``[allowed, limit, remaining, retry_after_ms, reset_after_ms]`` of the binding
tier, then with ``TIER`` one such array (window first) per tier, then the stamp
(ALLOW ``STAMP``) or the oldest live entry (PEEK ``OLDEST``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Dict, List, Optional, Sequence, Tuple

#: Who decided: the module, the bundled Lua script, the error policy, or the
#: block cache (a rejection remembered from the server's, without a call).
COMMAND, SCRIPT, ERROR, CACHE = "command", "script", "error", "cache"


@dataclass
class TierState:
    """One tier's fields, in the order the tiers were given."""

    window_ms: int
    limit: int
    remaining: int
    retry_after_ms: int
    reset_after_ms: int

    @property
    def window(self) -> timedelta:
        return timedelta(milliseconds=self.window_ms)

    @property
    def retry_after(self) -> Optional[timedelta]:
        return None if self.retry_after_ms < 0 else timedelta(milliseconds=self.retry_after_ms)

    @property
    def reset_after(self) -> timedelta:
        return timedelta(milliseconds=self.reset_after_ms)


@dataclass
class Decision:
    """What the server (or the error policy) decided about one request.

    Durations are kept as the reply's milliseconds (``*_ms``) and offered as
    :class:`datetime.timedelta` properties. A request that can never fit (its
    cost is above a tier's limit) has ``cost_exceeds_limit``, ``retry_after_ms
    == -1`` and ``retry_after is None``.
    """

    allowed: bool
    limit: int
    remaining: int
    retry_after_ms: int
    reset_after_ms: int
    window_ms: int
    tier: int = 0
    tiers: Tuple[TierState, ...] = ()
    stamp: Optional[int] = None
    via: str = COMMAND
    error: Optional[BaseException] = field(default=None, compare=False)
    #: ``peek(..., oldest=True)``: the stamp (unix ms) of the oldest entry live
    #: in the binding tier's window, ``None`` if it holds none or not asked.
    oldest: Optional[int] = None

    @property
    def cost_exceeds_limit(self) -> bool:
        return self.via != ERROR and self.retry_after_ms == -1

    @property
    def retry_after(self) -> Optional[timedelta]:
        return None if self.retry_after_ms < 0 else timedelta(milliseconds=self.retry_after_ms)

    @property
    def reset_after(self) -> timedelta:
        return timedelta(milliseconds=self.reset_after_ms)

    @property
    def window(self) -> timedelta:
        return timedelta(milliseconds=self.window_ms)

    def __bool__(self) -> bool:
        return self.allowed


@dataclass(frozen=True)
class MultiDecision:
    """The result of ``allow_all``: one decision per request sent, in order."""

    allowed: bool
    decisions: Tuple[Decision, ...]
    #: The index of the request that rejected, or ``None``.
    rejected: Optional[int]
    #: The index of the binding decision: the rejecting one, or when all are
    #: admitted the one with the fewest remaining (ties: the earliest).
    binding_index: int
    via: str = COMMAND
    error: Optional[BaseException] = field(default=None, compare=False)

    @property
    def binding(self) -> Decision:
        return self.decisions[self.binding_index]

    @property
    def retry_after_ms(self) -> int:
        return self.binding.retry_after_ms

    @property
    def retry_after(self) -> Optional[timedelta]:
        return self.binding.retry_after

    def __bool__(self) -> bool:
        return self.allowed


def from_reply(reply: Any, window_ms: int, tiered: bool, stamp: bool = False, oldest: bool = False,
               via: str = COMMAND) -> Decision:
    """A Decision from a details reply. ``tiered``: the call had ``TIER``;
    ``stamp`` / ``oldest``: the reply ends with the stamp / the oldest entry."""
    items = list(reply)
    last: Optional[int] = None
    if stamp or oldest:
        last = int(items.pop())
    if len(items) != 5 + tiered:
        raise ValueError(f"not a details reply: {reply!r}")
    allowed, limit, remaining, retry, reset = (int(x) for x in items[:5])
    per_tier: Tuple[TierState, ...] = ()
    binding, binding_window = 0, window_ms
    if tiered:
        per_tier = tuple(TierState(*(int(x) for x in t)) for t in items[5])
        # The first tier whose fields are the reply's five is the binding one:
        # the server breaks ties to the earliest (docs/clients.md).
        for index, t in enumerate(per_tier):
            if (t.limit, t.remaining, t.retry_after_ms, t.reset_after_ms) == (limit, remaining, retry, reset):
                binding, binding_window = index, t.window_ms
                break
        else:
            raise ValueError(f"no tier matches the binding fields of {reply!r}")
    return Decision(
        allowed=bool(allowed), limit=limit, remaining=remaining, retry_after_ms=retry, reset_after_ms=reset,
        window_ms=binding_window, tier=binding, tiers=per_tier,
        stamp=last if stamp and last is not None and last >= 0 else None,
        via=via,
        oldest=last if oldest and last is not None and last >= 0 else None,
    )


def by_policy(allowed: bool, window_ms: int, limit: int, error: BaseException) -> Decision:
    """The decision of the error policy: ``allowed`` as it says, tier 0 as asked."""
    return Decision(allowed=allowed, limit=limit, remaining=0, retry_after_ms=0, reset_after_ms=0,
                    window_ms=window_ms, via=ERROR, error=error)


def combine(decisions: Sequence[Decision], rejected: Optional[int]) -> MultiDecision:
    """``allow_all``'s result from the decisions of the requests sent."""
    if rejected is not None:
        binding = rejected
    else:
        binding = min(range(len(decisions)), key=lambda i: (decisions[i].remaining, i))
    return MultiDecision(allowed=rejected is None, decisions=tuple(decisions), rejected=rejected,
                         binding_index=binding, via=decisions[binding].via)


def to_dict(decision: Decision) -> Dict[str, Any]:
    """The vectors' shape of a Decision (``via`` and ``error`` left out)."""
    return {
        "allowed": decision.allowed, "limit": decision.limit, "remaining": decision.remaining,
        "retry_after_ms": decision.retry_after_ms, "reset_after_ms": decision.reset_after_ms,
        "cost_exceeds_limit": decision.cost_exceeds_limit, "window_ms": decision.window_ms,
        "tier": decision.tier,
        "tiers": [{"window_ms": t.window_ms, "limit": t.limit, "remaining": t.remaining,
                   "retry_after_ms": t.retry_after_ms, "reset_after_ms": t.reset_after_ms} for t in decision.tiers],
        "stamp": decision.stamp,
    }


def tier_rows(decision: Decision) -> List[TierState]:
    """Every tier's fields: the per-tier list, or the one tier of a call without TIER."""
    if decision.tiers:
        return list(decision.tiers)
    return [TierState(decision.window_ms, decision.limit, decision.remaining, decision.retry_after_ms,
                      decision.reset_after_ms)]
