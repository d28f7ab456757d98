package io.xcloak.spring.cloud.gateway;

import java.time.Duration;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

import io.xcloak.Decision;
import io.xcloak.Headers;
import io.xcloak.Limiter;
import io.xcloak.Request;
import io.xcloak.Tier;
import io.xcloak.Via;
import io.xcloak.spring.XcloakProperties;

import org.springframework.cloud.gateway.event.FilterArgsEvent;
import org.springframework.cloud.gateway.filter.ratelimit.AbstractRateLimiter;
import org.springframework.cloud.gateway.route.RouteDefinitionRouteLocator;
import org.springframework.cloud.gateway.support.ConfigurationService;
import org.springframework.core.style.ToStringCreator;
import org.springframework.http.HttpStatus;
import org.springframework.validation.BeanPropertyBindingResult;
import org.springframework.validation.FieldError;
import org.springframework.web.server.ResponseStatusException;

import reactor.core.publisher.Mono;
import reactor.core.scheduler.Schedulers;

/**
 * A Spring Cloud Gateway {@code RateLimiter} on xcloak: the gateway's own
 * {@code RequestRateLimiter} filter uses it unchanged, as it uses {@code RedisRateLimiter}:
 *
 * <pre>
 * filters:
 *   - name: RequestRateLimiter
 *     args:
 *       rate-limiter: "#{&#64;xcloakRateLimiter}"
 *       key-resolver: "#{&#64;xcloakKeyResolver}"
 *       xcloak-rate-limiter.window: 60s
 *       xcloak-rate-limiter.limit: 10
 *       xcloak-rate-limiter.tiers[0].window: 1h
 *       xcloak-rate-limiter.tiers[0].limit: 100
 * </pre>
 *
 * <p>One {@code XCLOAK.ALLOW} per request on the key {@code rl:NAME:KEY} (NAME defaults to the
 * route's id), an exact sliding window where RedisRateLimiter keeps a token bucket. The response
 * carries the contract's headers (RateLimit-Policy, RateLimit, and Retry-After on a rejection)
 * beside the gateway's own X-RateLimit-Remaining, X-RateLimit-Burst-Capacity (the binding
 * limit) and X-RateLimit-Requested-Tokens (the cost). The gateway answers a rejection with its
 * configured status (429 by default). Under the error policy: RAISE fails the exchange (500),
 * ALLOW admits without headers, DENY answers 503.
 */
public class XcloakRateLimiter extends AbstractRateLimiter<XcloakRateLimiter.Config> {

    /** The per-route arguments' prefix: {@code xcloak-rate-limiter.window} and so on. */
    public static final String CONFIGURATION_PROPERTY_NAME = "xcloak-rate-limiter";

    /** The bean's name, which routes name in {@code rate-limiter: "#{@xcloakRateLimiter}"}. */
    public static final String BEAN_NAME = "xcloakRateLimiter";

    public static final String REMAINING_HEADER = "X-RateLimit-Remaining";
    public static final String BURST_CAPACITY_HEADER = "X-RateLimit-Burst-Capacity";
    public static final String REQUESTED_TOKENS_HEADER = "X-RateLimit-Requested-Tokens";

    private final Limiter limiter;
    private final Headers.Style style;
    private final boolean blockingTransport;
    private boolean includeHeaders = true;

    /**
     * @param blockingTransport the limiter's transport blocks (Jedis): calls then run on Reactor's
     *     bounded-elastic scheduler, never on the event loop
     */
    public XcloakRateLimiter(Limiter limiter, ConfigurationService configurationService, Headers.Style style,
            boolean blockingTransport) {
        super(Config.class, CONFIGURATION_PROPERTY_NAME, configurationService);
        this.limiter = limiter;
        this.style = style;
        this.blockingTransport = blockingTransport;
    }

    public boolean isIncludeHeaders() {
        return includeHeaders;
    }

    /** Whether responses carry any rate-limit header (default true), as RedisRateLimiter's option. */
    public void setIncludeHeaders(boolean includeHeaders) {
        this.includeHeaders = includeHeaders;
    }

    /** Binds a route's arguments, then checks them: a value out of range is refused, naming it. */
    @Override
    public void onApplicationEvent(FilterArgsEvent event) {
        super.onApplicationEvent(event);
        Config config = getConfig().get(event.getRouteId());
        if (config != null && event.getArgs().keySet().stream().anyMatch(k -> k.startsWith(CONFIGURATION_PROPERTY_NAME + "."))) {
            String problem = config.problem();
            if (problem != null) {
                getConfig().remove(event.getRouteId());
                throw new IllegalArgumentException("route '" + event.getRouteId() + "': " + problem);
            }
        }
    }

