package io.xcloak.spring.cloud.gateway;

import java.net.InetSocketAddress;
import java.util.List;

import io.xcloak.Limiter;
import io.xcloak.spring.XcloakAutoConfiguration;
import io.xcloak.spring.XcloakProperties;
import io.xcloak.spring.XcloakTransport;
import io.xcloak.spring.web.ClientAddress;

import org.springframework.beans.factory.ObjectProvider;
import org.springframework.boot.autoconfigure.AutoConfiguration;
import org.springframework.boot.autoconfigure.condition.ConditionalOnBean;
import org.springframework.boot.autoconfigure.condition.ConditionalOnClass;
import org.springframework.boot.autoconfigure.condition.ConditionalOnMissingBean;
import org.springframework.boot.autoconfigure.condition.ConditionalOnProperty;
import org.springframework.cloud.gateway.config.GatewayAutoConfiguration;
import org.springframework.cloud.gateway.config.GatewayProperties;
import org.springframework.cloud.gateway.filter.ratelimit.KeyResolver;
import org.springframework.cloud.gateway.filter.ratelimit.RateLimiter;
import org.springframework.cloud.gateway.support.ConfigurationService;
import org.springframework.context.annotation.Bean;
import org.springframework.context.annotation.Primary;
import org.springframework.http.HttpHeaders;

import reactor.core.publisher.Mono;

/**
 * The {@code xcloakRateLimiter} bean (primary, so the RequestRateLimiter filter takes it by default
 * when the gateway also defines its RedisRateLimiter), the {@code xcloakKeyResolver} bean (the
 * client's address, through {@code xcloak.trusted-proxies}; it backs off when the application
 * declares a KeyResolver), and the startup check of the routes' arguments. Runs before the
 * gateway's auto-configuration, whose RequestRateLimiter filter needs a RateLimiter bean.
 */
@AutoConfiguration(after = XcloakAutoConfiguration.class, before = GatewayAutoConfiguration.class)
@ConditionalOnClass({RateLimiter.class, Limiter.class})
@ConditionalOnProperty(prefix = XcloakProperties.PREFIX, name = "enabled", matchIfMissing = true)
@ConditionalOnBean(Limiter.class)
public class XcloakGatewayAutoConfiguration {

    @Bean(XcloakRateLimiter.BEAN_NAME)
    @Primary
    @ConditionalOnMissingBean(XcloakRateLimiter.class)
    public XcloakRateLimiter xcloakRateLimiter(Limiter limiter, ConfigurationService configurationService,
            XcloakProperties properties, ObjectProvider<XcloakTransport> transport) {
        XcloakTransport built = transport.getIfAvailable();
        return new XcloakRateLimiter(limiter, configurationService, properties.getHeaders(),
                built != null && built.blocking());
    }

    @Bean
    @ConditionalOnMissingBean(KeyResolver.class)
    public KeyResolver xcloakKeyResolver(XcloakProperties properties) {
        ClientAddress address = new ClientAddress(properties.getTrustedProxies());
        return exchange -> {
            InetSocketAddress remote = exchange.getRequest().getRemoteAddress();
            if (remote == null) {
                return Mono.empty(); // the gateway's deny-empty-key answers (403 by default)
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

    @Bean
    static RouteConfigurationCheck xcloakRouteConfigurationCheck(ObjectProvider<GatewayProperties> gateway) {
        return new RouteConfigurationCheck(gateway);
    }
}
