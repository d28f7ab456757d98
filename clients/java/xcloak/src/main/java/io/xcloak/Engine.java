package io.xcloak;

import java.io.IOException;
import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.List;
import java.util.Map;
import java.util.OptionalInt;
import java.util.Set;
import java.util.concurrent.CancellationException;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionException;
import java.util.concurrent.CompletionStage;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ThreadLocalRandom;
import java.util.function.DoubleSupplier;
import java.util.function.LongSupplier;
import java.util.function.Predicate;

/**
 * The calls of docs/clients.md over a {@link Transport}, written once for the sync and the async
 * API (the sync one waits for the async one): the fallback to the scripts per node, durable mode,
 * the error policy, the block cache, {@code acquire} and {@code allowAll}.
 *
 * <p>Nothing here sends a call twice unless the server said it did not run it: an unknown command
 * (then the script), {@code NOSCRIPT} (then {@code EVAL} of the text), an unknown
 * {@code EVALSHA_RO} (Redis before 7.0: then {@code EVALSHA}).
 */
final class Engine {
    /** The largest duration the server takes, in milliseconds (2^53 - 1). */
    static final long MAX_MS = 9_007_199_254_740_991L;

    private static final Set<String> UNAVAILABLE_CODES = Set.of(
            "LOADING", "BUSY", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN", "READONLY", "NOREPLICAS", "OOM", "MOVED",
            "ASK");
    private static final String MAX_CLIENTS = "ERR max number of clients reached";

    private enum Op {
        ALLOW("XCLOAK.ALLOW"),
        PEEK("XCLOAK.PEEK"),
        REFUND("XCLOAK.REFUND");

        final byte[] command;

        Op(String command) {
            this.command = Replies.ascii(command);
        }
    }

    private enum Path {
        COMMAND,
        SCRIPT,
        /** A node on the script, after the probe interval: the command again. */
        PROBE
    }

    /** A bundled script: its text and SHA-1. */
    record Script(byte[] code, byte[] sha) {
        static Script load(String name) {
            try (InputStream in = Engine.class.getResourceAsStream("lua/" + name)) {
                if (in == null) {
                    throw new IllegalStateException("the bundled script io/xcloak/lua/" + name + " is missing");
                }
                byte[] code = in.readAllBytes();
                byte[] digest = MessageDigest.getInstance("SHA-1").digest(code);
                return new Script(code, Replies.ascii(HexFormat.of().formatHex(digest)));
            } catch (IOException | NoSuchAlgorithmException e) {
                throw new IllegalStateException("can't read the bundled script " + name, e);
            }
        }
    }

    static final Script ALLOW_SCRIPT = Script.load("xcloak_allow.lua");
    static final Script PEEK_SCRIPT = Script.load("xcloak_peek.lua");
    static final Script REFUND_SCRIPT = Script.load("xcloak_refund.lua");

    /** What the fallback knows about one node. */
    private static final class NodeState {
        /** On the script since then (System.nanoTime), or null: on the command. */
        volatile Long scriptSince;
        /** EVALSHA_RO is unknown there (Redis before 7.0): peeks use EVALSHA. */
        volatile boolean noReadOnlyScripts;
    }

    private record Exchange(Transport.Reply reply, Via via) {}

    private final Transport transport;
    private final String prefix;
    private final ErrorPolicy policy;
    private final Duration timeout;
    private final Fallback fallback;
    private final long probeNanos;
    private final Durable durable;
    private final Clock clock;
    private final DoubleSupplier random;
    private final double jitterFraction;
    private final LongSupplier mono;
    private final BlockCache cache;
    private final Map<String, NodeState> nodes = new ConcurrentHashMap<>();
    private volatile boolean anyScript;

