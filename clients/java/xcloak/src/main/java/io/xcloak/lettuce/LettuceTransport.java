package io.xcloak.lettuce;

import io.lettuce.core.RedisClient;
import io.lettuce.core.RedisURI;
import io.lettuce.core.api.StatefulRedisConnection;
import io.lettuce.core.cluster.RedisClusterClient;
import io.lettuce.core.cluster.SlotHash;
import io.lettuce.core.cluster.api.StatefulRedisClusterConnection;
import io.lettuce.core.cluster.models.partitions.Partitions;
import io.lettuce.core.cluster.models.partitions.RedisClusterNode;
import io.lettuce.core.codec.ByteArrayCodec;
import io.lettuce.core.protocol.AsyncCommand;
import io.lettuce.core.protocol.Command;
import io.lettuce.core.protocol.CommandArgs;
import io.lettuce.core.protocol.ProtocolKeyword;
import io.xcloak.Transport;
import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionStage;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;

/**
 * The {@link Transport} over Lettuce: a standalone or Sentinel connection, or a Redis Cluster
 * connection, where each call goes straight to the connection of the node that serves its key's
 * slot (so no MOVED; one that comes after a resharding is followed once: nothing was applied).
 * Commands go out through {@code dispatch} with an output that keeps the nested array reply as it
 * came. A command that was written is never written again by Lettuce's reconnect (its
 * at-least-once replay of unanswered commands; see {@link OnceCommand}), so a call that may have
 * run never runs twice; the limiter's timeout ends the wait for its reply.
 */
public final class LettuceTransport implements Transport {
    private volatile StatefulRedisConnection<?, ?> primary;
    private final java.util.function.Supplier<StatefulRedisConnection<byte[], byte[]>> connector;
    private final StatefulRedisConnection<?, ?> replica;
    private final StatefulRedisClusterConnection<?, ?> cluster;
    private final boolean replicaReads;
    private volatile AutoCloseable owned;

    private LettuceTransport(StatefulRedisConnection<?, ?> primary, StatefulRedisConnection<?, ?> replica,
            StatefulRedisClusterConnection<?, ?> cluster, boolean replicaReads, AutoCloseable owned) {
        this(primary, null, replica, cluster, replicaReads, owned);
    }

    private LettuceTransport(StatefulRedisConnection<?, ?> primary,
            java.util.function.Supplier<StatefulRedisConnection<byte[], byte[]>> connector,
            StatefulRedisConnection<?, ?> replica, StatefulRedisClusterConnection<?, ?> cluster, boolean replicaReads,
            AutoCloseable owned) {
        this.primary = primary;
        this.connector = connector;
        this.replica = replica;
        this.cluster = cluster;
        this.replicaReads = replicaReads;
        this.owned = owned;
    }

    /** Over an open standalone or Sentinel connection (any codec); not closed by {@link #close()}. */
    public static LettuceTransport of(StatefulRedisConnection<?, ?> connection) {
        return new LettuceTransport(requireNonNull(connection, "connection"), null, null, false, null);
    }

    /** As {@link #of(StatefulRedisConnection)}; peeks read from {@code replica} (a connection to a replica). */
    public static LettuceTransport of(StatefulRedisConnection<?, ?> connection, StatefulRedisConnection<?, ?> replica) {
        return new LettuceTransport(
                requireNonNull(connection, "connection"), requireNonNull(replica, "replica"), null, true, null);
    }

    /**
     * Opens its own connection from {@code client} (a standalone RedisURI, or a Sentinel one:
     * {@code RedisURI.Builder.sentinel(host, port, masterId)}); {@link #close()} closes it.
     */
    public static LettuceTransport of(RedisClient client) {
        requireNonNull(client, "client");
        return new LettuceTransport(null, () -> client.connect(ByteArrayCodec.INSTANCE), null, null, false, null);
    }

    /** Opens its own connection to {@code uri} with {@code client}; {@link #close()} closes it. */
    public static LettuceTransport of(RedisClient client, RedisURI uri) {
        requireNonNull(client, "client");
        requireNonNull(uri, "uri");
        return new LettuceTransport(null, () -> client.connect(ByteArrayCodec.INSTANCE, uri), null, null, false, null);
    }

