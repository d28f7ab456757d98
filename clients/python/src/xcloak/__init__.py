"""xcloak: exact sliding-window rate limiting on Redis, from Python.

``Limiter`` (redis-py) and ``AsyncLimiter`` (redis.asyncio) send
``XCLOAK.ALLOW`` / ``PEEK`` / ``REFUND`` where the server has the xcloak module,
and the bundled Lua scripts where it doesn't (per node, re-probed), and turn
replies into :class:`Decision` values and HTTP headers. The contract they
implement is docs/clients.md of the xcloak repository; ``xcloak.limits``
plugs into limits (Flask-Limiter, slowapi) and ``xcloak.asgi`` into ASGI apps.
Every duration is a :class:`datetime.timedelta` or an ``int`` of milliseconds.

    import redis, xcloak
    limiter = xcloak.Limiter(redis.Redis())
    d = limiter.allow("rl:api:alice", window=60_000, limit=100)
    if not d.allowed:
        print("retry in", d.retry_after)
"""

from ._cache import Stats
from ._engine import Clock, Durable
from .aio.limiter import AsyncLimiter, AsyncPipeline
from .commands import AllowAllRequest
from .decision import CACHE, COMMAND, ERROR, SCRIPT, Decision, MultiDecision, TierState
from .errors import NotReplicatedError, UnavailableError, XcloakError
from .headers import default_name, headers
from .limiter import Limiter, Pipeline

__version__ = "0.1.0"

__all__ = [
    "AllowAllRequest", "AsyncLimiter", "AsyncPipeline", "CACHE", "COMMAND", "Clock", "Decision", "Durable",
    "ERROR", "Limiter", "MultiDecision", "NotReplicatedError", "Pipeline", "SCRIPT", "Stats", "TierState",
    "UnavailableError", "XcloakError", "default_name", "headers",
]
