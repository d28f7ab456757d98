package io.xcloak;

/**
 * Durable mode: {@code WAIT} counted fewer replicas than asked. The cause an
 * {@link XcloakUnavailableException} (or a {@link Via#ERROR} decision) carries.
 */
public class XcloakNotReplicatedException extends RuntimeException {
    private static final long serialVersionUID = 1L;
    private final long acknowledged;
    private final int wanted;

    public XcloakNotReplicatedException(long acknowledged, int wanted, String message) {
        super(message);
        this.acknowledged = acknowledged;
        this.wanted = wanted;
    }

    /** The replicas WAIT counted. */
    public long acknowledged() {
        return acknowledged;
    }

    /** The replicas asked for. */
    public int wanted() {
        return wanted;
    }
}
