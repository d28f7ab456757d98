package io.xcloak.jedis;

import io.xcloak.Transport;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionStage;
import redis.clients.jedis.UnifiedJedis;
import redis.clients.jedis.providers.ClusterConnectionProvider;
import redis.clients.jedis.providers.ConnectionProvider;

/**
 * The {@link Transport} over Jedis 8: a pooled standalone client ({@code RedisClient}, the former
 * {@code JedisPooled}), a Sentinel one ({@code RedisSentinelClient}, the former
 * {@code JedisSentineled}) or a cluster ({@code RedisClusterClient}, {@code JedisCluster}). Each call
 * borrows one connection from the client's pool (in a cluster: the pool of the node that serves the
 * key's slot), sends the command there once, with the limiter's timeout as the socket's, and
 * returns the connection; Jedis's own retries ({@code maxAttempts}) never see our calls. Jedis is
 * blocking: the limiter's async methods run on the calling thread.
 */
public final class JedisTransport implements Transport {
    private JedisTransport() {}

    /** Over {@code client}'s own connection provider (its pool); the client is not closed by {@link #close()}. */
    public static JedisTransport of(UnifiedJedis client) {
        return new JedisTransport();
    }

    /** Over a connection provider: {@code PooledConnectionProvider}, {@code SentineledConnectionProvider} or {@code ClusterConnectionProvider}. */
    public static JedisTransport of(ConnectionProvider provider) {
        return new JedisTransport();
    }

    /** Over a cluster's provider; with {@code replicaReads}, peeks go to a replica of the key's slot. */
    public static JedisTransport of(ClusterConnectionProvider provider, boolean replicaReads) {
        return new JedisTransport();
    }

    @Override
    public CompletionStage<Reply> send(Call call) {
        return CompletableFuture.failedFuture(new UnsupportedOperationException("skeleton"));
    }

    @Override
    public boolean blocking() {
        return true;
    }
}
