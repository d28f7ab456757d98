package io.xcloak;

import java.time.Duration;
import java.util.List;
import java.util.Objects;
import java.util.concurrent.CompletionStage;
import java.util.function.DoubleSupplier;
import java.util.function.LongSupplier;

/**
 * Exact sliding-window rate limiting on Redis (docs/clients.md): {@code allow}, {@code peek},
 * {@code refund}, {@code reset}, {@code acquire} and {@code allowAll}, each synchronous and as a
 * {@link CompletionStage} ({@code ...Async}). Thread-safe; build one per application and share it.
 *
 * <pre>{@code
 * Limiter limiter = Limiter.builder(LettuceTransport.of(redisClient)).build();
 * Decision d = limiter.allow(Request.of("login:alice", Duration.ofMinutes(1), 5));
 * if (!d.allowed()) { ... 429, d.headers(Headers.Style.IETF) ... }
 * }</pre>
 *
 * <p>Errors: the server's refusal of an argument is thrown as {@link XcloakException}, whatever the
 * error policy; an outage or a timeout goes to the policy ({@link ErrorPolicy}); a call that may
 * have been applied is never sent again. The async methods complete exceptionally with the same
 * exceptions.
 */
public final class Limiter implements AutoCloseable {
    private final Engine engine;

    private Limiter(Builder builder) {
        this.engine = new Engine(builder);
    }

    /** A builder over {@code transport} (a {@code LettuceTransport} or a {@code JedisTransport}). */
    public static Builder builder(Transport transport) {
        return new Builder(transport);
    }

    /** {@code XCLOAK.ALLOW key window limit [TIER w l]... [COST c] [NOW t] DETAILS [STAMP]}. */
    public Decision allow(Request request) {
        return Engine.join(engine.allow(request));
    }

    /** {@link #allow(Request)} of {@code Request.of(key, window, limit)}. */
    public Decision allow(String key, Duration window, long limit) {
        return allow(Request.of(key, window, limit));
    }

    public CompletionStage<Decision> allowAsync(Request request) {
        return engine.allow(request);
    }

    /**
     * {@code XCLOAK.PEEK key window limit [TIER w l]... [COST c] [NOW t] [OLDEST]}: would the request
     * be admitted now; records nothing. Goes to a replica where the transport reads from replicas.
     */
    public Decision peek(Request request) {
        return Engine.join(engine.peek(request));
    }

    public CompletionStage<Decision> peekAsync(Request request) {
        return engine.peek(request);
    }

    /** {@code XCLOAK.REFUND key stamp}: how many entries it removed. An outage is always thrown. */
    public long refund(String key, long stamp) {
        return refund(key, stamp, 1);
    }

    /** {@code XCLOAK.REFUND key stamp [COST c]}: how many entries it removed. */
    public long refund(String key, long stamp, long cost) {
        return Engine.join(engine.refund(key, stamp, cost));
    }

    public CompletionStage<Long> refundAsync(String key, long stamp, long cost) {
        return engine.refund(key, stamp, cost);
    }

    /** {@code DEL key}: whether a window was there. An outage is always thrown. */
    public boolean reset(String key) {
        return Engine.join(engine.reset(key));
    }

    public CompletionStage<Boolean> resetAsync(String key) {
        return engine.reset(key);
    }

    /**
     * Allows, then sleeps the server's retry-after (plus jitter) until admitted or {@code maxWait}
     * passes; returns the last decision. Never sleeps past the deadline; never retries a call (each
     * turn is a new request). An interrupt ends the wait with {@link java.util.concurrent.CancellationException}.
     */
    public Decision acquire(Request request, Duration maxWait) {
        return Engine.join(engine.acquire(request, maxWait));
    }

    /** {@link #acquire}; cancelling the returned future stops the wait (a call in flight may still be admitted). */
    public CompletionStage<Decision> acquireAsync(Request request, Duration maxWait) {
        return engine.acquire(request, maxWait);
    }

