"""What every call does, written once for the sync and the asyncio limiter.

Each operation is a generator: it yields requests and receives their answers,
and a driver (``limiter.py`` over redis-py, ``aio/limiter.py`` over
redis.asyncio) carries them out. So the fallback, NOSCRIPT, the re-probe,
redirections, allow_all's refunds and durable mode are one design:

- ``Locate(key, readonly)`` -> the node serving ``key`` (a replica when
  ``readonly`` and replica reads are on);
- ``Send(node, commands, hold)`` -> one reply per command, in order (an error
  reply as its exception, not raised), sent pipelined on one connection;
  ``hold`` keeps that connection for the next ``Send`` (``WAIT`` must follow
  the write on the same connection);
- ``Refresh()`` -> re-reads a cluster's slot map (after ``MOVED``).

A connection error or the limiter's timeout is thrown into the generator as
:class:`UnavailableError` at the ``yield`` of the ``Send`` it interrupted;
nothing is ever sent again after that (it may have been applied).
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field, replace
from importlib import resources
from typing import Any, Callable, Dict, Generator, List, Mapping, Optional, Sequence, Tuple, Union

from redis import exceptions as rex

from . import _cache
from . import acquire as plan
from . import commands as cmd
from .commands import Duration, Tiers
from .decision import COMMAND, SCRIPT, Decision, MultiDecision, by_policy, combine, from_reply
from .errors import NotReplicatedError, UnavailableError, XcloakError

FALLBACKS = ("auto", "always", "never")
POLICIES = ("raise", "allow", "deny")


def _script(name: str) -> Tuple[str, str]:
    text = resources.files(__package__).joinpath("lua").joinpath(name).read_text(encoding="utf-8")
    return text, hashlib.sha1(text.encode()).hexdigest()


ALLOW_LUA, ALLOW_SHA = _script("xcloak_allow.lua")
PEEK_LUA, PEEK_SHA = _script("xcloak_peek.lua")
REFUND_LUA, REFUND_SHA = _script("xcloak_refund.lua")
SCRIPTS = {ALLOW_SHA: ALLOW_LUA, PEEK_SHA: PEEK_LUA, REFUND_SHA: REFUND_LUA}
COMMAND_OF = {"allow": "XCLOAK.ALLOW", "peek": "XCLOAK.PEEK", "refund": "XCLOAK.REFUND"}
SHA_OF = {"allow": ALLOW_SHA, "peek": PEEK_SHA, "refund": REFUND_SHA}

# The replies of a server that can't serve now: the error policy's, not the caller's.
OUTAGE_CODES = ("LOADING", "BUSY", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN", "READONLY", "NOREPLICAS", "OOM")
_CODE_OF_CLASS = (
    (rex.NoScriptError, "NOSCRIPT"), (rex.ReadOnlyError, "READONLY"), (rex.BusyLoadingError, "LOADING"),
    (rex.OutOfMemoryError, "OOM"), (rex.NoPermissionError, "NOPERM"), (rex.ExecAbortError, "EXECABORT"),
    (rex.TryAgainError, "TRYAGAIN"), (rex.MasterDownError, "MASTERDOWN"), (rex.ClusterDownError, "CLUSTERDOWN"),
    (rex.AskError, "ASK"), (rex.MovedError, "MOVED"), (rex.AuthenticationError, "WRONGPASS"),
)


def server_text(error: BaseException) -> str:
    """The server's error line, ``CODE message``, as it was sent (redis-py
    strips the code of the errors it knows)."""
    message = str(error)
    code = getattr(error, "status_code", None)
    if not code:
        for klass, name in _CODE_OF_CLASS:
            if isinstance(error, klass):
                code = name
                break
    if code:
        return message if message.startswith(code + " ") else f"{code} {message}"
    first = message.split(" ", 1)[0]
    if first.isupper() and first.isalpha() and len(first) > 2:
        return message  # a code redis-py does not map (WRONGTYPE, NOREPLICAS, BUSY ...) is kept
    return f"ERR {message}"


def is_unknown_command(error: BaseException) -> bool:
    return isinstance(error, rex.ResponseError) and "unknown command" in str(error).lower()


def refusal(error: rex.ResponseError) -> XcloakError:
    """A server error as the package's: an outage code for the policy, else the caller's error."""
    text = server_text(error)
    if text.split(" ", 1)[0] in OUTAGE_CODES:
        return UnavailableError(text, error)
    return XcloakError(text)


def refuse_durable_pipeline(engine: Engine) -> None:
    """A pipeline reports each admission with its reply; durable mode must
    WAIT first (docs/clients.md, Durable mode), so the two don't mix."""
    if engine.durable is not None:
        raise XcloakError("xcloak: pipeline() is not available in durable mode: call allow() for each "
                          "request, which waits for the replicas")


