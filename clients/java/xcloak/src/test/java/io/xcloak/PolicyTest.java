package io.xcloak;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.net.ConnectException;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionStage;
import org.junit.jupiter.api.Test;

/**
 * docs/clients.md, "allow_all" and "Errors", without a server: a transport that admits the first
 * request and has no answer for the second. The admission is refunded, then the policy answers
 * once for the whole call; a server's refusal is raised whatever the policy.
 */
class PolicyTest {
    /** Admits XCLOAK.ALLOW on "a" (stamp 7), fails every other ALLOW, answers refunds with 1. */
    static final class Scripted implements Transport {
        final List<List<String>> sent = new ArrayList<>();
        final Object onB;

        Scripted(Object onB) {
            this.onB = onB;
        }

        @Override
        public CompletionStage<Reply> send(Call call) {
            List<String> command = Recording.strings(call.command());
            sent.add(command);
            if (command.get(0).equals("XCLOAK.REFUND")) {
                return CompletableFuture.completedFuture(new Reply(1L, ""));
            }
            if (command.get(1).equals("a")) {
                return CompletableFuture.completedFuture(new Reply(List.of(1L, 5L, 4L, 0L, 60_000L, 7L), ""));
            }
            if (onB instanceof Throwable t) {
                return CompletableFuture.failedFuture(t);
            }
            return CompletableFuture.completedFuture(new Reply(onB, ""));
        }
    }

    static final List<Request> REQUESTS = List.of(
            Request.of("a", Duration.ofMinutes(1), 5), Request.of("b", Duration.ofMinutes(1), 3));

    @Test
    void an_outage_at_j_refunds_before_it_and_the_policy_answers_once() {
        for (ErrorPolicy policy : ErrorPolicy.values()) {
            Scripted transport = new Scripted(new ConnectException("refused"));
            Limiter limiter = Limiter.builder(transport).onError(policy).build();
            if (policy == ErrorPolicy.RAISE) {
                XcloakUnavailableException e = assertThrows(XcloakUnavailableException.class, () -> limiter.allowAll(REQUESTS));
                assertInstanceOf(ConnectException.class, e.getCause());
            } else {
                MultiDecision m = limiter.allowAll(REQUESTS);
                boolean allowed = policy == ErrorPolicy.ALLOW;
                assertEquals(allowed, m.allowed(), policy.name());
                assertEquals(2, m.decisions().size());
                assertEquals(Via.COMMAND, m.decisions().get(0).via());
                assertEquals(7, m.decisions().get(0).stamp().getAsLong(), "the refunded request's decision keeps its admission");
                Decision error = m.binding();
                assertEquals(1, m.bindingIndex());
                assertEquals(Via.ERROR, error.via());
                assertEquals(3, error.limit(), "tier 0 of the request that failed, as asked");
                assertEquals(allowed ? -1 : 1, m.rejected().isPresent() ? m.rejected().getAsInt() : -1);
                assertTrue(m.headers(Headers.Style.BOTH).isEmpty(), "a via-error binding makes no header");
            }
            assertEquals(List.of("XCLOAK.REFUND", "a", "7"), transport.sent.get(2), policy + ": the admission is refunded");
            assertEquals(3, transport.sent.size());
        }
    }

    @Test
    void a_refusal_is_raised_whatever_the_policy_after_the_rollback() {
        Scripted transport = new Scripted(new Transport.ErrorReply("ERR limit must be an integer from 0 to 1000000"));
        Limiter limiter = Limiter.builder(transport).onError(ErrorPolicy.ALLOW).build();
        XcloakException e = assertThrows(XcloakException.class, () -> limiter.allowAll(REQUESTS));
        assertFalse(e instanceof XcloakUnavailableException);
        assertEquals("ERR limit must be an integer from 0 to 1000000", e.getMessage());
        assertEquals("XCLOAK.REFUND", transport.sent.get(2).get(0));
    }

    @Test
    void a_server_that_cannot_serve_now_goes_to_the_policy() {
        for (String reply : List.of("LOADING Redis is loading the dataset in memory", "BUSY Redis is busy running a script",
                "READONLY You can't write against a read only replica.", "ERR max number of clients reached",
                "CLUSTERDOWN The cluster is down", "OOM command not allowed when used memory > 'maxmemory'.")) {
            Limiter limiter = Limiter.builder(new Scripted(new Transport.ErrorReply(reply))).onError(ErrorPolicy.DENY).build();
            Decision d = limiter.allow(Request.of("b", Duration.ofMinutes(1), 3));
            assertEquals(Via.ERROR, d.via(), reply);
            assertFalse(d.allowed());
            assertEquals(reply, d.error().getCause().getMessage());
        }
    }
}
