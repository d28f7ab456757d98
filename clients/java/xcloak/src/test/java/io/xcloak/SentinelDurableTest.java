package io.xcloak;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.lettuce.core.RedisClient;
import io.lettuce.core.RedisURI;
import io.lettuce.core.api.StatefulRedisConnection;
import io.xcloak.jedis.JedisTransport;
import io.xcloak.lettuce.LettuceTransport;
import java.time.Duration;
import java.util.List;
import java.util.Set;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.EnumSource;
import redis.clients.jedis.HostAndPort;
import redis.clients.jedis.RedisSentinelClient;

/**
 * A primary with a replica, watched by a Sentinel: both libraries reach the primary through the
 * Sentinel; durable mode counts an admission only once the replica holds it (WAIT on the call's
 * connection), and a paused replica sends admissions to the error policy; peeks read a replica.
 */
class SentinelDurableTest {
    static RedisServer primary;
    static RedisServer replica;
    static RedisServer sentinel;
    static Clients clients;

    @BeforeAll
    static void start() {
        primary = RedisServer.withModule();
        replica = RedisServer.withModule("--replicaof", "127.0.0.1", Integer.toString(primary.port));
        assertTrue(RedisServer.eventually(Duration.ofSeconds(30),
                () -> replica.info("replication").contains("master_link_status:up")));
        sentinel = RedisServer.sentinel(primary);
        assertTrue(RedisServer.eventually(Duration.ofSeconds(30), () -> sentinel.cmd("SENTINEL",
                "get-master-addr-by-name", "xcloak") instanceof List<?> addr && addr.size() == 2));
        clients = new Clients();
    }

    @AfterAll
    static void stop() {
        clients.close();
        sentinel.close();
        replica.close();
        primary.close();
    }

    @BeforeEach
    void reset() {
        primary.cmd("FLUSHALL");
        primary.cmd("CONFIG", "RESETSTAT");
        replica.cmd("CONFIG", "RESETSTAT");
    }

    private Transport sentinelTransport(Clients.Library library) {
        if (library == Clients.Library.LETTUCE) {
            RedisClient client = Shared.lettuce(RedisURI.Builder.sentinel("127.0.0.1", sentinel.port, "xcloak").build());
            Transport t = LettuceTransport.of(client);
            closing(t, client);
            return t;
        }
        RedisSentinelClient client = RedisSentinelClient.builder().masterName("xcloak")
                .sentinels(Set.of(new HostAndPort("127.0.0.1", sentinel.port))).build();
        Transport t = JedisTransport.of(client);
        closing(client::close, null);
        return t;
    }

    private static final java.util.List<Runnable> CLEANUP = new java.util.ArrayList<>();

    private static void closing(AutoCloseable c, RedisClient client) {
        CLEANUP.add(() -> {
            try {
                c.close();
            } catch (Exception e) {
                // closing
            }
            if (client != null) {
                client.shutdown();
            }
        });
    }

    @AfterAll
    static void cleanup() {
        CLEANUP.forEach(Runnable::run);
    }

    @ParameterizedTest
    @EnumSource(Clients.Library.class)
    void through_the_sentinel_and_durable(Clients.Library library) {
        Transport transport = sentinelTransport(library);
        Request request = Request.of("durable:" + library, Duration.ofMinutes(1), 5);
        Limiter plain = Limiter.builder(transport).build();
        assertEquals(4, plain.allow(request).remaining());
        assertEquals(1, primary.calls("xcloak.allow"), "the Sentinel's primary answered");

        Limiter raise = Limiter.builder(transport).durable(1, Duration.ofMillis(300)).build();
        Decision durable = raise.allow(request);
        assertTrue(durable.allowed());
        assertTrue(durable.stamp().isEmpty(), "STAMP is sent in durable mode, shown only if asked");
        assertEquals(1, primary.calls("wait"), "one WAIT after the admission");

        replica.pause();
        try {
            XcloakUnavailableException e = assertThrows(XcloakUnavailableException.class, () -> raise.allow(request));
            XcloakNotReplicatedException cause = assertInstanceOf(XcloakNotReplicatedException.class, e.getCause());
            assertEquals(0, cause.acknowledged());
            assertEquals(1, cause.wanted());

            Limiter deny = Limiter.builder(transport).durable(1, Duration.ofMillis(300)).onError(ErrorPolicy.DENY).build();
            long before = plain.peek(request).remaining();
            Decision denied = deny.allow(request);
            assertFalse(denied.allowed());
            assertEquals(Via.ERROR, denied.via());
            assertInstanceOf(XcloakNotReplicatedException.class, denied.error().getCause());
            assertEquals(before, plain.peek(request).remaining(), "under deny the admission was refunded");

            Limiter allow = Limiter.builder(transport).durable(1, Duration.ofMillis(300)).onError(ErrorPolicy.ALLOW).build();
            assertTrue(allow.allow(request).allowed());

            // A rejection sends no WAIT: it wrote nothing.
            Request spent = Request.of("durable:spent:" + library, Duration.ofMinutes(1), 1);
            plain.allow(spent);
            long waits = primary.calls("wait");
            Decision rejected = raise.allow(spent);
            assertFalse(rejected.allowed());
            assertEquals(Via.COMMAND, rejected.via());
            assertEquals(waits, primary.calls("wait"));
        } finally {
            replica.resume();
        }
    }

    @Test
    void lettuce_peeks_read_the_replica() {
        RedisClient client = Shared.lettuce();
        try (StatefulRedisConnection<String, String> p = client.connect(RedisURI.create("127.0.0.1", primary.port));
                StatefulRedisConnection<String, String> r = client.connect(RedisURI.create("127.0.0.1", replica.port))) {
            Limiter limiter = Limiter.builder(LettuceTransport.of(p, r)).build();
            Request request = Request.of("replica-peek", Duration.ofMinutes(1), 5);
            limiter.allow(request);
            limiter.peek(request);
            assertEquals(1, replica.calls("xcloak.peek"));
            assertEquals(0, primary.calls("xcloak.peek"));
            assertEquals(1, primary.calls("xcloak.allow"));
        } finally {
            client.shutdown();
        }
    }
}
