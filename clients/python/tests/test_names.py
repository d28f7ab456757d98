"""The names table (docs/clients.md; clients/python/names.tsv) against the
package's public surface, both ways.

- names.tsv holds every concept key of the shared list, in its order, once,
  then the Python-only names; every line has three tab-separated fields.
- Every name in it exists: ``xcloak...`` paths import, ``Class.member`` is a
  member, an option or call argument is a parameter of the limiter, a quoted
  value is accepted by its option.
- Every public name of the package is in it: ``__all__`` of xcloak,
  xcloak.aio, xcloak.asgi and xcloak.limits (by identity), every public
  method of Limiter and AsyncLimiter (the async one mirrors the sync one
  name for name), every public field and property of Decision, TierState and
  MultiDecision, every option of the limiter and of ``headers``.

What would fail: a name renamed in the code but not in the file (the old
``replica_peeks``, ``Durable.timeout_ms``, ``Decision.oldest_ms``), a public
name added without a line, a row naming something that does not exist.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import re
from pathlib import Path

import pytest

import xcloak
import xcloak.aio
import xcloak.asgi
import xcloak.limits
from xcloak import _engine
from xcloak.headers import STYLES

TSV = Path(__file__).resolve().parents[1] / "names.tsv"
CONCEPTS = """Limiter, AsyncLimiter, Limiter.allow, Limiter.peek, Limiter.refund, Limiter.reset, Limiter.acquire,
Limiter.allow_all, headers, Decision, MultiDecision, TierState, AllowAllRequest,
Decision.allowed, Decision.limit, Decision.remaining, Decision.retry_after, Decision.reset_after,
Decision.cost_exceeds_limit, Decision.window, Decision.tier, Decision.tiers, Decision.stamp, Decision.oldest,
Decision.via, Decision.error, MultiDecision.decisions, MultiDecision.binding, MultiDecision.rejected,
Via.command, Via.script, Via.error,
call.cost, call.tiers, call.stamp, call.now, call.oldest, call.max_wait,
option.prefix, option.fallback, option.on_error, option.timeout, option.probe_interval, option.durable,
option.durable.replicas, option.durable.timeout, option.replica_reads, option.clock,
ErrorPolicy.raise, ErrorPolicy.allow, ErrorPolicy.deny, Fallback.auto, Fallback.always, Fallback.never,
headers.style, headers.names, Style.ietf, Style.legacy, Style.both,
XcloakError, UnavailableError, NotReplicated,
middleware, middleware.limit, middleware.key, middleware.trust_proxies, middleware.skip_successful,
middleware.skip_failed, middleware.request_result"""
CONCEPT_KEYS = [c.strip() for c in CONCEPTS.replace("\n", " ").split(",")]
CLASSES = {"Limiter": xcloak.Limiter, "AsyncLimiter": xcloak.AsyncLimiter, "Decision": xcloak.Decision,
           "MultiDecision": xcloak.MultiDecision, "TierState": xcloak.TierState, "Durable": xcloak.Durable,
           "Stats": xcloak.Stats}
VALUES = {"ErrorPolicy": _engine.POLICIES, "Fallback": _engine.FALLBACKS, "Style": STYLES}


def rows():
    lines = TSV.read_text(encoding="utf-8").splitlines()
    assert lines[0] == "concept\tname\tnote"
    out = []
    for number, line in enumerate(lines[1:], start=2):
        fields = line.split("\t")
        assert len(fields) == 3, f"names.tsv line {number}: {len(fields)} fields, not 3: {line!r}"
        out.append(tuple(fields))
    return out


ROWS = rows()


def limiter_parameters():
    return [p for p in inspect.signature(xcloak.Limiter.__init__).parameters if p not in ("self", "client")]


def call_parameters():
    names = set()
    for method in ("allow", "peek", "refund", "acquire", "allow_all"):
        names |= set(inspect.signature(getattr(xcloak.Limiter, method)).parameters) - {"self"}
    return names


def public_members(cls):
    names = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
    names |= {n for n, _ in inspect.getmembers(cls) if not n.startswith("_")}
    return {n for n in names if not n.startswith("_")}


def resolve(concept, name):
    """The object (or True) a row's name stands for; fails when it does not exist."""
    if name == "-":
        return True
    if name.startswith('"'):
        kind = concept.split(".")[0]
        assert name.strip('"') in VALUES[kind], (concept, name)
        return True
    if name.startswith("xcloak."):
        module, _, attr = name.rpartition(".")
        return getattr(importlib.import_module(module), attr)
    if name == "request.state.rate_limit":
        assert xcloak.asgi.STATE == "rate_limit"
        return True
    if "." in name:
        cls, member = name.split(".", 1)
        assert member in public_members(CLASSES[cls]), (concept, name)
        return True
    kind = concept.split(".")[0]
    if kind == "option":
        assert name in limiter_parameters(), (concept, name)
        assert name in inspect.signature(xcloak.AsyncLimiter.__init__).parameters
    elif kind == "call":
        assert name in call_parameters(), (concept, name)
    elif kind == "headers":
        assert name in inspect.signature(xcloak.headers).parameters, (concept, name)
    elif kind == "middleware":
        assert name in inspect.signature(xcloak.asgi.RateLimitMiddleware.__init__).parameters, (concept, name)
    else:
        pytest.fail(f"no rule for {concept}: {name}")
    return True


