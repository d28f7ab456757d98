package io.xcloak.spring.cloud.gateway;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.net.http.HttpResponse;
import java.util.List;
import java.util.Set;
import java.util.TreeSet;

import io.xcloak.Limiter;
import io.xcloak.spring.Http;
import io.xcloak.spring.test.RedisServer;

import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestInstance;
import org.springframework.boot.WebApplicationType;
import org.springframework.boot.builder.SpringApplicationBuilder;
import org.springframework.context.ConfigurableApplicationContext;

/**
 * Spring Cloud Gateway's own RequestRateLimiter filter with {@code #{@xcloakRateLimiter}},
 * routing to a local backend, over real HTTP; the gateway is started once per class from the
 * README's gateway.yml with only the Redis URL, the backend's URL and the key prefix changed.
 */
@TestInstance(TestInstance.Lifecycle.PER_CLASS)
abstract class GatewayContract {

    RedisServer redis;
    Backend backend;
    ConfigurableApplicationContext app;
    String base;

    abstract RedisServer redis();

    abstract String prefix();

    /**
     * The commands that carried the calls (XCLOAK.ALLOW, or the fallback's EVALSHA, whose first
     * call is sent again after NOSCRIPT and so counted twice: the fallback's count leaves it out).
     */
    abstract long limiterCalls();

    @BeforeAll
    void start() {
        redis = redis();
        backend = new Backend();
        app = new SpringApplicationBuilder(GatewayApp.class).web(WebApplicationType.REACTIVE).run(
                "--spring.config.location=classpath:gateway.yml",
                "--spring.data.redis.url=" + redis.url(),
                "--BACKEND_URL=" + backend.url(),
                "--xcloak.prefix=" + prefix(),
                "--server.port=0");
        base = "http://127.0.0.1:" + app.getEnvironment().getProperty("local.server.port");
    }

    @AfterAll
    void stop() {
        if (app != null) {
            app.close();
        }
        backend.close();
    }

    @Test
    void sixtyConcurrentRequestsAdmitExactlyTheLimit() {
        Limiter limiter = app.getBean(Limiter.class);
        long callsBefore = limiterCalls();
        long cachedBefore = limiter.stats().cacheHits();
        long servedBefore = backend.served();
        List<HttpResponse<String>> responses = Http.concurrently(60, "GET", base + "/api/items");
        Set<Integer> remaining = new TreeSet<>();
        int admitted = 0;
        for (HttpResponse<String> r : responses) {
            assertEquals("\"10-in-60s\";q=10;w=60", r.headers().firstValue("RateLimit-Policy").orElse(null));
            assertEquals("10", r.headers().firstValue("X-RateLimit-Burst-Capacity").orElse(null));
            assertEquals("1", r.headers().firstValue("X-RateLimit-Requested-Tokens").orElse(null));
            String left = r.headers().firstValue("X-RateLimit-Remaining").orElseThrow();
            assertTrue(r.headers().firstValue("RateLimit").orElse("").startsWith("\"10-in-60s\";r=" + left + ";t="),
                    "RateLimit " + r.headers().firstValue("RateLimit") + " with X-RateLimit-Remaining " + left);
            if (r.statusCode() == 200) {
                admitted++;
                assertEquals("backend", r.body());
                remaining.add(Integer.parseInt(left));
                assertFalse(r.headers().firstValue("Retry-After").isPresent());
            } else {
                assertEquals(429, r.statusCode());
                assertEquals("0", left);
                long retryAfter = Long.parseLong(r.headers().firstValue("Retry-After").orElseThrow());
                assertTrue(retryAfter >= 1 && retryAfter <= 60, "Retry-After " + retryAfter);
            }
        }
        assertEquals(10, admitted);
        assertEquals(Set.of(0, 1, 2, 3, 4, 5, 6, 7, 8, 9), remaining);
        assertEquals(10, backend.served() - servedBefore, "the backend saw only the admitted requests");
        assertEquals(10L, redis.commands().zcard(prefix() + "rl:api:127.0.0.1"));
        // Each request was one call, or answered by the block cache (a rejection it had seen).
        long calls = limiterCalls() - callsBefore;
        long cached = limiter.stats().cacheHits() - cachedBefore;
        assertTrue(calls >= 10, "calls " + calls);
        assertEquals(60, calls + cached, "calls " + calls + " + cache hits " + cached);
    }

    @Test
    void aRouteWithTiersSendsEveryPolicy() {
        HttpResponse<String> r = Http.send("GET", base + "/search/q");
        assertEquals(200, r.statusCode());
        assertEquals("\"5-in-1s\";q=5;w=1, \"100-in-60s\";q=100;w=60", r.headers().firstValue("RateLimit-Policy").orElse(null));
        assertEquals(1L, redis.commands().zcard(prefix() + "rl:search:127.0.0.1"));
    }
}