    /**
     * The standalone connection; a transport made from a client connects on its first call (a
     * server that is down then is an outage of that call, and the next call connects again).
     */
    private StatefulRedisConnection<?, ?> primary() {
        StatefulRedisConnection<?, ?> connection = primary;
        if (connection != null) {
            return connection;
        }
        synchronized (this) {
            if (primary == null) {
                StatefulRedisConnection<byte[], byte[]> opened = connector.get();
                owned = opened;
                primary = opened;
            }
            return primary;
        }
    }

    /** Over an open cluster connection; not closed by {@link #close()}. */
    public static LettuceTransport of(StatefulRedisClusterConnection<?, ?> connection) {
        return of(connection, false);
    }

    /**
     * Over an open cluster connection; with {@code replicaReads}, peeks go to a replica of the key's
     * primary (the primary when it has none).
     */
    public static LettuceTransport of(StatefulRedisClusterConnection<?, ?> connection, boolean replicaReads) {
        return new LettuceTransport(null, null, requireNonNull(connection, "connection"), replicaReads, null);
    }

    /** Opens its own cluster connection from {@code client}; {@link #close()} closes it. */
    public static LettuceTransport of(RedisClusterClient client) {
        StatefulRedisClusterConnection<byte[], byte[]> connection = client.connect(ByteArrayCodec.INSTANCE);
        return new LettuceTransport(null, null, connection, false, connection);
    }

    private static <T> T requireNonNull(T value, String name) {
        if (value == null) {
            throw new IllegalArgumentException(name + " must be a connection, not null");
        }
        return value;
    }

    @Override
    public String node(String key, boolean read) {
        if (cluster == null) {
            return read && replica != null ? "replica" : "";
        }
        RedisClusterNode node = route(key, read);
        return node == null ? "slot " + SlotHash.getSlot(key) : name(node);
    }

    private static String name(RedisClusterNode node) {
        RedisURI uri = node.getUri();
        return uri.getHost() + ":" + uri.getPort();
    }

    /** The node that serves {@code key} ({@code read}: a replica of it, with replica reads). */
    private RedisClusterNode route(String key, boolean read) {
        Partitions partitions = cluster.getPartitions();
        RedisClusterNode primaryNode = partitions.getPartitionBySlot(SlotHash.getSlot(key.getBytes(StandardCharsets.UTF_8)));
        if (primaryNode == null || !read || !replicaReads) {
            return primaryNode;
        }
        for (RedisClusterNode candidate : partitions) {
            if (primaryNode.getNodeId().equals(candidate.getSlaveOf())
                    && !candidate.is(RedisClusterNode.NodeFlag.FAIL)
                    && !candidate.is(RedisClusterNode.NodeFlag.EVENTUAL_FAIL)) {
                return candidate;
            }
        }
        return primaryNode;
    }

    @Override
    public CompletionStage<Reply> send(Call call) {
        if (cluster == null) {
            StatefulRedisConnection<?, ?> connection;
            try {
                connection = call.read() && replica != null ? replica : primary();
            } catch (RuntimeException e) {
                return CompletableFuture.failedFuture(e);
            }
            return exchange(connection, call, node(call.key(), call.read()), null, true);
        }
        RedisClusterNode node = route(call.key(), call.read());
        if (node == null) {
            return CompletableFuture.failedFuture(new IllegalStateException(
                    "no node serves the slot of " + call.key() + " (the cluster's slot map is empty)"));
        }
        StatefulRedisConnection<?, ?> connection;
        try {
            connection = connection(node.getUri().getHost(), node.getUri().getPort(), call.read() && replicaReads);
        } catch (RuntimeException e) {
            return CompletableFuture.failedFuture(e);
        }
        return exchange(connection, call, name(node), null, true);
    }

    private StatefulRedisConnection<?, ?> connection(String host, int port, boolean read) {
        return cluster.getConnection(host, port,
                read ? io.lettuce.core.protocol.ConnectionIntent.READ
                        : io.lettuce.core.protocol.ConnectionIntent.WRITE);
    }

