package io.xcloak;

import java.time.Duration;
import java.util.Objects;

/**
 * One {@code TIER window limit} pair after a request's positional window and limit: tier
 * <i>i</i> of a request is its <i>i</i>-th {@code Tier} (tier 0 is the positional pair).
 *
 * @param window the tier's window, a whole number of milliseconds
 * @param limit the tier's limit
 */
public record Tier(Duration window, long limit) {
    public Tier {
        Objects.requireNonNull(window, "window");
        Request.wholeMillis("window of a tier", window);
    }

    /** A tier of {@code limit} per {@code window}. */
    public static Tier of(Duration window, long limit) {
        return new Tier(window, limit);
    }
}
