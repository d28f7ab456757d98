package io.xcloak.spring;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.net.InetSocketAddress;
import java.time.Duration;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.CompletionStage;
import java.util.concurrent.ConcurrentHashMap;

import io.xcloak.Headers;
import io.xcloak.Limiter;
import io.xcloak.Transport;
import io.xcloak.jedis.JedisTransport;
import io.xcloak.spring.test.RedisServer;
import io.xcloak.spring.web.ClientAddress;
import io.xcloak.spring.web.HttpLimits;
import io.xcloak.spring.web.RateLimitWebFilter;
import io.xcloak.spring.web.RouteLimit;

import org.junit.jupiter.api.Test;
import org.springframework.mock.http.server.reactive.MockServerHttpRequest;
import org.springframework.mock.web.server.MockServerWebExchange;

import reactor.core.publisher.Mono;
import reactor.core.scheduler.Schedulers;

/**
 * A blocking transport (Jedis) never runs on the caller's thread in the WebFilter: its calls, the
 * admission and the refund, go to Reactor's bounded-elastic scheduler, so an event loop that calls
 * the filter is never blocked.
 */
class WebFilterThreadTest {

    /** Records the threads that sent calls. */
    private static final class Recording implements Transport {
        final Transport delegate;
        final Set<String> threads = ConcurrentHashMap.newKeySet();

        Recording(Transport delegate) {
            this.delegate = delegate;
        }

        @Override
        public CompletionStage<Reply> send(Call call) {
            threads.add(Thread.currentThread().getName());
            return delegate.send(call);
        }

        @Override
        public boolean blocking() {
            return delegate.blocking();
        }

        @Override
        public void close() {
            delegate.close();
        }
    }

    @Test
    void jedisCallsRunOnBoundedElasticNotOnTheCallersThread() {
        RedisServer server = RedisServer.shared();
        long allowsBefore = server.calls("xcloak.allow");
        long refundsBefore = server.calls("xcloak.refund");
        try (redis.clients.jedis.RedisClient jedis = redis.clients.jedis.RedisClient.create("127.0.0.1", server.port())) {
            Recording transport = new Recording(JedisTransport.of(jedis));
            assertTrue(transport.blocking());
            Limiter limiter = Limiter.builder(transport).prefix("thread:").build();
            XcloakProperties.Route route = new XcloakProperties.Route();
            route.setPaths(List.of("/api/**"));
            route.setWindow(Duration.ofSeconds(60));
            route.setLimit(10L);
            route.setSkipSuccessful(true);
            RateLimitWebFilter filter = new RateLimitWebFilter(
                    new HttpLimits(limiter, RouteLimit.of(Map.of("api", route)), Headers.Style.IETF),
                    RateLimitWebFilter.clientAddress(ClientAddress.peerOnly()), true, 0);
            MockServerWebExchange exchange = MockServerWebExchange.from(
                    MockServerHttpRequest.get("/api/x").remoteAddress(new InetSocketAddress("127.0.0.1", 40000)));
            // Subscribed from a parallel thread, standing for an event loop.
            filter.filter(exchange, e -> Mono.empty()).subscribeOn(Schedulers.parallel()).block(Duration.ofSeconds(10));
            assertEquals(200, exchange.getResponse().getStatusCode() == null ? 200 : exchange.getResponse().getStatusCode().value());
            assertFalse(transport.threads.isEmpty());
            for (String thread : transport.threads) {
                assertTrue(thread.startsWith("boundedElastic"), "a Jedis call ran on " + thread);
            }
            // The allow and the skip-successful refund both ran: the window is empty again.
            assertEquals(1, server.calls("xcloak.allow") - allowsBefore);
            assertEquals(1, server.calls("xcloak.refund") - refundsBefore);
            assertEquals(0L, server.commands().zcard("thread:rl:api:127.0.0.1"));
        }
    }
}
