package io.xcloak.spring;

import java.time.Duration;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

import io.xcloak.ErrorPolicy;
import io.xcloak.Fallback;
import io.xcloak.Headers;

import org.springframework.boot.context.properties.ConfigurationProperties;
import org.springframework.validation.Errors;
import org.springframework.validation.Validator;

/**
 * The {@code xcloak.*} properties. They are checked when the application context starts (this
 * class is its own {@link Validator}, which Spring Boot runs when it binds them): a value out of
 * range stops the context, with the property's name and its range in the error, never at the
 * first request and never through the error policy.
 *
 * <pre>
 * xcloak:
 *   on-error: deny
 *   routes:
 *     login:
 *       paths: [/login]
 *       window: 1m
 *       limit: 5
 *       tiers: [{window: 1h, limit: 20}]
 *       skip-successful: true
 * </pre>
 */
@ConfigurationProperties(prefix = XcloakProperties.PREFIX, ignoreUnknownFields = false)
public class XcloakProperties implements Validator {

    public static final String PREFIX = "xcloak";

    /** The largest window, 2^53-1 ms (the server's range). */
    public static final long MAX_WINDOW_MS = 9_007_199_254_740_991L;

    /** The largest limit (the module's default xcloak.max-limit and the script's cap). */
    public static final long MAX_LIMIT = 1_000_000L;

    /** TIER pairs after the positional window and limit (16 tiers in all). */
    public static final int MAX_TIERS = 15;

    /** The largest block cache. */
    public static final int MAX_BLOCK_CACHE = 1_000_000;

    /** Whether the starter builds the limiter and the web filters at all. */
    private boolean enabled = true;

    /** Prepended to every key the limiter touches. */
    private String prefix = "";

    /** What an outage or a timeout answers: raise (500), allow (serve, no headers) or deny (503). */
    private ErrorPolicy onError = ErrorPolicy.RAISE;

    /** The limiter's own timeout for each call. */
    private Duration timeout = Duration.ofSeconds(1);

    /** auto (the bundled Lua script where the module is missing), always, or never. */
    private Fallback fallback = Fallback.AUTO;

    /** How often a server served by the script is probed for the module again. */
    private Duration probeInterval = Duration.ofSeconds(60);

    /** Durable mode: an admission counts once this many replicas hold it (WAIT). */
    private final Durable durable = new Durable();

    /** Entries of the in-process cache of rejections (0 turns it off). */
    private int blockCache = 10_000;

    /** The header style: ietf (RateLimit-Policy and RateLimit), legacy (RateLimit-Limit...) or both. */
    private Headers.Style headers = Headers.Style.IETF;

    /** Proxies whose X-Forwarded-For (or Forwarded) is believed; addresses or CIDR networks. */
    private List<String> trustedProxies = new ArrayList<>();

    /** The web filter's limits, by name (the name is the key's middle: rl:NAME:CLIENT). */
    private Map<String, Route> routes = new LinkedHashMap<>();

    /**
     * The servlet filter's order (and the WebFilter's). The default, -101, runs before Spring
     * Security's filter chain (-100), so a login form is counted before it is checked; above -100 a
     * key function can read the authenticated principal.
     */
    private int filterOrder = -101;

    public static class Durable {

        /** Replicas that must hold an admission; 0 turns durable mode off. */
        private int replicas = 0;

        /** How long WAIT waits for them. */
        private Duration timeout = Duration.ofMillis(100);

        public int getReplicas() {
            return replicas;
        }

        public void setReplicas(int replicas) {
            this.replicas = replicas;
        }

        public Duration getTimeout() {
            return timeout;
        }

        public void setTimeout(Duration timeout) {
            this.timeout = timeout;
        }
    }

    /** One limit of the web filter. */
    public static class Route {

        /** Path patterns (PathPattern syntax: /login, /api/**); none means every path. */
        private List<String> paths = new ArrayList<>();

        /** HTTP methods it counts (GET, POST...); none means every method. */
        private List<String> methods = new ArrayList<>();

        /** Tier 0's window. */
        private Duration window;

        /** Tier 0's limit. */
        private Long limit;

        /** Units one request takes. */
        private long cost = 1;