    Engine(Limiter.Builder b) {
        this.transport = b.transport;
        this.prefix = b.prefix;
        this.policy = b.onError;
        this.timeout = b.timeout;
        this.fallback = b.fallback;
        this.probeNanos = b.probeInterval.toNanos();
        this.durable = b.durable;
        this.clock = b.clock;
        this.random = b.random != null ? b.random : () -> ThreadLocalRandom.current().nextDouble();
        this.jitterFraction = b.jitterFraction;
        this.mono = b.monotonicNanos;
        this.cache = b.blockCache > 0 ? new BlockCache(b.blockCache) : null;
    }

    // ---- configuration ----

    private static void duration(String name, Duration value, boolean whole) {
        boolean fits = !value.isNegative()
                && value.compareTo(Duration.ofMillis(1)) >= 0
                && value.compareTo(Duration.ofMillis(MAX_MS)) <= 0;
        if (fits && (!whole || value.getNano() % 1_000_000 == 0)) {
            return;
        }
        throw new IllegalArgumentException(name + " must be " + (whole ? "a whole number of milliseconds" : "a duration")
                + " from 1 ms to " + MAX_MS + " ms, not " + value);
    }

    /** Every option in its range: configuration is refused when it is built, never at the first call. */
    static void check(Limiter.Builder b) {
        duration("timeout", b.timeout, false);
        duration("probeInterval", b.probeInterval, false);
        if (b.durable != null) {
            if (b.durable.replicas() < 1) {
                throw new IllegalArgumentException("durable.replicas must be from 1 to " + Integer.MAX_VALUE + ", not "
                        + b.durable.replicas() + " (WAIT 0 waits for nothing)");
            }
            duration("durable.timeout", b.durable.timeout(), true);
        }
        if (b.blockCache < 0 || b.blockCache > 1_000_000) {
            throw new IllegalArgumentException(
                    "blockCache must be from 0 (off) to 1000000 entries, not " + b.blockCache);
        }
        if (!(b.jitterFraction >= 0 && b.jitterFraction <= 1)) {
            throw new IllegalArgumentException("jitterFraction must be from 0 to 1, not " + b.jitterFraction);
        }
    }

    // ---- the calls ----

    /** The request as sent: the prefix on its key, NOW from the clock, STAMP when asked (or durable). */
    private Request prepare(Request request, Op op, boolean stamp) {
        if (op == Op.ALLOW && request.oldest()) {
            throw new IllegalArgumentException("oldest is a peek option: allow does not take it");
        }
        if (op == Op.PEEK && request.stamp()) {
            throw new IllegalArgumentException("stamp is an allow option: peek does not take it");
        }
        if (prefix.isEmpty() && (clock == null || request.now().isPresent()) && (!stamp || request.stamp())) {
            return request;
        }
        Request prepared = prefix.isEmpty() ? request : request.withKey(prefix + request.key());
        if (clock != null && request.now().isEmpty()) {
            prepared = prepared.withNow(clock.nowMillis());
        }
        if (stamp && !prepared.stamp()) {
            prepared = prepared.withStamp();
        }
        // Request and Tier refused a window of a fraction of a millisecond when they were made.
        return prepared;
    }

    CompletionStage<Decision> allow(Request request) {
        Request prepared;
        try {
            prepared = prepare(request, Op.ALLOW, request.stamp() || durable != null);
        } catch (RuntimeException e) {
            return CompletableFuture.failedFuture(e);
        }
        CompletionStage<Decision> decided = cachedAllow(prepared);
        if (!request.stamp() && durable != null) {
            decided = decided.thenApply(Engine::withoutStamp);
        }
        return policy(request, decided);
    }

    private static Decision withoutStamp(Decision d) {
        if (d.stamp().isEmpty()) {
            return d;
        }
        return new Decision(d.allowed(), d.limit(), d.remaining(), d.retryAfter(), d.resetAfter(),
                d.costExceedsLimit(), d.window(), d.tier(), d.tiers(), java.util.OptionalLong.empty(), d.oldest(),
                d.via(), d.error());
    }

