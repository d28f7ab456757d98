package io.xcloak;

import java.time.Duration;
import java.util.List;
import java.util.concurrent.CompletionStage;
import java.util.function.Predicate;

/**
 * The one thing a {@link Limiter} needs from a Redis client library: send one command to the node
 * that serves a key, once, and (durable mode) a {@code WAIT} after its reply on the same
 * connection. {@link io.xcloak.lettuce.LettuceTransport} and {@link io.xcloak.jedis.JedisTransport}
 * implement it; everything else (the fallback, the error policy, the block cache) is the limiter's.
 *
 * <p>A transport never sends a call twice unless the server said it did not run it (a
 * {@code MOVED} or {@code ASK} redirection may be followed once).
 */
public interface Transport extends AutoCloseable {

    /**
     * Sends {@code call} once. The stage completes with the reply, a server's error reply as an
     * {@link ErrorReply} value; it completes exceptionally only when there was no answer (a
     * connection refused, reset or closed; {@code call.timeout()} passed), which the limiter's error
     * policy answers.
     */
    CompletionStage<Reply> send(Call call);

    /**
     * Who serves {@code key} ({@code read}: the peeks' node): "" for a single server, an address in a
     * cluster. The fallback's state is kept per node.
     */
    default String node(String key, boolean read) {
        return "";
    }

    /** Whether {@link #send} does its I/O on the calling thread (Jedis): then the async calls block. */
    default boolean blocking() {
        return false;
    }

    /** Closes what the transport opened itself (never a connection or client it was given). */
    @Override
    default void close() {}

    /**
     * One command.
     *
     * @param key the key the command touches (its slot picks the node)
     * @param command the name and the arguments, each as bytes
     * @param read a read ({@code XCLOAK.PEEK}, {@code EVALSHA_RO}): may go to a replica where the
     *     transport reads from replicas
     * @param timeout the limiter's timeout for this command
     * @param then null, or the {@code WAIT} to send after the reply on the same connection
     */
    record Call(String key, List<byte[]> command, boolean read, Duration timeout, Wait then) {
        public Call {
            command = List.copyOf(command);
        }
    }

    /**
     * Durable mode's {@code WAIT replicas timeoutMillis}, sent after the reply when {@code when}
     * holds for it (the reply says the call wrote), on the connection that carried the call.
     */
    record Wait(int replicas, long timeoutMillis, Predicate<Object> when) {}

    /**
     * A reply: {@link Long}, {@code byte[]}, {@link java.util.List} of these, {@code null}, or an
     * {@link ErrorReply}.
     *
     * @param value the reply
     * @param node the node that answered (as {@link #node})
     * @param waitReply the reply of the {@code WAIT} sent after it (a Long or an ErrorReply); null
     *     when none was sent
     * @param waitError why the {@code WAIT} got no answer (a timeout, a lost connection); else null
     */
    record Reply(Object value, String node, Object waitReply, Throwable waitError) {
        public Reply(Object value, String node) {
            this(value, node, null, null);
        }
    }

    /** A server's error reply, its text verbatim, code first ({@code ERR ...}, {@code NOSCRIPT ...}). */
    record ErrorReply(String message) {
        /** The code: the first word ({@code ERR}, {@code WRONGTYPE}, {@code MOVED}). */
        public String code() {
            int space = message.indexOf(' ');
            return space < 0 ? message : message.substring(0, space);
        }
    }
}
