package io.xcloak.spring;

import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.ArrayList;
import java.util.List;

import io.xcloak.spring.test.RedisServer;

import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.CsvSource;
import org.springframework.boot.WebApplicationType;
import org.springframework.boot.builder.SpringApplicationBuilder;

/**
 * A bad xcloak.* value stops the application context from starting, and the error names the
 * property and its range: it is never found at the first request, nor answered by the error
 * policy.
 */
class StartupValidationTest {

    @ParameterizedTest
    @CsvSource(delimiter = '|', value = {
        "xcloak.routes.api.limit=0                 | routes[api].limit   | from 1 to 1000000",
        "xcloak.routes.api.window=1500us           | routes[api].window  | whole number of milliseconds",
        "xcloak.routes.api.cost=11                 | routes[api].cost    | from 1 to the limit (10)",
        "xcloak.routes.api.tiers[0].limit=-1       | routes[api].tiers[0].limit | from 1 to 1000000",
        "xcloak.timeout=0s                         | timeout             | positive",
        "xcloak.block-cache=1000001                | blockCache          | from 0 (off) to 1000000",
        "xcloak.trusted-proxies=10.0.0.0/33        | trustedProxies      | from 0 to 32",
    })
    void aValueOutOfRangeStopsTheContext(String setting, String field, String range) {
        Throwable error = assertThrows(Throwable.class, () -> new SpringApplicationBuilder(TestApp.class)
                .web(WebApplicationType.NONE)
                .properties("spring.data.redis.url=" + RedisServer.shared().url(), "xcloak.routes.api.paths=/api/**",
                        "xcloak.routes.api.window=60s", "xcloak.routes.api.limit=10")
                .run("--" + setting)
                .close());
        String messages = messages(error);
        assertTrue(messages.contains("'" + field + "'") && messages.contains(range),
                "the error should name " + field + " and its range '" + range + "':\n" + messages);
    }

    @ParameterizedTest
    @CsvSource(delimiter = '|', value = {
        "xcloak.on-error=fail-open   | xcloak.on-error",
        "xcloak.routes.api.limt=10   | xcloak.routes.api.limt",
    })
    void anUnknownValueOrPropertyStopsTheContext(String setting, String property) {
        Throwable error = assertThrows(Throwable.class, () -> new SpringApplicationBuilder(TestApp.class)
                .web(WebApplicationType.NONE)
                .properties("spring.data.redis.url=" + RedisServer.shared().url(),
                        "xcloak.routes.api.window=60s", "xcloak.routes.api.limit=10")
                .run("--" + setting)
                .close());
        String messages = messages(error);
        assertTrue(messages.contains(property), "the error should name " + property + ":\n" + messages);
    }

    static String messages(Throwable error) {
        List<String> all = new ArrayList<>();
        for (Throwable t = error; t != null; t = t.getCause()) {
            all.add(t.getClass().getName() + ": " + t.getMessage());
        }
        return String.join("\n", all);
    }
}
