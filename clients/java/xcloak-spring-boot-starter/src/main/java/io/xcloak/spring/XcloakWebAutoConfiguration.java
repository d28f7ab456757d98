package io.xcloak.spring;

import io.xcloak.Limiter;
import io.xcloak.spring.web.ClientAddress;
import io.xcloak.spring.web.HttpLimits;
import io.xcloak.spring.web.RateLimitFilter;
import io.xcloak.spring.web.RateLimitWebFilter;
import io.xcloak.spring.web.ReactiveKeyResolver;
import io.xcloak.spring.web.RouteLimit;
import io.xcloak.spring.web.ServletKeyResolver;

import org.springframework.beans.factory.ObjectProvider;
import org.springframework.boot.autoconfigure.AutoConfiguration;
import org.springframework.boot.autoconfigure.condition.ConditionalOnBean;
import org.springframework.boot.autoconfigure.condition.ConditionalOnClass;
import org.springframework.boot.autoconfigure.condition.ConditionalOnMissingBean;
import org.springframework.boot.autoconfigure.condition.ConditionalOnProperty;
import org.springframework.boot.autoconfigure.condition.ConditionalOnWebApplication;
import org.springframework.boot.web.servlet.FilterRegistrationBean;
import org.springframework.context.annotation.Bean;
import org.springframework.context.annotation.Configuration;

/**
 * The web filter of the application's kind over the {@link Limiter} bean (the starter's or the
 * application's own): a servlet filter for Spring MVC, a {@code WebFilter} for WebFlux, with the
 * limits of {@code xcloak.routes}. The key function backs off when the application declares a
 * {@link ServletKeyResolver} or {@link ReactiveKeyResolver} bean.
 */
@AutoConfiguration(after = XcloakAutoConfiguration.class)
@ConditionalOnClass(Limiter.class)
@ConditionalOnProperty(prefix = XcloakProperties.PREFIX, name = "enabled", matchIfMissing = true)
@ConditionalOnBean(Limiter.class)
public class XcloakWebAutoConfiguration {

    @Configuration(proxyBeanMethods = false)
    @ConditionalOnWebApplication(type = ConditionalOnWebApplication.Type.SERVLET)
    @ConditionalOnClass({jakarta.servlet.Filter.class, FilterRegistrationBean.class})
    static class Servlet {

        @Bean
        @ConditionalOnMissingBean
        ServletKeyResolver xcloakServletKeyResolver(XcloakProperties properties) {
            return RateLimitFilter.clientAddress(new ClientAddress(properties.getTrustedProxies()));
        }

        @Bean
        @ConditionalOnMissingBean(name = "xcloakRateLimitFilter")
        FilterRegistrationBean<RateLimitFilter> xcloakRateLimitFilter(Limiter limiter, XcloakProperties properties,
                ServletKeyResolver keyResolver) {
            HttpLimits limits = new HttpLimits(limiter, RouteLimit.of(properties.getRoutes()), properties.getHeaders());
            FilterRegistrationBean<RateLimitFilter> registration =
                    new FilterRegistrationBean<>(new RateLimitFilter(limits, keyResolver));
            registration.setName("xcloakRateLimitFilter");
            registration.setOrder(properties.getFilterOrder());
            registration.setEnabled(!properties.getRoutes().isEmpty());
            return registration;
        }
    }

    @Configuration(proxyBeanMethods = false)
    @ConditionalOnWebApplication(type = ConditionalOnWebApplication.Type.REACTIVE)
    @ConditionalOnClass(org.springframework.web.server.WebFilter.class)
    static class Reactive {

        @Bean
        @ConditionalOnMissingBean
        ReactiveKeyResolver xcloakReactiveKeyResolver(XcloakProperties properties) {
            return RateLimitWebFilter.clientAddress(new ClientAddress(properties.getTrustedProxies()));
        }

        @Bean
        @ConditionalOnMissingBean
        RateLimitWebFilter xcloakRateLimitWebFilter(Limiter limiter, XcloakProperties properties,
                ReactiveKeyResolver keyResolver, ObjectProvider<XcloakTransport> transport) {
            HttpLimits limits = new HttpLimits(limiter, RouteLimit.of(properties.getRoutes()), properties.getHeaders());
            XcloakTransport built = transport.getIfAvailable();
            boolean blocking = built != null && built.built().blocking();
            return new RateLimitWebFilter(limits, keyResolver, blocking, properties.getFilterOrder());
        }
    }
}
