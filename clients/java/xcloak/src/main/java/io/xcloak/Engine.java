package io.xcloak;

import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionException;
import java.util.concurrent.CompletionStage;
import java.util.concurrent.ExecutionException;

/** The calls of docs/clients.md over a {@link Transport}. (Skeleton: the API's shape first.) */
final class Engine {
    private final Transport transport;

    Engine(Limiter.Builder builder) {
        this.transport = builder.transport;
    }

    static void check(Limiter.Builder builder) {}

    CompletionStage<Decision> allow(Request request) {
        return CompletableFuture.failedFuture(new UnsupportedOperationException("skeleton"));
    }

    CompletionStage<Decision> peek(Request request) {
        return CompletableFuture.failedFuture(new UnsupportedOperationException("skeleton"));
    }

    CompletionStage<Long> refund(String key, long stamp, long cost) {
        return CompletableFuture.failedFuture(new UnsupportedOperationException("skeleton"));
    }

    CompletionStage<Boolean> reset(String key) {
        return CompletableFuture.failedFuture(new UnsupportedOperationException("skeleton"));
    }

    CompletionStage<Decision> acquire(Request request, java.time.Duration maxWait) {
        return CompletableFuture.failedFuture(new UnsupportedOperationException("skeleton"));
    }

    CompletionStage<MultiDecision> allowAll(List<Request> requests) {
        return CompletableFuture.failedFuture(new UnsupportedOperationException("skeleton"));
    }

    Stats stats() {
        return new Stats(0, 0);
    }

    void close() {
        transport.close();
    }

    /** Waits for {@code stage}, throwing what it failed with (not wrapped). */
    static <T> T join(CompletionStage<T> stage) {
        try {
            return stage.toCompletableFuture().get();
        } catch (ExecutionException | CompletionException e) {
            Throwable cause = e.getCause();
            if (cause instanceof RuntimeException runtime) {
                throw runtime;
            }
            if (cause instanceof Error error) {
                throw error;
            }
            throw new XcloakException(String.valueOf(cause), cause);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            stage.toCompletableFuture().cancel(true);
            throw new java.util.concurrent.CancellationException("interrupted");
        }
    }
}