    /** An allow through the block cache: a hit answers without a call; a server decision is recorded. */
    private CompletionStage<Decision> cachedAllow(Request prepared) {
        if (cache == null || prepared.now().isPresent()) {
            return allowOnce(prepared, NOT_CACHED);
        }
        if (!cache.isEmpty()) {
            Decision hit = cache.lookup(prepared.key(), BlockCache.Sig.of(prepared), prepared.cost(), mono.getAsLong());
            if (hit != null) {
                return CompletableFuture.completedFuture(hit);
            }
        }
        return allowOnce(prepared, mono.getAsLong());
    }

    /** {@code sentAt}: the monotonic time before sending, for the block cache (NOT_CACHED: no cache). */
    private static final long NOT_CACHED = Long.MIN_VALUE;

    private CompletionStage<Decision> allowOnce(Request prepared, long sentAt) {
        List<byte[]> args = Replies.windowArgs(prepared, false, prepared.stamp());
        CompletionStage<Exchange> exchanged = exchange(Op.ALLOW, prepared.key(), args, true);
        if (durable == null) {
            return exchanged.thenApply(ex -> {
                Decision decision = Replies.decision(ex.reply.value(), prepared.window(), false, ex.via);
                if (sentAt != NOT_CACHED) {
                    cache.record(prepared, sentAt, decision);
                }
                return decision;
            });
        }
        return exchanged.thenCompose(ex -> {
            Decision decision = Replies.decision(ex.reply.value(), prepared.window(), false, ex.via);
            if (!decision.allowed()) {
                if (sentAt != NOT_CACHED) {
                    cache.record(prepared, sentAt, decision);
                }
                return CompletableFuture.completedFuture(decision);
            }
            return replicated(prepared, decision, ex.reply).thenApply(d -> {
                if (sentAt != NOT_CACHED) {
                    cache.record(prepared, sentAt, d);
                }
                return d;
            });
        });
    }

    /** Durable mode: the admission stands only if WAIT counted enough replicas. */
    private CompletionStage<Decision> replicated(Request prepared, Decision decision, Transport.Reply reply) {
        long acknowledged = 0;
        String lost = "";
        Object wait = reply.waitReply();
        if (wait instanceof Long n) {
            acknowledged = n;
        } else if (wait instanceof Transport.ErrorReply error) {
            XcloakException classified = classify(error);
            if (!(classified instanceof XcloakUnavailableException)) {
                // WAIT refused (NOPERM, on a replica): the caller's configuration, raised.
                return CompletableFuture.failedFuture(classified);
            }
            lost = " (" + error.message() + ")";
        } else if (reply.waitError() != null) {
            lost = " (" + reply.waitError() + ")";
        } else {
            lost = " (WAIT answered " + Replies.show(wait) + ")";
        }
        if (acknowledged >= durable.replicas()) {
            return CompletableFuture.completedFuture(decision);
        }
        String message = "not replicated: WAIT " + durable.replicas() + " " + durable.timeout().toMillis()
                + " counted " + acknowledged + lost;
        XcloakUnavailableException outage = new XcloakUnavailableException(
                "xcloak unavailable (not replicated): " + message,
                new XcloakNotReplicatedException(acknowledged, durable.replicas(), message));
        if (policy != ErrorPolicy.DENY || decision.stamp().isEmpty()) {
            return CompletableFuture.failedFuture(outage);
        }
        // Best effort: a request turned away consumes nothing.
        return refundOnce(prepared.key(), decision.stamp().getAsLong(), prepared.cost(), false)
                .handle((removed, error) -> {
                    throw new CompletionException(outage);
                });
    }

    CompletionStage<Decision> peek(Request request) {
        Request prepared;
        try {
            prepared = prepare(request, Op.PEEK, false);
        } catch (RuntimeException e) {
            return CompletableFuture.failedFuture(e);
        }
        List<byte[]> args = Replies.windowArgs(prepared, true, false);
        return policy(request, exchange(Op.PEEK, prepared.key(), args, false)
                .thenApply(ex -> Replies.decision(ex.reply.value(), prepared.window(), true, ex.via)));
    }