    /**
     * Sends {@code call} on {@code connection} (after ASKING when {@code asking}), then its WAIT; a
     * MOVED or ASK (nothing was applied) is followed once in a cluster.
     */
    private CompletionStage<Reply> exchange(StatefulRedisConnection<?, ?> connection, Call call, String node,
            String asking, boolean follow) {
        if (asking != null) {
            dispatch(connection, List.of("ASKING".getBytes(StandardCharsets.US_ASCII)), call.timeout().toMillis());
        }
        return dispatch(connection, call.command(), call.timeout().toMillis()).thenCompose(value -> {
            if (cluster != null && follow && value instanceof ErrorReply error
                    && (error.code().equals("MOVED") || error.code().equals("ASK"))) {
                return redirect(call, error);
            }
            Wait then = call.then();
            if (then == null || !then.when().test(value)) {
                return CompletableFuture.completedFuture(new Reply(value, node));
            }
            List<byte[]> wait = List.of("WAIT".getBytes(StandardCharsets.US_ASCII),
                    Long.toString(then.replicas()).getBytes(StandardCharsets.US_ASCII),
                    Long.toString(then.timeoutMillis()).getBytes(StandardCharsets.US_ASCII));
            return dispatch(connection, wait, then.timeoutMillis() + call.timeout().toMillis())
                    .handle((waitReply, waitError) -> new Reply(value, node, waitReply, waitError));
        });
    }

    private CompletionStage<Reply> redirect(Call call, ErrorReply error) {
        // "MOVED 3999 127.0.0.1:6381" / "ASK 3999 127.0.0.1:6381"
        String[] parts = error.message().split(" ");
        String address = parts.length > 2 ? parts[2] : "";
        int colon = address.lastIndexOf(':');
        if (colon < 0) {
            return CompletableFuture.completedFuture(new Reply(error, node(call.key(), call.read())));
        }
        String host = address.substring(0, colon);
        int port = Integer.parseInt(address.substring(colon + 1));
        StatefulRedisConnection<?, ?> target;
        try {
            target = connection(host, port, false);
        } catch (RuntimeException e) {
            return CompletableFuture.failedFuture(e);
        }
        boolean ask = error.code().equals("ASK");
        return exchange(target, call, host + ":" + port, ask ? "ASKING" : null, false);
    }

    /**
     * One command through {@code dispatch}, written at most once, bounded by {@code timeoutMillis}
     * on Lettuce's own timer (the one its command timeouts use: cheaper per call than a scheduled
     * executor).
     */
    @SuppressWarnings({"unchecked", "rawtypes"})
    private static CompletableFuture<Object> dispatch(StatefulRedisConnection<?, ?> connection, List<byte[]> command,
            long timeoutMillis) {
        CommandArgs<byte[], byte[]> args = new CommandArgs<>(ByteArrayCodec.INSTANCE);
        for (int i = 1; i < command.size(); i++) {
            args.add(command.get(i));
        }
        Command<byte[], byte[], Object> sent = new Command<>(new Keyword(command.get(0)), new RawOutput(), args);
        AsyncCommand<byte[], byte[], Object> future = new AsyncCommand<>(sent);
        OnceCommand<byte[], byte[], Object> once = new OnceCommand<>(future);
        once.timeout(connection.getResources().timer().newTimeout(
                t -> future.completeExceptionally(new TimeoutException(
                        "no reply within the limiter's timeout (" + timeoutMillis + " ms)")),
                timeoutMillis, TimeUnit.MILLISECONDS));
        ((StatefulRedisConnection) connection).dispatch(once);
        return future;
    }

    /** A command name of our own (XCLOAK.ALLOW, EVALSHA, WAIT...). */
    private record Keyword(byte[] bytes) implements ProtocolKeyword {
        @Override
        public byte[] getBytes() {
            return bytes;
        }

        @Override
        public String toString() {
            return new String(bytes, StandardCharsets.US_ASCII);
        }
    }

    @Override
    public synchronized void close() {
        if (owned != null) {
            try {
                owned.close();
            } catch (Exception e) {
                throw new IllegalStateException("closing the limiter's own connection", e);
            }
        }
    }

}
