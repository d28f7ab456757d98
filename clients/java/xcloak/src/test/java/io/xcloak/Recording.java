package io.xcloak;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.concurrent.CompletionStage;

/** A transport that records every command it passes on (as strings), for the tests. */
final class Recording implements Transport {
    final Transport inner;
    final List<List<String>> sent = Collections.synchronizedList(new ArrayList<>());

    Recording(Transport inner) {
        this.inner = inner;
    }

    static List<String> strings(List<byte[]> command) {
        List<String> out = new ArrayList<>(command.size());
        for (byte[] arg : command) {
            out.add(new String(arg, StandardCharsets.UTF_8));
        }
        return out;
    }

    @Override
    public CompletionStage<Reply> send(Call call) {
        sent.add(strings(call.command()));
        return inner.send(call);
    }

    @Override
    public String node(String key, boolean read) {
        return inner.node(key, read);
    }

    @Override
    public boolean blocking() {
        return inner.blocking();
    }

    @Override
    public void close() {
        inner.close();
    }
}