def is_outage(error: BaseException) -> bool:
    """Connection errors and timeouts (not a wrong password, which is the caller's)."""
    if isinstance(error, rex.AuthenticationError):
        return False
    return isinstance(error, (rex.ConnectionError, rex.TimeoutError, OSError, TimeoutError))


def failure_of(error: BaseException) -> BaseException:
    """A transport step's failure as the operation sees it: a server's error
    reply as the package's (an outage code as UnavailableError), a connection
    error or timeout as UnavailableError. Anything else (a wrong password, a
    cancellation, a bug) is raised."""
    if isinstance(error, rex.AuthenticationError):
        raise XcloakError(server_text(error)) from error
    if isinstance(error, rex.ResponseError):  # e.g. NOPERM on the handshake
        return refusal(error)
    if isinstance(error, (rex.RedisError, OSError)) and (is_outage(error)
                                                        or isinstance(error, rex.RedisClusterException)):
        failure = UnavailableError(f"xcloak: {type(error).__name__}: {error}", error)
        failure.__cause__ = error
        return failure
    raise error


class Direct:
    """One ``allow`` or ``peek`` sent straight to a single server that the
    module answers, outside durable mode: the hot path, without the
    operation's generators. Both drivers use it the same way (the sync one
    calls ``exchange``, the async one awaits it), then :meth:`decision` reads
    the reply; ``None`` there means "unknown command" (nothing was applied), and
    the call goes the whole way (:meth:`Engine.allow`), which takes the script."""

    __slots__ = ("engine", "node", "commands", "window_ms", "limit", "tiered", "stamp", "oldest", "remember")

    def __init__(self, engine: Engine, node: Any, commands: Tuple[Tuple[Any, ...], ...], window_ms: int,
                 limit: int, tiered: bool, stamp: bool, oldest: bool) -> None:
        self.engine = engine
        self.node = node
        self.commands = commands
        self.window_ms = window_ms
        self.limit = limit
        self.tiered = tiered
        self.stamp = stamp
        self.oldest = oldest
        #: An allow the block cache records: (key, sig, cost, sent_at).
        self.remember: Optional[Tuple[str, _cache.Sig, int, float]] = None

    def deadline(self) -> float:
        return time.monotonic() + self.engine.timeout_s

    def decision(self, reply: Any) -> Optional[Decision]:
        if not isinstance(reply, rex.ResponseError):
            decision = from_reply(reply, self.window_ms, self.tiered, stamp=self.stamp, oldest=self.oldest)
            if self.remember is not None and self.engine.cache is not None:
                self.engine.cache.record(*self.remember, decision)
            return decision
        if is_unknown_command(reply):
            if self.engine.fallback == "never":
                raise XcloakError(server_text(reply))
            self.engine._on_script(self.node.name)  # nothing was applied: the script answers
            return None
        refused = refusal(reply)
        if isinstance(refused, UnavailableError):
            return self.engine.policy(refused, self.window_ms, self.limit)
        raise refused

    def failed(self, error: BaseException) -> Decision:
        failure = failure_of(error)
        if isinstance(failure, UnavailableError):
            return self.engine.policy(failure, self.window_ms, self.limit)
        raise failure


class Locate:
    """-> the node serving ``key`` (a replica when ``readonly`` and replica reads are on)."""

    __slots__ = ("key", "readonly")

    def __init__(self, key: str, readonly: bool = False) -> None:
        self.key = key
        self.readonly = readonly


