package io.xcloak;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Deque;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionStage;
import java.util.function.Function;

/**
 * Runs the conformance vectors (clients/conformance/vectors.json) through the public API: against a
 * replay of their replies (no server: the pure core), or against a live server, through the
 * command (a server with the module) or the fallback (a server without it).
 */
final class Vectors {
    static final Map<String, Object> FILE = Json.load("vectors.json");

    @SuppressWarnings("unchecked")
    static List<Map<String, Object>> cases() {
        return (List<Map<String, Object>>) FILE.get("cases");
    }

    /** A transport that answers with the vectors' replies, checking each command as it comes. */
    static final class Replay implements Transport {
        final Deque<Map<String, Object>> expected = new ArrayDeque<>();

        @Override
        public CompletionStage<Reply> send(Call call) {
            Map<String, Object> next = expected.poll();
            if (next == null) {
                throw new AssertionError("an unexpected command: " + Recording.strings(call.command()));
            }
            assertEquals(next.get("command"), Recording.strings(call.command()), "the command sent");
            return CompletableFuture.completedFuture(new Reply(Json.reply(next.get("reply")), ""));
        }
    }

    /** A virtual clock: now from a start, each sleep advances it and returns at once. */
    static final class VirtualClock implements Clock {
        long now;
        final List<Long> sleeps = new ArrayList<>();

        VirtualClock(long start) {
            this.now = start;
        }

        @Override
        public long nowMillis() {
            return now;
        }

        @Override
        public void sleep(Duration duration) {
            sleepAsync(duration);
        }

        @Override
        public CompletionStage<Void> sleepAsync(Duration duration) {
            sleeps.add(duration.toMillis());
            now += duration.toMillis();
            return CompletableFuture.completedFuture(null);
        }
    }

    /** Where a case runs: its transport (recorded), the via it expects, and how to send a setup command. */
    record Target(Transport transport, Via via, Function<List<String>, Object> setup) {}

    /**
     * Runs {@code c} step by step. {@code replay} non-null: the pure run (each step's replies queued
     * there); else live on {@code target}.
     */
    @SuppressWarnings("unchecked")
    static void run(Map<String, Object> c, Target target, Replay replay) {
        String name = (String) c.get("name");
        List<Map<String, Object>> steps = (List<Map<String, Object>>) c.get("steps");
        for (int i = 0; i < steps.size(); i++) {
            Map<String, Object> step = steps.get(i);
            String where = name + " step " + i + " (" + step.get("op") + ")";
            try {
                runStep(step, target, replay, where);
            } catch (AssertionError e) {
                throw new AssertionError(where + ": " + e.getMessage(), e);
            }
        }
    }

