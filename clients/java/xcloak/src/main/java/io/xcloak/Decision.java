package io.xcloak;

import java.time.Duration;
import java.util.List;
import java.util.Map;
import java.util.OptionalLong;

/**
 * The reply of {@code XCLOAK.ALLOW ... DETAILS [STAMP]} or {@code XCLOAK.PEEK}, read into one value
 * (docs/clients.md, "Decision"). Every duration is a {@link Duration} of the reply's milliseconds.
 *
 * @param allowed admitted (a peek: would be admitted now)
 * @param limit the binding tier's limit
 * @param remaining the binding tier's remaining units, never below 0
 * @param retryAfter zero when allowed; else the wait until the request fits in every tier if nothing
 *     else is admitted meanwhile. <b>Negative (-1 ms) when the request can never fit</b> (the reply's
 *     -1, {@link #costExceedsLimit()} true): Java's Duration has no "none", and a negative wait
 *     can't be mistaken for one
 * @param resetAfter until the binding tier's window is empty
 * @param costExceedsLimit the cost is above a tier's limit: it can never be admitted; answer with a
 *     client error, don't retry
 * @param window the binding tier's window
 * @param tier the binding tier's index: 0 for the positional pair, <i>i</i> for the <i>i</i>-th tier
 * @param tiers with tiers only (else empty): every tier, in the order given
 * @param stamp with {@link Request#withStamp()}: the admission's stamp; empty when rejected or not
 *     asked
 * @param oldest a peek with {@link Request#withOldest()}: the stamp (unix ms) of the oldest entry
 *     live in the binding tier's window; empty when that window is empty or not asked
 * @param via who decided
 * @param error with {@link Via#ERROR}: the outage or timeout that the error policy answered; else
 *     null
 */
public record Decision(
        boolean allowed,
        long limit,
        long remaining,
        Duration retryAfter,
        Duration resetAfter,
        boolean costExceedsLimit,
        Duration window,
        int tier,
        List<TierState> tiers,
        OptionalLong stamp,
        OptionalLong oldest,
        Via via,
        Throwable error) {

    /** The never-fits {@link #retryAfter()}: -1 ms. */
    public static final Duration NEVER = Duration.ofMillis(-1);

    public Decision {
        tiers = List.copyOf(tiers);
    }

    /** The HTTP header fields of this decision in {@code style}, with the default policy names. */
    public Map<String, String> headers(Headers.Style style) {
        return Headers.of(this, style);
    }

    /** The HTTP header fields of this decision in {@code style}, one policy name per tier. */
    public Map<String, String> headers(Headers.Style style, List<String> names) {
        return Headers.of(this, style, names);
    }
}
