package io.xcloak;

/**
 * What a {@link Limiter} answers when there is no answer: an outage or a timeout, never an argument
 * or configuration error (docs/clients.md, "Errors").
 */
public enum ErrorPolicy {
    /** Throw {@link XcloakUnavailableException} with the cause (the default). */
    RAISE,
    /** Fail open: a {@link Decision} with {@code allowed} true and {@link Via#ERROR}. */
    ALLOW,
    /** Fail closed: a {@link Decision} with {@code allowed} false and {@link Via#ERROR}. */
    DENY
}
