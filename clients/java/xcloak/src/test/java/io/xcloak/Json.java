package io.xcloak;

import com.google.gson.JsonArray;
import com.google.gson.JsonElement;
import com.google.gson.JsonObject;
import com.google.gson.JsonParser;
import com.google.gson.JsonPrimitive;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/** The conformance files as plain Java values: Long, Double, String, Boolean, List, Map, null. */
final class Json {
    private Json() {}

    @SuppressWarnings("unchecked")
    static Map<String, Object> load(String name) {
        Path path = RedisServer.repo().resolve("clients/conformance").resolve(name);
        try {
            return (Map<String, Object>) plain(JsonParser.parseString(Files.readString(path, StandardCharsets.UTF_8)));
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }

    static Object plain(JsonElement e) {
        if (e == null || e.isJsonNull()) {
            return null;
        }
        if (e instanceof JsonArray array) {
            List<Object> out = new ArrayList<>();
            array.forEach(item -> out.add(plain(item)));
            return out;
        }
        if (e instanceof JsonObject object) {
            Map<String, Object> out = new LinkedHashMap<>();
            object.entrySet().forEach(entry -> out.put(entry.getKey(), plain(entry.getValue())));
            return out;
        }
        JsonPrimitive p = e.getAsJsonPrimitive();
        if (p.isBoolean()) {
            return p.getAsBoolean();
        }
        if (p.isString()) {
            return p.getAsString();
        }
        String text = p.getAsString();
        return text.contains(".") || text.contains("e") ? (Object) p.getAsDouble() : (Object) p.getAsLong();
    }

    /** A vector's reply as a transport's value: Long, byte[], List, null, ErrorReply. */
    @SuppressWarnings("unchecked")
    static Object reply(Object json) {
        if (json instanceof Map<?, ?> map && map.containsKey("error")) {
            return new Transport.ErrorReply((String) map.get("error"));
        }
        if (json instanceof List<?> list) {
            List<Object> out = new ArrayList<>();
            for (Object item : list) {
                out.add(reply(item));
            }
            return out;
        }
        if (json instanceof String s) {
            return s.getBytes(StandardCharsets.UTF_8);
        }
        return json;
    }

    /** A Decision in the vectors' shape. */
    static Map<String, Object> decision(Decision d) {
        Map<String, Object> out = new LinkedHashMap<>();
        out.put("allowed", d.allowed());
        out.put("limit", d.limit());
        out.put("remaining", d.remaining());
        out.put("retry_after_ms", d.retryAfter().toMillis());
        out.put("reset_after_ms", d.resetAfter().toMillis());
        out.put("cost_exceeds_limit", d.costExceedsLimit());
        out.put("window_ms", d.window().toMillis());
        out.put("tier", (long) d.tier());
        List<Object> tiers = new ArrayList<>();
        for (TierState t : d.tiers()) {
            Map<String, Object> tier = new LinkedHashMap<>();
            tier.put("window_ms", t.window().toMillis());
            tier.put("limit", t.limit());
            tier.put("remaining", t.remaining());
            tier.put("retry_after_ms", t.retryAfter().toMillis());
            tier.put("reset_after_ms", t.resetAfter().toMillis());
            tiers.add(tier);
        }
        out.put("tiers", tiers);
        out.put("stamp", d.stamp().isPresent() ? (Object) d.stamp().getAsLong() : null);
        return out;
    }

    static long num(Map<String, Object> m, String key, long otherwise) {
        Object v = m.get(key);
        return v == null ? otherwise : ((Number) v).longValue();
    }

    /** A vector step's request: key, window, limit, tiers, cost. */
    @SuppressWarnings("unchecked")
    static Request request(Map<String, Object> step) {
        Request r = Request.of((String) step.get("key"), Duration.ofMillis(num(step, "window", 0)), num(step, "limit", 0));
        Object tiers = step.get("tiers");
        if (tiers != null) {
            for (List<Object> pair : (List<List<Object>>) tiers) {
                r = r.withTier(Duration.ofMillis(((Number) pair.get(0)).longValue()), ((Number) pair.get(1)).longValue());
            }
        }
        if (step.get("cost") != null) {
            r = r.withCost(num(step, "cost", 1));
        }
        if (step.get("now") != null) {
            r = r.withNow(num(step, "now", 0));
        }
        if (Boolean.TRUE.equals(step.get("stamp"))) {
            r = r.withStamp();
        }
        if (Boolean.TRUE.equals(step.get("oldest"))) {
            r = r.withOldest();
        }
        return r;
    }

    @SuppressWarnings("unchecked")
    static List<String> strings(Object list) {
        return list == null ? List.of() : (List<String>) list;
    }
}
