package io.xcloak.spring.test;

import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.UncheckedIOException;
import java.net.ServerSocket;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;

import io.lettuce.core.RedisClient;
import io.lettuce.core.api.StatefulRedisConnection;
import io.lettuce.core.api.sync.RedisCommands;

/**
 * A real redis-server on a free loopback port (19500-19899), with the module from {@code XCLOAK_MODULE} or
 * without it (the fallback's case). {@link #shared()} is one server with the module for the whole
 * test run (started once, stopped when the JVM exits); each test class uses keys of its own.
 */
public final class RedisServer implements AutoCloseable {

    private static RedisServer shared;

    private final Process process;
    private final int port;
    private final RedisClient client;
    private final StatefulRedisConnection<String, String> connection;

    /** The server with the module, shared by every test class of this JVM. */
    public static synchronized RedisServer shared() {
        if (shared == null) {
            shared = start(true);
            RedisServer server = shared;
            Runtime.getRuntime().addShutdownHook(new Thread(server::close));
        }
        return shared;
    }

    /** A server of its own; {@code withModule} false is a server that has no XCLOAK.* command. */
    public static RedisServer start(boolean withModule) {
        String module = System.getenv("XCLOAK_MODULE");
        if (withModule && (module == null || !Files.isRegularFile(Path.of(module)))) {
            throw new IllegalStateException("XCLOAK_MODULE must name the module (libxcloak.so); it is " + module);
        }
        String binary = System.getenv().getOrDefault("XCLOAK_SERVER", "redis-server");
        for (int attempt = 0; ; attempt++) {
            int port = freePort();
            List<String> args = new ArrayList<>(List.of(binary, "--port", String.valueOf(port), "--bind", "127.0.0.1",
                    "--save", "", "--appendonly", "no", "--protected-mode", "no"));
            if (withModule) {
                args.addAll(List.of("--loadmodule", module));
            }
            try {
                Path dir = Files.createTempDirectory("xcloak-redis-");
                Process process = new ProcessBuilder(args).directory(dir.toFile()).redirectErrorStream(true).start();
                CountDownLatch ready = new CountDownLatch(1);
                StringBuilder log = new StringBuilder();
                Thread reader = new Thread(() -> {
                    try (BufferedReader in = new BufferedReader(
                            new InputStreamReader(process.getInputStream(), StandardCharsets.UTF_8))) {
                        for (String line; (line = in.readLine()) != null; ) {
                            synchronized (log) {
                                log.append(line).append('\n');
                            }
                            if (line.contains("Ready to accept connections")) {
                                ready.countDown();
                            }
                        }
                    } catch (IOException e) {
                        // the process ended
                    }
                });
                reader.setDaemon(true);
                reader.start();
                boolean up = ready.await(30, TimeUnit.SECONDS);
                if (!up || !process.isAlive()) {
                    process.destroyForcibly();
                    if (attempt < 2) {
                        continue; // the port was taken meanwhile
                    }
                    synchronized (log) {
                        throw new IllegalStateException("redis-server did not start on " + port + ":\n" + log);
                    }
                }
                return new RedisServer(process, port);
            } catch (IOException e) {
                throw new UncheckedIOException(e);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                throw new IllegalStateException(e);
            }
        }
    }

    private RedisServer(Process process, int port) {
        this.process = process;
        this.port = port;
        this.client = RedisClient.create("redis://127.0.0.1:" + port);
        this.connection = client.connect();
    }

    public int port() {
        return port;
    }

    public String url() {
        return "redis://127.0.0.1:" + port;
    }

    public RedisCommands<String, String> commands() {
        return connection.sync();
    }

    /** INFO commandstats as {command: {calls, usec, ...}}. */
    public Map<String, Map<String, Double>> commandStats() {
        Map<String, Map<String, Double>> stats = new HashMap<>();
        for (String line : commands().info("commandstats").split("\r?\n")) {
            if (!line.startsWith("cmdstat_")) {
                continue;
            }
            int colon = line.indexOf(':');
            Map<String, Double> fields = new HashMap<>();
            for (String pair : line.substring(colon + 1).split(",")) {
                String[] kv = pair.split("=", 2);
                fields.put(kv[0], Double.parseDouble(kv[1]));
            }
            stats.put(line.substring("cmdstat_".length(), colon), fields);
        }
        return stats;
    }

    /** Calls of one command since the last CONFIG RESETSTAT (0 if never called). */
    public long calls(String command) {
        Map<String, Double> fields = commandStats().get(command);
        return fields == null ? 0 : fields.get("calls").longValue();
    }

    @Override
    public void close() {
        try {
            connection.close();
            client.shutdown();
        } catch (RuntimeException e) {
            // the server may be gone already
        }
        process.destroy();
        try {
            if (!process.waitFor(10, TimeUnit.SECONDS)) {
                process.destroyForcibly();
            }
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }

    /** The Spring modules' servers take ports 19500-19899 (the core's 19000-19499, dist-check 19900-19999). */
    private static int freePort() {
        java.util.concurrent.ThreadLocalRandom random = java.util.concurrent.ThreadLocalRandom.current();
        for (int attempt = 0; attempt < 200; attempt++) {
            int port = 19500 + random.nextInt(400);
            try (ServerSocket socket = new ServerSocket(port, 1, java.net.InetAddress.getLoopbackAddress())) {
                return socket.getLocalPort();
            } catch (IOException taken) {
                // try another
            }
        }
        throw new IllegalStateException("no free port in 19500-19899");
    }
}
