package io.xcloak;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.atomic.AtomicLong;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.EnumSource;

/**
 * docs/clients.md, "Fallback": the script answers a server without the module, NOSCRIPT is
 * answered by the script's text, a later MODULE LOAD is picked up at the next probe; NEVER raises
 * the unknown command, ALWAYS uses the script from the first call. And acquire against a real
 * clock: it sleeps the server's retry-after and is admitted; a cancelled wait sends nothing more.
 */
class FallbackTest {
    RedisServer server;
    Clients clients;

    @BeforeEach
    void start() {
        server = RedisServer.plain("--enable-module-command", "yes");
        clients = new Clients();
    }

    @AfterEach
    void stop() {
        clients.close();
        server.close();
    }

    @ParameterizedTest
    @EnumSource(Clients.Library.class)
    void the_script_then_the_module_at_the_next_probe(Clients.Library library) {
        AtomicLong now = new AtomicLong(1_000_000_000L);
        Limiter limiter = Limiter.builder(clients.transport(library, server)).probeInterval(Duration.ofSeconds(60))
                .monotonicNanos(now::get).build();
        Request request = Request.of("fallback", Duration.ofMinutes(1), 10);
        limiter.reset("fallback"); // connected (a client's own setup may draw errors of its own)
        long errors = server.stat("errorstats", "errorstat_ERR", "count");
        assertEquals(Via.SCRIPT, limiter.allow(request).via());
        assertEquals(Via.SCRIPT, limiter.allow(request).via());
        assertEquals(errors + 1, server.stat("errorstats", "errorstat_ERR", "count"), "one unknown command, then the script");
        // A flushed script cache: NOSCRIPT, then the text (EVAL) runs it once.
        server.cmd("SCRIPT", "FLUSH");
        assertEquals(7, limiter.allow(request).remaining());
        assertEquals(2, server.calls("eval"), "the first script call's NOSCRIPT, and this one's");
        server.cmd("MODULE", "LOAD", RedisServer.module().toString());
        assertEquals(Via.SCRIPT, limiter.allow(request).via(), "before the probe interval");
        now.addAndGet(Duration.ofSeconds(60).toNanos());
        Decision probed = limiter.allow(request);
        assertEquals(Via.COMMAND, probed.via(), "the probe found the module");
        assertEquals(5, probed.remaining(), "the module reads the script's window: one exact log");
        assertEquals(Via.COMMAND, limiter.allow(request).via());
        assertEquals(2, server.calls("xcloak.allow"));
    }

    @ParameterizedTest
    @EnumSource(Clients.Library.class)
    void never_raises_the_unknown_command_and_always_uses_the_script(Clients.Library library) {
        Transport transport = clients.transport(library, server);
        Limiter never = Limiter.builder(transport).fallback(Fallback.NEVER).onError(ErrorPolicy.ALLOW).build();
        Request request = Request.of("never", Duration.ofMinutes(1), 10);
        XcloakException e = assertThrows(XcloakException.class, () -> never.allow(request));
        assertFalse(e instanceof XcloakUnavailableException, "a refusal, not an outage: " + e);
        assertTrue(e.getMessage().startsWith("ERR unknown command"), e.getMessage());
        Limiter always = Limiter.builder(transport).fallback(Fallback.ALWAYS).build();
        assertEquals(Via.SCRIPT, always.allow(request).via());
        assertEquals(Via.SCRIPT, always.peek(request).via());
        assertEquals(1, server.calls("evalsha_ro"), "a peek through the script is read-only");
    }

    @ParameterizedTest
    @EnumSource(Clients.Library.class)
    void acquire_sleeps_the_retry_after_and_a_cancelled_wait_sends_nothing_more(Clients.Library library) {
        Limiter limiter = Limiter.builder(clients.transport(library, server)).fallback(Fallback.ALWAYS).build();
        Request request = Request.of("acquire:" + library, Duration.ofMillis(300), 1);
        assertTrue(limiter.allow(request).allowed());
        long started = System.nanoTime();
        Decision d = limiter.acquire(request, Duration.ofSeconds(5));
        long waitedMs = (System.nanoTime() - started) / 1_000_000;
        assertTrue(d.allowed(), d.toString());
        assertTrue(waitedMs >= 250, "slept the server's retry-after: " + waitedMs + " ms");
        long calls = server.calls("evalsha");
        CompletableFuture<Decision> waiting = limiter.acquireAsync(request, Duration.ofSeconds(5)).toCompletableFuture();
        assertTrue(RedisServer.eventually(Duration.ofSeconds(2), () -> server.calls("evalsha") == calls + 1));
        waiting.cancel(true);
        RedisServer.sleep(600); // past the retry-after and its jitter: a live wait would have sent again
        assertEquals(calls + 1, server.calls("evalsha"), "a cancelled wait sends nothing more");
        // A deadline shorter than the retry-after: the rejection, at once.
        Decision rejected = limiter.acquire(request.withKey("acquire:dl:" + library), Duration.ZERO);
        assertTrue(rejected.allowed());
        Decision late = limiter.acquire(request.withKey("acquire:dl:" + library), Duration.ofMillis(10));
        assertFalse(late.allowed());
    }
}
