package io.xcloak.spring.web;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.Collections;
import java.util.List;
import java.util.Map;

import jakarta.servlet.AsyncEvent;
import jakarta.servlet.AsyncListener;
import jakarta.servlet.FilterChain;
import jakarta.servlet.ServletException;
import jakarta.servlet.http.HttpServletRequest;
import jakarta.servlet.http.HttpServletResponse;

import org.springframework.http.server.PathContainer;
import org.springframework.web.filter.OncePerRequestFilter;

/**
 * The Spring MVC (servlet) filter: the limits of {@code xcloak.routes} that a request meets are
 * checked in one call before the request is served (docs/clients.md, Middleware). A rejection is
 * {@code 429 Too Many Requests} with the contract's headers; an admission carries the same
 * headers. Under the error policy: RAISE throws (the container's error handling answers 500),
 * ALLOW serves without headers, DENY answers 503. With {@code skip-successful} (or
 * {@code skip-failed}) the admission carries STAMP and is refunded once the response's status is
 * known, after the response has been flushed.
 */
public class RateLimitFilter extends OncePerRequestFilter {

    private final HttpLimits limits;
    private final ServletKeyResolver keyResolver;

    public RateLimitFilter(HttpLimits limits, ServletKeyResolver keyResolver) {
        this.limits = limits;
        this.keyResolver = keyResolver;
    }

    /** The default key: the client's address, through trusted proxies only. */
    public static ServletKeyResolver clientAddress(ClientAddress address) {
        return request -> address.resolve(request.getRemoteAddr(),
                address.readsForwardingHeaders() ? Collections.list(request.getHeaders("X-Forwarded-For")) : List.of(),
                address.readsForwardingHeaders() ? Collections.list(request.getHeaders("Forwarded")) : List.of());
    }

    @Override
    protected void doFilterInternal(HttpServletRequest request, HttpServletResponse response, FilterChain chain)
            throws ServletException, IOException {
        String uri = request.getRequestURI();
        String contextPath = request.getContextPath();
        PathContainer path = PathContainer.parsePath(contextPath.isEmpty() ? uri : uri.substring(contextPath.length()));
        List<RouteLimit> matched = limits.matching(request.getMethod(), path);
        if (matched.isEmpty()) {
            chain.doFilter(request, response);
            return;
        }
        String client = keyResolver.resolve(request);
        if (client == null) {
            chain.doFilter(request, response);
            return;
        }
        HttpLimits.Outcome outcome = limits.check(matched, client); // RAISE: the exception propagates
        request.setAttribute(HttpLimits.DECISION_ATTRIBUTE, outcome.decision());
        for (Map.Entry<String, String> header : outcome.headers().entrySet()) {
            response.setHeader(header.getKey(), header.getValue());
        }
        int status = outcome.status();
        if (status != 0) {
            response.setStatus(status);
            String body = outcome.body();
            if (!body.isEmpty()) {
                response.setContentType("text/plain;charset=UTF-8");
                response.getOutputStream().write(body.getBytes(StandardCharsets.UTF_8));
            }
            return;
        }
        boolean mayRefund = outcome.refunds(200) || outcome.refunds(500);
        if (!mayRefund) {
            chain.doFilter(request, response);
            return;
        }
        boolean failed = true;
        try {
            chain.doFilter(request, response);
            failed = false;
        } finally {
            if (request.isAsyncStarted()) {
                request.getAsyncContext().addListener(new RefundOnComplete(outcome, response));
            } else {
                int finalStatus = failed ? 500 : response.getStatus();
                if (outcome.refunds(finalStatus)) {
                    if (!failed) {
                        response.flushBuffer(); // the client has its answer before the refund's round trip
                    }
                    outcome.refund(finalStatus);
                }
            }
        }
    }

    /** An async request (DeferredResult, Callable...): its status is known when it completes. */
    private static final class RefundOnComplete implements AsyncListener {

        private final HttpLimits.Outcome outcome;
        private final HttpServletResponse response;

        RefundOnComplete(HttpLimits.Outcome outcome, HttpServletResponse response) {
            this.outcome = outcome;
            this.response = response;
        }

        @Override
        public void onComplete(AsyncEvent event) {
            outcome.refund(response.getStatus());
        }

        @Override
        public void onTimeout(AsyncEvent event) {
        }

        @Override
        public void onError(AsyncEvent event) {
        }

        @Override
        public void onStartAsync(AsyncEvent event) {
        }
    }
}
