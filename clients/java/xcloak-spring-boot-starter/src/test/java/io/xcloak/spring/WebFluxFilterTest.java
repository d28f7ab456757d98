package io.xcloak.spring;

import org.springframework.boot.WebApplicationType;

/** WebFlux (Reactor Netty): the WebFilter, over the limiter's CompletionStage API. */
class WebFluxFilterTest extends WebAppContract {

    @Override
    WebApplicationType type() {
        return WebApplicationType.REACTIVE;
    }

    @Override
    String prefix() {
        return "webflux:";
    }
}
