package io.xcloak;

import io.lettuce.core.RedisClient;
import io.lettuce.core.RedisURI;
import io.xcloak.jedis.JedisTransport;
import io.xcloak.lettuce.LettuceTransport;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.function.Function;
import java.util.stream.Stream;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.DynamicTest;
import org.junit.jupiter.api.TestFactory;

/**
 * Every conformance vector, four ways live (Lettuce and Jedis, each through the command on a
 * server with the module and through the fallback on one without) and once pure (a replay of the
 * vectors' own replies, no server).
 */
class VectorsTest {
    static RedisServer module;
    static RedisServer plain;
    static RedisClient lettuce;
    static List<AutoCloseable> closing = new ArrayList<>();

    @BeforeAll
    static void start() {
        module = RedisServer.withModule();
        plain = RedisServer.plain();
        lettuce = Shared.lettuce();
    }

    @AfterAll
    static void stop() throws Exception {
        for (AutoCloseable c : closing) {
            c.close();
        }
        lettuce.shutdown();
        module.close();
        plain.close();
    }

    @TestFactory
    Stream<DynamicTest> pure() {
        Vectors.Replay replay = new Vectors.Replay();
        Vectors.Target target = new Vectors.Target(replay, Via.COMMAND, null);
        return Vectors.cases().stream().map(c -> DynamicTest.dynamicTest((String) c.get("name"),
                () -> Vectors.run(c, target, replay)));
    }

    @TestFactory
    Stream<DynamicTest> lettuceCommand() {
        return live(module, Via.COMMAND, this::lettuce);
    }

    @TestFactory
    Stream<DynamicTest> lettuceScript() {
        return live(plain, Via.SCRIPT, this::lettuce);
    }

    @TestFactory
    Stream<DynamicTest> jedisCommand() {
        return live(module, Via.COMMAND, this::jedis);
    }

    @TestFactory
    Stream<DynamicTest> jedisScript() {
        return live(plain, Via.SCRIPT, this::jedis);
    }

    private Transport lettuce(RedisServer server) {
        LettuceTransport t = LettuceTransport.of(lettuce, RedisURI.create("127.0.0.1", server.port));
        closing.add(t);
        return t;
    }

    private Transport jedis(RedisServer server) {
        redis.clients.jedis.RedisClient client = redis.clients.jedis.RedisClient.create("127.0.0.1", server.port);
        closing.add(client);
        return JedisTransport.of(client);
    }

    private Stream<DynamicTest> live(RedisServer server, Via via, Function<RedisServer, Transport> transport) {
        Transport t = transport.apply(server);
        Vectors.Target target = new Vectors.Target(t, via, command -> normalize(server.cmd(command.toArray())));
        return Vectors.cases().stream().map(c -> DynamicTest.dynamicTest((String) c.get("name"), () -> {
            server.cmd("FLUSHALL");
            Vectors.run(c, target, null);
        }));
    }

    private static Object normalize(Object reply) {
        return reply instanceof Map<?, ?> ? reply : reply;
    }
}
