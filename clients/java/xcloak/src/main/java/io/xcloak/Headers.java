package io.xcloak;

import java.time.Duration;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * HTTP header fields from a {@link Decision} (docs/clients.md, "Headers"). Pure: nothing is sent.
 * Seconds always round up; a rejected decision with a positive retry-after adds {@code Retry-After}
 * (at least 1); a never-fits decision has none; a {@link Via#ERROR} decision makes no header. The
 * maps keep the fields in the order the contract lists them.
 */
public final class Headers {
    private Headers() {}

    /** Which fields: the draft's current ones (the default), the draft-06 ones, or both. */
    public enum Style {
        /** draft-ietf-httpapi-ratelimit-headers-09/10: {@code RateLimit-Policy} and {@code RateLimit}, one policy per tier. */
        IETF,
        /** draft-06: {@code RateLimit-Limit}, {@code RateLimit-Remaining}, {@code RateLimit-Reset} of the binding tier. */
        LEGACY,
        /** The two sets. */
        BOTH
    }

    /** {@code decision}'s fields in {@code style}, with the default policy names. */
    public static Map<String, String> of(Decision decision, Style style) {
        return of(decision, style, List.of());
    }

    /** {@code decision}'s fields in {@code style}; {@code names} gives one policy name per tier. */
    public static Map<String, String> of(Decision decision, Style style, List<String> names) {
        Map<String, String> fields = new LinkedHashMap<>();
        if (decision.via() == Via.ERROR) {
            return fields;
        }
        List<String> policies = new ArrayList<>();
        List<String> states = new ArrayList<>();
        addPolicies(decision, names, policies, states);
        write(fields, style, policies, states, decision);
        return fields;
    }

    /**
     * {@code multi}'s fields: every sent decision's policies in request order ({@code names.get(i)}
     * for request i, or none for the defaults); the legacy fields and {@code Retry-After} are the
     * binding decision's.
     */
    public static Map<String, String> of(MultiDecision multi, Style style, List<List<String>> names) {
        Map<String, String> fields = new LinkedHashMap<>();
        if (multi.binding().via() == Via.ERROR) {
            return fields;
        }
        List<String> policies = new ArrayList<>();
        List<String> states = new ArrayList<>();
        for (int i = 0; i < multi.decisions().size(); i++) {
            Decision decision = multi.decisions().get(i);
            if (decision.via() == Via.ERROR) {
                continue;
            }
            addPolicies(decision, i < names.size() ? names.get(i) : List.of(), policies, states);
        }
        write(fields, style, policies, states, multi.binding());
        return fields;
    }

    /** A policy's default name: {@code <limit>-in-<s>s} for a whole number of seconds, else {@code <limit>-in-<ms>ms}. */
    public static String defaultName(long limit, Duration window) {
        long ms = window.toMillis();
        return ms % 1000 == 0 ? limit + "-in-" + ms / 1000 + "s" : limit + "-in-" + ms + "ms";
    }

    /** Whole seconds, rounded up: {@code (ms + 999) / 1000}. */
    static long ceilSeconds(Duration duration) {
        long ms = duration.toMillis();
        return ms <= 0 ? 0 : (ms + 999) / 1000;
    }

    private static void addPolicies(Decision d, List<String> names, List<String> policies, List<String> states) {
        if (d.tiers().isEmpty()) {
            String name = names.isEmpty() ? defaultName(d.limit(), d.window()) : names.get(0);
            policies.add(policy(name, d.limit(), d.window()));
            states.add(state(name, d.remaining(), d.resetAfter()));
            return;
        }
        for (int t = 0; t < d.tiers().size(); t++) {
            TierState tier = d.tiers().get(t);
            String name = t < names.size() ? names.get(t) : defaultName(tier.limit(), tier.window());
            policies.add(policy(name, tier.limit(), tier.window()));
            states.add(state(name, tier.remaining(), tier.resetAfter()));
        }
    }

    private static String policy(String name, long limit, Duration window) {
        return "\"" + name + "\";q=" + limit + ";w=" + ceilSeconds(window);
    }

    private static String state(String name, long remaining, Duration resetAfter) {
        return "\"" + name + "\";r=" + remaining + ";t=" + ceilSeconds(resetAfter);
    }

    private static void write(
            Map<String, String> fields, Style style, List<String> policies, List<String> states, Decision binding) {
        if (style == Style.IETF || style == Style.BOTH) {
            fields.put("RateLimit-Policy", String.join(", ", policies));
            fields.put("RateLimit", String.join(", ", states));
        }
        if (style == Style.LEGACY || style == Style.BOTH) {
            fields.put("RateLimit-Limit", Long.toString(binding.limit()));
            fields.put("RateLimit-Remaining", Long.toString(binding.remaining()));
            fields.put("RateLimit-Reset", Long.toString(ceilSeconds(binding.resetAfter())));
        }
        if (!binding.allowed() && binding.retryAfter().toMillis() > 0) {
            fields.put("Retry-After", Long.toString(Math.max(1, ceilSeconds(binding.retryAfter()))));
        }
    }
}