    CompletionStage<Long> refund(String key, long stamp, long cost) {
        String full = prefix + key;
        if (cache != null) {
            cache.forget(full, mono.getAsLong());
        }
        return refundOnce(full, stamp, cost, true);
    }

    /** A refund of {@code key} (the prefix on it); {@code wait}: durable mode's WAIT after it. */
    private CompletionStage<Long> refundOnce(String key, long stamp, long cost, boolean wait) {
        return exchange(Op.REFUND, key, Replies.refundArgs(stamp, cost), wait).thenApply(ex -> {
            // A refund that was not replicated is lost in a failover: the window stays
            // conservative, so its WAIT figure raises nothing.
            if (ex.reply.value() instanceof Long n && n >= 0) {
                return n;
            }
            throw new XcloakException("XCLOAK.REFUND answers a count, not " + Replies.show(ex.reply.value()));
        });
    }

    CompletionStage<Boolean> reset(String key) {
        String full = prefix + key;
        if (cache != null) {
            cache.forget(full, mono.getAsLong());
        }
        List<byte[]> command = List.of(Replies.ascii("DEL"), full.getBytes(StandardCharsets.UTF_8));
        return send(new Transport.Call(full, command, false, timeout, null)).handle((reply, error) -> {
            if (error != null) {
                throw outage(error);
            }
            if (reply.value() instanceof Long n) {
                return n > 0;
            }
            if (reply.value() instanceof Transport.ErrorReply refusal) {
                throw classify(refusal);
            }
            throw new XcloakException("DEL answers a count, not " + Replies.show(reply.value()));
        });
    }

    CompletionStage<Decision> acquire(Request request, Duration maxWait) {
        CompletableFuture<Decision> result = new CompletableFuture<>();
        long startMs = clock != null ? clock.nowMillis() : 0;
        long startNanos = System.nanoTime();
        long maxMs;
        try {
            maxMs = Request.wholeMillis("maxWait", maxWait);
            if (maxMs < 0) {
                throw new IllegalArgumentException("maxWait must be from 0 ms, not " + maxWait);
            }
        } catch (IllegalArgumentException e) {
            return CompletableFuture.failedFuture(e);
        }
        acquireTurn(request, maxMs, startMs, startNanos, result);
        return result;
    }

    private void acquireTurn(Request request, long maxMs, long startMs, long startNanos, CompletableFuture<Decision> result) {
        if (result.isDone()) {
            return; // cancelled
        }
        allow(request).whenComplete((decision, error) -> {
            if (error != null) {
                result.completeExceptionally(unwrap(error));
                return;
            }
            long waited = clock != null ? clock.nowMillis() - startMs : (System.nanoTime() - startNanos) / 1_000_000;
            long left = Math.max(0, maxMs - waited);
            long sleep = acquireStep(decision, left, jitterFraction, random);
            if (sleep < 0) {
                result.complete(decision);
                return;
            }
            Duration pause = Duration.ofMillis(sleep);
            CompletionStage<Void> slept;
            try {
                slept = clock != null ? clock.sleepAsync(pause) : new SystemSleep().sleepAsync(pause);
            } catch (RuntimeException e) {
                result.completeExceptionally(e);
                return;
            }
            slept.whenComplete((ignored, sleepError) -> {
                if (sleepError != null) {
                    result.completeExceptionally(unwrap(sleepError));
                } else {
                    acquireTurn(request, maxMs, startMs, startNanos, result);
                }
            });
        });
    }

    /** The system's sleep for acquire without a clock: a delayed completion, no thread held. */
    private static final class SystemSleep implements Clock {
        @Override
        public long nowMillis() {
            return System.currentTimeMillis();
        }

        @Override
        public void sleep(Duration duration) throws InterruptedException {
            Thread.sleep(duration.toMillis());
        }
    }

