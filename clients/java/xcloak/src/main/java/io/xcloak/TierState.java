package io.xcloak;

import java.time.Duration;

/**
 * One tier of a {@link Decision} made with tiers, in the order given.
 *
 * @param window the tier's window
 * @param limit the tier's limit
 * @param remaining the tier's remaining units, never below 0
 * @param retryAfter until the request fits in this tier; negative (-1 ms) when it never can
 * @param resetAfter until the tier's window is empty
 */
public record TierState(Duration window, long limit, long remaining, Duration retryAfter, Duration resetAfter) {}