        /** Further windows, checked in the same call, all or nothing. */
        private List<Tier> tiers = new ArrayList<>();

        /** Refund the request's admission when its response is a success (status below 400). */
        private boolean skipSuccessful;

        /** Refund the request's admission when its response is a failure (status 400 or above). */
        private boolean skipFailed;

        public List<String> getPaths() {
            return paths;
        }

        public void setPaths(List<String> paths) {
            this.paths = paths;
        }

        public List<String> getMethods() {
            return methods;
        }

        public void setMethods(List<String> methods) {
            this.methods = methods;
        }

        public Duration getWindow() {
            return window;
        }

        public void setWindow(Duration window) {
            this.window = window;
        }

        public Long getLimit() {
            return limit;
        }

        public void setLimit(Long limit) {
            this.limit = limit;
        }

        public long getCost() {
            return cost;
        }

        public void setCost(long cost) {
            this.cost = cost;
        }

        public List<Tier> getTiers() {
            return tiers;
        }

        public void setTiers(List<Tier> tiers) {
            this.tiers = tiers;
        }

        public boolean isSkipSuccessful() {
            return skipSuccessful;
        }

        public void setSkipSuccessful(boolean skipSuccessful) {
            this.skipSuccessful = skipSuccessful;
        }

        public boolean isSkipFailed() {
            return skipFailed;
        }

        public void setSkipFailed(boolean skipFailed) {
            this.skipFailed = skipFailed;
        }
    }

    /** A further window and its limit. */
    public static class Tier {

        private Duration window;

        private Long limit;

        public Duration getWindow() {
            return window;
        }

        public void setWindow(Duration window) {
            this.window = window;
        }

        public Long getLimit() {
            return limit;
        }

        public void setLimit(Long limit) {
            this.limit = limit;
        }
    }

    @Override
    public boolean supports(Class<?> type) {
        return XcloakProperties.class.isAssignableFrom(type);
    }

    @Override
    public void validate(Object target, Errors errors) {
        XcloakProperties p = (XcloakProperties) target;
        if (p.prefix == null) {
            errors.rejectValue("prefix", "xcloak.prefix", "must be a string (empty for none)");
        }
        positive(errors, "timeout", p.timeout);
        positive(errors, "probeInterval", p.probeInterval);
        if (p.durable.replicas < 0) {
            errors.rejectValue("durable.replicas", "xcloak.range", "must be an integer from 0 (off) up");
        }
        positive(errors, "durable.timeout", p.durable.timeout);
        if (p.blockCache < 0 || p.blockCache > MAX_BLOCK_CACHE) {
            errors.rejectValue("blockCache", "xcloak.range", "must be an integer from 0 (off) to " + MAX_BLOCK_CACHE);
        }
        try {
            new io.xcloak.spring.web.ClientAddress(p.trustedProxies);
        } catch (IllegalArgumentException e) {
            errors.rejectValue("trustedProxies", "xcloak.trustedProxies", e.getMessage());
        }
        for (Map.Entry<String, Route> entry : p.routes.entrySet()) {
            validateRoute(errors, "routes[" + entry.getKey() + "]", entry.getValue());
        }
    }

    /**
     * Checks one limit against the server's ranges; {@code path} is the field path under the
     * target ({@code routes[login]}). Also used by the gateway's per-route configuration.
     */
    public static void validateRoute(Errors errors, String path, Route route) {
        for (String pattern : route.paths) {
            if (pattern == null || !pattern.startsWith("/")) {
                errors.rejectValue(path + ".paths", "xcloak.paths", "each must be a path pattern starting with '/' (got '" + pattern + "')");
            }
        }
        for (String method : route.methods) {
            if (method == null || !method.matches("[A-Za-z]+")) {
                errors.rejectValue(path + ".methods", "xcloak.methods", "each must be an HTTP method name (got '" + method + "')");
            }
        }
        validateLimit(errors, path, route.window, route.limit, route.cost, route.tiers);
    }

