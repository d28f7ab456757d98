package io.xcloak;

import io.lettuce.core.RedisClient;
import io.lettuce.core.RedisURI;
import io.xcloak.jedis.JedisTransport;
import io.xcloak.lettuce.LettuceTransport;
import java.util.ArrayList;
import java.util.List;

/** The two client libraries under test, each over a server; everything opened is closed by {@link #close()}. */
final class Clients implements AutoCloseable {
    enum Library {
        LETTUCE,
        JEDIS
    }

    private final List<AutoCloseable> opened = new ArrayList<>();
    private final List<RedisClient> lettuceClients = new ArrayList<>();

    Transport transport(Library library, RedisServer server) {
        return switch (library) {
            case LETTUCE -> {
                RedisClient client = Shared.lettuce(RedisURI.create("127.0.0.1", server.port));
                lettuceClients.add(client);
                LettuceTransport t = LettuceTransport.of(client);
                opened.add(t);
                yield t;
            }
            case JEDIS -> {
                redis.clients.jedis.RedisClient client = redis.clients.jedis.RedisClient.create("127.0.0.1", server.port);
                opened.add(client);
                yield JedisTransport.of(client);
            }
        };
    }

    @Override
    public void close() {
        for (AutoCloseable c : opened) {
            try {
                c.close();
            } catch (Exception e) {
                // closing a connection to a server a test killed
            }
        }
        for (RedisClient c : lettuceClients) {
            c.shutdown(java.time.Duration.ZERO, java.time.Duration.ofSeconds(2));
        }
    }
}
