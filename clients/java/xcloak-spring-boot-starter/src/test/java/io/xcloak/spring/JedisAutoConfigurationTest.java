package io.xcloak.spring;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;

import io.xcloak.Decision;
import io.xcloak.Limiter;
import io.xcloak.Via;
import io.xcloak.spring.test.RedisServer;

import org.junit.jupiter.api.Test;
import org.springframework.boot.WebApplicationType;
import org.springframework.boot.builder.SpringApplicationBuilder;
import org.springframework.context.ConfigurableApplicationContext;
import org.springframework.data.redis.connection.RedisConnectionFactory;
import org.springframework.data.redis.connection.jedis.JedisConnectionFactory;

/** With spring.data.redis.client-type=jedis the starter builds its limiter over a Jedis client. */
class JedisAutoConfigurationTest {

    @Test
    void theLimiterIsBuiltFromJedisConnectionFactory() {
        RedisServer redis = RedisServer.shared();
        try (ConfigurableApplicationContext app = new SpringApplicationBuilder(TestApp.class)
                .web(WebApplicationType.NONE)
                .run("--spring.data.redis.url=" + redis.url(), "--spring.data.redis.client-type=jedis",
                        "--xcloak.prefix=jedis:")) {
            assertTrue(app.getBean(RedisConnectionFactory.class) instanceof JedisConnectionFactory);
            assertTrue(app.getBean(XcloakTransport.class).blocking());
            Limiter limiter = app.getBean(Limiter.class);
            long before = redis.calls("xcloak.allow");
            Decision first = limiter.allow("k", Duration.ofSeconds(60), 1);
            Decision second = limiter.allow("k", Duration.ofSeconds(60), 1);
            assertTrue(first.allowed());
            assertEquals(Via.COMMAND, first.via());
            assertTrue(!second.allowed());
            assertEquals(2, redis.calls("xcloak.allow") - before);
            assertEquals(1L, redis.commands().zcard("jedis:k"));
        }
    }
}