    @SuppressWarnings("unchecked")
    private static void runStep(Map<String, Object> step, Target target, Replay replay, String where) {
        String op = (String) step.get("op");
        Recording recording = new Recording(target.transport);
        Limiter.Builder builder = Limiter.builder(recording).fallback(replay != null ? Fallback.NEVER : Fallback.AUTO);
        if (replay != null) {
            replay.expected.clear();
            if (step.containsKey("calls")) {
                replay.expected.addAll((List<Map<String, Object>>) step.get("calls"));
            } else if (step.containsKey("command") && !op.equals("raw") && !op.equals("setup")) {
                replay.expected.add(step);
            }
        }
        switch (op) {
            case "raw":
                return; // a typed API can't send it
            case "setup":
                if (replay == null) {
                    Object got = target.setup.apply((List<String>) step.get("command"));
                    assertEquals(step.get("reply"), got, where + " setup reply");
                }
                return;
            case "allow", "peek": {
                Limiter limiter = builder.build();
                Request request = Json.request(step);
                boolean peek = op.equals("peek");
                if (step.containsKey("error")) {
                    XcloakException e = assertThrows(XcloakException.class,
                            () -> { Decision d = peek ? limiter.peek(request) : limiter.allow(request); throw new AssertionError("no error: " + d); });
                    assertEquals(step.get("error"), e.getMessage());
                } else {
                    Decision d = peek ? limiter.peek(request) : limiter.allow(request);
                    assertEquals(step.get("decision"), Json.decision(d), "the decision");
                    assertEquals(target.via, d.via(), "via");
                    if (peek && step.containsKey("oldest_ms")) {
                        Object oldest = d.oldest().isPresent() ? (Object) d.oldest().getAsLong() : null;
                        assertEquals(step.get("oldest_ms"), oldest, "oldest");
                    }
                    checkHeaders((Map<String, Object>) step.get("headers"), style -> d.headers(style,
                            Json.strings(step.get("names"))));
                }
                checkCommands(List.of((List<String>) step.get("command")), recording.sent);
                return;
            }
            case "refund": {
                Limiter limiter = builder.build();
                String key = (String) step.get("key");
                long stamp = Json.num(step, "stamp", 0);
                long cost = Json.num(step, "cost", 1);
                if (step.containsKey("error")) {
                    XcloakException e = assertThrows(XcloakException.class, () -> limiter.refund(key, stamp, cost));
                    assertEquals(step.get("error"), e.getMessage());
                } else {
                    assertEquals(step.get("removed"), limiter.refund(key, stamp, cost), "removed");
                }
                checkCommands(List.of((List<String>) step.get("command")), recording.sent);
                return;
            }
            case "reset": {
                Limiter limiter = builder.build();
                assertEquals(step.get("existed"), limiter.reset((String) step.get("key")), "existed");
                checkCommands(List.of((List<String>) step.get("command")), recording.sent);
                return;
            }
            case "acquire": {
                VirtualClock clock = new VirtualClock(Json.num(step, "start", 0));
                Iterator<Object> draws = ((List<Object>) step.get("random")).iterator();
                Limiter limiter = builder.clock(clock)
                        .jitterFraction(((Number) step.get("jitter_fraction")).doubleValue())
                        .random(() -> ((Number) draws.next()).doubleValue())
                        .build();
                Decision d = limiter.acquire(Json.request(step), Duration.ofMillis(Json.num(step, "max_wait_ms", 0)));
                assertEquals(step.get("decision"), Json.decision(d), "the last decision");
                List<Map<String, Object>> calls = (List<Map<String, Object>>) step.get("calls");
                List<List<String>> commands = new ArrayList<>();
                List<Long> sleeps = new ArrayList<>();
                for (Map<String, Object> call : calls) {
                    commands.add((List<String>) call.get("command"));
                    if (call.get("sleep_ms") != null) {
                        sleeps.add(((Number) call.get("sleep_ms")).longValue());
                    }
                }
                assertEquals(sleeps, clock.sleeps, "the sleeps");
                checkCommands(commands, recording.sent);
                String outcome = (String) step.get("outcome");
                assertEquals(outcome.equals("admitted"), d.allowed(), "outcome " + outcome);
                assertEquals(outcome.equals("never"), d.costExceedsLimit(), "outcome " + outcome);
                return;
            }
            case "allow_all": {
                Limiter limiter = builder.build();
                List<Request> requests = new ArrayList<>();
                for (Map<String, Object> r : (List<Map<String, Object>>) step.get("requests")) {
                    requests.add(Json.request(r).withNow(Json.num(step, "now", 0)));
                }
                MultiDecision m = limiter.allowAll(requests);
                assertEquals(step.get("allowed"), m.allowed(), "allowed");
                assertEquals(step.get("rejected"), m.rejected().isPresent() ? (Object) (long) m.rejected().getAsInt() : null,
                        "rejected");
                assertEquals(step.get("binding"), (long) m.bindingIndex(), "binding");
                List<Object> decisions = new ArrayList<>();
                for (Decision d : m.decisions()) {
                    decisions.add(Json.decision(d));
                    assertEquals(target.via, d.via(), "via");
                }
                assertEquals(step.get("decisions"), decisions, "decisions");
                List<List<String>> names = step.get("names") == null ? List.of() : (List<List<String>>) step.get("names");
                checkHeaders((Map<String, Object>) step.get("headers"), style -> m.headers(style, names));
                List<List<String>> commands = new ArrayList<>();
                for (Map<String, Object> call : (List<Map<String, Object>>) step.get("calls")) {
                    commands.add((List<String>) call.get("command"));
                }
                checkCommands(commands, recording.sent);
                return;
            }
            default:
                throw new AssertionError("an op this runner does not know: " + op);
        }
    }

    @SuppressWarnings("unchecked")
    private static void checkHeaders(Map<String, Object> expected, Function<Headers.Style, Map<String, String>> headers) {
        if (expected == null) {
            return;
        }
        assertEquals(expected.get("ietf"), new LinkedHashMap<String, Object>(headers.apply(Headers.Style.IETF)), "ietf headers");
        assertEquals(expected.get("legacy"), new LinkedHashMap<String, Object>(headers.apply(Headers.Style.LEGACY)), "legacy headers");
        Map<String, Object> both = new LinkedHashMap<>((Map<String, Object>) expected.get("ietf"));
        both.putAll((Map<String, Object>) expected.get("legacy"));
        assertEquals(both, new LinkedHashMap<String, Object>(headers.apply(Headers.Style.BOTH)), "both headers");
    }

    /**
     * The commands sent, in the vectors' form: a script call ({@code EVALSHA[_RO] sha 1 key args},
     * {@code EVAL[_RO] text 1 key args}) as the command it stands for, and the resends the server
     * asked for (an unknown command, NOSCRIPT) collapsed.
     */
    static void checkCommands(List<List<String>> expected, List<List<String>> sent) {
        List<List<String>> canonical = new ArrayList<>();
        for (List<String> command : sent) {
            List<String> c = canonical(command);
            if (canonical.isEmpty() || !canonical.get(canonical.size() - 1).equals(c)) {
                canonical.add(c);
            }
        }
        assertEquals(expected, canonical, "the commands sent");
    }

    static List<String> canonical(List<String> command) {
        String name = command.get(0);
        if (!name.startsWith("EVAL")) {
            return command;
        }
        String script = command.get(1);
        String op = null;
        for (Map.Entry<String, Engine.Script> e : Map.of("XCLOAK.ALLOW", Engine.ALLOW_SCRIPT, "XCLOAK.PEEK",
                Engine.PEEK_SCRIPT, "XCLOAK.REFUND", Engine.REFUND_SCRIPT).entrySet()) {
            if (script.equals(new String(e.getValue().sha(), StandardCharsets.US_ASCII))
                    || script.equals(new String(e.getValue().code(), StandardCharsets.UTF_8))) {
                op = e.getKey();
            }
        }
        assertTrue(op != null, "a script call of an unknown script: " + name);
        assertEquals("1", command.get(2), "numkeys");
        assertEquals(op.equals("XCLOAK.PEEK"), name.endsWith("_RO"), "a peek goes by " + name);
        List<String> out = new ArrayList<>();
        out.add(op);
        out.addAll(command.subList(3, command.size()));
        return out;
    }
}
