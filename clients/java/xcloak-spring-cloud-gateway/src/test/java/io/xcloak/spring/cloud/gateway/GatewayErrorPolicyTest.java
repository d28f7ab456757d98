package io.xcloak.spring.cloud.gateway;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.net.ServerSocket;
import java.time.Duration;

import io.lettuce.core.RedisClient;
import io.xcloak.ErrorPolicy;
import io.xcloak.Headers;
import io.xcloak.Limiter;
import io.xcloak.XcloakUnavailableException;
import io.xcloak.lettuce.LettuceTransport;

import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.springframework.cloud.gateway.filter.ratelimit.RateLimiter;
import org.springframework.web.server.ResponseStatusException;

/**
 * The error policy through the gateway's RateLimiter contract, against a Redis that is not there
 * (a loopback port nobody listens on): RAISE fails the exchange (the gateway answers 500), ALLOW
 * admits without headers, DENY fails it with 503.
 */
class GatewayErrorPolicyTest {

    private static RedisClient client;

    @BeforeAll
    static void nobodyListens() throws Exception {
        int port;
        try (ServerSocket socket = new ServerSocket(0)) {
            port = socket.getLocalPort();
        }
        client = RedisClient.create("redis://127.0.0.1:" + port);
    }

    @AfterAll
    static void close() {
        client.shutdown();
    }

    private static XcloakRateLimiter limiter(ErrorPolicy policy) {
        // The first call opens the connection: refused, an outage like any other.
        Limiter limiter = Limiter.builder(LettuceTransport.of(client))
                .onError(policy).timeout(Duration.ofMillis(500)).build();
        XcloakRateLimiter rateLimiter = new XcloakRateLimiter(limiter, null, Headers.Style.IETF, false);
        rateLimiter.getConfig().put("api", new XcloakRateLimiter.Config().setWindow(Duration.ofSeconds(60)).setLimit(10L));
        return rateLimiter;
    }

    @Test
    void raiseFailsTheExchange() {
        RuntimeException e = assertThrows(RuntimeException.class,
                () -> limiter(ErrorPolicy.RAISE).isAllowed("api", "127.0.0.1").block(Duration.ofSeconds(10)));
        boolean unavailable = false;
        for (Throwable t = e; t != null; t = t.getCause()) {
            unavailable |= t instanceof XcloakUnavailableException;
        }
        assertTrue(unavailable, e.toString());
    }

    @Test
    void allowAdmitsWithoutHeaders() {
        RateLimiter.Response response = limiter(ErrorPolicy.ALLOW).isAllowed("api", "127.0.0.1").block(Duration.ofSeconds(10));
        assertTrue(response.isAllowed());
        assertTrue(response.getHeaders().isEmpty(), response.getHeaders().toString());
    }

    @Test
    void denyFailsWith503() {
        ResponseStatusException e = assertThrows(ResponseStatusException.class,
                () -> limiter(ErrorPolicy.DENY).isAllowed("api", "127.0.0.1").block(Duration.ofSeconds(10)));
        assertEquals(503, e.getStatusCode().value());
    }
}
