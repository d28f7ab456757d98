package io.xcloak.spring;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.net.http.HttpResponse;
import java.time.Duration;
import java.util.List;
import java.util.Set;
import java.util.TreeSet;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

import io.xcloak.spring.test.RedisServer;

import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestInstance;
import org.springframework.boot.WebApplicationType;
import org.springframework.boot.builder.SpringApplicationBuilder;
import org.springframework.context.ConfigurableApplicationContext;

/**
 * What the servlet filter and the WebFilter must both do, over real HTTP against an application
 * started once per class on a random port, configured by the README's application.yml
 * (src/test/resources/web.yml, the same for both) with only the Redis URL and the key prefix changed.
 */
@TestInstance(TestInstance.Lifecycle.PER_CLASS)
abstract class WebAppContract {

    private static final Pattern REMAINING = Pattern.compile("\"10-in-60s\";r=(\\d+);t=(\\d+)");

    final RedisServer redis = RedisServer.shared();
    ConfigurableApplicationContext app;
    String base;

    abstract WebApplicationType type();

    /** This class's key prefix (the two classes share the server). */
    abstract String prefix();

    @BeforeAll
    void start() {
        app = new SpringApplicationBuilder(TestApp.class).web(type()).run(
                "--spring.config.location=classpath:web.yml",
                "--spring.data.redis.url=" + redis.url(),
                "--xcloak.prefix=" + prefix(),
                "--server.port=0");
        base = "http://127.0.0.1:" + app.getEnvironment().getProperty("local.server.port");
    }

    @AfterAll
    void stop() {
        if (app != null) {
            app.close();
        }
    }

    @Test
    void sixtyConcurrentRequestsAdmitExactlyTheLimit() {
        List<HttpResponse<String>> responses = Http.concurrently(60, "GET", base + "/api/items");
        Set<Integer> remaining = new TreeSet<>();
        int admitted = 0;
        int rejected = 0;
        for (HttpResponse<String> r : responses) {
            assertEquals("\"10-in-60s\";q=10;w=60", r.headers().firstValue("RateLimit-Policy").orElse(null));
            Matcher m = REMAINING.matcher(r.headers().firstValue("RateLimit").orElse(""));
            assertTrue(m.matches(), "RateLimit: " + r.headers().firstValue("RateLimit"));
            int t = Integer.parseInt(m.group(2));
            assertTrue(t >= 1 && t <= 60, "t=" + t);
            if (r.statusCode() == 200) {
                admitted++;
                assertEquals("items", r.body());
                remaining.add(Integer.parseInt(m.group(1)));
                assertFalse(r.headers().firstValue("Retry-After").isPresent());
            } else {
                rejected++;
                assertEquals(429, r.statusCode());
                assertEquals("0", m.group(1));
                long retryAfter = Long.parseLong(r.headers().firstValue("Retry-After").orElseThrow());
                assertTrue(retryAfter >= 1 && retryAfter <= 60, "Retry-After " + retryAfter);
            }
        }
        assertEquals(10, admitted);
        assertEquals(50, rejected);
        // Each admission saw its own count: 9 left after the first, 0 after the tenth.
        assertEquals(Set.of(0, 1, 2, 3, 4, 5, 6, 7, 8, 9), remaining);
        assertEquals(10L, redis.commands().zcard(prefix() + "rl:api:127.0.0.1"));
    }

    @Test
    void aPathNoRouteMatchesIsNotLimited() {
        HttpResponse<String> r = Http.send("GET", base + "/free");
        assertEquals(200, r.statusCode());
        assertFalse(r.headers().firstValue("RateLimit").isPresent());
        assertFalse(r.headers().firstValue("RateLimit-Policy").isPresent());
    }

    @Test
    void skipSuccessfulCountsOnlyTheFailedLogins() {
        String key = prefix() + "rl:login:127.0.0.1";
        // Five successful logins, more than the limit of 3: each is refunded once it has succeeded.
        for (int i = 0; i < 5; i++) {
            HttpResponse<String> r = Http.send("POST", base + "/login?ok=true");
            assertEquals(200, r.statusCode(), "successful login " + i);
            if (i == 0) { // the handler reads the decision from the request's attribute
                assertEquals("welcome, 2 left", r.body());
            }
            assertEquals("\"3-in-60s\";q=3;w=60, \"20-in-3600s\";q=20;w=3600",
                    r.headers().firstValue("RateLimit-Policy").orElse(null));
        }
        Http.await(Duration.ofSeconds(10), "the refunds", () -> redis.commands().zcard(key) == 0);
        // Failed logins count: three are served, the fourth is refused.
        for (int i = 0; i < 3; i++) {
            HttpResponse<String> r = Http.send("POST", base + "/login?ok=false");
            assertEquals(401, r.statusCode(), "failed login " + i);
            assertEquals("wrong password, " + (2 - i) + " left", r.body());
        }
        Http.await(Duration.ofSeconds(10), "three failures counted", () -> redis.commands().zcard(key) == 3);
        HttpResponse<String> refused = Http.send("POST", base + "/login?ok=true");
        assertEquals(429, refused.statusCode());
        assertTrue(refused.headers().firstValue("Retry-After").isPresent());
        assertEquals(3L, redis.commands().zcard(key));
        // The route counts POST only.
        assertFalse(Http.send("GET", base + "/login?ok=true").headers().firstValue("RateLimit").isPresent());
    }
}
