package io.xcloak.lettuce;

import io.lettuce.core.RedisClient;
import io.lettuce.core.api.StatefulRedisConnection;
import io.lettuce.core.cluster.RedisClusterClient;
import io.lettuce.core.cluster.api.StatefulRedisClusterConnection;
import io.xcloak.Transport;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionStage;

/**
 * The {@link Transport} over Lettuce: a standalone or Sentinel connection, or a Redis Cluster
 * connection (each call goes straight to the node that serves its key's slot, so no MOVED).
 * Commands go out through {@code dispatch}; a command that was written is never re-sent by
 * Lettuce's reconnect (its at-least-once replay), so a call that may have run is never run twice.
 */
public final class LettuceTransport implements Transport {
    private LettuceTransport() {}

    /** Over an open standalone or Sentinel connection (any codec); not closed by {@link #close()}. */
    public static LettuceTransport of(StatefulRedisConnection<?, ?> connection) {
        return new LettuceTransport();
    }

    /** As {@link #of(StatefulRedisConnection)}; peeks read from {@code replica}. */
    public static LettuceTransport of(StatefulRedisConnection<?, ?> connection, StatefulRedisConnection<?, ?> replica) {
        return new LettuceTransport();
    }

    /** Opens its own connection from {@code client} (a standalone or Sentinel RedisURI), closed by {@link #close()}. */
    public static LettuceTransport of(RedisClient client) {
        return new LettuceTransport();
    }

    /** Over an open cluster connection; not closed by {@link #close()}. */
    public static LettuceTransport of(StatefulRedisClusterConnection<?, ?> connection) {
        return new LettuceTransport();
    }

    /** Over an open cluster connection; with {@code replicaReads}, peeks go to a replica of the key's primary. */
    public static LettuceTransport of(StatefulRedisClusterConnection<?, ?> connection, boolean replicaReads) {
        return new LettuceTransport();
    }

    /** Opens its own cluster connection from {@code client}, closed by {@link #close()}. */
    public static LettuceTransport of(RedisClusterClient client) {
        return new LettuceTransport();
    }

    @Override
    public CompletionStage<Reply> send(Call call) {
        return CompletableFuture.failedFuture(new UnsupportedOperationException("skeleton"));
    }
}
