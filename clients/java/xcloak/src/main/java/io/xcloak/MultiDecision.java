package io.xcloak;

import java.time.Duration;
import java.util.List;
import java.util.Map;
import java.util.OptionalInt;

/**
 * What {@link Limiter#allowAll} returns: one request against several identities, all or nothing
 * (docs/clients.md, "allow_all").
 *
 * @param allowed every request was admitted (under the error policy: the policy's answer)
 * @param decisions one per request sent, in order (a refunded request's decision still shows its
 *     own admission)
 * @param rejected the index of the request that rejected; empty when none did
 * @param bindingIndex the index in {@code decisions} of {@link #binding()}
 */
public record MultiDecision(boolean allowed, List<Decision> decisions, OptionalInt rejected, int bindingIndex) {

    public MultiDecision {
        decisions = List.copyOf(decisions);
    }

    /**
     * The decision that rejected, or when all are admitted the one with the fewest remaining (ties:
     * the earliest).
     */
    public Decision binding() {
        return decisions.get(bindingIndex);
    }

    /** The binding decision's retry-after. */
    public Duration retryAfter() {
        return binding().retryAfter();
    }

    /** The binding decision's {@link Via}. */
    public Via via() {
        return binding().via();
    }

    /** The binding decision's error (with {@link Via#ERROR}), else null. */
    public Throwable error() {
        return binding().error();
    }

    /** The header fields: every sent decision's policies, in request order. */
    public Map<String, String> headers(Headers.Style style) {
        return Headers.of(this, style, List.of());
    }

    /** The header fields, with policy names per request ({@code names.get(i)} for request i). */
    public Map<String, String> headers(Headers.Style style, List<List<String>> names) {
        return Headers.of(this, style, names);
    }
}
