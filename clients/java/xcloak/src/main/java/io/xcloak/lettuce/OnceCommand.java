package io.xcloak.lettuce;

import io.lettuce.core.protocol.CommandWrapper;
import io.lettuce.core.protocol.RedisCommand;
import io.netty.buffer.ByteBuf;
import io.netty.util.Timeout;

/**
 * A command Lettuce writes at most once. With {@code autoReconnect} (its default), Lettuce keeps
 * the commands that were written but not answered when a connection drops and writes them again
 * after it reconnects (its at-least-once mode): an ALLOW that had run would run twice. Lettuce
 * skips, on every path that would write a command again, a command that says it is done
 * ({@code CommandHandler.isWriteable}, {@code DefaultEndpoint.drainCommands}); this one says so from
 * the moment it was encoded. The reply still completes it (the decoder does not ask), and a reply
 * that never comes ends in the limiter's timeout.
 */
final class OnceCommand<K, V, T> extends CommandWrapper<K, V, T> {
    private volatile boolean written;
    private volatile Timeout timeout;

    OnceCommand(RedisCommand<K, V, T> command) {
        super(command);
    }

    @Override
    public void encode(ByteBuf buf) {
        written = true;
        super.encode(buf);
    }

    @Override
    public boolean isDone() {
        return written || super.isDone();
    }

    boolean written() {
        return written;
    }

    /** The limiter's timeout for this command, cancelled when the reply comes. */
    void timeout(Timeout timeout) {
        this.timeout = timeout;
    }

    @Override
    public void complete() {
        super.complete();
        Timeout t = timeout;
        if (t != null) {
            t.cancel();
        }
    }
}
