package io.xcloak.lettuce;

import io.lettuce.core.codec.ByteArrayCodec;
import io.lettuce.core.output.CommandOutput;
import io.xcloak.Transport;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Deque;
import java.util.List;

/**
 * A reply as it came, nested arrays included: Long, byte[], List, null, Boolean, Double, or a
 * {@link Transport.ErrorReply} for the server's error replies (so a refusal is a value, not an
 * exception; Lettuce's own failures, set as text, still fail the command).
 */
final class RawOutput extends CommandOutput<byte[], byte[], Object> {
    /** The open arrays, innermost first, each with the count it still expects. */
    private final Deque<List<Object>> open = new ArrayDeque<>();
    private final Deque<int[]> left = new ArrayDeque<>();
    private boolean done;

    RawOutput() {
        super(ByteArrayCodec.INSTANCE, null);
    }

    private void add(Object value) {
        if (open.isEmpty()) {
            if (!done) {
                output = value;
                done = true;
            }
            return;
        }
        open.peek().add(value);
        close();
    }

    /** Closes every array that is full, innermost first. */
    private void close() {
        while (!left.isEmpty() && --left.peek()[0] <= 0) {
            left.pop();
            List<Object> full = open.pop();
            if (open.isEmpty()) {
                output = full;
                done = true;
            } else {
                open.peek().add(full);
            }
        }
    }

    @Override
    public void set(ByteBuffer bytes) {
        if (bytes == null) {
            add(null);
            return;
        }
        byte[] copy = new byte[bytes.remaining()];
        bytes.get(copy);
        add(copy);
    }

    @Override
    public void set(long integer) {
        add(integer);
    }

    @Override
    public void set(double number) {
        add(number);
    }

    @Override
    public void set(boolean value) {
        add(value);
    }

    @Override
    public void setError(ByteBuffer error) {
        add(new Transport.ErrorReply(error == null ? "" : StandardCharsets.UTF_8.decode(error).toString()));
    }

    @Override
    public void multi(int count) {
        if (count < 0) {
            add(null);
        } else if (count == 0) {
            add(new ArrayList<>(0));
        } else {
            open.push(new ArrayList<>(count));
            left.push(new int[] {count});
        }
    }
}
