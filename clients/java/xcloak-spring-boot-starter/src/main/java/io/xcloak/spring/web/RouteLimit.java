package io.xcloak.spring.web;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;

import io.xcloak.spring.XcloakProperties;

import org.springframework.http.server.PathContainer;
import org.springframework.web.util.pattern.PathPattern;
import org.springframework.web.util.pattern.PathPatternParser;

/**
 * One limit of the web filters, built once from {@code xcloak.routes.NAME}: which requests it
 * counts (path patterns, methods) and the limit itself. Its keys are {@code rl:NAME:CLIENT}.
 */
public final class RouteLimit {

    private final String name;
    private final String keyPrefix;
    private final List<PathPattern> paths;
    private final Set<String> methods;
    private final Duration window;
    private final long limit;
    private final long cost;
    private final List<XcloakProperties.Tier> tiers;
    private final boolean skipSuccessful;
    private final boolean skipFailed;

    public RouteLimit(String name, XcloakProperties.Route route) {
        this.name = name;
        this.keyPrefix = "rl:" + name + ":";
        List<PathPattern> parsed = new ArrayList<>();
        for (String path : route.getPaths()) {
            parsed.add(PathPatternParser.defaultInstance.parse(path));
        }
        this.paths = List.copyOf(parsed);
        Set<String> m = new TreeSet<>();
        for (String method : route.getMethods()) {
            m.add(method.toUpperCase(Locale.ROOT));
        }
        this.methods = Set.copyOf(m);
        this.window = route.getWindow();
        this.limit = route.getLimit();
        this.cost = route.getCost();
        this.tiers = List.copyOf(route.getTiers());
        this.skipSuccessful = route.isSkipSuccessful();
        this.skipFailed = route.isSkipFailed();
    }

    /** Every route of the properties, in their order. */
    public static List<RouteLimit> of(Map<String, XcloakProperties.Route> routes) {
        List<RouteLimit> limits = new ArrayList<>();
        routes.forEach((name, route) -> limits.add(new RouteLimit(name, route)));
        return List.copyOf(limits);
    }

    public boolean matches(String method, PathContainer path) {
        if (!methods.isEmpty() && !methods.contains(method.toUpperCase(Locale.ROOT))) {
            return false;
        }
        if (paths.isEmpty()) {
            return true;
        }
        for (PathPattern pattern : paths) {
            if (pattern.matches(path)) {
                return true;
            }
        }
        return false;
    }

    /** Whether a response of this status gives the admission back. */
    public boolean refunds(int status) {
        return status < 400 ? skipSuccessful : skipFailed;
    }

    /** Whether it may refund at all (its admissions then carry STAMP). */
    public boolean mayRefund() {
        return skipSuccessful || skipFailed;
    }

    public String name() {
        return name;
    }

    public String key(String client) {
        return keyPrefix + client;
    }

    public Duration window() {
        return window;
    }

    public long limit() {
        return limit;
    }

    public long cost() {
        return cost;
    }

    public List<XcloakProperties.Tier> tiers() {
        return tiers;
    }
}
