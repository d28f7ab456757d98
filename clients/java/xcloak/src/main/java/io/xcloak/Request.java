package io.xcloak;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Objects;
import java.util.OptionalLong;

/**
 * One call's arguments: {@code key window limit [TIER w l]... [COST c] [NOW t]} and the flags
 * {@code STAMP} (allow) and {@code OLDEST} (peek). Immutable; the {@code with...} methods return a
 * copy.
 *
 * <pre>{@code
 * Request login = Request.of("login:alice", Duration.ofMinutes(1), 5)
 *         .withTier(Duration.ofHours(1), 20)
 *         .withStamp();
 * }</pre>
 *
 * <p>Durations are sent as whole milliseconds: one that is not is refused here, naming it. Every
 * other range (window 1 to 2^53-1 ms, limit, cost 1 to the limit, at most 15 tiers) is the
 * server's to check, so the error text is the same in every language and through the fallback.
 *
 * @param key the key, used as given after the limiter's prefix
 * @param window tier 0's window
 * @param limit tier 0's limit
 * @param tiers the tiers after the positional pair (tier <i>i</i> is {@code tiers.get(i - 1)})
 * @param cost the request's cost (1 is not sent)
 * @param stamp ask for the admission's stamp, the handle {@link Limiter#refund} takes (allow only)
 * @param now unix milliseconds sent as {@code NOW}, for replays and tests
 * @param oldest ask a peek for the oldest live entry of the binding tier (peek only)
 */
public record Request(
        String key,
        Duration window,
        long limit,
        List<Tier> tiers,
        long cost,
        boolean stamp,
        OptionalLong now,
        boolean oldest) {

    public Request {
        Objects.requireNonNull(key, "key");
        Objects.requireNonNull(window, "window");
        Objects.requireNonNull(now, "now");
        wholeMillis("window", window);
        tiers = List.copyOf(tiers);
    }

    /** {@code limit} per {@code window} on {@code key}, cost 1. */
    public static Request of(String key, Duration window, long limit) {
        return new Request(key, window, limit, List.of(), 1, false, OptionalLong.empty(), false);
    }

    /** A copy with one more tier. */
    public Request withTier(Duration window, long limit) {
        List<Tier> more = new ArrayList<>(tiers);
        more.add(new Tier(window, limit));
        return new Request(key, this.window, this.limit, more, cost, stamp, now, oldest);
    }

    /** A copy with these tiers (after the positional pair). */
    public Request withTiers(List<Tier> tiers) {
        return new Request(key, window, limit, tiers, cost, stamp, now, oldest);
    }

    /** A copy with this cost. */
    public Request withCost(long cost) {
        return new Request(key, window, limit, tiers, cost, stamp, now, oldest);
    }

    /** A copy that asks for the admission's stamp ({@code STAMP}). */
    public Request withStamp() {
        return new Request(key, window, limit, tiers, cost, true, now, oldest);
    }

    /** A copy sent with {@code NOW nowMillis} (unix milliseconds). */
    public Request withNow(long nowMillis) {
        return new Request(key, window, limit, tiers, cost, stamp, OptionalLong.of(nowMillis), oldest);
    }

    /** A copy of this request on another key. */
    public Request withKey(String key) {
        return new Request(key, window, limit, tiers, cost, stamp, now, oldest);
    }

    /** A copy that asks a peek for the oldest live entry ({@code OLDEST}). */
    public Request withOldest() {
        return new Request(key, window, limit, tiers, cost, stamp, now, true);
    }

    /** {@code duration} in whole milliseconds, or IllegalArgumentException naming {@code name}. */
    static long wholeMillis(String name, Duration duration) {
        if (duration.getNano() % 1_000_000 != 0) {
            throw new IllegalArgumentException(
                    name + " must be a whole number of milliseconds, not " + duration);
        }
        try {
            return duration.toMillis();
        } catch (ArithmeticException e) {
            throw new IllegalArgumentException(
                    name + " must be from 1 to 9007199254740991 milliseconds, not " + duration, e);
        }
    }
}
