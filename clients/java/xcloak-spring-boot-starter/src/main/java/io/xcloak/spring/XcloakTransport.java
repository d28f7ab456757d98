package io.xcloak.spring;

/**
 * The transport the starter built from the connection factory; closes what it opened (a Jedis
 * client) when the context closes, after the limiter.
 */
public final class XcloakTransport implements AutoCloseable {

    private final RedisTransports.Built built;

    XcloakTransport(RedisTransports.Built built) {
        this.built = built;
    }

    RedisTransports.Built built() {
        return built;
    }

    /** Whether the transport's calls block their thread (Jedis): the WebFilter then moves them off the event loop. */
    public boolean blocking() {
        return built.blocking();
    }

    @Override
    public void close() {
        if (built.owned() != null) {
            try {
                built.owned().close();
            } catch (Exception e) {
                throw new IllegalStateException("xcloak: closing the Redis client failed", e);
            }
        }
    }
}
