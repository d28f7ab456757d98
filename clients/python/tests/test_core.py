"""The pure core, driven by every vector without a server: reply -> Decision,
Decision -> headers (both styles, and ``both``), acquire's planning on the
recorded replies, allow_all's binding and headers.

What would fail: a wrong binding tier (the last matching tier instead of the
first), a stamp of -1 kept instead of None, seconds rounded down or to
nearest, a Retry-After on a never-fits decision, a jitter subtracted or drawn
when the fraction is 0, a sleep past the deadline, a missing sleep floor of
1 ms, the binding of allow_all taken from the last decision.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from vectors import steps
from xcloak import acquire as plan
from xcloak.decision import ERROR, Decision, by_policy, combine, from_reply, to_dict
from xcloak.headers import default_name, headers

WINDOW_STEPS = [s for s in steps("allow", "peek") if "decision" in s[2]]


@pytest.mark.parametrize("case,index,step", WINDOW_STEPS, ids=[f"{c}-{i}" for c, i, _ in WINDOW_STEPS])
def test_reply_to_decision_and_headers(case, index, step):
    reply = step["reply"]
    decision = from_reply(reply, step["window"], bool(step.get("tiers")), stamp=step.get("stamp", False),
                          oldest=step.get("oldest", False))
    assert to_dict(decision) == step["decision"]
    if step.get("oldest"):
        assert decision.oldest == step["oldest_ms"]
    names = step.get("names")
    assert headers(decision, "ietf", names) == step["headers"]["ietf"]
    assert headers(decision, "legacy", names) == step["headers"]["legacy"]
    assert headers(decision, "both", names) == {**step["headers"]["ietf"], **step["headers"]["legacy"]}
    assert headers(decision, names=names) == step["headers"]["ietf"], "ietf is the default style"
    if decision.cost_exceeds_limit:
        assert decision.retry_after is None and decision.retry_after_ms == -1
    else:
        assert decision.retry_after // timedelta(milliseconds=1) == decision.retry_after_ms


ACQUIRES = list(steps("acquire"))


@pytest.mark.parametrize("case,index,step", ACQUIRES, ids=[f"{c}-{i}" for c, i, _ in ACQUIRES])
def test_acquire_planning(case, index, step):
    """Replays the recorded replies through acquire's step: same sleeps, outcome."""
    draws = list(step["random"])
    deadline = step["start"] + step["max_wait_ms"]
    outcome = None
    for call in step["calls"]:
        decision = from_reply(call["reply"], step["window"], bool(step.get("tiers")))
        outcome, sleep = plan.next_step(decision, deadline - call["now"], step["jitter_fraction"], lambda: draws.pop(0))
        assert sleep == call["sleep_ms"], call
    assert outcome == step["outcome"]
    assert to_dict(decision) == step["decision"]
    assert not draws, "every random draw used, and no more"


ALL = list(steps("allow_all"))


@pytest.mark.parametrize("case,index,step", ALL, ids=[f"{c}-{i}" for c, i, _ in ALL])
def test_allow_all_binding_and_headers(case, index, step):
    sent = len(step["decisions"])
    decisions = [from_reply(call["reply"], r["window"], bool(r.get("tiers")), stamp=True)
                 for call, r in zip(step["calls"][:sent], step["requests"])]
    assert [to_dict(d) for d in decisions] == step["decisions"]
    multi = combine(decisions, step["rejected"])
    assert multi.allowed == step["allowed"] and multi.binding_index == step["binding"]
    names = step.get("names")
    assert headers(multi, "ietf", names) == step["headers"]["ietf"]
    assert headers(multi, "legacy", names) == step["headers"]["legacy"]


def test_default_names():
    assert default_name(60000, 5) == "5-in-60s"
    assert default_name(1500, 3) == "3-in-1500ms"


def test_error_decisions_have_no_headers():
    d = by_policy(True, 60000, 5, ConnectionError("down"))
    assert d.via == ERROR and d.allowed and d.remaining == 0 and not d.tiers and d.stamp is None
    assert headers(d) == {} and headers(d, "legacy") == {}
    assert not d.cost_exceeds_limit


def test_jitter_is_added_never_subtracted_and_cut_at_the_deadline():
    d = Decision(allowed=False, limit=1, remaining=0, retry_after_ms=1000, reset_after_ms=1000, window_ms=60000)
    assert plan.next_step(d, 5000, 0.1, lambda: 0.999) == (None, 1099)
    assert plan.next_step(d, 1050, 0.1, lambda: 0.999) == (None, 1050)
    assert plan.next_step(d, 999, 0.1, lambda: 0.5) == (plan.DEADLINE, None)
    never = Decision(allowed=False, limit=1, remaining=0, retry_after_ms=-1, reset_after_ms=0, window_ms=60000)
    assert plan.next_step(never, 10**9, 0.1, lambda: 0.5) == (plan.NEVER, None)
    tiny = Decision(allowed=False, limit=1, remaining=0, retry_after_ms=0, reset_after_ms=0, window_ms=1)
    assert plan.next_step(tiny, 10, 0.0, lambda: pytest.fail("drawn without jitter")) == (None, 1)
