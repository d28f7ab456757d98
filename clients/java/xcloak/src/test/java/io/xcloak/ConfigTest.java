package io.xcloak;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import java.util.List;
import java.util.function.UnaryOperator;
import org.junit.jupiter.api.Test;

/**
 * Configuration is refused when it is built, naming the option and its range, never at the first
 * call and never through the error policy; options a call does not take are refused by name before
 * anything is sent (docs/clients.md, "Arguments").
 */
class ConfigTest {
    /** A transport that fails the test if anything is sent. */
    static final Transport NOTHING_SENT = call -> {
        throw new AssertionError("sent " + Recording.strings(call.command()));
    };

    private static void refused(String option, String range, UnaryOperator<Limiter.Builder> configure) {
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
                () -> configure.apply(Limiter.builder(NOTHING_SENT).onError(ErrorPolicy.ALLOW)).build());
        assertTrue(e.getMessage().startsWith(option + " must be"), e.getMessage());
        assertTrue(e.getMessage().contains(range), e.getMessage());
    }

    @Test
    void every_option_out_of_range_is_refused_at_build() {
        refused("timeout", "from 1 ms to 9007199254740991 ms", b -> b.timeout(Duration.ZERO));
        refused("timeout", "from 1 ms", b -> b.timeout(Duration.ofMillis(-5)));
        refused("probeInterval", "from 1 ms", b -> b.probeInterval(Duration.ofNanos(10)));
        refused("durable.replicas", "from 1 to 2147483647", b -> b.durable(0, Duration.ofMillis(100)));
        refused("durable.timeout", "a whole number of milliseconds from 1 ms", b -> b.durable(1, Duration.ofNanos(1_500_000)));
        refused("durable.timeout", "from 1 ms", b -> b.durable(1, Duration.ZERO));
        refused("blockCache", "from 0 (off) to 1000000", b -> b.blockCache(-1));
        refused("blockCache", "from 0 (off) to 1000000", b -> b.blockCache(1_000_001));
        refused("jitterFraction", "from 0 to 1", b -> b.jitterFraction(1.5));
        refused("jitterFraction", "from 0 to 1", b -> b.jitterFraction(Double.NaN));
        // In range: built.
        Limiter.builder(NOTHING_SENT).timeout(Duration.ofNanos(1_500_000)).durable(2, Duration.ofMillis(50))
                .blockCache(0).jitterFraction(1).build();
    }

    @Test
    void what_only_the_client_can_see_is_refused_by_name_before_sending() {
        Limiter limiter = Limiter.builder(NOTHING_SENT).onError(ErrorPolicy.ALLOW).build();
        Request r = Request.of("k", Duration.ofMinutes(1), 5);
        IllegalArgumentException oldest = assertThrows(IllegalArgumentException.class, () -> limiter.allow(r.withOldest()));
        assertTrue(oldest.getMessage().startsWith("oldest"), oldest.getMessage());
        IllegalArgumentException stamp = assertThrows(IllegalArgumentException.class, () -> limiter.peek(r.withStamp()));
        assertTrue(stamp.getMessage().startsWith("stamp"), stamp.getMessage());
        IllegalArgumentException window = assertThrows(IllegalArgumentException.class,
                () -> Request.of("k", Duration.ofNanos(1_500_000), 5));
        assertEquals("window must be a whole number of milliseconds, not PT0.0015S", window.getMessage());
        IllegalArgumentException tier = assertThrows(IllegalArgumentException.class,
                () -> r.withTier(Duration.ofNanos(1), 5));
        assertTrue(tier.getMessage().startsWith("window of a tier"), tier.getMessage());
        IllegalArgumentException maxWait = assertThrows(IllegalArgumentException.class,
                () -> limiter.acquire(r, Duration.ofNanos(5)));
        assertTrue(maxWait.getMessage().startsWith("maxWait"), maxWait.getMessage());
        // allowAll checks every request before sending any.
        assertThrows(IllegalArgumentException.class, () -> limiter.allowAll(List.of(r, r.withOldest())));
        assertThrows(IllegalArgumentException.class, () -> limiter.allowAll(List.of()));
    }

    @Test
    void the_bundled_scripts_are_src_lua_byte_for_byte() throws Exception {
        for (String name : List.of("xcloak_allow.lua", "xcloak_peek.lua", "xcloak_refund.lua")) {
            byte[] source = java.nio.file.Files.readAllBytes(RedisServer.repo().resolve("src/lua").resolve(name));
            try (var in = Engine.class.getResourceAsStream("lua/" + name)) {
                assertTrue(java.util.Arrays.equals(source, in.readAllBytes()), name + " differs from src/lua (scripts/sync-lua.sh)");
            }
        }
    }
}