    /**
     * One request against several identities, all or nothing: each admitted in order with
     * {@code STAMP}; if request <i>j</i> rejects, 0..<i>j</i>-1 are refunded and the rest not sent.
     */
    public MultiDecision allowAll(List<Request> requests) {
        return Engine.join(engine.allowAll(requests));
    }

    public CompletionStage<MultiDecision> allowAllAsync(List<Request> requests) {
        return engine.allowAll(requests);
    }

    /** The block cache's counters. */
    public Stats stats() {
        return engine.stats();
    }

    /** Closes the transport (which closes only what it opened itself). */
    @Override
    public void close() {
        engine.close();
    }

    /**
     * A limiter's options, checked when {@link #build()} is called: a value out of range throws
     * {@link IllegalArgumentException} naming the option and its range.
     */
    public static final class Builder {
        final Transport transport;
        String prefix = "";
        ErrorPolicy onError = ErrorPolicy.RAISE;
        Duration timeout = Duration.ofSeconds(1);
        Fallback fallback = Fallback.AUTO;
        Duration probeInterval = Duration.ofSeconds(60);
        Durable durable;
        int blockCache = 10_000;
        Clock clock;
        DoubleSupplier random;
        double jitterFraction = 0.1;
        LongSupplier monotonicNanos = System::nanoTime;

        private Builder(Transport transport) {
            this.transport = Objects.requireNonNull(transport, "transport");
        }

        /** Put before every key (default ""). */
        public Builder prefix(String prefix) {
            this.prefix = Objects.requireNonNull(prefix, "prefix");
            return this;
        }

        /** What an outage or a timeout answers (default {@link ErrorPolicy#RAISE}). */
        public Builder onError(ErrorPolicy policy) {
            this.onError = Objects.requireNonNull(policy, "onError");
            return this;
        }

        /** Each call's timeout, whatever the client's own socket settings (default 1 s; 1 ms to 2^53-1 ms). */
        public Builder timeout(Duration timeout) {
            this.timeout = Objects.requireNonNull(timeout, "timeout");
            return this;
        }

        /** When the bundled scripts stand in for the module (default {@link Fallback#AUTO}). */
        public Builder fallback(Fallback fallback) {
            this.fallback = Objects.requireNonNull(fallback, "fallback");
            return this;
        }

        /** How long a node stays on the script before the command is tried again (default 60 s). */
        public Builder probeInterval(Duration probeInterval) {
            this.probeInterval = Objects.requireNonNull(probeInterval, "probeInterval");
            return this;
        }

        /** Durable mode: admissions wait for {@code replicas} replicas ({@code WAIT}) for at most {@code timeout}. */
        public Builder durable(int replicas, Duration timeout) {
            this.durable = new Durable(replicas, timeout);
            return this;
        }

        /** The block cache's size in entries (default 10,000; 0 turns it off; at most 1,000,000). */
        public Builder blockCache(int entries) {
            this.blockCache = entries;
            return this;
        }

        /** A clock for tests and replays: every call then sends {@code NOW} from it. */
        public Builder clock(Clock clock) {
            this.clock = Objects.requireNonNull(clock, "clock");
            return this;
        }

        /** acquire's random source: uniform in [0, 1) (default ThreadLocalRandom). */
        public Builder random(DoubleSupplier random) {
            this.random = Objects.requireNonNull(random, "random");
            return this;
        }

        /** acquire's jitter: up to this fraction of the retry-after is added (default 0.1; 0 to 1). */
        public Builder jitterFraction(double jitterFraction) {
            this.jitterFraction = jitterFraction;
            return this;
        }

        /** The block cache's monotonic clock in nanoseconds (tests; default System::nanoTime). */
        Builder monotonicNanos(LongSupplier monotonicNanos) {
            this.monotonicNanos = monotonicNanos;
            return this;
        }

        /** The limiter; a value out of range throws IllegalArgumentException naming its option. */
        public Limiter build() {
            Engine.check(this);
            return new Limiter(this);
        }
    }
}
