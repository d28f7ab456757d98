package io.xcloak;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.lettuce.core.RedisClient;
import io.lettuce.core.RedisURI;
import io.lettuce.core.api.StatefulRedisConnection;
import io.lettuce.core.codec.StringCodec;
import io.lettuce.core.output.IntegerOutput;
import io.lettuce.core.protocol.CommandArgs;
import io.lettuce.core.protocol.CommandType;
import io.xcloak.lettuce.LettuceTransport;
import java.time.Duration;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeoutException;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.EnumSource;

/**
 * docs/clients.md, "Errors": an outage or a timeout goes to the error policy, and a call that may
 * have been applied is never sent again, neither by the package nor by the client library. Each
 * timed-out call is counted on the server (INFO commandstats): exactly once.
 */
class FaultsTest {
    static final Duration TIMEOUT = Duration.ofMillis(300);
    static final Request REQUEST = Request.of("faults", Duration.ofMinutes(1), 10);

    RedisServer server;
    Clients clients;

    @BeforeEach
    void start() {
        server = RedisServer.withModule();
        clients = new Clients();
    }

    @AfterEach
    void stop() {
        clients.close();
        server.close();
    }

    private Limiter limiter(Clients.Library library, ErrorPolicy policy) {
        return Limiter.builder(clients.transport(library, server)).timeout(TIMEOUT).onError(policy).build();
    }

    @ParameterizedTest
    @EnumSource(Clients.Library.class)
    void a_call_into_a_paused_server_times_out_and_runs_once(Clients.Library library) {
        Limiter limiter = limiter(library, ErrorPolicy.RAISE);
        assertEquals(9, limiter.allow(REQUEST).remaining()); // connected
        server.pause();
        long started = System.nanoTime();
        XcloakUnavailableException e = assertThrows(XcloakUnavailableException.class, () -> limiter.allow(REQUEST));
        long tookMs = (System.nanoTime() - started) / 1_000_000;
        server.resume();
        assertInstanceOf(TimeoutException.class, e.getCause(), e.toString());
        assertTrue(tookMs < 3_000, "the limiter's timeout bounds the call: " + tookMs + " ms");
        // The server ran the timed-out call when it resumed, once: the next call sees both.
        assertTrue(RedisServer.eventually(Duration.ofSeconds(5), () -> server.calls("xcloak.allow") == 2),
                "calls: " + server.calls("xcloak.allow"));
        Decision next = limiter.allow(REQUEST);
        assertEquals(7, next.remaining(), "the timed-out call was applied once, not twice: " + next);
        assertEquals(3, server.calls("xcloak.allow"));
    }

    @ParameterizedTest
    @EnumSource(Clients.Library.class)
    void the_policy_answers_a_timeout_and_the_call_still_runs_once(Clients.Library library) {
        Limiter deny = limiter(library, ErrorPolicy.DENY);
        deny.allow(REQUEST);
        server.pause();
        Decision d = deny.allow(REQUEST);
        server.resume();
        assertFalse(d.allowed());
        assertEquals(Via.ERROR, d.via());
        assertInstanceOf(XcloakUnavailableException.class, d.error());
        assertTrue(d.headers(Headers.Style.BOTH).isEmpty(), "an error decision makes no header");
        assertTrue(RedisServer.eventually(Duration.ofSeconds(5), () -> server.calls("xcloak.allow") == 2));
        assertEquals(7, deny.allow(REQUEST).remaining());
    }

    @ParameterizedTest
    @EnumSource(Clients.Library.class)
    void a_write_held_by_client_pause_times_out_and_runs_once(Clients.Library library) {
        Limiter limiter = limiter(library, ErrorPolicy.RAISE);
        limiter.allow(REQUEST);
        server.cmd("CLIENT", "PAUSE", "10000", "WRITE");
        XcloakUnavailableException e = assertThrows(XcloakUnavailableException.class, () -> limiter.allow(REQUEST));
        assertInstanceOf(TimeoutException.class, e.getCause());
        assertEquals(1, server.calls("xcloak.allow"), "held, not run, while paused");
        if (library == Clients.Library.JEDIS) {
            // Jedis destroys a connection that timed out: the server frees the client and
            // drops the command it held, so the call ran never (at most once), not late.
            assertTrue(RedisServer.eventually(Duration.ofSeconds(5),
                    () -> !String.valueOf(server.cmd("CLIENT", "LIST")).contains("xcloak.allow")),
                    String.valueOf(server.cmd("CLIENT", "LIST")));
            server.cmd("CLIENT", "UNPAUSE");
            assertEquals(8, limiter.allow(REQUEST).remaining());
            assertEquals(2, server.calls("xcloak.allow"));
            return;
        }
        // Lettuce keeps the connection: the held call runs when the pause ends, once.
        server.cmd("CLIENT", "UNPAUSE");
        assertTrue(RedisServer.eventually(Duration.ofSeconds(5), () -> server.calls("xcloak.allow") == 2));
        assertEquals(7, limiter.allow(REQUEST).remaining());
        assertEquals(3, server.calls("xcloak.allow"));
    }

