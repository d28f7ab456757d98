package io.xcloak;

import java.time.Duration;
import java.util.Objects;

/**
 * Durable mode (docs/clients.md, "Durable mode"): an admission counts only once {@code replicas}
 * replicas hold it. After the reply of an admitting allow (and of a refund) the limiter sends
 * {@code WAIT replicas timeout} on the connection that carried the call; fewer acknowledgements
 * go to the error policy as "not replicated" ({@link XcloakNotReplicatedException}).
 *
 * @param replicas from 1 to 2^31-1
 * @param timeout WAIT's own timeout, a whole number of milliseconds from 1 ms
 */
public record Durable(int replicas, Duration timeout) {
    public Durable {
        Objects.requireNonNull(timeout, "durable.timeout");
    }
}
