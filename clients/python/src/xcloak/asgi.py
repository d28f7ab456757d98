"""ASGI: a middleware and a FastAPI / Starlette dependency (docs/clients.md, "Middleware").

    from xcloak.asgi import Limit, RateLimitMiddleware
    app.add_middleware(RateLimitMiddleware, limiter=xcloak.AsyncLimiter(redis.asyncio.Redis()),
                       limits=[Limit(60_000, 100, tiers=[(3_600_000, 1000)])])

- **Key**: ``key(scope)``; the default is the client's address. ``X-Forwarded-For``
  is read only when ``trusted_proxies`` lists the peer (addresses or networks),
  and then the address is the rightmost one not in that list.
- **Limits**: one or more per route (``limits`` is a list, or a function of
  the ASGI scope returning one), each with tiers; keys are
  ``rl:<name>:<client key>``. Several limits are ``allow_all``.
- **Rejected**: ``429`` with the headers (a never-fits request: no
  ``Retry-After``, and a body saying it is larger than the limit);
  **allowed**: the response carries the same headers. A rejection the
  limiter's block cache answers (``AsyncLimiter(block_cache=...)``, on by
  default) is the same 429 with the same headers, ``Retry-After`` counting
  down, and no call to Redis.
- **Error policy** (the limiter's ``on_error``): ``raise`` lets the framework
  answer (500); ``allow`` serves without headers; ``deny`` answers ``503``.
- ``skip_successful`` / ``skip_failed``: the admission is made with ``STAMP``
  and, once the response status is known (< 400 is a success), refunded by
  its stamp. Never PEEK-then-ALLOW. Until that refund, a request in flight
  holds its slot: concurrent successful requests can be turned away.
- The request's decision is ``request.state.rate_limit`` (``scope["state"]``).
- The configuration is checked when the middleware is built (``Limit`` when
  it is built): a bad one raises there, never at the first request.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

from .aio.limiter import AsyncLimiter
from .commands import AllowAllRequest, Duration, limit_config
from .decision import ERROR, Decision, MultiDecision
from .headers import STYLES
from .headers import headers as _headers

__all__ = ["Limit", "RateLimit", "RateLimitMiddleware"]

Scope = Dict[str, Any]
Receive = Callable[[], Awaitable[Dict[str, Any]]]
Send = Callable[[Dict[str, Any]], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]
#: The request's Decision (or MultiDecision) in ``scope["state"]``: Starlette and
#: FastAPI read it as ``request.state.rate_limit``.
STATE = "rate_limit"


@dataclass(frozen=True)
class Limit:
    """One limit: ``limit`` per ``window`` (a timedelta or ms), more ``tiers``,
    a ``name`` (the key's middle part, default ``http``), a ``cost`` and
    optional policy ``names`` for the headers (one per tier).

    Checked when it is built, with the server's ranges (``window`` 1 to
    2^53-1 ms, ``limit`` 0 to 1,000,000, ``cost`` 1 to 1,000,000, at most 15
    ``tiers`` after the first): a bad one raises ``TypeError`` or
    ``ValueError`` naming it at startup, never a 500 at the first request."""

    window: Duration
    limit: int
    tiers: Sequence[Tuple[Duration, int]] = ()
    name: str = "http"
    cost: int = 1
    names: Optional[Sequence[str]] = None

    def __post_init__(self) -> None:
        limit_config(self.window, self.limit, self.cost, self.tiers)
        object.__setattr__(self, "tiers", tuple(self.tiers))
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"Limit name must be a non-empty str (the key's middle part), got {self.name!r}")
        if self.names is not None:
            names = list(self.names)
            if len(names) != 1 + len(self.tiers) or not all(isinstance(n, str) for n in names):
                raise ValueError(f"Limit names must be one str per tier ({1 + len(self.tiers)}), got {self.names!r}")
            object.__setattr__(self, "names", tuple(names))


Networks = List[Union[ipaddress.IPv4Network, ipaddress.IPv6Network]]


def _networks(proxies: Iterable[str]) -> Networks:
    if isinstance(proxies, (str, bytes)):
        raise TypeError(f"trusted_proxies must be a list of addresses or networks, not a single str ({proxies!r})")
    out: Networks = []
    for p in proxies:
        try:
            out.append(ipaddress.ip_network(p, strict=False))
        except (TypeError, ValueError):
            raise ValueError(f"trusted_proxies: {p!r} is not an IP address or network (e.g. '10.0.0.0/8')") from None
    return out


def _trusted(address: str, networks: Networks) -> bool:
    try:
        ip = ipaddress.ip_address(address.strip())
    except ValueError:
        return False
    return any(ip in net for net in networks)


def client_address(scope: Scope, trusted_proxies: Networks = ()) -> str:  # type: ignore[assignment]
    """The client's address; behind trusted proxies, the rightmost
    ``X-Forwarded-For`` address that is not one of them."""
    client = scope.get("client")
    peer = client[0] if client else "unknown"
    if not trusted_proxies or not _trusted(peer, trusted_proxies):
        return peer
    forwarded: List[str] = []
    for name, value in scope.get("headers", ()):
        if name.lower() == b"x-forwarded-for":
            forwarded += [part.strip() for part in value.decode("latin-1").split(",") if part.strip()]
    for address in reversed(forwarded):
        if not _trusted(address, trusted_proxies):
            return address
    return forwarded[0] if forwarded else peer


def _limits(limits: Any) -> Tuple[Limit, ...]:
    """The configured limits: at least one, each a :class:`Limit` (checked when built)."""
    if isinstance(limits, Limit):
        limits = [limits]
    try:
        out = tuple(limits)
    except TypeError:
        raise TypeError(f"limits must be a list of xcloak.asgi.Limit (or a function of the scope returning one), "
                        f"not {type(limits).__name__}") from None
    if not out:
        raise ValueError("limits: at least one xcloak.asgi.Limit")
    for i, lim in enumerate(out):
        if not isinstance(lim, Limit):
            raise TypeError(f"limits[{i}] must be an xcloak.asgi.Limit, not {type(lim).__name__}")
    return out


class _Guard:
    """What the middleware and the dependency share: the decision for a request."""

    def __init__(self, limiter: AsyncLimiter, key: Optional[Callable[[Scope], str]], trusted_proxies: Iterable[str],
                 style: str, skip_successful: bool, skip_failed: bool) -> None:
        if not isinstance(limiter, AsyncLimiter):
            raise TypeError("limiter must be an xcloak.AsyncLimiter (over redis.asyncio), "
                            f"not {type(limiter).__name__}")
        if key is not None and not callable(key):
            raise TypeError(f"key must be a function of the ASGI scope, not {type(key).__name__}")
        if style not in STYLES:
            raise ValueError(f"style must be one of {', '.join(STYLES)} (got {style!r})")
        for name, flag in (("skip_successful", skip_successful), ("skip_failed", skip_failed)):
            if not isinstance(flag, bool):
                raise TypeError(f"{name} must be a bool, not {type(flag).__name__}")
        self.limiter = limiter
        self.networks = _networks(trusted_proxies)
        self.key = key or (lambda scope: client_address(scope, self.networks))
        self.style = style
        self.skip_successful = skip_successful
        self.skip_failed = skip_failed

    async def decide(self, scope: Scope, limits: Sequence[Limit]) -> Tuple[Union[Decision, MultiDecision],
                                                                          List[Tuple[str, Decision, int]]]:
        ident = self.key(scope)
        stamp = self.skip_successful or self.skip_failed
        keys = [f"rl:{lim.name}:{ident}" for lim in limits]
        decision: Union[Decision, MultiDecision]
        if len(limits) == 1:
            lim = limits[0]
            single = await self.limiter.allow(keys[0], lim.window, lim.limit, cost=lim.cost, tiers=lim.tiers,
                                              stamp=stamp)
            decision, decisions = single, [single]
        else:
            requests: List[AllowAllRequest] = [
                {"key": key, "window": lim.window, "limit": lim.limit, "tiers": lim.tiers, "cost": lim.cost}
                for key, lim in zip(keys, limits)]
            multi = await self.limiter.allow_all(requests, stamp=stamp)
            decision, decisions = multi, list(multi.decisions)
        admitted: List[Tuple[str, Decision, int]] = []
        if stamp and decision.allowed and decision.via != ERROR:
            admitted = [(key, d, lim.cost) for key, lim, d in zip(keys, limits, decisions) if d.stamp is not None]
        return decision, admitted

    def header_list(self, decision: Union[Decision, MultiDecision], limits: Sequence[Limit]
                    ) -> List[Tuple[bytes, bytes]]:
        names: Any = None
        if any(lim.names for lim in limits):
            names = [lim.names for lim in limits] if isinstance(decision, MultiDecision) else limits[0].names
        return [(k.lower().encode(), v.encode()) for k, v in _headers(decision, self.style, names).items()]

    async def settle(self, admitted: List[Tuple[str, Decision, int]], status: int) -> None:
        """skip_successful / skip_failed: refund this request's own admissions by stamp."""
        if not admitted:
            return
        if (self.skip_successful and status < 400) or (self.skip_failed and status >= 400):
            for key, d, cost in admitted:
                try:
                    await self.limiter.refund(key, d.stamp, cost)  # type: ignore[arg-type]
                except Exception:  # the window stays conservative: never generous
                    pass