class Send:
    """-> one reply per command, in order, sent pipelined on one connection to
    ``node``; ``hold`` keeps that connection for the next Send (a WAIT)."""

    __slots__ = ("node", "commands", "hold")

    def __init__(self, node: Any, commands: Tuple[Tuple[Any, ...], ...], hold: bool = False) -> None:
        self.node = node
        self.commands = commands
        self.hold = hold


class Refresh:
    """-> re-reads a cluster's slot map (after MOVED)."""

    __slots__ = ()


@dataclass
class _NodeState:
    mode: str = COMMAND
    since: float = 0.0
    # EVALSHA_RO (7.0+); set off when a server answers it "unknown command".
    read_only_scripts: bool = True


@dataclass(frozen=True)
class Durable:
    """``durable=Durable(replicas=N, timeout=T)``: an admission counts once N
    replicas hold it (``WAIT N T`` on the same connection, after the call).
    ``timeout`` is a :class:`datetime.timedelta` or an int of milliseconds
    (default 100), the WAIT's own, after the call's (docs/clients.md)."""

    replicas: int
    timeout: Duration = 100
    timeout_ms: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        cmd.config_int(self.replicas, "Durable replicas", 1, 2**31 - 1)
        # WAIT N 0 would block for ever: a timeout is at least 1 ms.
        object.__setattr__(self, "timeout_ms", cmd.duration_ms(self.timeout, "Durable timeout", 1))


@dataclass(frozen=True)
class Clock:
    """For tests and replays: ``now_ms()`` (unix milliseconds) is sent as
    ``NOW``, and ``sleep(ms)`` is acquire's (an ``AsyncLimiter`` awaits it when
    it returns an awaitable)."""

    now_ms: Callable[[], int]
    sleep: Callable[[int], Any]

    def __post_init__(self) -> None:
        for name in ("now_ms", "sleep"):
            if not callable(getattr(self, name)):
                raise TypeError(f"Clock {name} must be callable, not {type(getattr(self, name)).__name__}")


Op = Generator[Any, Any, Any]
MAX_REDIRECTIONS = 3


@dataclass
class Entry:
    """One call of a pipeline: its command's name and arguments after the key."""

    kind: str  # "allow" | "peek" | "refund" | "reset"
    key: str
    args: List[str]
    parse: Callable[[Any, str], Any]


#: The fields of an ``allow_all`` request: the required ones, then all.
REQUEST_REQUIRED = ("key", "window", "limit")
REQUEST_FIELDS = ("key", "window", "limit", "cost", "tiers")


