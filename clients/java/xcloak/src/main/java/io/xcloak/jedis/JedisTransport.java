package io.xcloak.jedis;

import io.xcloak.Transport;
import java.lang.reflect.Field;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionStage;
import java.util.concurrent.TimeoutException;
import redis.clients.jedis.Connection;
import redis.clients.jedis.HostAndPort;
import redis.clients.jedis.UnifiedJedis;
import redis.clients.jedis.commands.ProtocolCommand;
import redis.clients.jedis.exceptions.JedisConnectionException;
import redis.clients.jedis.exceptions.JedisDataException;
import redis.clients.jedis.providers.ClusterConnectionProvider;
import redis.clients.jedis.providers.ConnectionProvider;
import redis.clients.jedis.util.JedisClusterCRC16;

/**
 * The {@link Transport} over Jedis 8: a pooled standalone client ({@code RedisClient}, which
 * replaced {@code JedisPooled}), a Sentinel one ({@code RedisSentinelClient}, which replaced
 * {@code JedisSentineled}) or a cluster ({@code RedisClusterClient}, {@code JedisCluster}).
 *
 * <p>Each call borrows one connection from the client's pool (in a cluster: from the pool of the
 * node that serves the key's slot, so no MOVED), sends the command there once with the limiter's
 * timeout as the socket's, reads the reply (then, in durable mode, sends {@code WAIT} on the same
 * connection), and gives the connection back (a connection that timed out is broken and closed by
 * the pool). Jedis's command executor and its retries ({@code maxAttempts}, the cluster's
 * redirections and reconnections) never see these calls: a call is never sent twice, whatever the
 * client's {@code maxAttempts}. A {@code MOVED} or {@code ASK} after a resharding (nothing was
 * applied) is followed once. Jedis blocks: the limiter's async methods run on the calling thread.
 */
public final class JedisTransport implements Transport {
    private static final byte[] WAIT = "WAIT".getBytes(StandardCharsets.US_ASCII);
    private static final byte[] ASKING = "ASKING".getBytes(StandardCharsets.US_ASCII);

    private final ConnectionProvider provider;
    private final ClusterConnectionProvider cluster;
    private final boolean replicaReads;

    private JedisTransport(ConnectionProvider provider, boolean replicaReads) {
        this.provider = provider;
        this.cluster = provider instanceof ClusterConnectionProvider c ? c : null;
        this.replicaReads = replicaReads && cluster != null;
        if (this.replicaReads) {
            checkReplicaSlots(cluster);
        }
    }

    /**
     * Jedis keeps its replicas' slots only for a client built with
     * {@code DefaultJedisClientConfig.builder().readOnlyForRedisClusterReplicas()}: refused here, at
     * build, rather than at the first peek.
     */
    private static void checkReplicaSlots(ClusterConnectionProvider cluster) {
        try {
            cluster.getReplicaConnectionFromSlot(0).close();
        } catch (NullPointerException e) {
            throw new IllegalArgumentException("replicaReads needs a cluster client whose JedisClientConfig has "
                    + "readOnlyForRedisClusterReplicas() (Jedis keeps no replica slots without it)", e);
        } catch (RuntimeException unreachable) {
            // the cluster can't be reached now: the calls will say so
        }
    }

    /**
     * Over {@code client}'s own connection provider (its pool, its Sentinel watch, its slot map):
     * {@code RedisClient}, {@code RedisSentinelClient}, {@code RedisClusterClient} or
     * {@code JedisCluster}. The client stays the caller's: {@link #close()} does not close it.
     */
    public static JedisTransport of(UnifiedJedis client) {
        if (client == null) {
            throw new IllegalArgumentException("client must be a Jedis client, not null");
        }
        return new JedisTransport(providerOf(client), false);
    }

    /**
     * As {@link #of(UnifiedJedis)}; with {@code replicaReads} (a cluster client whose
     * {@code JedisClientConfig} has {@code readOnlyForRedisClusterReplicas()}), peeks go to a
     * replica of the key's slot.
     */
    public static JedisTransport of(UnifiedJedis client, boolean replicaReads) {
        if (client == null) {
            throw new IllegalArgumentException("client must be a Jedis client, not null");
        }
        return new JedisTransport(providerOf(client), replicaReads);
    }

    /**
     * Over a connection provider: {@code PooledConnectionProvider}, {@code SentineledConnectionProvider}
     * or {@code ClusterConnectionProvider} (share it with your client through the client builder's
     * {@code connectionProvider(...)}). Not closed by {@link #close()}.
     */
    public static JedisTransport of(ConnectionProvider provider) {
        if (provider == null) {
            throw new IllegalArgumentException("provider must be a Jedis connection provider, not null");
        }
        return new JedisTransport(provider, false);
    }

    /** Over a cluster's provider; with {@code replicaReads}, peeks go to a replica of the key's slot. */
    public static JedisTransport of(ClusterConnectionProvider provider, boolean replicaReads) {
        if (provider == null) {
            throw new IllegalArgumentException("provider must be a Jedis connection provider, not null");
        }
        return new JedisTransport(provider, replicaReads);
    }

