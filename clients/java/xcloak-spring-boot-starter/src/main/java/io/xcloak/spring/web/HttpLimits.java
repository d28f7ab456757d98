package io.xcloak.spring.web;

import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.OptionalInt;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionStage;

import io.xcloak.Decision;
import io.xcloak.Headers;
import io.xcloak.Limiter;
import io.xcloak.MultiDecision;
import io.xcloak.Request;
import io.xcloak.Tier;
import io.xcloak.Via;
import io.xcloak.spring.XcloakProperties;

import org.apache.commons.logging.Log;
import org.apache.commons.logging.LogFactory;
import org.springframework.http.server.PathContainer;

/**
 * What the servlet filter and the WebFilter share (docs/clients.md, Middleware): which limits a
 * request meets, one call for them (several are one {@code allowAll}), the verdict and its
 * headers, and the refunds of {@code skip-successful} / {@code skip-failed} once the status is
 * known. The two filters only adapt it to their framework.
 */
public final class HttpLimits {

    private static final Log log = LogFactory.getLog(HttpLimits.class);

    /**
     * The request attribute (servlet) or exchange attribute (WebFlux) holding the request's
     * {@link MultiDecision} (one decision per matched route, in configuration order), for the
     * handler to read: {@code @RequestAttribute(HttpLimits.DECISION_ATTRIBUTE) MultiDecision d}.
     */
    public static final String DECISION_ATTRIBUTE = "io.xcloak.decision";

    /** The body of a 429 whose request can never fit. */
    public static final String NEVER_FITS_BODY = "The request is larger than the rate limit: it can never be admitted.\n";

    private final Limiter limiter;
    private final List<RouteLimit> routes;
    private final Headers.Style style;

    public HttpLimits(Limiter limiter, List<RouteLimit> routes, Headers.Style style) {
        this.limiter = limiter;
        this.routes = List.copyOf(routes);
        this.style = style;
    }

    /** The limits this request meets, in configuration order (empty: it is not limited). */
    public List<RouteLimit> matching(String method, PathContainer path) {
        List<RouteLimit> matched = null;
        for (RouteLimit route : routes) {
            if (route.matches(method, path)) {
                if (matched == null) {
                    matched = new ArrayList<>(routes.size());
                }
                matched.add(route);
            }
        }
        return matched == null ? List.of() : matched;
    }

    /** One request per limit; with STAMP where the limit may be refunded. */
    static List<Request> requests(List<RouteLimit> matched, String client) {
        List<Request> requests = new ArrayList<>(matched.size());
        for (RouteLimit route : matched) {
            requests.add(request(route, client));
        }
        return requests;
    }

    private static Request request(RouteLimit route, String client) {
        Request request = Request.of(route.key(client), route.window(), route.limit());
        if (!route.tiers().isEmpty()) {
            List<Tier> tiers = new ArrayList<>(route.tiers().size());
            for (XcloakProperties.Tier tier : route.tiers()) {
                tiers.add(Tier.of(tier.getWindow(), tier.getLimit()));
            }
            request = request.withTiers(tiers);
        }
        if (route.cost() != 1) {
            request = request.withCost(route.cost());
        }
        if (route.mayRefund()) {
            request = request.withStamp();
        }
        return request;
    }

    /** Blocks the calling thread (the servlet filter's). Throws under the RAISE policy. */
    public Outcome check(List<RouteLimit> matched, String client) {
        List<Request> requests = requests(matched, client);
        MultiDecision decision = requests.size() == 1 ? single(limiter.allow(requests.get(0))) : limiter.allowAll(requests);
        return new Outcome(matched, requests, decision);
    }

    /** Never blocks over Lettuce; completes exceptionally under the RAISE policy. */
    public CompletionStage<Outcome> checkAsync(List<RouteLimit> matched, String client) {
        List<Request> requests = requests(matched, client);
        CompletionStage<MultiDecision> call = requests.size() == 1
                ? limiter.allowAsync(requests.get(0)).thenApply(HttpLimits::single)
                : limiter.allowAllAsync(requests);
        return call.thenApply(decision -> new Outcome(matched, requests, decision));
    }

    private static MultiDecision single(Decision d) {
        return new MultiDecision(d.allowed(), List.of(d), d.allowed() ? OptionalInt.empty() : OptionalInt.of(0), 0);
    }

    /** A request's verdict and, once its response's status is known, its refunds. */
    public final class Outcome {

        private final List<RouteLimit> matched;
        private final List<Request> requests;
        private final MultiDecision decision;

        Outcome(List<RouteLimit> matched, List<Request> requests, MultiDecision decision) {
            this.matched = matched;
            this.requests = requests;
            this.decision = decision;
        }

        public MultiDecision decision() {
            return decision;
        }

        /** 0 to serve the request; else the status to answer with (429, or 503 under DENY). */
        public int status() {
            if (decision.allowed()) {
                return 0;
            }
            return decision.via() == Via.ERROR ? 503 : 429;
        }

        /** The contract's headers; none when the error policy answered. */
        public Map<String, String> headers() {
            if (decision.via() == Via.ERROR) {
                return Map.of();
            }
            return decision.headers(style);
        }

        /** The body of a rejection: empty, or the never-fits sentence. */
        public String body() {
            return status() == 429 && decision.binding().costExceedsLimit() ? NEVER_FITS_BODY : "";
        }

        /** Whether a response of this status gives an admission back. */
        public boolean refunds(int status) {
            if (!decision.allowed() || decision.via() == Via.ERROR) {
                return false;
            }
            for (RouteLimit route : matched) {
                if (route.refunds(status)) {
                    return true;
                }
            }
            return false;
        }

        /** The refunds a response of {@code status} earns, blocking; an outage is logged, not thrown. */
        public void refund(int status) {
            for (int i = 0; i < matched.size(); i++) {
                if (!matched.get(i).refunds(status)) {
                    continue;
                }
                Decision admitted = decision.decisions().get(i);
                if (admitted.stamp().isEmpty()) {
                    continue;
                }
                try {
                    limiter.refund(requests.get(i).key(), admitted.stamp().getAsLong(), requests.get(i).cost());
                } catch (RuntimeException e) {
                    // The admission stays: the window is conservative, never generous.
                    log.warn("xcloak: the refund of " + requests.get(i).key() + " failed", e);
                }
            }
        }

        /** {@link #refund(int)} without blocking; completes normally whatever happens. */
        public CompletionStage<Void> refundAsync(int status) {
            CompletableFuture<Void> all = CompletableFuture.completedFuture(null);
            for (int i = 0; i < matched.size(); i++) {
                if (!matched.get(i).refunds(status)) {
                    continue;
                }
                Decision admitted = decision.decisions().get(i);
                if (admitted.stamp().isEmpty()) {
                    continue;
                }
                Request request = requests.get(i);
                long stamp = admitted.stamp().getAsLong();
                all = all.thenCompose(ignored -> limiter.refundAsync(request.key(), stamp, request.cost())
                        .handle((removed, error) -> {
                            if (error != null) {
                                log.warn("xcloak: the refund of " + request.key() + " failed", error);
                            }
                            return null;
                        }));
            }
            return all;
        }
    }
}