    /**
     * Checks a limit (tier 0, its tiers and its cost) against the server's ranges; {@code path} is
     * the field path of the limit under the target ("" at the top). The gateway's per-route
     * configuration is checked by it too.
     */
    public static void validateLimit(Errors errors, String path, Duration window, Long limit, long cost, List<Tier> tiers) {
        String at = path.isEmpty() ? "" : path + ".";
        long smallest = validateTier(errors, at, window, limit);
        if (tiers.size() > MAX_TIERS) {
            errors.rejectValue(at + "tiers", "xcloak.range", "must hold at most " + MAX_TIERS + " tiers (16 windows in all), got " + tiers.size());
        }
        for (int i = 0; i < tiers.size(); i++) {
            Tier tier = tiers.get(i);
            smallest = Math.min(smallest, validateTier(errors, at + "tiers[" + i + "].", tier.window, tier.limit));
        }
        if (cost < 1 || cost > smallest) {
            errors.rejectValue(at + "cost", "xcloak.range", "must be an integer from 1 to the limit ("
                    + (smallest == Long.MAX_VALUE ? MAX_LIMIT : smallest) + ")");
        }
    }

    /** Returns the limit when it is valid, else Long.MAX_VALUE (the cost check then uses MAX_LIMIT). */
    private static long validateTier(Errors errors, String at, Duration window, Long limit) {
        if (window == null) {
            errors.rejectValue(at + "window", "xcloak.required", "is required: a duration from 1ms to " + MAX_WINDOW_MS + "ms");
        } else if (window.isNegative() || window.isZero() || window.getNano() % 1_000_000 != 0
                || window.compareTo(Duration.ofMillis(MAX_WINDOW_MS)) > 0) {
            errors.rejectValue(at + "window", "xcloak.range",
                    "must be a whole number of milliseconds from 1ms to " + MAX_WINDOW_MS + "ms (got " + window + ")");
        }
        if (limit == null) {
            errors.rejectValue(at + "limit", "xcloak.required", "is required: an integer from 1 to " + MAX_LIMIT);
            return Long.MAX_VALUE;
        }
        if (limit < 1 || limit > MAX_LIMIT) {
            errors.rejectValue(at + "limit", "xcloak.range", "must be an integer from 1 to " + MAX_LIMIT + " (got " + limit + ")");
            return Long.MAX_VALUE;
        }
        return limit;
    }

    private static void positive(Errors errors, String field, Duration value) {
        if (value == null || value.isNegative() || value.isZero() || value.getNano() % 1_000_000 != 0) {
            errors.rejectValue(field, "xcloak.range", "must be a positive whole number of milliseconds (got " + value + ")");
        }
    }

    public boolean isEnabled() {
        return enabled;
    }

    public void setEnabled(boolean enabled) {
        this.enabled = enabled;
    }

    public String getPrefix() {
        return prefix;
    }

    public void setPrefix(String prefix) {
        this.prefix = prefix;
    }

    public ErrorPolicy getOnError() {
        return onError;
    }

    public void setOnError(ErrorPolicy onError) {
        this.onError = onError;
    }

    public Duration getTimeout() {
        return timeout;
    }

    public void setTimeout(Duration timeout) {
        this.timeout = timeout;
    }

    public Fallback getFallback() {
        return fallback;
    }

    public void setFallback(Fallback fallback) {
        this.fallback = fallback;
    }

    public Duration getProbeInterval() {
        return probeInterval;
    }

    public void setProbeInterval(Duration probeInterval) {
        this.probeInterval = probeInterval;
    }

    public Durable getDurable() {
        return durable;
    }

    public int getBlockCache() {
        return blockCache;
    }

    public void setBlockCache(int blockCache) {
        this.blockCache = blockCache;
    }

    public Headers.Style getHeaders() {
        return headers;
    }

    public void setHeaders(Headers.Style headers) {
        this.headers = headers;
    }

    public List<String> getTrustedProxies() {
        return trustedProxies;
    }

    public void setTrustedProxies(List<String> trustedProxies) {
        this.trustedProxies = trustedProxies;
    }

    public Map<String, Route> getRoutes() {
        return routes;
    }

    public void setRoutes(Map<String, Route> routes) {
        this.routes = routes;
    }

    public int getFilterOrder() {
        return filterOrder;
    }

    public void setFilterOrder(int filterOrder) {
        this.filterOrder = filterOrder;
    }
}