    @ParameterizedTest
    @EnumSource(Clients.Library.class)
    void a_stopped_server_goes_to_the_policy_and_a_refusal_never_does(Clients.Library library) {
        Limiter allow = limiter(library, ErrorPolicy.ALLOW);
        allow.allow(REQUEST);
        // A bad argument is the server's refusal: raised whatever the policy.
        XcloakException refusal = assertThrows(XcloakException.class,
                () -> allow.allow(Request.of("faults", Duration.ZERO, 10)));
        assertFalse(refusal instanceof XcloakUnavailableException);
        assertEquals("ERR window must be an integer from 1 to 9007199254740991 (milliseconds)", refusal.getMessage());
        server.kill();
        Decision d = allow.allow(REQUEST);
        assertTrue(d.allowed());
        assertEquals(Via.ERROR, d.via());
        // refund and reset return no Decision: an outage there is always raised.
        assertThrows(XcloakUnavailableException.class, () -> allow.refund("faults", 1));
        assertThrows(XcloakUnavailableException.class, () -> allow.reset("faults"));
        // Under RAISE, the outage itself.
        Limiter raise = Limiter.builder(clients.transport(library, server)).timeout(TIMEOUT).build();
        assertThrows(XcloakUnavailableException.class, () -> raise.allow(REQUEST));
    }

    /**
     * Lettuce's reconnect writes again the commands that were written but not answered when the
     * connection dropped (its at-least-once mode, on by default; the first of them gets the
     * connection's error instead). A limiter's ALLOW is never among them: a call sent into a paused
     * server that then dies is not run by the server that comes back. The controls, plain
     * {@code dispatch}es of INCR around it, show the replay the limiter avoids.
     */
    @Test
    void lettuce_never_writes_a_sent_allow_again_after_a_reconnect() throws Exception {
        RedisClient client = Shared.lettuce(RedisURI.create("127.0.0.1", server.port));
        try (StatefulRedisConnection<String, String> connection = client.connect()) {
            Limiter limiter = Limiter.builder(LettuceTransport.of(connection)).timeout(Duration.ofSeconds(2)).build();
            limiter.allow(REQUEST);
            server.pause();
            CompletableFuture<Long> before = incr(connection, "control-before");
            CompletableFuture<Decision> inFlight = limiter.allowAsync(REQUEST).toCompletableFuture();
            CompletableFuture<Long> after = incr(connection, "control-after");
            RedisServer.sleep(100); // all three written to the socket
            server.killPaused();
            server.restart();
            assertEquals(1L, after.get(), "Lettuce replays a plain dispatch after a reconnect (the control)");
            assertTrue(RedisServer.eventually(Duration.ofSeconds(5),
                    () -> "1".equals(String.valueOf(server.cmd("GET", "control-after")))));
            Throwable failure = assertThrows(Exception.class, inFlight::join);
            assertInstanceOf(XcloakUnavailableException.class, Engine.unwrap(failure));
            assertEquals(0, server.calls("xcloak.allow"), "the sent ALLOW was not written again");
            assertEquals(9, limiter.allow(REQUEST).remaining(), "the limiter works on the new connection");
            assertTrue(before.isDone());
        } finally {
            client.shutdown();
        }
    }

    private static CompletableFuture<Long> incr(StatefulRedisConnection<String, String> connection, String key) {
        return connection.async().dispatch(CommandType.INCR, new IntegerOutput<>(StringCodec.UTF8),
                new CommandArgs<>(StringCodec.UTF8).addKey(key)).toCompletableFuture();
    }
}