def test_every_concept_once_in_order_then_python_only_lines():
    concepts = [c for c, _, _ in ROWS]
    assert concepts[:len(CONCEPT_KEYS)] == CONCEPT_KEYS
    assert len(set(concepts)) == len(concepts), "a concept twice"
    for concept, name, _ in ROWS[len(CONCEPT_KEYS):]:
        assert name != "-", concept
    for concept, name, note in ROWS:
        if name == "-":
            assert note, f"{concept}: '-' needs a note saying why"


@pytest.mark.parametrize("concept,name,note", ROWS, ids=[r[0] for r in ROWS])
def test_every_name_in_the_file_exists(concept, name, note):
    assert resolve(concept, name)


def named_objects():
    return [resolve(c, n) for c, n, _ in ROWS if n.startswith("xcloak.")]


def covered(cls_name, member):
    text = TSV.read_text(encoding="utf-8")
    if any(n == f"{cls_name}.{member}" for _, n, _ in ROWS):
        return True
    if re.search(rf"\b{cls_name}\.{member}\b", text):
        return True
    return cls_name == "TierState" and covered("Decision", member)


@pytest.mark.parametrize("module", [xcloak, xcloak.aio, xcloak.asgi, xcloak.limits],
                         ids=lambda m: m.__name__)
def test_every_exported_name_is_in_the_file(module):
    objects = named_objects()
    missing = [n for n in module.__all__ if not any(getattr(module, n) is o for o in objects)]
    assert not missing, f"{module.__name__}.__all__ names missing from names.tsv: {missing}"


def test_every_public_member_of_the_core_is_in_the_file():
    missing = []
    for cls_name in ("Limiter", "Decision", "MultiDecision", "TierState", "Durable", "Stats"):
        for member in sorted(public_members(CLASSES[cls_name])):
            if not covered(cls_name, member):
                missing.append(f"{cls_name}.{member}")
    assert not missing, f"public names missing from names.tsv: {missing}"


def test_the_async_limiter_mirrors_the_sync_one_name_for_name():
    assert public_members(xcloak.AsyncLimiter) == public_members(xcloak.Limiter)
    for name in public_members(xcloak.Limiter):
        sync, aio = getattr(xcloak.Limiter, name), getattr(xcloak.AsyncLimiter, name)
        if callable(sync):
            assert inspect.signature(sync).parameters == inspect.signature(aio).parameters, name


def test_every_option_is_in_the_file():
    names = {n for c, n, _ in ROWS if c.startswith("option.")}
    assert set(limiter_parameters()) <= names, set(limiter_parameters()) - names
    call = {n for c, n, _ in ROWS if c.startswith("call.")}
    assert call_parameters() - {"key", "window", "limit", "requests"} <= call
    header_options = {n for c, n, _ in ROWS if c.startswith("headers.")}
    assert set(inspect.signature(xcloak.headers).parameters) - {"decision"} <= header_options
