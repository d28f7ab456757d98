package io.xcloak.spring.web;

import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.Map;
import java.util.Optional;

import org.springframework.core.Ordered;
import org.springframework.core.io.buffer.DataBuffer;
import org.springframework.http.HttpHeaders;
import org.springframework.http.HttpStatus;
import org.springframework.http.HttpStatusCode;
import org.springframework.http.MediaType;
import org.springframework.http.server.reactive.ServerHttpResponse;
import org.springframework.web.server.ServerWebExchange;
import org.springframework.web.server.WebFilter;
import org.springframework.web.server.WebFilterChain;

import reactor.core.publisher.Mono;
import reactor.core.scheduler.Schedulers;

/**
 * The WebFlux filter: the same behaviour as {@link RateLimitFilter}, without blocking. The call
 * goes through the limiter's {@code CompletionStage} API, which over Lettuce holds no thread;
 * over a blocking transport (Jedis) the call is moved off the event loop to Reactor's
 * bounded-elastic scheduler. Under the error policy RAISE the error reaches WebFlux's exception
 * handlers (500).
 */
public class RateLimitWebFilter implements WebFilter, Ordered {

    private final HttpLimits limits;
    private final ReactiveKeyResolver keyResolver;
    private final boolean blockingTransport;
    private final int order;

    public RateLimitWebFilter(HttpLimits limits, ReactiveKeyResolver keyResolver, boolean blockingTransport, int order) {
        this.limits = limits;
        this.keyResolver = keyResolver;
        this.blockingTransport = blockingTransport;
        this.order = order;
    }

    /** The default key: the client's address, through trusted proxies only. */
    public static ReactiveKeyResolver clientAddress(ClientAddress address) {
        return exchange -> {
            InetSocketAddress remote = exchange.getRequest().getRemoteAddress();
            if (remote == null) {
                return Mono.empty();
            }
            String peer = remote.getAddress() != null ? remote.getAddress().getHostAddress() : remote.getHostString();
            if (!address.readsForwardingHeaders()) {
                return Mono.just(peer);
            }
            HttpHeaders headers = exchange.getRequest().getHeaders();
            return Mono.just(address.resolve(peer, values(headers, "X-Forwarded-For"), values(headers, "Forwarded")));
        };
    }

    private static List<String> values(HttpHeaders headers, String name) {
        List<String> values = headers.get(name);
        return values == null ? List.of() : values;
    }

    @Override
    public int getOrder() {
        return order;
    }

    @Override
    public Mono<Void> filter(ServerWebExchange exchange, WebFilterChain chain) {
        List<RouteLimit> matched = limits.matching(exchange.getRequest().getMethod().name(),
                exchange.getRequest().getPath().pathWithinApplication());
        if (matched.isEmpty()) {
            return chain.filter(exchange);
        }
        return keyResolver.resolve(exchange).map(Optional::of).defaultIfEmpty(Optional.empty()).flatMap(client -> {
            if (client.isEmpty()) {
                return chain.filter(exchange);
            }
            return check(matched, client.get()).flatMap(outcome -> serve(exchange, chain, outcome));
        });
    }

    private Mono<HttpLimits.Outcome> check(List<RouteLimit> matched, String client) {
        if (blockingTransport) {
            return Mono.fromCallable(() -> limits.check(matched, client)).subscribeOn(Schedulers.boundedElastic());
        }
        return Mono.fromCompletionStage(() -> limits.checkAsync(matched, client));
    }

    private Mono<Void> serve(ServerWebExchange exchange, WebFilterChain chain, HttpLimits.Outcome outcome) {
        exchange.getAttributes().put(HttpLimits.DECISION_ATTRIBUTE, outcome.decision());
        ServerHttpResponse response = exchange.getResponse();
        for (Map.Entry<String, String> header : outcome.headers().entrySet()) {
            response.getHeaders().set(header.getKey(), header.getValue());
        }
        int status = outcome.status();
        if (status != 0) {
            response.setStatusCode(HttpStatus.valueOf(status));
            String body = outcome.body();
            if (body.isEmpty()) {
                return response.setComplete();
            }
            response.getHeaders().setContentType(new MediaType(MediaType.TEXT_PLAIN, StandardCharsets.UTF_8));
            DataBuffer buffer = response.bufferFactory().wrap(body.getBytes(StandardCharsets.UTF_8));
            return response.writeWith(Mono.just(buffer));
        }
        if (!outcome.refunds(200) && !outcome.refunds(500)) {
            return chain.filter(exchange);
        }
        return chain.filter(exchange)
                .then(Mono.defer(() -> refund(outcome, statusOf(response))))
                .onErrorResume(error -> refund(outcome, 500).then(Mono.error(error)));
    }

    private Mono<Void> refund(HttpLimits.Outcome outcome, int status) {
        if (!outcome.refunds(status)) {
            return Mono.empty();
        }
        if (blockingTransport) {
            return Mono.<Void>fromRunnable(() -> outcome.refund(status)).subscribeOn(Schedulers.boundedElastic());
        }
        return Mono.fromCompletionStage(() -> outcome.refundAsync(status));
    }

    private static int statusOf(ServerHttpResponse response) {
        HttpStatusCode code = response.getStatusCode();
        return code == null ? 200 : code.value();
    }
}
