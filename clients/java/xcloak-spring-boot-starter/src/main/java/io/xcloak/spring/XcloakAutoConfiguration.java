package io.xcloak.spring;

import java.util.Locale;

import io.xcloak.Limiter;

import org.springframework.boot.autoconfigure.AutoConfiguration;
import org.springframework.boot.autoconfigure.condition.ConditionalOnBean;
import org.springframework.boot.autoconfigure.condition.ConditionalOnClass;
import org.springframework.boot.autoconfigure.condition.ConditionalOnMissingBean;
import org.springframework.boot.autoconfigure.condition.ConditionalOnProperty;
import org.springframework.boot.context.properties.EnableConfigurationProperties;
import org.springframework.boot.data.redis.autoconfigure.DataRedisAutoConfiguration;
import org.springframework.context.annotation.Bean;
import org.springframework.data.redis.connection.RedisConnectionFactory;

/**
 * Builds the {@link Limiter} from Spring Data Redis' {@link RedisConnectionFactory} and the
 * {@code xcloak.*} properties. It backs off when the application declares its own {@code Limiter}.
 */
@AutoConfiguration(after = DataRedisAutoConfiguration.class)
@ConditionalOnClass(Limiter.class)
@ConditionalOnProperty(prefix = XcloakProperties.PREFIX, name = "enabled", matchIfMissing = true)
@EnableConfigurationProperties(XcloakProperties.class)
public class XcloakAutoConfiguration {

    /** The limiter's transport, and whether its calls block (Jedis). */
    @Bean
    @ConditionalOnMissingBean(Limiter.class)
    @ConditionalOnBean(RedisConnectionFactory.class)
    XcloakTransport xcloakTransport(RedisConnectionFactory factory) {
        return new XcloakTransport(RedisTransports.from(factory));
    }

    @Bean
    @ConditionalOnMissingBean
    @ConditionalOnBean(XcloakTransport.class)
    public Limiter xcloakLimiter(XcloakProperties properties, XcloakTransport transport) {
        return build(Limiter.builder(transport.built().transport()), properties);
    }

    /** The properties on a builder; the core's refusal is reported with the property's name. */
    public static Limiter build(Limiter.Builder builder, XcloakProperties p) {
        builder.prefix(p.getPrefix()).onError(p.getOnError()).timeout(p.getTimeout()).fallback(p.getFallback())
                .probeInterval(p.getProbeInterval()).blockCache(p.getBlockCache());
        if (p.getDurable().getReplicas() > 0) {
            builder.durable(p.getDurable().getReplicas(), p.getDurable().getTimeout());
        }
        try {
            return builder.build();
        } catch (IllegalArgumentException e) {
            throw new IllegalStateException(XcloakProperties.PREFIX + "." + kebab(e.getMessage()), e);
        }
    }

    /** "blockCache must be..." is the property xcloak.block-cache. */
    private static String kebab(String message) {
        int space = message.indexOf(' ');
        String option = space < 0 ? message : message.substring(0, space);
        StringBuilder out = new StringBuilder();
        for (char c : option.toCharArray()) {
            if (Character.isUpperCase(c)) {
                out.append('-').append(Character.toLowerCase(c));
            } else {
                out.append(c);
            }
        }
        return out.toString().toLowerCase(Locale.ROOT) + (space < 0 ? "" : message.substring(space));
    }
}
