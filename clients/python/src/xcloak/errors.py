"""The two kinds of errors (docs/clients.md, "Errors"), never confused.

- :class:`XcloakError`: the server refused the call (an argument out of range,
  ``WRONGTYPE``, ``NOPERM``, an unknown command with ``fallback="never"``), or
  the client refused an argument before sending it. The message is the
  server's, verbatim (``ERR window must be an integer from 1 to ...``). It is
  raised under every error policy: a bad argument is a bug in the caller.
- :class:`UnavailableError`: no answer (a connection refused, reset or closed,
  the limiter's timeout) or a server that can't serve now (``LOADING``,
  ``BUSY``, ``MASTERDOWN``, ``CLUSTERDOWN``, ``TRYAGAIN``, ``READONLY``,
  ``NOREPLICAS``, ``OOM``, durable mode's "not replicated"). Only these go to
  the error policy; under ``raise`` (the default) this is what is raised, with
  the cause as ``__cause__`` and :attr:`UnavailableError.cause`.

Both derive from :class:`redis.exceptions.RedisError`, so code (and limits'
``wrap_exceptions``) that handles redis-py's errors handles these too.
"""

from __future__ import annotations

from typing import Optional

from redis.exceptions import RedisError


class XcloakError(RedisError):
    """The server refused the call; ``str(error)`` is its message, verbatim."""


class UnavailableError(XcloakError):
    """No answer, or a server that can't serve now (the error policy's case)."""

    def __init__(self, message: str, cause: Optional[BaseException] = None) -> None:
        super().__init__(message)
        self.cause = cause


class NotReplicatedError(XcloakError):
    """Durable mode: ``WAIT`` answered fewer replicas than asked within its
    timeout. It is the :attr:`UnavailableError.cause` of the outage the error
    policy answers (``Decision.error.cause`` under ``allow`` and ``deny``)."""

    def __init__(self, replicas: int, acknowledged: int, timeout_ms: int) -> None:
        super().__init__(f"not replicated: WAIT {replicas} {timeout_ms} answered {acknowledged}")
        self.replicas = replicas
        self.acknowledged = acknowledged