class Engine:
    """The configuration and per-node state of one limiter; builds the operations.

    Every option is checked here, when the limiter is built: a bad one raises
    ``TypeError`` or ``ValueError`` naming it and its range, never at the first
    call and never through the error policy."""

    def __init__(self, *, prefix: str, fallback: str, on_error: str, timeout: Duration, probe_interval: Duration,
                 replica_reads: bool, durable: Optional[Durable], clock: Optional[Clock],
                 jitter_fraction: float, random: Callable[[], float], block_cache: int = _cache.DEFAULT_ENTRIES):
        if not isinstance(prefix, str):
            raise TypeError(f"prefix must be a str, not {type(prefix).__name__}")
        if fallback not in FALLBACKS:
            raise ValueError(f"fallback must be one of {', '.join(FALLBACKS)} (got {fallback!r})")
        if on_error not in POLICIES:
            raise ValueError(f"on_error must be one of {', '.join(POLICIES)} (got {on_error!r})")
        if not isinstance(replica_reads, bool):
            raise TypeError(f"replica_reads must be a bool, not {type(replica_reads).__name__}")
        if durable is not None and not isinstance(durable, Durable):
            raise TypeError(f"durable must be xcloak.Durable(replicas, timeout) or None, not {type(durable).__name__}")
        if clock is not None and not isinstance(clock, Clock):
            raise TypeError(f"clock must be xcloak.Clock(now_ms, sleep) or None, not {type(clock).__name__}")
        if isinstance(jitter_fraction, bool) or not isinstance(jitter_fraction, (int, float)) \
                or not 0 <= jitter_fraction <= 1:
            raise ValueError(f"jitter_fraction must be a number from 0 to 1 (got {jitter_fraction!r})")
        if not callable(random):
            raise TypeError(f"random must be callable (uniform in [0, 1)), not {type(random).__name__}")
        self.prefix = prefix
        self.fallback = fallback
        self.on_error = on_error
        self.timeout_ms = cmd.duration_ms(timeout, "timeout", 1)
        self.timeout_s = self.timeout_ms / 1000
        self.probe_interval_ms = cmd.duration_ms(probe_interval, "probe_interval", 0)
        self.replica_reads = replica_reads
        self.durable = durable
        self.clock = clock
        self.jitter_fraction = float(jitter_fraction)
        self.random = random
        self.nodes: Dict[str, _NodeState] = {}
        entries = _cache.capacity(block_cache)
        #: The block cache (``_cache``), None when ``block_cache=0``.
        self.cache: Optional[_cache.BlockCache] = _cache.BlockCache(entries) if entries else None

    def stats(self) -> _cache.Stats:
        return self.cache.stats() if self.cache is not None else _cache.Stats(0, 0)

    def forget(self, key: str) -> None:
        """A refund or reset of ``key`` (prefixed) through this limiter: its
        cached rejection goes first, before anything is sent."""
        if self.cache is not None:
            self.cache.forget(key)

    def wait_budget(self) -> float:
        """Seconds a durable WAIT may take: its own timeout, then the
        limiter's for the reply to come back; the call before it had its own."""
        assert self.durable is not None
        return (self.durable.timeout_ms + self.timeout_ms) / 1000

    # ------------------------------------------------------------ per node

    def _state(self, node_name: str) -> _NodeState:
        state = self.nodes.get(node_name)
        if state is None:
            state = self.nodes[node_name] = _NodeState(mode=SCRIPT if self.fallback == "always" else COMMAND)
        return state

    def mode_of(self, node_name: str) -> str:
        """``command`` or ``script``; a node on the script is probed with the
        command again once ``probe_interval`` has passed (a later MODULE LOAD)."""
        state = self._state(node_name)
        if state.mode == SCRIPT and self.fallback == "auto" \
                and (time.monotonic() - state.since) * 1000 >= self.probe_interval_ms:
            return COMMAND
        return state.mode

    def _on_script(self, node_name: str) -> None:
        state = self._state(node_name)
        state.mode, state.since = SCRIPT, time.monotonic()

    def _on_command(self, node_name: str) -> None:
        self._state(node_name).mode = COMMAND

    # ------------------------------------------------------------ requests

    def now_ms(self, now: Optional[int]) -> Optional[int]:
        if now is not None:
            return cmd.integer(now, "now")
        return self.clock.now_ms() if self.clock else None

    def window_request(self, key: str, window: Duration, limit: int, cost: int, tiers: Optional[Tiers],
                       now: Optional[int]) -> Tuple[str, int, int, List[Tuple[int, int]], int, Optional[int]]:
        window_ms = cmd.to_ms(window, "window")
        limit = cmd.integer(limit, "limit")
        cost = cmd.integer(cost, "cost")
        return self.prefix + key, window_ms, limit, cmd.tiers_ms(tiers), cost, self.now_ms(now)

    # ------------------------------------------------------------ one call

    def call(self, kind: str, key: str, args: List[str]) -> Op:
        """One ALLOW / PEEK / REFUND through the command or the script, on the
        key's node; returns ``(reply, via, node)``."""
        readonly = kind == "peek" and self.replica_reads
        name = COMMAND_OF[kind]
        sha = SHA_OF[kind]
        for _ in range(MAX_REDIRECTIONS):
            node = yield Locate(key, readonly)
            node_name = node.name
            if self.mode_of(node_name) == COMMAND:
                (reply,) = yield Send(node, ((name, key, *args),))
                if is_unknown_command(reply):
                    if self.fallback == "never":
                        raise XcloakError(server_text(reply))
                    self._on_script(node_name)  # nothing was applied: the script answers
                elif isinstance(reply, (rex.MovedError, rex.AskError)):
                    yield Refresh()
                    continue
                elif isinstance(reply, rex.ResponseError):
                    raise refusal(reply)
                else:
                    self._on_command(node_name)
                    return reply, COMMAND, node
            reply = yield from self._script(node, kind, sha, key, args)
            if isinstance(reply, (rex.MovedError, rex.AskError)):
                yield Refresh()
                continue
            if isinstance(reply, rex.ResponseError):
                raise refusal(reply)
            return reply, SCRIPT, node
        raise UnavailableError(f"{key!r}: still redirected after {MAX_REDIRECTIONS} tries (the cluster is resharding)")

    def _script(self, node: Any, kind: str, sha: str, key: str, args: List[str]) -> Op:
        state = self._state(node.name)
        for _ in range(2):
            verb = "EVALSHA_RO" if kind == "peek" and state.read_only_scripts else "EVALSHA"
            (reply,) = yield Send(node, ((verb, sha, 1, key, *args),))
            if verb == "EVALSHA_RO" and is_unknown_command(reply):
                state.read_only_scripts = False  # before 7.0: nothing was applied
                (reply,) = yield Send(node, (("EVALSHA", sha, 1, key, *args),))
            if isinstance(reply, rex.NoScriptError):
                (loaded,) = yield Send(node, (("SCRIPT", "LOAD", SCRIPTS[sha]),))
                if isinstance(loaded, rex.ResponseError):
                    return loaded
                continue  # nothing was applied: send it again, once
            return reply
        return reply

    # ------------------------------------------------------------ the API

    def direct(self, kind: str, node: Any, key: str, window: Duration, limit: int, cost: int,
               tiers: Optional[Tiers], now: Optional[int], flag: bool) -> Union[Direct, Decision, None]:
        """The hot path of ``allow`` (``flag``: stamp) or ``peek`` (``flag``:
        oldest) when it applies: one server (``node``, None for a cluster),
        answered by the module, not durable; else None. An ``allow`` the
        block cache answers is that Decision, nothing to send."""
        if node is None or self.durable is not None or self.mode_of(node.name) != COMMAND:
            return None
        key, window_ms, limit, tiers_ms, cost, now_ms = self.window_request(key, window, limit, cost, tiers, now)
        if kind == "allow":
            cache = self.cache if now_ms is None else None
            if cache is not None:
                sig = _cache.sig_of(window_ms, limit, tiers_ms)
                hit = cache.lookup(key, sig, cost)
                if hit is not None:
                    return hit
            command = ("XCLOAK.ALLOW", key, *cmd.allow_args(window_ms, limit, tiers_ms, cost, now_ms, flag))
            direct = Direct(self, node, (command,), window_ms, limit, bool(tiers_ms), flag, False)
            if cache is not None:
                direct.remember = (key, sig, cost, cache.monotonic())  # read before sending
            return direct
        command = ("XCLOAK.PEEK", key, *cmd.peek_args(window_ms, limit, tiers_ms, cost, now_ms, flag))
        return Direct(self, node, (command,), window_ms, limit, bool(tiers_ms), False, flag)

    def allow(self, key: str, window: Duration, limit: int, cost: int = 1, tiers: Optional[Tiers] = None,
              stamp: bool = False, now: Optional[int] = None) -> Op:
        key, window_ms, limit, tiers_ms, cost, now_ms = self.window_request(key, window, limit, cost, tiers, now)
        # The block cache: consulted and recorded unless the call carries NOW.
        cache = self.cache if now_ms is None else None
        if cache is not None:
            sig = _cache.sig_of(window_ms, limit, tiers_ms)
            hit = cache.lookup(key, sig, cost)
            if hit is not None:
                return hit
            sent_at = cache.monotonic()
        # Durable mode always sends STAMP (the deny path refunds by it); the
        # decision shows it only if asked.
        want_stamp = stamp or self.durable is not None
        args = cmd.allow_args(window_ms, limit, tiers_ms, cost, now_ms, want_stamp)
        try:
            reply, via, node = yield from self.call("allow", key, args)
            decision = from_reply(reply, window_ms, bool(tiers_ms), stamp=want_stamp, via=via)
            if cache is not None:
                cache.record(key, sig, cost, sent_at, decision)
            if self.durable is not None and decision.allowed:
                yield from self._wait_replicated(node, key, decision, cost)
        except UnavailableError as error:
            return self.policy(error, window_ms, limit)
        if want_stamp and not stamp:
            decision = _without_stamp(decision)
        return decision

    def _wait_replicated(self, node: Any, key: str, decision: Decision, cost: int) -> Op:
        """``WAIT N timeout`` after an admission; fewer replicas: the policy's."""
        durable = self.durable
        assert durable is not None
        (acked,) = yield Send(node, (("WAIT", durable.replicas, durable.timeout_ms),))
        if isinstance(acked, rex.ResponseError):
            raise refusal(acked)
        if int(acked) < durable.replicas:
            cause = NotReplicatedError(durable.replicas, int(acked), durable.timeout_ms)
            error = UnavailableError(f"xcloak: {cause}", cause)
            if self.on_error == "deny" and decision.stamp is not None:
                try:  # a request turned away consumes nothing (best effort)
                    yield from self.call("refund", key, cmd.refund_args(decision.stamp, cost))
                except (UnavailableError, XcloakError):
                    pass
            raise error

    def peek(self, key: str, window: Duration, limit: int, cost: int = 1, tiers: Optional[Tiers] = None,
             now: Optional[int] = None, oldest: bool = False) -> Op:
        key, window_ms, limit, tiers_ms, cost, now_ms = self.window_request(key, window, limit, cost, tiers, now)
        args = cmd.peek_args(window_ms, limit, tiers_ms, cost, now_ms, oldest)
        try:
            reply, via, _ = yield from self.call("peek", key, args)
        except UnavailableError as error:
            return self.policy(error, window_ms, limit)
        return from_reply(reply, window_ms, bool(tiers_ms), oldest=oldest, via=via)

    def refund(self, key: str, stamp: int, cost: int = 1) -> Op:
        """How many entries it removed. An outage is raised (there is no
        decision to fail open or closed)."""
        args = cmd.refund_args(cmd.integer(stamp, "stamp"), cmd.integer(cost, "cost"))
        key = self.prefix + key
        self.forget(key)
        reply, _, node = yield from self.call("refund", key, args)
        if self.durable is not None:
            (acked,) = yield Send(node, (("WAIT", self.durable.replicas, self.durable.timeout_ms),))
            if isinstance(acked, rex.ResponseError):
                raise refusal(acked)
        return int(reply)

    def reset(self, key: str) -> Op:
        key = self.prefix + key
        self.forget(key)
        for _ in range(MAX_REDIRECTIONS):
            node = yield Locate(key)
            (reply,) = yield Send(node, (("DEL", key),))
            if isinstance(reply, (rex.MovedError, rex.AskError)):
                yield Refresh()
                continue
            if isinstance(reply, rex.ResponseError):
                raise refusal(reply)
            return int(reply) == 1
        raise UnavailableError(f"{key!r}: still redirected after {MAX_REDIRECTIONS} tries")

    def allow_all(self, requests: Sequence[Mapping[str, Any]], stamp: bool = False, now: Optional[int] = None) -> Op:
        """In order, each with STAMP; a rejection refunds the earlier ones by
        stamp and cost, in order, and sends nothing after it."""
        check_requests(requests)
        now_ms = self.now_ms(now)
        cache = self.cache if now_ms is None else None
        decisions: List[Decision] = []
        admitted: List[Tuple[str, Decision, int]] = []
        rejected = None
        index = 0
        try:
            for index, request in enumerate(requests):
                key, window_ms, limit, tiers_ms, cost, _ = self.window_request(
                    request["key"], request["window"], request["limit"], request.get("cost", 1),
                    request.get("tiers"), now_ms)
                if cache is not None:  # a hit at j is the server's rejection at j, without a call
                    sig = _cache.sig_of(window_ms, limit, tiers_ms)
                    hit = cache.lookup(key, sig, cost)
                    if hit is not None:
                        decisions.append(hit)
                        rejected = index
                        break
                    sent_at = cache.monotonic()
                args = cmd.allow_args(window_ms, limit, tiers_ms, cost, now_ms, True)
                reply, via, node = yield from self.call("allow", key, args)
                decision = from_reply(reply, window_ms, bool(tiers_ms), stamp=True, via=via)
                if cache is not None:
                    cache.record(key, sig, cost, sent_at, decision)
                if not decision.allowed:
                    decisions.append(decision)
                    rejected = index
                    break
                if self.durable is not None:
                    # not replicated: an outage at this request (refunded
                    # here under deny, as a single allow is)
                    yield from self._wait_replicated(node, key, decision, cost)
                decisions.append(decision)
                admitted.append((key, decision, cost))
        except UnavailableError as error:
            # An outage at request `index`: 0..index-1 are refunded, then the
            # policy answers once: the decisions received, then its own for
            # this request (its tier 0), which binds.
            yield from self._refund_all(admitted, best_effort=True)
            d = self.policy(error, window_ms, limit)
            sent = tuple(decisions if stamp else (_without_stamp(x) for x in decisions)) + (d,)
            return MultiDecision(allowed=d.allowed, decisions=sent, rejected=None if d.allowed else index,
                                 binding_index=index, via=d.via, error=d.error)
        except XcloakError:
            yield from self._refund_all(admitted, best_effort=True)
            raise
        if rejected is not None:
            yield from self._refund_all(admitted, best_effort=True)
        result = combine(decisions, rejected)
        if not stamp:
            result = MultiDecision(allowed=result.allowed, decisions=tuple(_without_stamp(d) for d in decisions),
                                   rejected=result.rejected, binding_index=result.binding_index, via=result.via)
        return result

    def _refund_all(self, admitted: List[Tuple[str, Decision, int]], best_effort: bool) -> Op:
        for key, decision, cost in admitted:
            try:
                assert decision.stamp is not None
                yield from self.call("refund", key, cmd.refund_args(decision.stamp, cost))
            except (UnavailableError, XcloakError):
                if not best_effort:
                    raise
                # the admission stays in place: conservative, never generous

    def policy(self, error: UnavailableError, window_ms: int, limit: int) -> Decision:
        if self.on_error == "raise":
            raise error
        return by_policy(self.on_error == "allow", window_ms, limit, error)

    # ------------------------------------------------------------ acquire

    def wall_ms(self) -> int:
        return self.clock.now_ms() if self.clock else int(time.time() * 1000)

    def acquire(self, key: str, window: Duration, limit: int, cost: int, tiers: Optional[Tiers],
                max_wait: Duration) -> Generator[Tuple[str, Any], Any, Decision]:
        """acquire's loop (docs/clients.md, "acquire"): yields ``("allow", ())``
        for one ``allow`` call (its Decision sent back) and ``("sleep", ms)``;
        returns the last Decision."""
        max_wait_ms = cmd.to_ms(max_wait, "max_wait")
        if not 0 <= max_wait_ms <= cmd.MAX_MS:
            raise XcloakError(f"max_wait must be from 0 to {cmd.MAX_MS} milliseconds (got {max_wait!r})")
        deadline = self.wall_ms() + max_wait_ms
        while True:
            decision: Decision = yield "allow", ()
            _, sleep_ms = plan.next_step(decision, deadline - self.wall_ms(), self.jitter_fraction, self.random)
            if sleep_ms is None:
                return decision
            yield "sleep", sleep_ms

    # ------------------------------------------------------------ pipelines

    def pipeline_results(self, results: Sequence[Any], policy_args: Sequence[Optional[Tuple[int, int]]]) -> List[Any]:
        """A pipeline's results, in order: an argument error raised, an outage
        to the policy (raised where there is no decision to make)."""
        out = []
        for result, args in zip(results, policy_args):
            if isinstance(result, UnavailableError):
                if args is None or self.on_error == "raise":
                    raise result
                result = self.policy(result, *args)
            elif isinstance(result, XcloakError):
                raise result
            out.append(result)
        return out

    def pipeline(self, entries: Sequence[Entry]) -> Op:
        """Every entry in one round trip per node; entries answered "unknown
        command" are sent again through the script (and NOSCRIPT ones after
        SCRIPT LOAD), the rest untouched. Returns one result per entry, an
        argument error as its XcloakError (raised by the caller)."""
        # The block cache: a pipeline is sent as queued (never answered by the
        # cache, its rejections not recorded); its refunds and resets drop
        # their key's entry before sending, and its admissions after.
        for e in entries:
            if e.kind == "refund" or e.kind == "reset":
                self.forget(e.key)
        results: List[Any] = [None] * len(entries)
        pending = list(range(len(entries)))
        for _ in range(MAX_REDIRECTIONS):
            if not pending:
                break
            by_node: Dict[str, Tuple[Any, List[int]]] = {}
            for i in pending:
                e = entries[i]
                node = yield Locate(e.key, e.kind == "peek" and self.replica_reads)
                by_node.setdefault(node.name, (node, []))[1].append(i)
            redirected: List[int] = []
            for node, indexes in by_node.values():
                yield from self._pipeline_node(node, entries, indexes, results, redirected)
            pending = redirected
            if redirected:
                yield Refresh()
        for i in pending:
            results[i] = UnavailableError(f"{entries[i].key!r}: still redirected (the cluster is resharding)")
        for e, result in zip(entries, results):
            if e.kind == "allow" and isinstance(result, Decision) and result.allowed:
                self.forget(e.key)
        return results

    def _pipeline_node(self, node: Any, entries: Sequence[Entry], indexes: List[int], results: List[Any],
                       redirected: List[int]) -> Op:
        names, shas = COMMAND_OF, SHA_OF
        mode = self.mode_of(node.name)
        scripted: List[int] = []
        commands: List[Tuple[str, ...]] = []
        sent: List[int] = []
        for i in indexes:
            e = entries[i]
            if e.kind == "reset":
                commands.append(("DEL", e.key))
                sent.append(i)
            elif mode == COMMAND:
                commands.append((names[e.kind], e.key, *e.args))
                sent.append(i)
            else:
                scripted.append(i)
        if commands:
            replies = yield Send(node, tuple(commands))
            for i, reply in zip(sent, replies):
                if is_unknown_command(reply) and self.fallback != "never":
                    self._on_script(node.name)
                    scripted.append(i)
                elif isinstance(reply, (rex.MovedError, rex.AskError)):
                    redirected.append(i)
                else:
                    if entries[i].kind != "reset" and not isinstance(reply, rex.ResponseError):
                        self._on_command(node.name)
                    results[i] = self._result(entries[i], reply, COMMAND)
        if not scripted:
            return
        for attempt in range(2):
            scripts = tuple(("EVALSHA", shas[entries[i].kind], 1, entries[i].key, *entries[i].args) for i in scripted)
            replies = yield Send(node, scripts)
            missing = []
            for i, reply in zip(scripted, replies):
                if isinstance(reply, rex.NoScriptError) and attempt == 0:
                    missing.append(i)
                elif isinstance(reply, (rex.MovedError, rex.AskError)):
                    redirected.append(i)
                else:
                    results[i] = self._result(entries[i], reply, SCRIPT)
            if not missing:
                return
            loads = tuple(("SCRIPT", "LOAD", SCRIPTS[sha]) for sha in {shas[entries[i].kind] for i in missing})
            yield Send(node, loads)
            scripted = missing

    @staticmethod
    def _result(entry: Entry, reply: Any, via: str) -> Any:
        if isinstance(reply, rex.ResponseError):
            return refusal(reply)
        return entry.parse(reply, via)