    /**
     * docs/clients.md, "acquire": after {@code decision}, with {@code leftMs} until the deadline, how
     * long to sleep, or -1 to return it (admitted, answered by the policy, never fits, or can't fit
     * before the deadline). The jitter is added, never subtracted; every sleep is at least 1 ms and
     * never past the deadline.
     */
    static long acquireStep(Decision decision, long leftMs, double jitterFraction, DoubleSupplier random) {
        if (decision.allowed() || decision.via() == Via.ERROR || decision.costExceedsLimit()) {
            return -1;
        }
        long retryMs = decision.retryAfter().toMillis();
        if (retryMs < 0 || retryMs > leftMs) {
            return -1;
        }
        long jitterMs = jitterFraction > 0 ? (long) Math.floor(retryMs * jitterFraction * random.getAsDouble()) : 0;
        return Math.max(1, Math.min(retryMs + jitterMs, leftMs));
    }

    CompletionStage<MultiDecision> allowAll(List<Request> requests) {
        List<Request> prepared = new ArrayList<>(requests.size());
        try {
            // Every argument the client checks, before anything is sent: a bad one at
            // request j would otherwise follow admissions before it.
            if (requests.isEmpty()) {
                throw new IllegalArgumentException("requests must hold from 1 request, not none");
            }
            for (Request request : requests) {
                prepared.add(prepare(request, Op.ALLOW, true));
            }
        } catch (RuntimeException e) {
            return CompletableFuture.failedFuture(e);
        }
        CompletableFuture<MultiDecision> result = new CompletableFuture<>();
        allowAllStep(requests, prepared, new ArrayList<>(), 0, result);
        return result;
    }

    private void allowAllStep(List<Request> requests, List<Request> prepared, List<Decision> decisions, int j,
            CompletableFuture<MultiDecision> result) {
        if (j == prepared.size()) {
            result.complete(Replies.multi(decisions));
            return;
        }
        cachedAllow(prepared.get(j)).whenComplete((decision, error) -> {
            if (error == null) {
                decisions.add(decision);
                if (decision.allowed()) {
                    allowAllStep(requests, prepared, decisions, j + 1, result);
                } else {
                    refundAdmitted(prepared, decisions).whenComplete((v, e) -> result.complete(Replies.multi(decisions)));
                }
                return;
            }
            Throwable cause = unwrap(error);
            refundAdmitted(prepared, decisions).whenComplete((v, e) -> {
                if (!(cause instanceof XcloakUnavailableException) || policy == ErrorPolicy.RAISE) {
                    result.completeExceptionally(cause);
                    return;
                }
                boolean allowed = policy == ErrorPolicy.ALLOW;
                decisions.add(Replies.errorDecision(requests.get(j), allowed, cause));
                result.complete(new MultiDecision(
                        allowed, decisions, allowed ? OptionalInt.empty() : OptionalInt.of(j), j));
            });
        });
    }

    /** Refunds every admission among {@code decisions}, in order, best effort, with no WAIT. */
    private CompletionStage<Void> refundAdmitted(List<Request> prepared, List<Decision> decisions) {
        CompletionStage<Void> chain = CompletableFuture.completedFuture(null);
        for (int i = 0; i < decisions.size(); i++) {
            Decision d = decisions.get(i);
            Request r = prepared.get(i);
            if (d.allowed() && d.stamp().isPresent()) {
                chain = chain.thenCompose(v -> refundOnce(r.key(), d.stamp().getAsLong(), r.cost(), false)
                        .handle((n, e) -> null));
            }
        }
        return chain;
    }

    Stats stats() {
        return cache == null ? new Stats(0, 0) : cache.stats();
    }

    void close() {
        transport.close();
    }

    // ---- the error policy ----

    private CompletionStage<Decision> policy(Request request, CompletionStage<Decision> stage) {
        if (policy == ErrorPolicy.RAISE) {
            return stage;
        }
        return stage.handle((decision, error) -> {
            if (error == null) {
                return decision;
            }
            Throwable cause = unwrap(error);
            if (cause instanceof XcloakUnavailableException) {
                return Replies.errorDecision(request, policy == ErrorPolicy.ALLOW, cause);
            }
            throw cause instanceof RuntimeException r ? r : new CompletionException(cause);
        });
    }

