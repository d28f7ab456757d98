package io.xcloak;

import java.time.Duration;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.OptionalLong;

/**
 * The block cache (docs/clients.md, "Block cache"): a rejection the server gave, held until its
 * retry-after passes, answers the same request again without a call. One entry per key, least
 * recently used evicted when full; O(1) per operation (a LinkedHashMap in access order). Its clock
 * is the local monotonic one, in nanoseconds; an entry's time is taken just before the call was
 * sent, so a cached answer can only end early, never late. Thread-safe: the lock is never held
 * across a network call.
 */
final class BlockCache {
    /** The request's shape: window, limit and the tiers, in ms and ints. */
    record Sig(long windowMs, long limit, List<Long> tiers) {
        /** Whether a request of {@code cost} fits in every tier's limit (else it never fits: the server says so). */
        boolean fits(long cost) {
            if (cost > limit) {
                return false;
            }
            for (int i = 1; i < tiers.size(); i += 2) {
                if (cost > tiers.get(i)) {
                    return false;
                }
            }
            return true;
        }

        static Sig of(Request request) {
            List<Long> tiers = new ArrayList<>(request.tiers().size() * 2);
            for (Tier tier : request.tiers()) {
                tiers.add(tier.window().toMillis());
                tiers.add(tier.limit());
            }
            return new Sig(request.window().toMillis(), request.limit(), tiers);
        }
    }

    private record Entry(Sig sig, long cost, long sentAtNanos, long deadlineNanos, Decision decision) {}

    private final int capacity;
    private final LinkedHashMap<String, Entry> entries;
    /**
     * When a key of each slot (by its hash) was last refunded or reset through this limiter: a
     * rejection sent before that is not held (the server may have decided it before the window
     * opened). A collision only skips a record.
     */
    private final long[] forgotten = filled(new long[256]);
    private long hits;
    /** The entries held, readable without the lock: an empty cache costs no lock per call. */
    private volatile int size;

    BlockCache(int capacity) {
        this.capacity = capacity;
        this.entries = new LinkedHashMap<>(Math.min(capacity, 1024) * 2, 0.75f, true) {
            private static final long serialVersionUID = 1L;

            @Override
            protected boolean removeEldestEntry(Map.Entry<String, Entry> eldest) {
                return size() > BlockCache.this.capacity;
            }
        };
    }

    /** The cached rejection of {@code key} for this request at {@code nowNanos}, or null (a miss). */
    Decision lookup(String key, Sig sig, long cost, long nowNanos) {
        if (size == 0) {
            return null;
        }
        synchronized (this) {
            return lookupLocked(key, sig, cost, nowNanos);
        }
    }

    private Decision lookupLocked(String key, Sig sig, long cost, long nowNanos) {
        Entry entry = entries.get(key); // touches it (LRU)
        if (entry == null) {
            return null;
        }
        if (nowNanos - entry.deadlineNanos >= 0) {
            entries.remove(key); // an expired entry is dropped when met
            size = entries.size();
            return null;
        }
        if (!entry.sig.equals(sig) || cost < entry.cost || !sig.fits(cost)) {
            return null; // a smaller cost, another shape, or a cost that never fits: sent
        }
        hits++;
        long elapsedMs = Math.floorDiv(nowNanos - entry.sentAtNanos, 1_000_000L);
        long leftNanos = entry.deadlineNanos - nowNanos;
        long retryMs = Math.max(1, (leftNanos + 999_999) / 1_000_000);
        Decision d = entry.decision;
        List<TierState> tiers = new ArrayList<>(d.tiers().size());
        for (TierState t : d.tiers()) {
            tiers.add(new TierState(
                    t.window(),
                    t.limit(),
                    t.remaining(),
                    Duration.ofMillis(Math.max(0, t.retryAfter().toMillis() - elapsedMs)),
                    Duration.ofMillis(Math.max(0, t.resetAfter().toMillis() - elapsedMs))));
        }
        return new Decision(
                false,
                d.limit(),
                0,
                Duration.ofMillis(retryMs),
                Duration.ofMillis(Math.max(0, d.resetAfter().toMillis() - elapsedMs)),
                false,
                d.window(),
                d.tier(),
                tiers,
                OptionalLong.empty(),
                OptionalLong.empty(),
                Via.CACHE,
                null);
    }

    /**
     * What the server decided for a request sent at {@code sentAtNanos}: a rejection with a positive
     * retry-after is held (replacing the key's entry); an admission drops the key's entry; anything
     * else (never-fits) changes nothing.
     */
    /** Whether the cache holds nothing (read without the lock). */
    boolean isEmpty() {
        return size == 0;
    }

    /** {@link #record(String, Sig, long, long, Decision)} of {@code request}, its shape read only when held. */
    void record(Request request, long sentAtNanos, Decision decision) {
        if (decision.allowed()) {
            if (size != 0) {
                drop(request.key());
            }
            return;
        }
        record(request.key(), Sig.of(request), request.cost(), sentAtNanos, decision);
    }

    void record(String key, Sig sig, long cost, long sentAtNanos, Decision decision) {
        if (decision.allowed()) {
            if (size != 0) {
                drop(key);
            }
            return;
        }
        long retryMs = decision.retryAfter().toMillis();
        if (decision.costExceedsLimit() || retryMs <= 0) {
            return;
        }
        synchronized (this) {
            if (forgotten[slot(key)] > sentAtNanos) {
                return; // refunded or reset while this call was in flight
            }
            entries.put(key, new Entry(sig, cost, sentAtNanos, sentAtNanos + retryMs * 1_000_000L, decision));
            size = entries.size();
        }
    }

    /**
     * Drops {@code key}'s entry (refund and reset, before they are sent, at monotonic {@code
     * nowNanos}) and keeps a rejection of it already in flight from being held.
     */
    synchronized void forget(String key, long nowNanos) {
        entries.remove(key);
        size = entries.size();
        forgotten[slot(key)] = nowNanos;
    }

    /** Drops {@code key}'s entry after an admission: calls in flight beside it saw the same window. */
    private synchronized void drop(String key) {
        entries.remove(key);
        size = entries.size();
    }

    private int slot(String key) {
        return key.hashCode() & (forgotten.length - 1);
    }

    private static long[] filled(long[] slots) {
        java.util.Arrays.fill(slots, Long.MIN_VALUE);
        return slots;
    }

    synchronized Stats stats() {
        return new Stats(hits, entries.size());
    }
}
