package io.xcloak.spring;

import java.util.LinkedHashSet;
import java.util.Set;

import io.lettuce.core.AbstractRedisClient;
import io.lettuce.core.RedisClient;
import io.lettuce.core.cluster.RedisClusterClient;
import io.xcloak.Transport;
import io.xcloak.jedis.JedisTransport;
import io.xcloak.lettuce.LettuceTransport;

import org.springframework.data.redis.connection.RedisClusterConfiguration;
import org.springframework.data.redis.connection.RedisConnectionFactory;
import org.springframework.data.redis.connection.RedisNode;
import org.springframework.data.redis.connection.jedis.JedisClientConfiguration;
import org.springframework.data.redis.connection.jedis.JedisConnectionFactory;
import org.springframework.data.redis.connection.lettuce.LettuceConnectionFactory;
import org.springframework.util.ClassUtils;

import redis.clients.jedis.DefaultJedisClientConfig;
import redis.clients.jedis.HostAndPort;
import redis.clients.jedis.UnifiedJedis;

/**
 * A transport from Spring Data Redis' connection factory:
 * <ul>
 *   <li>Lettuce (Spring Boot's default): the factory's own {@code RedisClient} or
 *       {@code RedisClusterClient} (standalone, Sentinel, Cluster), on a connection of the
 *       limiter's own, opened at the first call;</li>
 *   <li>Jedis: a Jedis 8 {@code RedisClient} (standalone) or {@code RedisClusterClient} built from
 *       the factory's host, port, credentials, database, SSL and client name, closed with the
 *       limiter. Jedis with Sentinel is not built here: declare a {@code Limiter} bean.</li>
 * </ul>
 */
final class RedisTransports {

    private static final boolean LETTUCE = ClassUtils.isPresent("io.lettuce.core.RedisClient", null)
            && ClassUtils.isPresent("org.springframework.data.redis.connection.lettuce.LettuceConnectionFactory", null);
    private static final boolean JEDIS = ClassUtils.isPresent("redis.clients.jedis.UnifiedJedis", null)
            && ClassUtils.isPresent("org.springframework.data.redis.connection.jedis.JedisConnectionFactory", null);

    private RedisTransports() {
    }

    /** The transport, and what the limiter must close beside it (null when nothing). */
    record Built(Transport transport, AutoCloseable owned, boolean blocking) {
    }

    static Built from(RedisConnectionFactory factory) {
        if (LETTUCE && Lettuce.accepts(factory)) {
            return Lettuce.from(factory);
        }
        if (JEDIS && Jedis.accepts(factory)) {
            return Jedis.from(factory);
        }
        throw new IllegalStateException("xcloak: no Limiter can be built from " + factory.getClass().getName()
                + " (Lettuce's and Jedis' connection factories are supported): declare a io.xcloak.Limiter bean");
    }

    private static final class Lettuce {

        static boolean accepts(RedisConnectionFactory factory) {
            return factory instanceof LettuceConnectionFactory;
        }

        static Built from(RedisConnectionFactory factory) {
            LettuceConnectionFactory lettuce = (LettuceConnectionFactory) factory;
            // The factory's client is taken at the first call too: the factory may start after this bean.
            return new Built(new LazyTransport(() -> {
                AbstractRedisClient client = lettuce.getRequiredNativeClient();
                if (client instanceof RedisClusterClient cluster) {
                    return LettuceTransport.of(cluster);
                }
                return LettuceTransport.of((RedisClient) client);
            }, false), null, false);
        }
    }

    private static final class Jedis {

        static boolean accepts(RedisConnectionFactory factory) {
            return factory instanceof JedisConnectionFactory;
        }

        @SuppressWarnings("deprecation") // Jedis 8 keeps ssl(), sslSocketFactory() and sslParameters(): Spring Data's configuration gives those
        static Built from(RedisConnectionFactory factory) {
            JedisConnectionFactory jedis = (JedisConnectionFactory) factory;
            if (jedis.isRedisSentinelAware()) {
                throw new IllegalStateException("xcloak: the starter builds no Limiter over Jedis with Sentinel"
                        + " (spring.data.redis.sentinel.*): declare a io.xcloak.Limiter bean over a Jedis RedisSentinelClient"
                        + " (JedisTransport.of(client)), or use Lettuce");
            }
            JedisClientConfiguration spring = jedis.getClientConfiguration();
            DefaultJedisClientConfig.Builder config = DefaultJedisClientConfig.builder()
                    .connectionTimeoutMillis((int) spring.getConnectTimeout().toMillis())
                    .socketTimeoutMillis((int) spring.getReadTimeout().toMillis())
                    .ssl(spring.isUseSsl());
            spring.getSslSocketFactory().ifPresent(config::sslSocketFactory);
            spring.getSslParameters().ifPresent(config::sslParameters);
            spring.getHostnameVerifier().ifPresent(config::hostnameVerifier);
            spring.getClientName().ifPresent(config::clientName);
            UnifiedJedis client;
            if (jedis.isRedisClusterAware()) {
                RedisClusterConfiguration cluster = jedis.getClusterConfiguration();
                if (cluster.getUsername() != null) {
                    config.user(cluster.getUsername());
                }
                cluster.getPassword().map(String::new).ifPresent(config::password);
                Set<HostAndPort> nodes = new LinkedHashSet<>();
                for (RedisNode node : cluster.getClusterNodes()) {
                    nodes.add(new HostAndPort(node.getHost(), node.getPort()));
                }
                client = redis.clients.jedis.RedisClusterClient.builder().nodes(nodes).clientConfig(config.build()).build();
            } else {
                var standalone = jedis.getStandaloneConfiguration();
                if (standalone.getUsername() != null) {
                    config.user(standalone.getUsername());
                }
                standalone.getPassword().map(String::new).ifPresent(config::password);
                config.database(standalone.getDatabase());
                client = redis.clients.jedis.RedisClient.builder()
                        .hostAndPort(standalone.getHostName(), standalone.getPort())
                        .clientConfig(config.build())
                        .build();
            }
            UnifiedJedis opened = client;
            return new Built(new LazyTransport(() -> JedisTransport.of(opened), true), client, true);
        }
    }
}