    static Throwable unwrap(Throwable error) {
        while ((error instanceof CompletionException || error instanceof ExecutionException) && error.getCause() != null) {
            error = error.getCause();
        }
        return error;
    }

    /** A server's error reply as the contract's kind: an outage, or a refusal raised as is. */
    static XcloakException classify(Transport.ErrorReply error) {
        String message = error.message();
        if (UNAVAILABLE_CODES.contains(error.code()) || message.startsWith(MAX_CLIENTS)) {
            return new XcloakUnavailableException(
                    "xcloak unavailable (server unavailable): " + message, new XcloakException(message));
        }
        return new XcloakException(message);
    }

    private static boolean unknownCommand(Object value) {
        return value instanceof Transport.ErrorReply e && e.message().startsWith("ERR unknown command");
    }

    // ---- command, script, probe ----

    /** Sends one call, by the command or by the script, and returns its reply (not an error reply). */
    private CompletionStage<Exchange> exchange(Op op, String key, List<byte[]> args, boolean wait) {
        boolean read = op == Op.PEEK;
        Transport.Wait then = null;
        if (durable != null && wait && op != Op.PEEK) {
            Predicate<Object> wrote = op == Op.ALLOW
                    ? reply -> reply instanceof List<?> items && !items.isEmpty() && Long.valueOf(1).equals(items.get(0))
                    : reply -> reply instanceof Long;
            then = new Transport.Wait(durable.replicas(), durable.timeout().toMillis(), wrote);
        }
        Transport.Wait waitThen = then;
        Path path = path(key, read);
        byte[] keyBytes = key.getBytes(StandardCharsets.UTF_8);
        if (path == Path.SCRIPT) {
            return script(op, key, keyBytes, args, read, waitThen, transport.node(key, read));
        }
        List<byte[]> command = new ArrayList<>(args.size() + 2);
        command.add(op.command);
        command.add(keyBytes);
        command.addAll(args);
        CompletableFuture<Exchange> out = new CompletableFuture<>();
        send(new Transport.Call(key, command, read, timeout, waitThen)).whenComplete((reply, error) -> {
            if (error != null) {
                out.completeExceptionally(outage(error));
                return;
            }
            if (!(reply.value() instanceof Transport.ErrorReply refusal)) {
                if (path == Path.PROBE) {
                    mark(reply.node(), null);
                }
                out.complete(new Exchange(reply, Via.COMMAND));
            } else if (fallback == Fallback.AUTO && unknownCommand(refusal)) {
                // Nothing was applied: the script answers, here and from now on.
                mark(reply.node(), mono.getAsLong());
                forward(script(op, key, keyBytes, args, read, waitThen, reply.node()), out);
            } else {
                out.completeExceptionally(classify(refusal));
            }
        });
        return out;
    }

    private static <T> void forward(CompletionStage<T> from, CompletableFuture<T> to) {
        from.whenComplete((value, error) -> {
            if (error != null) {
                to.completeExceptionally(unwrap(error));
            } else {
                to.complete(value);
            }
        });
    }

    private CompletionStage<Exchange> script(Op op, String key, byte[] keyBytes, List<byte[]> args, boolean read,
            Transport.Wait then, String node) {
        Script script = switch (op) {
            case ALLOW -> ALLOW_SCRIPT;
            case PEEK -> PEEK_SCRIPT;
            case REFUND -> REFUND_SCRIPT;
        };
        NodeState state = nodes.get(node);
        boolean readOnly = read && (state == null || !state.noReadOnlyScripts);
        return evalsha(script, key, keyBytes, args, read, then, readOnly, false, node);
    }