    @Override
    public Mono<Response> isAllowed(String routeId, String id) {
        Config config = loadConfiguration(routeId);
        Request request = config.request(routeId, id);
        Mono<Decision> call = blockingTransport
                ? Mono.fromCallable(() -> limiter.allow(request)).subscribeOn(Schedulers.boundedElastic())
                : Mono.fromCompletionStage(() -> limiter.allowAsync(request));
        return call.flatMap(decision -> {
            if (decision.via() == Via.ERROR) {
                if (decision.allowed()) {
                    return Mono.just(new Response(true, Map.of()));
                }
                return Mono.error(new ResponseStatusException(HttpStatus.SERVICE_UNAVAILABLE,
                        "the rate limiter's Redis is unavailable", decision.error()));
            }
            return Mono.just(new Response(decision.allowed(), headers(decision, request)));
        });
    }

    private Map<String, String> headers(Decision decision, Request request) {
        if (!includeHeaders) {
            return Map.of();
        }
        Map<String, String> headers = new LinkedHashMap<>(decision.headers(style));
        headers.put(REMAINING_HEADER, String.valueOf(decision.remaining()));
        headers.put(BURST_CAPACITY_HEADER, String.valueOf(decision.limit()));
        headers.put(REQUESTED_TOKENS_HEADER, String.valueOf(request.cost()));
        return headers;
    }

    /** The route's configuration, else the default filters', as RedisRateLimiter finds it. */
    Config loadConfiguration(String routeId) {
        Config config = getConfig().get(routeId);
        if (config == null) {
            config = getConfig().get(RouteDefinitionRouteLocator.DEFAULT_FILTERS);
        }
        if (config == null) {
            throw new IllegalArgumentException("No xcloak-rate-limiter configuration for route " + routeId
                    + " or defaultFilters (xcloak-rate-limiter.window and xcloak-rate-limiter.limit)");
        }
        return config;
    }

    @Override
    public String toString() {
        return new ToStringCreator(this).append("config", getConfig()).toString();
    }

    /** One route's limit: {@code xcloak-rate-limiter.*} in the filter's args. */
    public static class Config {

        /** Tier 0's window. */
        private Duration window;

        /** Tier 0's limit. */
        private Long limit;

        /** Units one request takes. */
        private long cost = 1;

        /** Further windows, checked in the same call, all or nothing. */
        private List<XcloakProperties.Tier> tiers = new ArrayList<>();

        /** The key's middle, rl:NAME:KEY; the route's id when unset. */
        private String name;

        /** Null when the configuration is in range; else what is wrong, naming the argument. */
        public String problem() {
            BeanPropertyBindingResult errors = new BeanPropertyBindingResult(this, CONFIGURATION_PROPERTY_NAME);
            XcloakProperties.validateLimit(errors, "", window, limit, cost, tiers);
            if (!errors.hasErrors()) {
                return null;
            }
            List<String> problems = new ArrayList<>();
            for (FieldError error : errors.getFieldErrors()) {
                problems.add(CONFIGURATION_PROPERTY_NAME + "." + error.getField() + " " + error.getDefaultMessage());
            }
            return String.join("; ", problems);
        }

        Request request(String routeId, String id) {
            Request request = Request.of("rl:" + (name != null ? name : routeId) + ":" + id, window, limit);
            if (!tiers.isEmpty()) {
                List<Tier> list = new ArrayList<>(tiers.size());
                for (XcloakProperties.Tier tier : tiers) {
                    list.add(Tier.of(tier.getWindow(), tier.getLimit()));
                }
                request = request.withTiers(list);
            }
            return cost == 1 ? request : request.withCost(cost);
        }

        public Duration getWindow() {
            return window;
        }

        public Config setWindow(Duration window) {
            this.window = window;
            return this;
        }

        public Long getLimit() {
            return limit;
        }

        public Config setLimit(Long limit) {
            this.limit = limit;
            return this;
        }

        public long getCost() {
            return cost;
        }

        public Config setCost(long cost) {
            this.cost = cost;
            return this;
        }

        public List<XcloakProperties.Tier> getTiers() {
            return tiers;
        }

        public Config setTiers(List<XcloakProperties.Tier> tiers) {
            this.tiers = tiers;
            return this;
        }

        public String getName() {
            return name;
        }

        public Config setName(String name) {
            this.name = name;
            return this;
        }

        @Override
        public String toString() {
            return new ToStringCreator(this).append("window", window).append("limit", limit).append("cost", cost)
                    .append("tiers", tiers.size()).append("name", name).toString();
        }
    }
}
