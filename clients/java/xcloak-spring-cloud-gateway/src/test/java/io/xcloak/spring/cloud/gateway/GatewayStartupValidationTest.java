package io.xcloak.spring.cloud.gateway;

import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.xcloak.spring.test.RedisServer;

import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.CsvSource;
import org.springframework.boot.WebApplicationType;
import org.springframework.boot.builder.SpringApplicationBuilder;

/** A route's xcloak-rate-limiter argument out of range stops the gateway, naming the full property. */
class GatewayStartupValidationTest {

    private static final String ROUTE = "spring.cloud.gateway.server.webflux.routes[0].";

    @ParameterizedTest
    @CsvSource(delimiter = '|', value = {
        "xcloak-rate-limiter.limit=0    | filters[0].args.xcloak-rate-limiter.limit must be an integer from 1 to 1000000",
        "xcloak-rate-limiter.cost=11    | filters[0].args.xcloak-rate-limiter.cost must be an integer from 1 to the limit (10)",
        "xcloak-rate-limiter.window=    | filters[0].args.xcloak-rate-limiter.window is required",
        "none                           | route 'api' uses #{@xcloakRateLimiter} without xcloak-rate-limiter.window and xcloak-rate-limiter.limit",
    })
    void aBadRouteStopsTheGateway(String arg, String expected) {
        java.util.List<String> properties = new java.util.ArrayList<>(java.util.List.of(
                "spring.data.redis.url=" + RedisServer.shared().url(), "server.port=0",
                ROUTE + "id=api", ROUTE + "uri=http://127.0.0.1:9", ROUTE + "predicates[0]=Path=/api/**",
                ROUTE + "filters[0].name=RequestRateLimiter",
                ROUTE + "filters[0].args.rate-limiter=#{@xcloakRateLimiter}"));
        if (!arg.equals("none")) {
            properties.add(ROUTE + "filters[0].args.xcloak-rate-limiter.window=60s");
            properties.add(ROUTE + "filters[0].args.xcloak-rate-limiter.limit=10");
            properties.add(ROUTE + "filters[0].args." + arg);
        }
        Throwable error = assertThrows(Throwable.class, () -> new SpringApplicationBuilder(GatewayApp.class)
                .web(WebApplicationType.REACTIVE)
                .properties(properties.toArray(String[]::new))
                .run()
                .close());
        StringBuilder messages = new StringBuilder();
        for (Throwable t = error; t != null; t = t.getCause()) {
            messages.append(t.getMessage()).append('\n');
        }
        assertTrue(messages.toString().contains(expected), "expected '" + expected + "' in:\n" + messages);
    }
}
