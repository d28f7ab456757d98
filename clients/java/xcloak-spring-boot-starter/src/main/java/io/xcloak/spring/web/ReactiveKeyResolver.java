package io.xcloak.spring.web;

import org.springframework.web.server.ServerWebExchange;

import reactor.core.publisher.Mono;

/**
 * The WebFilter's key function: the client's identity in an exchange. The default is the
 * client's address ({@link ClientAddress}); declare a bean of this type to replace it (a
 * principal, an API key). An empty Mono leaves the request unlimited.
 */
@FunctionalInterface
public interface ReactiveKeyResolver {

    Mono<String> resolve(ServerWebExchange exchange);
}