    private CompletionStage<Exchange> evalsha(Script script, String key, byte[] keyBytes, List<byte[]> args,
            boolean read, Transport.Wait then, boolean readOnly, boolean byText, String node) {
        List<byte[]> command = new ArrayList<>(args.size() + 4);
        command.add(Replies.ascii(byText ? (readOnly ? "EVAL_RO" : "EVAL") : (readOnly ? "EVALSHA_RO" : "EVALSHA")));
        command.add(byText ? script.code : script.sha);
        command.add(Replies.ascii("1"));
        command.add(keyBytes);
        command.addAll(args);
        CompletableFuture<Exchange> out = new CompletableFuture<>();
        send(new Transport.Call(key, command, read, timeout, then)).whenComplete((reply, error) -> {
            if (error != null) {
                out.completeExceptionally(outage(error));
                return;
            }
            if (!(reply.value() instanceof Transport.ErrorReply refusal)) {
                out.complete(new Exchange(reply, Via.SCRIPT));
            } else if (readOnly && unknownCommand(refusal)) {
                // Redis before 7.0 has no EVALSHA_RO: EVALSHA on that node from now on.
                nodes.computeIfAbsent(reply.node(), n -> new NodeState()).noReadOnlyScripts = true;
                forward(evalsha(script, key, keyBytes, args, read, then, false, byText, node), out);
            } else if (!byText && refusal.code().equals("NOSCRIPT")) {
                // Not cached there (a restart, SCRIPT FLUSH, a new node): the text runs
                // it once and caches it.
                forward(evalsha(script, key, keyBytes, args, read, then, readOnly, true, node), out);
            } else {
                out.completeExceptionally(classify(refusal));
            }
        });
        return out;
    }

    /** Sends once; the stage fails only when there was no answer (see {@link #outage}). */
    private CompletionStage<Transport.Reply> send(Transport.Call call) {
        try {
            return transport.send(call);
        } catch (RuntimeException e) {
            return CompletableFuture.failedFuture(e);
        }
    }

    /** A transport's failure as the contract's kind: no answer becomes XcloakUnavailableException. */
    private static RuntimeException outage(Throwable error) {
        Throwable cause = unwrap(error);
        if (cause instanceof XcloakException x) {
            return x;
        }
        if (cause instanceof CancellationException c) {
            return c;
        }
        String what = cause instanceof java.util.concurrent.TimeoutException ? "timeout" : "connection";
        return new XcloakUnavailableException("xcloak unavailable (" + what + "): " + cause, cause);
    }

    /** Command, script or probe for the node serving {@code key}. */
    private Path path(String key, boolean read) {
        switch (fallback) {
            case NEVER:
                return Path.COMMAND;
            case ALWAYS:
                return Path.SCRIPT;
            default:
                if (!anyScript) {
                    return Path.COMMAND;
                }
        }
        NodeState state = nodes.get(transport.node(key, read));
        if (state == null) {
            return Path.COMMAND;
        }
        synchronized (state) {
            Long since = state.scriptSince;
            if (since == null) {
                return Path.COMMAND;
            }
            long now = mono.getAsLong();
            if (now - since >= probeNanos) {
                state.scriptSince = now; // this call probes; the others keep the script meanwhile
                return Path.PROBE;
            }
            return Path.SCRIPT;
        }
    }

    /** Records that {@code node} is served by the script since {@code since}, or (null) by the command again. */
    private void mark(String node, Long since) {
        NodeState state = nodes.computeIfAbsent(node, n -> new NodeState());
        state.scriptSince = since;
        boolean any = false;
        for (NodeState s : nodes.values()) {
            any |= s.scriptSince != null;
        }
        anyScript = any;
    }

    /** Waits for {@code stage}, throwing what it failed with (not wrapped). */
    static <T> T join(CompletionStage<T> stage) {
        CompletableFuture<T> future = stage.toCompletableFuture();
        try {
            return future.get();
        } catch (ExecutionException | CompletionException e) {
            Throwable cause = unwrap(e);
            if (cause instanceof RuntimeException runtime) {
                throw runtime;
            }
            if (cause instanceof Error error) {
                throw error;
            }
            throw new XcloakException(String.valueOf(cause), cause);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            future.cancel(true);
            throw new CancellationException("interrupted");
        }
    }

}
