package io.xcloak.spring.cloud.gateway;

import static org.junit.jupiter.api.Assertions.assertFalse;

import io.xcloak.spring.test.RedisServer;

import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.Test;

/**
 * The gateway on a server without the module (a managed Redis): fallback auto answers through the
 * bundled Lua script, with the same decisions and headers.
 */
class GatewayFallbackTest extends GatewayContract {

    private RedisServer withoutModule;

    @Override
    RedisServer redis() {
        withoutModule = RedisServer.start(false);
        return withoutModule;
    }

    @Override
    String prefix() {
        return "fallback:";
    }

    @Override
    long limiterCalls() {
        // Script runs that answered: a NOSCRIPT (the first calls, before the script is loaded) is a failed call.
        long runs = 0;
        for (String command : new String[] {"evalsha", "eval"}) {
            java.util.Map<String, Double> stats = redis.commandStats().get(command);
            if (stats != null) {
                runs += stats.get("calls").longValue() - stats.getOrDefault("failed_calls", 0.0).longValue();
            }
        }
        return runs;
    }

    @Test
    void theServerHasNoModule() {
        assertFalse(redis.commands().info("modules").contains("name=xcloak"));
    }

    @AfterAll
    void stopServer() {
        if (withoutModule != null) {
            withoutModule.close();
        }
    }
}
