package io.xcloak.spring;

import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionStage;
import java.util.function.Supplier;

import io.xcloak.Transport;

/**
 * Opens the real transport at the first call, not when the context starts: an application whose
 * Redis is down at startup starts, and its first calls meet the error policy (a connection that
 * can't be opened is an outage: nothing was sent), as Spring Data Redis' own connections do. A
 * failed open is tried again at the next call.
 */
final class LazyTransport implements Transport {

    private final Supplier<Transport> open;
    private final boolean blocking;
    private volatile Transport delegate;
    private volatile boolean closed;

    LazyTransport(Supplier<Transport> open, boolean blocking) {
        this.open = open;
        this.blocking = blocking;
    }

    private Transport delegate() {
        Transport d = delegate;
        if (d != null) {
            return d;
        }
        synchronized (this) {
            if (closed) {
                throw new IllegalStateException("xcloak: the limiter is closed");
            }
            if (delegate == null) {
                delegate = open.get();
            }
            return delegate;
        }
    }

    @Override
    public CompletionStage<Reply> send(Call call) {
        Transport d;
        try {
            d = delegate();
        } catch (RuntimeException e) {
            return CompletableFuture.failedFuture(e);
        }
        return d.send(call);
    }

    @Override
    public String node(String key, boolean read) {
        Transport d = delegate;
        if (d == null) {
            try {
                d = delegate();
            } catch (RuntimeException e) {
                return "";
            }
        }
        return d.node(key, read);
    }

    @Override
    public boolean blocking() {
        return blocking;
    }

    @Override
    public void close() {
        Transport d;
        synchronized (this) {
            closed = true;
            d = delegate;
        }
        if (d != null) {
            d.close();
        }
    }
}
