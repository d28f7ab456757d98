package io.xcloak.spring.cloud.gateway;

import java.util.List;
import java.util.Map;

import org.springframework.beans.factory.ObjectProvider;
import org.springframework.beans.factory.SmartInitializingSingleton;
import org.springframework.boot.context.properties.bind.Bindable;
import org.springframework.boot.context.properties.bind.Binder;
import org.springframework.boot.context.properties.source.MapConfigurationPropertySource;
import org.springframework.cloud.gateway.config.GatewayProperties;
import org.springframework.cloud.gateway.filter.FilterDefinition;
import org.springframework.cloud.gateway.route.RouteDefinition;

/**
 * Checks every route's {@code xcloak-rate-limiter.*} arguments (and the default filters') when
 * the context starts, so that a value out of range stops the application with the property's
 * name, instead of the gateway dropping the route with a warning when it loads its routes.
 * Also refused: a route that names {@code #{@xcloakRateLimiter}} with no window and limit of its
 * own nor in the default filters.
 */
final class RouteConfigurationCheck implements SmartInitializingSingleton {

    private static final String FILTER = "RequestRateLimiter";

    private final ObjectProvider<GatewayProperties> properties;

    RouteConfigurationCheck(ObjectProvider<GatewayProperties> properties) {
        this.properties = properties;
    }

    @Override
    public void afterSingletonsInstantiated() {
        GatewayProperties gateway = properties.getIfAvailable();
        if (gateway == null) {
            return;
        }
        String base = GatewayProperties.PREFIX;
        boolean defaults = check(base + ".default-filters", gateway.getDefaultFilters());
        List<RouteDefinition> routes = gateway.getRoutes();
        for (int r = 0; r < routes.size(); r++) {
            List<FilterDefinition> filters = routes.get(r).getFilters();
            for (int f = 0; f < filters.size(); f++) {
                FilterDefinition filter = filters.get(f);
                String at = base + ".routes[" + r + "].filters[" + f + "].args";
                if (!FILTER.equals(filter.getName())) {
                    continue;
                }
                boolean own = check(at, filter);
                String limiter = filter.getArgs().getOrDefault("rate-limiter", filter.getArgs().get("rateLimiter"));
                if (!own && !defaults && limiter != null && limiter.contains("@" + XcloakRateLimiter.BEAN_NAME)) {
                    throw new IllegalStateException(at + ": route '" + routes.get(r).getId()
                            + "' uses #{@xcloakRateLimiter} without xcloak-rate-limiter.window and xcloak-rate-limiter.limit"
                            + " (nor in default-filters)");
                }
            }
        }
    }

    private static boolean check(String base, List<FilterDefinition> filters) {
        boolean any = false;
        for (int f = 0; f < filters.size(); f++) {
            if (FILTER.equals(filters.get(f).getName())) {
                any |= check(base + "[" + f + "].args", filters.get(f));
            }
        }
        return any;
    }

    /** Whether the filter has xcloak-rate-limiter arguments; throws when they are out of range. */
    private static boolean check(String at, FilterDefinition filter) {
        Map<String, String> args = filter.getArgs();
        if (args.keySet().stream().noneMatch(k -> k.startsWith(XcloakRateLimiter.CONFIGURATION_PROPERTY_NAME + "."))) {
            return false;
        }
        XcloakRateLimiter.Config config;
        try {
            config = new Binder(new MapConfigurationPropertySource(args))
                    .bindOrCreate(XcloakRateLimiter.CONFIGURATION_PROPERTY_NAME, Bindable.of(XcloakRateLimiter.Config.class));
        } catch (RuntimeException e) {
            throw new IllegalStateException(at + "." + XcloakRateLimiter.CONFIGURATION_PROPERTY_NAME + ": "
                    + (e.getCause() != null ? e.getCause().getMessage() : e.getMessage()), e);
        }
        String problem = config.problem();
        if (problem != null) {
            throw new IllegalStateException(at + ": " + problem.replace(XcloakRateLimiter.CONFIGURATION_PROPERTY_NAME + ".",
                    at + "." + XcloakRateLimiter.CONFIGURATION_PROPERTY_NAME + "."));
        }
        return true;
    }
}