def _without_stamp(decision: Decision) -> Decision:
    return replace(decision, stamp=None)


def check_requests(requests: Sequence[Mapping[str, Any]]) -> None:
    """allow_all's requests: mappings with the known fields only (a misspelled
    ``teirs`` or ``cots`` is refused, never ignored), before anything is sent."""
    if isinstance(requests, (str, bytes)) or not isinstance(requests, Sequence):
        raise XcloakError(f"allow_all requests must be a list of mappings, not {type(requests).__name__}")
    if not requests:
        raise XcloakError("allow_all needs at least one request")
    for index, request in enumerate(requests):
        if not isinstance(request, Mapping):
            raise XcloakError(f"allow_all request {index} must be a mapping with the fields "
                              f"{', '.join(REQUEST_FIELDS)}, not {type(request).__name__}")
        unknown = [name for name in request if name not in REQUEST_FIELDS]
        if unknown:
            raise XcloakError(f"allow_all request {index} has unknown field(s) {', '.join(map(repr, unknown))} "
                              f"(the fields are {', '.join(REQUEST_FIELDS)})")
        missing = [name for name in REQUEST_REQUIRED if name not in request]
        if missing:
            raise XcloakError(f"allow_all request {index} lacks {', '.join(missing)} "
                              f"(required: {', '.join(REQUEST_REQUIRED)})")
