package io.xcloak;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.stream.Stream;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.DynamicTest;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestFactory;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.EnumSource;

/**
 * The block cache (docs/clients.md, "Block cache"): the pure vectors
 * (clients/conformance/block_cache.json) through BlockCache on a virtual monotonic clock, and the
 * live rules through a Limiter on a real server, the calls counted by INFO commandstats.
 */
class BlockCacheTest {
    static RedisServer server;
    static Clients clients;

    @BeforeAll
    static void start() {
        server = RedisServer.withModule();
        clients = new Clients();
    }

    @AfterAll
    static void stop() {
        clients.close();
        server.close();
    }

    @BeforeEach
    void flush() {
        server.cmd("FLUSHALL");
        server.cmd("CONFIG", "RESETSTAT");
    }

    @TestFactory
    @SuppressWarnings("unchecked")
    Stream<DynamicTest> vectors() {
        List<Map<String, Object>> cases = (List<Map<String, Object>>) Json.load("block_cache.json").get("cases");
        return cases.stream().map(c -> DynamicTest.dynamicTest((String) c.get("name"), () -> {
            BlockCache cache = new BlockCache(((Number) c.get("capacity")).intValue());
            List<Map<String, Object>> steps = (List<Map<String, Object>>) c.get("steps");
            for (int i = 0; i < steps.size(); i++) {
                Map<String, Object> step = steps.get(i);
                String where = c.get("name") + " step " + i + " (" + step.get("op") + ")";
                long at = Json.num(step, "at", 0) * 1_000_000L;
                String key = (String) step.get("key");
                switch ((String) step.get("op")) {
                    case "allow" -> {
                        Request request = Json.request(step);
                        BlockCache.Sig sig = BlockCache.Sig.of(request);
                        Decision hit = cache.lookup(key, sig, request.cost(), at);
                        if (Boolean.TRUE.equals(step.get("sent"))) {
                            assertNull(hit, where + ": must miss");
                            Decision server = Replies.decision(Json.reply(step.get("reply")), request.window(), false,
                                    Via.COMMAND);
                            cache.record(key, sig, request.cost(), at, server);
                        } else {
                            assertNotNull(hit, where + ": must hit");
                            Map<String, Object> expected = new LinkedHashMap<>((Map<String, Object>) step.get("decision"));
                            assertEquals("cache", expected.remove("via"), where);
                            assertEquals(Via.CACHE, hit.via(), where);
                            assertEquals(expected, Json.decision(hit), where);
                            Map<String, Object> headers = (Map<String, Object>) step.get("headers");
                            assertEquals(headers.get("ietf"), new LinkedHashMap<String, Object>(hit.headers(Headers.Style.IETF)), where);
                            assertEquals(headers.get("legacy"), new LinkedHashMap<String, Object>(hit.headers(Headers.Style.LEGACY)), where);
                        }
                    }
                    case "forget" -> cache.forget(key, at);
                    case "size" -> assertEquals(Json.num(step, "entries", -1), cache.stats().cacheEntries(), where);
                    default -> throw new AssertionError(where + ": an op this runner does not know");
                }
            }
        }));
    }

    @Test
    void aRejectionInFlightAcrossARefundOfItsKeyIsNotHeld() {
        BlockCache cache = new BlockCache(10);
        Request request = Request.of("k", Duration.ofMinutes(1), 10);
        BlockCache.Sig sig = BlockCache.Sig.of(request);
        Decision rejected = Replies.decision(Json.reply(List.of(0L, 10L, 0L, 1000L, 60000L)), request.window(), false,
                Via.COMMAND);
        long sentAt = 100_000_000L; // the allow is sent ...
        cache.forget("k", 101_000_000L); // ... a refund of the key goes through the limiter while it is in flight ...
        cache.record("k", sig, 1, sentAt, rejected); // ... and its rejection may predate the refund
        assertEquals(0, cache.stats().cacheEntries());
        String other = Stream.of("a", "b", "c").filter(k -> (k.hashCode() & 255) != ("k".hashCode() & 255))
                .findFirst().orElseThrow();
        cache.record(other, sig, 1, sentAt, rejected); // another key's rejection in flight is held
        assertNotNull(cache.lookup(other, sig, 1, 101_500_000L));
        cache.record("k", sig, 1, 102_000_000L, rejected); // sent after the refund: held
        assertNotNull(cache.lookup("k", sig, 1, 102_500_000L));
    }

    private static Limiter limiter(Clients.Library library) {
        return Limiter.builder(clients.transport(library, server)).build();
    }

    /** Two admissions then a rejection: the key is blocked for about a minute. */
    private static Request blocked(Limiter limiter, String key) {
        Request request = Request.of(key, Duration.ofMinutes(1), 2);
        limiter.allow(request);
        limiter.allow(request);
        Decision rejected = limiter.allow(request);
        assertEquals(Via.COMMAND, rejected.via());
        assertTrue(!rejected.allowed() && rejected.retryAfter().toMillis() > 0);
        return request;
    }