async def _respond(send: Send, status: int, headers: List[Tuple[bytes, bytes]], body: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": headers + [(b"content-type", b"text/plain; charset=utf-8"),
                                      (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def rejection_body(decision: Union[Decision, MultiDecision]) -> bytes:
    binding = decision.binding if isinstance(decision, MultiDecision) else decision
    if binding.cost_exceeds_limit:
        return b"Too Many Requests: this request is larger than the limit and can never be admitted\n"
    return b"Too Many Requests\n"


class RateLimitMiddleware:
    """An ASGI middleware limiting HTTP requests (see the module's docs)."""

    def __init__(self, app: App, limiter: AsyncLimiter,
                 limits: Union[Sequence[Limit], Callable[[Scope], Optional[Sequence[Limit]]]],
                 key: Optional[Callable[[Scope], str]] = None, trusted_proxies: Iterable[str] = (),
                 style: str = "ietf", skip_successful: bool = False, skip_failed: bool = False) -> None:
        self.app = app
        self.limits: Union[Tuple[Limit, ...], Callable[[Scope], Optional[Sequence[Limit]]]] = (
            limits if callable(limits) else _limits(limits))
        self.guard = _Guard(limiter, key, trusted_proxies, style, skip_successful, skip_failed)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limits = self.limits(scope) if callable(self.limits) else self.limits
        if not limits:
            await self.app(scope, receive, send)
            return
        guard = self.guard
        decision, admitted = await guard.decide(scope, limits)  # under on_error="raise": the framework's 500
        scope.setdefault("state", {})[STATE] = decision  # Starlette: request.state.rate_limit
        if decision.via == ERROR:
            if not decision.allowed:
                await _respond(send, 503, [], b"Service Unavailable: the rate limiter cannot decide\n")
                return
            await self.app(scope, receive, send)  # fail open: served, without headers
            return
        extra = guard.header_list(decision, limits)
        if not decision.allowed:
            await _respond(send, 429, extra, rejection_body(decision))
            return
        status = [500]

        async def send_with_headers(message: Dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                message = dict(message, headers=list(message.get("headers", [])) + extra)
            await send(message)

        try:
            await self.app(scope, receive, send_with_headers)
        finally:
            await guard.settle(admitted, status[0])


class RateLimit:
    """A FastAPI / Starlette dependency: ``Depends(RateLimit(limiter, Limit(...), ...))``.

    Raises ``HTTPException(429)`` with the headers when rejected (``503`` under
    ``on_error="deny"``), and puts the headers on the route's response when
    admitted. ``skip_successful`` / ``skip_failed`` need the response's
    status, which only the middleware sees: use :class:`RateLimitMiddleware`
    for them.
    """

    def __init__(self, limiter: AsyncLimiter, *limits: Limit, key: Optional[Callable[[Scope], str]] = None,
                 trusted_proxies: Iterable[str] = (), style: str = "ietf") -> None:
        self.limits = _limits(limits)
        self.guard = _Guard(limiter, key, trusted_proxies, style, False, False)

    async def __call__(self, request: Any, response: Any) -> Union[Decision, MultiDecision]:
        from starlette.exceptions import HTTPException

        decision, _ = await self.guard.decide(request.scope, self.limits)
        request.scope.setdefault("state", {})[STATE] = decision
        if decision.via == ERROR:
            if not decision.allowed:
                raise HTTPException(503, "Service Unavailable: the rate limiter cannot decide")
            return decision
        fields = {k.decode(): v.decode() for k, v in self.guard.header_list(decision, self.limits)}
        if not decision.allowed:
            raise HTTPException(429, rejection_body(decision).decode().strip(), headers=fields)
        for name, value in fields.items():
            response.headers[name] = value
        return decision


def _annotate() -> None:
    """FastAPI reads the parameters' annotations to inject Request and Response."""
    try:
        from starlette.requests import Request
        from starlette.responses import Response
    except ImportError:  # starlette is an extra: the middleware needs none of it
        return
    RateLimit.__call__.__annotations__.update(request=Request, response=Response)


_annotate()
