package io.xcloak;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.lettuce.core.RedisURI;
import io.lettuce.core.cluster.RedisClusterClient;
import io.lettuce.core.cluster.api.StatefulRedisClusterConnection;
import io.xcloak.jedis.JedisTransport;
import io.xcloak.lettuce.LettuceTransport;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Set;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import redis.clients.jedis.DefaultJedisClientConfig;
import redis.clients.jedis.HostAndPort;

/**
 * A 3+3 Redis Cluster whose first primary (and its replica) has no module: every call goes
 * straight to the node that serves its key (0 MOVED on every node, INFO errorstats), the choice of
 * command or script is made per node, and peeks read from replicas where asked.
 */
class ClusterTest {
    static RedisCluster cluster;

    @BeforeAll
    static void start() {
        cluster = new RedisCluster(false, true, true);
    }

    @AfterAll
    static void stop() {
        cluster.close();
    }

    @BeforeEach
    void reset() {
        for (RedisServer p : cluster.primaries) {
            p.cmd("FLUSHALL");
        }
        cluster.resetStats();
    }

    static final List<String> KEYS = keys();

    private static List<String> keys() {
        List<String> keys = new ArrayList<>();
        for (int i = 0; i < 60; i++) {
            keys.add("cluster:user:" + i);
        }
        return keys;
    }

    /** Each key once, twice: via per the key's node; 0 MOVED; peeks on replicas. */
    private void check(Limiter limiter, boolean replicaPeeks) {
        int script = 0;
        for (String key : KEYS) {
            Request request = Request.of(key, Duration.ofMinutes(1), 5);
            Via expected = cluster.owner(key) == cluster.primaries.get(0) ? Via.SCRIPT : Via.COMMAND;
            assertEquals(4, limiter.allow(request).remaining(), key);
            Decision second = limiter.allow(request);
            assertEquals(3, second.remaining(), key);
            assertEquals(expected, second.via(), key + " on " + cluster.owner(key).port);
            script += expected == Via.SCRIPT ? 1 : 0;
            limiter.peek(request);
        }
        assertTrue(script > 0 && script < KEYS.size(), "keys on both kinds of node: " + script);
        List<RedisServer> nodes = cluster.nodes();
        assertEquals(0, RedisCluster.sum(nodes, "errorstats", "errorstat_MOVED", "count"), "no MOVED");
        assertEquals(0, RedisCluster.sum(nodes, "errorstats", "errorstat_ASK", "count"), "no ASK");
        // The module's nodes ran each allow once; the script's node ran them through EVALSHA.
        assertEquals(2L * (KEYS.size() - script), RedisCluster.sum(nodes, "commandstats", "cmdstat_xcloak.allow", "calls"));
        long peeksOnReplicas = RedisCluster.sum(cluster.replicas, "commandstats", "cmdstat_xcloak.peek", "calls")
                + RedisCluster.sum(cluster.replicas, "commandstats", "cmdstat_evalsha_ro", "calls");
        long peeksOnPrimaries = RedisCluster.sum(cluster.primaries, "commandstats", "cmdstat_xcloak.peek", "calls")
                + RedisCluster.sum(cluster.primaries, "commandstats", "cmdstat_evalsha_ro", "calls");
        if (replicaPeeks) {
            assertEquals(KEYS.size(), peeksOnReplicas);
            assertEquals(0, peeksOnPrimaries);
        } else {
            assertEquals(0, peeksOnReplicas);
            assertEquals(KEYS.size(), peeksOnPrimaries);
        }
        // allow_all across slots, rolled back on the node of each earlier key.
        Request open = Request.of(KEYS.get(0), Duration.ofMinutes(1), 5);
        Request full = Request.of(KEYS.get(1), Duration.ofMinutes(1), 2);
        MultiDecision m = limiter.allowAll(List.of(open, full));
        assertEquals(1, m.rejected().getAsInt(), m.toString());
        assertEquals(3, limiter.peek(open).remaining(), "the admission on the first key was refunded");
    }

    @Test
    void lettuce() {
        RedisClusterClient client = Shared.lettuceCluster(RedisURI.create("127.0.0.1", cluster.primaries.get(1).port));
        try (StatefulRedisClusterConnection<String, String> connection = client.connect()) {
            check(Limiter.builder(LettuceTransport.of(connection)).build(), false);
            reset();
            check(Limiter.builder(LettuceTransport.of(connection, true)).build(), true);
        } finally {
            client.shutdown();
        }
    }

    @Test
    void jedis() {
        try (redis.clients.jedis.RedisClusterClient client = redis.clients.jedis.RedisClusterClient.create(
                Set.of(new HostAndPort("127.0.0.1", cluster.primaries.get(1).port)))) {
            check(Limiter.builder(JedisTransport.of(client)).build(), false);
            reset();
            assertThrows(IllegalArgumentException.class, () -> JedisTransport.of(client, true),
                    "replica reads need readOnlyForRedisClusterReplicas(): refused at build");
        }
        reset();
        try (redis.clients.jedis.RedisClusterClient client = redis.clients.jedis.RedisClusterClient.builder()
                .nodes(Set.of(new HostAndPort("127.0.0.1", cluster.primaries.get(1).port)))
                .clientConfig(DefaultJedisClientConfig.builder().readOnlyForRedisClusterReplicas().build())
                .build()) {
            check(Limiter.builder(JedisTransport.of(client, true)).build(), true);
        }
    }
}