    @ParameterizedTest
    @EnumSource(Clients.Library.class)
    void a_hit_answers_without_a_call(Clients.Library library) {
        Limiter limiter = limiter(library);
        Request request = blocked(limiter, "bc:hit:" + library);
        long calls = server.calls("xcloak.allow");
        for (int i = 0; i < 5; i++) {
            Decision d = limiter.allow(request);
            assertEquals(Via.CACHE, d.via());
            assertTrue(!d.allowed() && d.retryAfter().toMillis() >= 1 && d.retryAfter().toMillis() <= 60_000, d.toString());
            assertTrue(d.headers(Headers.Style.IETF).containsKey("Retry-After"));
        }
        assertEquals(calls, server.calls("xcloak.allow"), "no call for a cached rejection");
        assertEquals(new Stats(5, 1), limiter.stats());
        // A larger cost is answered too; a smaller one and another shape are sent.
        assertEquals(Via.CACHE, limiter.allow(request.withCost(2)).via());
        assertEquals(Via.COMMAND, limiter.allow(request.withTier(Duration.ofHours(1), 100)).via());
        assertEquals(calls + 1, server.calls("xcloak.allow"));
    }

    @Test
    void peek_and_an_explicit_now_bypass_it() {
        Limiter limiter = limiter(Clients.Library.LETTUCE);
        Request request = blocked(limiter, "bc:bypass");
        long allows = server.calls("xcloak.allow");
        assertEquals(Via.COMMAND, limiter.peek(request).via());
        assertEquals(1, server.calls("xcloak.peek"));
        Decision withNow = limiter.allow(request.withNow(System.currentTimeMillis()));
        assertEquals(Via.COMMAND, withNow.via());
        assertEquals(allows + 1, server.calls("xcloak.allow"));
        assertEquals(0, limiter.stats().cacheHits());
    }

    @Test
    void refund_and_reset_drop_the_key_first() {
        Limiter limiter = limiter(Clients.Library.LETTUCE);
        Request request = Request.of("bc:refund", Duration.ofMinutes(1), 1).withStamp();
        Decision admitted = limiter.allow(request);
        assertEquals(Via.COMMAND, limiter.allow(request).via()); // rejected, cached
        assertEquals(Via.CACHE, limiter.allow(request).via());
        assertEquals(1, limiter.refund("bc:refund", admitted.stamp().getAsLong()));
        Decision again = limiter.allow(request);
        assertTrue(again.allowed(), "the refund opened the window: " + again);
        assertEquals(Via.COMMAND, again.via());
        assertEquals(Via.COMMAND, limiter.allow(request).via()); // rejected, cached again
        assertEquals(1, limiter.stats().cacheEntries());
        assertTrue(limiter.reset("bc:refund"));
        assertEquals(0, limiter.stats().cacheEntries());
        assertTrue(limiter.allow(request).allowed());
    }

    @Test
    void allow_all_sends_nothing_when_its_first_identity_is_blocked() {
        Limiter limiter = limiter(Clients.Library.LETTUCE);
        Request first = blocked(limiter, "bc:all:ip");
        Request second = Request.of("bc:all:account", Duration.ofMinutes(1), 5);
        long calls = server.calls("xcloak.allow");
        MultiDecision m = limiter.allowAll(List.of(first, second));
        assertEquals(calls, server.calls("xcloak.allow"));
        assertEquals(0, m.rejected().getAsInt());
        assertEquals(1, m.decisions().size());
        assertEquals(Via.CACHE, m.via());
        // Blocked second: the first is admitted, then refunded.
        Request open = Request.of("bc:all:open", Duration.ofMinutes(1), 5);
        MultiDecision n = limiter.allowAll(List.of(open, first));
        assertEquals(1, n.rejected().getAsInt());
        assertEquals(Via.CACHE, n.decisions().get(1).via());
        assertEquals(1, server.calls("xcloak.refund"));
        assertEquals(5, limiter.peek(open).remaining(), "the admission of the first was refunded");
    }

    @Test
    void an_outage_does_not_reach_a_cached_key_and_zero_turns_it_off() {
        Limiter limiter = Limiter.builder(clients.transport(Clients.Library.LETTUCE, server))
                .timeout(Duration.ofMillis(200)).build();
        Request request = blocked(limiter, "bc:outage");
        server.pause();
        try {
            assertEquals(Via.CACHE, limiter.allow(request).via());
            assertThrows(XcloakUnavailableException.class, () -> limiter.allow(request.withKey("bc:other")));
        } finally {
            server.resume();
        }
        Limiter off = Limiter.builder(clients.transport(Clients.Library.JEDIS, server)).blockCache(0).build();
        Request r = blocked(off, "bc:off");
        long calls = server.calls("xcloak.allow");
        assertEquals(Via.COMMAND, off.allow(r).via());
        assertEquals(calls + 1, server.calls("xcloak.allow"));
        assertEquals(new Stats(0, 0), off.stats());
    }

    @Test
    void least_recently_used_out_when_full() {
        BlockCache cache = new BlockCache(2);
        Request r = Request.of("a", Duration.ofMinutes(1), 1);
        BlockCache.Sig sig = BlockCache.Sig.of(r);
        Decision rejected = Replies.decision(List.of(0L, 1L, 0L, 60_000L, 60_000L), r.window(), false, Via.COMMAND);
        cache.record("a", sig, 1, 0, rejected);
        cache.record("b", sig, 1, 0, rejected);
        assertNotNull(cache.lookup("a", sig, 1, 1)); // a is now the most recent
        cache.record("c", sig, 1, 0, rejected);
        assertNull(cache.lookup("b", sig, 1, 2), "b was the least recently used");
        assertNotNull(cache.lookup("a", sig, 1, 2));
        assertNotNull(cache.lookup("c", sig, 1, 2));
    }
}
