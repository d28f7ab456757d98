package io.xcloak;

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.OptionalLong;

/**
 * The pure core: a reply becomes a {@link Decision} (docs/clients.md, "Decision"); a request
 * becomes its canonical command. No I/O: the conformance vectors drive it without a server.
 */
final class Replies {
    private Replies() {}

    static final byte[] DETAILS = ascii("DETAILS");
    static final byte[] STAMP = ascii("STAMP");
    static final byte[] OLDEST = ascii("OLDEST");
    static final byte[] TIER = ascii("TIER");
    static final byte[] COST = ascii("COST");
    static final byte[] NOW = ascii("NOW");

    static byte[] ascii(String text) {
        return text.getBytes(StandardCharsets.US_ASCII);
    }

    static byte[] number(long value) {
        return ascii(Long.toString(value));
    }

    /**
     * The arguments after the key, in the canonical order: {@code window limit [TIER w l]... [COST c]
     * [NOW t]}, then for an allow {@code DETAILS [STAMP]}, for a peek {@code [OLDEST]}.
     */
    static List<byte[]> windowArgs(Request request, boolean peek, boolean stamp) {
        List<byte[]> args = new ArrayList<>(8 + 3 * request.tiers().size());
        args.add(number(Request.wholeMillis("window", request.window())));
        args.add(number(request.limit()));
        for (int i = 0; i < request.tiers().size(); i++) {
            Tier tier = request.tiers().get(i);
            args.add(TIER);
            args.add(number(Request.wholeMillis("window of TIER " + (i + 1), tier.window())));
            args.add(number(tier.limit()));
        }
        if (request.cost() != 1) {
            args.add(COST);
            args.add(number(request.cost()));
        }
        if (request.now().isPresent()) {
            args.add(NOW);
            args.add(number(request.now().getAsLong()));
        }
        if (peek) {
            if (request.oldest()) {
                args.add(OLDEST);
            }
        } else {
            args.add(DETAILS);
            if (stamp) {
                args.add(STAMP);
            }
        }
        return args;
    }

    /** {@code XCLOAK.REFUND}'s arguments after the key: {@code stamp [COST c]}. */
    static List<byte[]> refundArgs(long stamp, long cost) {
        List<byte[]> args = new ArrayList<>(3);
        args.add(number(stamp));
        if (cost != 1) {
            args.add(COST);
            args.add(number(cost));
        }
        return args;
    }

    /**
     * Reads an allow's reply ({@code peek} false: the last element is the stamp) or a peek's (the
     * oldest entry). {@code window} is tier 0's, the binding one's when there are no tiers.
     */
    static Decision decision(Object reply, Duration window, boolean peek, Via via) {
        if (!(reply instanceof List<?> items) || items.size() < 5) {
            throw bad(reply);
        }
        long[] f = new long[5];
        for (int i = 0; i < 5; i++) {
            f[i] = integer(items.get(i), reply);
        }
        int next = 5;
        List<TierState> tiers = new ArrayList<>();
        if (items.size() > next && items.get(next) instanceof List<?> perTier) {
            for (Object t : perTier) {
                if (!(t instanceof List<?> tier) || tier.size() != 5) {
                    throw bad(reply);
                }
                tiers.add(new TierState(
                        millis(integer(tier.get(0), reply)),
                        integer(tier.get(1), reply),
                        Math.max(0, integer(tier.get(2), reply)),
                        millis(integer(tier.get(3), reply)),
                        millis(integer(tier.get(4), reply))));
            }
            next++;
        }
        OptionalLong last = OptionalLong.empty();
        if (items.size() > next) {
            long value = integer(items.get(next), reply);
            if (value >= 0) {
                last = OptionalLong.of(value);
            }
        }
        long remaining = Math.max(0, f[2]);
        // The reply gives the binding tier's fields but not its index: the first tier
        // with the same four, since the server breaks ties to the earliest.
        int tier = 0;
        for (int i = 0; i < tiers.size(); i++) {
            TierState t = tiers.get(i);
            if (t.limit() == f[1]
                    && t.remaining() == remaining
                    && t.retryAfter().toMillis() == f[3]
                    && t.resetAfter().toMillis() == f[4]) {
                tier = i;
                break;
            }
        }
        return new Decision(
                f[0] == 1,
                f[1],
                remaining,
                millis(f[3]),
                millis(f[4]),
                f[3] == -1,
                tiers.isEmpty() ? window : tiers.get(tier).window(),
                tier,
                tiers,
                peek ? OptionalLong.empty() : last,
                peek ? last : OptionalLong.empty(),
                via,
                null);
    }

    /** What the error policy answers (docs/clients.md): tier 0 as asked, everything else empty. */
    static Decision errorDecision(Request request, boolean allowed, Throwable error) {
        return new Decision(
                allowed,
                request.limit(),
                0,
                Duration.ZERO,
                Duration.ZERO,
                false,
                request.window(),
                0,
                List.of(),
                OptionalLong.empty(),
                OptionalLong.empty(),
                Via.ERROR,
                error);
    }

    /** A MultiDecision of server decisions: the rejected one binds, else the fewest remaining (ties: the earliest). */
    static MultiDecision multi(List<Decision> decisions) {
        int binding = 0;
        for (int i = 0; i < decisions.size(); i++) {
            Decision d = decisions.get(i);
            if (!d.allowed()) {
                return new MultiDecision(false, decisions, java.util.OptionalInt.of(i), i);
            }
            if (d.remaining() < decisions.get(binding).remaining()) {
                binding = i;
            }
        }
        return new MultiDecision(true, decisions, java.util.OptionalInt.empty(), binding);
    }

    private static Duration millis(long ms) {
        return ms == -1 ? Decision.NEVER : Duration.ofMillis(ms);
    }

    private static long integer(Object value, Object reply) {
        if (value instanceof Long l) {
            return l;
        }
        throw bad(reply);
    }

    static XcloakException bad(Object reply) {
        return new XcloakException("an xcloak reply is five integers, a tier list and a stamp or the oldest entry, not "
                + show(reply));
    }

    static String show(Object reply) {
        if (reply instanceof byte[] bytes) {
            return new String(bytes, StandardCharsets.UTF_8);
        }
        if (reply instanceof List<?> list) {
            List<String> parts = new ArrayList<>();
            for (Object item : list) {
                parts.add(show(item));
            }
            return parts.toString();
        }
        return String.valueOf(reply);
    }
}