    /** The client's provider: UnifiedJedis keeps it in a protected field, with no getter. */
    private static ConnectionProvider providerOf(UnifiedJedis client) {
        try {
            Field field = UnifiedJedis.class.getDeclaredField("provider");
            field.setAccessible(true);
            Object provider = field.get(client);
            if (provider instanceof ConnectionProvider p) {
                return p;
            }
            throw new IllegalArgumentException("client has no connection provider (a client over one Connection): "
                    + "use JedisTransport.of(ConnectionProvider)");
        } catch (ReflectiveOperationException | RuntimeException e) {
            if (e instanceof IllegalArgumentException iae) {
                throw iae;
            }
            throw new IllegalArgumentException(
                    "can't read the client's connection provider: use JedisTransport.of(ConnectionProvider)", e);
        }
    }

    @Override
    public boolean blocking() {
        return true;
    }

    @Override
    public String node(String key, boolean read) {
        if (cluster == null) {
            return "";
        }
        HostAndPort node = cluster.getNode(slot(key));
        String name = node == null ? "slot " + slot(key) : node.toString();
        return read && replicaReads ? name + " replicas" : name;
    }

    private static int slot(String key) {
        return JedisClusterCRC16.getSlot(key.getBytes(StandardCharsets.UTF_8));
    }

    @Override
    public CompletionStage<Reply> send(Call call) {
        try {
            Connection connection;
            String node = node(call.key(), call.read());
            if (cluster == null) {
                connection = provider.getConnection();
            } else if (call.read() && replicaReads) {
                connection = cluster.getReplicaConnectionFromSlot(slot(call.key()));
            } else {
                connection = cluster.getConnectionFromSlot(slot(call.key()));
            }
            return CompletableFuture.completedFuture(exchange(connection, call, node, false, true));
        } catch (RuntimeException e) {
            return CompletableFuture.failedFuture(e);
        }
    }

    /** Sends {@code call} on {@code connection} (after ASKING when {@code asking}) and gives the connection back. */
    private Reply exchange(Connection connection, Call call, String node, boolean asking, boolean follow) {
        try {
            int timeout = millis(call.timeout().toMillis());
            if (asking) {
                command(connection, List.of(ASKING), timeout);
            }
            Object value = command(connection, call.command(), timeout);
            if (cluster != null && follow && value instanceof ErrorReply error
                    && (error.code().equals("MOVED") || error.code().equals("ASK"))) {
                return redirect(call, error);
            }
            Wait then = call.then();
            if (then == null || !then.when().test(value)) {
                return new Reply(value, node);
            }
            List<byte[]> wait = List.of(WAIT, ascii(then.replicas()), ascii(then.timeoutMillis()));
            try {
                Object waitReply = command(connection, wait, millis(then.timeoutMillis() + call.timeout().toMillis()));
                return new Reply(value, node, waitReply, null);
            } catch (JedisConnectionException e) {
                return new Reply(value, node, null, cause(e));
            }
        } catch (JedisConnectionException e) {
            throw new java.util.concurrent.CompletionException(cause(e));
        } finally {
            release(connection);
        }
    }

    /** Gives {@code connection} back to its pool; a broken one is destroyed (an error doing so is not the call's). */
    private static void release(Connection connection) {
        try {
            connection.close();
        } catch (RuntimeException e) {
            // destroying a broken connection to a paused or dead server
        }
    }

    private Reply redirect(Call call, ErrorReply error) {
        // "MOVED 3999 127.0.0.1:6381" / "ASK 3999 127.0.0.1:6381"
        String[] parts = error.message().split(" ");
        HostAndPort target = parts.length > 2 ? HostAndPort.from(parts[2]) : null;
        if (target == null) {
            return new Reply(error, node(call.key(), call.read()));
        }
        boolean ask = error.code().equals("ASK");
        if (!ask) {
            cluster.renewSlotCache();
        }
        return exchange(cluster.getConnection(target), call, target.toString(), ask, false);
    }

    /** One command, its reply: a server's error reply as an {@link ErrorReply}, an outage thrown. */
    private static Object command(Connection connection, List<byte[]> command, int timeoutMillis) {
        byte[] name = command.get(0);
        ProtocolCommand keyword = () -> name;
        byte[][] args = command.subList(1, command.size()).toArray(new byte[0][]);
        connection.setSoTimeout(timeoutMillis);
        try {
            connection.sendCommand(keyword, args);
            return raw(connection.getOne());
        } catch (JedisDataException e) {
            return new ErrorReply(e.getMessage());
        } finally {
            if (!connection.isBroken()) {
                connection.rollbackTimeout();
            }
        }
    }

    /** Jedis's reply as the Transport's: nested errors become ErrorReply values. */
    private static Object raw(Object value) {
        if (value instanceof List<?> list) {
            List<Object> out = new ArrayList<>(list.size());
            for (Object item : list) {
                out.add(raw(item));
            }
            return out;
        }
        if (value instanceof JedisDataException e) {
            return new ErrorReply(e.getMessage());
        }
        return value;
    }

    /** A socket timeout as TimeoutException (the limiter's timeout), anything else as it came. */
    private static Throwable cause(JedisConnectionException e) {
        for (Throwable t = e; t != null; t = t.getCause()) {
            if (t instanceof java.net.SocketTimeoutException) {
                TimeoutException timeout = new TimeoutException("no reply within the limiter's timeout: " + t.getMessage());
                timeout.initCause(e);
                return timeout;
            }
        }
        return e;
    }

    private static int millis(long ms) {
        return (int) Math.max(1, Math.min(Integer.MAX_VALUE, ms));
    }

    private static byte[] ascii(long n) {
        return Long.toString(n).getBytes(StandardCharsets.US_ASCII);
    }
}
