package io.xcloak;

import java.time.Duration;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionStage;
import java.util.concurrent.TimeUnit;

/**
 * A limiter's clock, for tests and replays (docs/clients.md, "acquire"): with a clock, every call
 * sends {@code NOW} from {@link #nowMillis()} (so the block cache is bypassed) and
 * {@code acquire} sleeps through {@link #sleep}. Without one, the server's clock decides, which is
 * what production wants.
 */
public interface Clock {
    /** Unix milliseconds, sent as {@code NOW}. */
    long nowMillis();

    /** Sleeps {@code duration} (acquire's wait between turns). */
    void sleep(Duration duration) throws InterruptedException;

    /** The asynchronous sleep of {@code acquireAsync}: by default a delayed completion. */
    default CompletionStage<Void> sleepAsync(Duration duration) {
        return CompletableFuture.runAsync(
                () -> {}, CompletableFuture.delayedExecutor(duration.toNanos(), TimeUnit.NANOSECONDS));
    }
}
