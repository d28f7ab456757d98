package io.xcloak.spring;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.time.Duration;
import java.util.concurrent.atomic.AtomicBoolean;

import io.lettuce.core.RedisClient;
import io.xcloak.ErrorPolicy;
import io.xcloak.Headers;
import io.xcloak.Limiter;
import io.xcloak.XcloakUnavailableException;
import io.xcloak.lettuce.LettuceTransport;
import io.xcloak.spring.web.ClientAddress;
import io.xcloak.spring.web.HttpLimits;
import io.xcloak.spring.web.RateLimitFilter;
import io.xcloak.spring.web.RateLimitWebFilter;
import io.xcloak.spring.web.RouteLimit;

import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.springframework.mock.http.server.reactive.MockServerHttpRequest;
import org.springframework.mock.web.MockFilterChain;
import org.springframework.mock.web.MockHttpServletRequest;
import org.springframework.mock.web.MockHttpServletResponse;
import org.springframework.mock.web.server.MockServerWebExchange;

import reactor.core.publisher.Mono;

/**
 * The error policy in both filters, against a Redis that is not there (a loopback port nobody
 * listens on: every call is an outage). RAISE lets the exception reach the framework's error
 * handling (500), ALLOW serves the request without headers, DENY answers 503 without headers.
 */
class ErrorPolicyTest {

    private static RedisClient client;
    private static String url;

    @BeforeAll
    static void nobodyListens() throws Exception {
        int port;
        try (ServerSocket socket = new ServerSocket(0)) {
            port = socket.getLocalPort();
        }
        url = "redis://127.0.0.1:" + port;
        client = RedisClient.create(url);
    }

    @AfterAll
    static void close() {
        client.shutdown();
    }

    private static HttpLimits limits(ErrorPolicy policy) {
        XcloakProperties.Route route = new XcloakProperties.Route();
        route.setPaths(java.util.List.of("/api/**"));
        route.setWindow(Duration.ofSeconds(60));
        route.setLimit(10L);
        Limiter limiter = Limiter.builder(new LazyTransport(() -> LettuceTransport.of(client), false))
                .onError(policy)
                .timeout(Duration.ofMillis(500))
                .build();
        return new HttpLimits(limiter, RouteLimit.of(java.util.Map.of("api", route)), Headers.Style.IETF);
    }

    private static MockHttpServletResponse servlet(ErrorPolicy policy, MockFilterChain chain) throws Exception {
        MockHttpServletRequest request = new MockHttpServletRequest("GET", "/api/items");
        request.setRemoteAddr("127.0.0.1");
        MockHttpServletResponse response = new MockHttpServletResponse();
        RateLimitFilter filter = new RateLimitFilter(limits(policy), RateLimitFilter.clientAddress(ClientAddress.peerOnly()));
        filter.doFilter(request, response, chain);
        return response;
    }

    @Test
    void servletRaiseThrowsToTheFrameworksErrorHandling() {
        MockFilterChain chain = new MockFilterChain();
        assertThrows(XcloakUnavailableException.class, () -> servlet(ErrorPolicy.RAISE, chain));
        assertNull(chain.getRequest(), "the request must not be served");
    }

    @Test
    void servletAllowServesWithoutHeaders() throws Exception {
        MockFilterChain chain = new MockFilterChain();
        MockHttpServletResponse response = servlet(ErrorPolicy.ALLOW, chain);
        assertNotNull(chain.getRequest(), "the request must be served");
        assertEquals(200, response.getStatus());
        assertNull(response.getHeader("RateLimit"));
        assertNull(response.getHeader("RateLimit-Policy"));
    }

    @Test
    void servletDenyAnswers503WithoutHeaders() throws Exception {
        MockFilterChain chain = new MockFilterChain();
        MockHttpServletResponse response = servlet(ErrorPolicy.DENY, chain);
        assertNull(chain.getRequest(), "the request must not be served");
        assertEquals(503, response.getStatus());
        assertNull(response.getHeader("RateLimit"));
        assertNull(response.getHeader("Retry-After"));
    }

    private static MockServerWebExchange reactive(ErrorPolicy policy, AtomicBoolean served) {
        MockServerWebExchange exchange = MockServerWebExchange.from(
                MockServerHttpRequest.get("/api/items").remoteAddress(new InetSocketAddress("127.0.0.1", 40000)));
        RateLimitWebFilter filter = new RateLimitWebFilter(limits(policy),
                RateLimitWebFilter.clientAddress(ClientAddress.peerOnly()), false, 0);
        filter.filter(exchange, e -> Mono.fromRunnable(() -> served.set(true))).block(Duration.ofSeconds(10));
        return exchange;
    }

    @Test
    void webFluxRaiseSignalsTheErrorToWebFluxsHandlers() {
        AtomicBoolean served = new AtomicBoolean();
        RuntimeException error = assertThrows(RuntimeException.class, () -> reactive(ErrorPolicy.RAISE, served));
        assertTrue(StartupValidationTest.messages(error).contains(XcloakUnavailableException.class.getName()),
                StartupValidationTest.messages(error));
        assertTrue(!served.get(), "the request must not be served");
    }

    @Test
    void webFluxAllowServesWithoutHeaders() {
        AtomicBoolean served = new AtomicBoolean();
        MockServerWebExchange exchange = reactive(ErrorPolicy.ALLOW, served);
        assertTrue(served.get(), "the request must be served");
        assertNull(exchange.getResponse().getHeaders().getFirst("RateLimit"));
    }

    @Test
    void webFluxDenyAnswers503WithoutHeaders() {
        AtomicBoolean served = new AtomicBoolean();
        MockServerWebExchange exchange = reactive(ErrorPolicy.DENY, served);
        assertTrue(!served.get(), "the request must not be served");
        assertEquals(503, exchange.getResponse().getStatusCode().value());
        assertNull(exchange.getResponse().getHeaders().getFirst("RateLimit"));
    }
}
