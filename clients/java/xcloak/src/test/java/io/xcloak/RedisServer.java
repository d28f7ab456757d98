package io.xcloak;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.net.InetAddress;
import java.net.ServerSocket;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.function.BooleanSupplier;
import java.util.stream.Stream;

/**
 * A real redis-server process on loopback, with the module or without it: the Java counterpart of
 * the repository's tests/common. Server binary: $XCLOAK_SERVER, else redis-server; the module:
 * $XCLOAK_MODULE, else target/release/libxcloak.so of the checkout ($XCLOAK_REPO). Ports come
 * from the Java core's slice, 19000-19499 (the Spring modules: 19500-19899; dist-check: 19900-19999), each checked free with its cluster bus port (+10000).
 */
final class RedisServer implements AutoCloseable {
    private static final int FIRST_PORT = 19000;
    private static final int LAST_PORT = 19499;
    private static final AtomicInteger NEXT = new AtomicInteger();

    final int port;
    final Path dir;
    private final List<String> args;
    private Process process;

    private RedisServer(int port, Path dir, List<String> args) {
        this.port = port;
        this.dir = dir;
        this.args = args;
    }

    static Path repo() {
        String repo = System.getenv("XCLOAK_REPO");
        return repo != null ? Path.of(repo) : Path.of("../../..").toAbsolutePath().normalize();
    }

    static Path module() {
        String module = System.getenv("XCLOAK_MODULE");
        return module != null ? Path.of(module) : repo().resolve("target/release/libxcloak.so");
    }

    static String binary(String env, String fallback) {
        String value = System.getenv(env);
        return value != null && !value.isEmpty() ? value : fallback;
    }

    static int freePort() {
        NEXT.compareAndSet(0, FIRST_PORT + (int) (ProcessHandle.current().pid() % 10) * 50);
        for (int tries = 0; tries < 2000; tries++) {
            int p = NEXT.incrementAndGet();
            if (p > LAST_PORT) {
                NEXT.set(FIRST_PORT);
                continue;
            }
            if (free(p) && free(p + 10000)) {
                return p;
            }
        }
        throw new IllegalStateException("no free port in " + FIRST_PORT + "-" + LAST_PORT);
    }

    private static boolean free(int port) {
        try (ServerSocket socket = new ServerSocket(port, 1, InetAddress.getLoopbackAddress())) {
            return socket.isBound();
        } catch (IOException e) {
            return false;
        }
    }

    /** A server with the module. */
    static RedisServer withModule(String... extra) {
        return start(true, extra);
    }

    /** A server without the module: the scripts answer. */
    static RedisServer plain(String... extra) {
        return start(false, extra);
    }

    static RedisServer start(boolean module, String... extra) {
        if (module && !Files.exists(module())) {
            throw new IllegalStateException("module not built at " + module() + " (make build, or set XCLOAK_MODULE)");
        }
        for (int attempt = 0; attempt < 5; attempt++) {
            int port = freePort();
            Path dir;
            try {
                dir = Files.createTempDirectory("xcloak-java-");
            } catch (IOException e) {
                throw new UncheckedIOException(e);
            }
            List<String> args = new ArrayList<>(List.of(binary("XCLOAK_SERVER", "redis-server"),
                    "--port", Integer.toString(port), "--bind", "127.0.0.1", "--dir", dir.toString(),
                    "--logfile", "server.log", "--save", "", "--appendonly", "no", "--protected-mode", "no"));
            if (module) {
                args.add("--loadmodule");
                args.add(module().toString());
            }
            args.addAll(List.of(extra));
            RedisServer server = new RedisServer(port, dir, args);
            if (server.launch()) {
                return server;
            }
        }
        throw new IllegalStateException("no free port after 5 attempts");
    }

    /** A Sentinel watching {@code primary} under the name "xcloak" (quorum 1). */
    static RedisServer sentinel(RedisServer primary) {
        int port = freePort();
        try {
            Path dir = Files.createTempDirectory("xcloak-java-sentinel-");
            Files.writeString(dir.resolve("sentinel.conf"), "sentinel monitor xcloak 127.0.0.1 " + primary.port + " 1\n"
                    + "sentinel down-after-milliseconds xcloak 1000\nsentinel failover-timeout xcloak 5000\n");
            List<String> args = List.of(binary("XCLOAK_SENTINEL", "redis-sentinel"), dir.resolve("sentinel.conf").toString(),
                    "--port", Integer.toString(port), "--bind", "127.0.0.1", "--dir", dir.toString(),
                    "--logfile", "server.log", "--protected-mode", "no");
            RedisServer server = new RedisServer(port, dir, args);
            if (!server.launch()) {
                throw new IllegalStateException("sentinel port taken");
            }
            return server;
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }

    private boolean launch() {
        try {
            process = new ProcessBuilder(args).directory(dir.toFile()).redirectErrorStream(true)
                    .redirectOutput(dir.resolve("stdout.log").toFile()).start();
        } catch (IOException e) {
            throw new UncheckedIOException("can't start " + args.get(0), e);
        }
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(20);
        while (System.nanoTime() < deadline) {
            if (!process.isAlive()) {
                if (log().contains("Address already in use")) {
                    return false;
                }
                throw new IllegalStateException("server on " + port + " exited:\n" + log());
            }
            try {
                String info = (String) cmd("INFO", "server");
                if (field(info, "process_id").equals(Long.toString(process.pid()))) {
                    return true;
                }
                close(); // someone else's server answers on our port
                return false;
            } catch (RuntimeException notYet) {
                sleep(10);
            }
        }
        throw new IllegalStateException("server on " + port + " not ready:\n" + log());
    }

    String log() {
        try {
            return Files.readString(dir.resolve("server.log"));
        } catch (IOException e) {
            return "";
        }
    }

    String addr() {
        return "127.0.0.1:" + port;
    }

    /** One command on a fresh socket. */
    Object cmd(Object... command) {
        return Resp.call(port, 5000, command);
    }

    String info(String section) {
        return (String) cmd("INFO", section);
    }

    /** A counter of INFO section: stat("commandstats", "cmdstat_xcloak.allow", "calls"); 0 when absent. */
    long stat(String section, String line, String field) {
        for (String l : info(section).split("\r?\n")) {
            int colon = l.indexOf(':');
            if (colon < 0 || !l.substring(0, colon).equals(line)) {
                continue;
            }
            for (String kv : l.substring(colon + 1).split(",")) {
                String[] pair = kv.split("=", 2);
                if (pair[0].equals(field)) {
                    return Long.parseLong(pair[1].trim());
                }
            }
        }
        return 0;
    }

    /** How many times the server ran {@code command} (INFO commandstats). */
    long calls(String command) {
        return stat("commandstats", "cmdstat_" + command.toLowerCase(), "calls");
    }

    static String field(String info, String name) {
        for (String l : info.split("\r?\n")) {
            if (l.startsWith(name + ":")) {
                return l.substring(name.length() + 1).trim();
            }
        }
        return "";
    }

    /** SIGSTOP: connections stay open, nothing answers. */
    void pause() {
        signal("STOP");
    }

    /** SIGCONT. */
    void resume() {
        signal("CONT");
    }

    private void signal(String signal) {
        try {
            Process kill = new ProcessBuilder("kill", "-" + signal, Long.toString(process.pid())).start();
            kill.waitFor(5, TimeUnit.SECONDS);
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }

    /** Stops the process at once (SIGKILL) and waits for it; the directory stays for a restart. */
    void kill() {
        if (process != null) {
            signal("CONT");
            process.destroyForcibly();
            try {
                process.waitFor(10, TimeUnit.SECONDS);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
            process = null;
        }
    }

    /** SIGKILL without a SIGCONT first: a paused server dies without reading what was sent to it. */
    void killPaused() {
        if (process != null) {
            process.destroyForcibly();
            try {
                process.waitFor(10, TimeUnit.SECONDS);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
            process = null;
        }
    }

    /** Starts the server again on its port and options. */
    void restart() {
        kill();
        if (!launch()) {
            throw new IllegalStateException("port " + port + " was taken while the server was down");
        }
    }

    @Override
    public void close() {
        kill();
        try (Stream<Path> files = Files.walk(dir)) {
            files.sorted(Comparator.reverseOrder()).forEach(p -> p.toFile().delete());
        } catch (IOException e) {
            // a temp dir left behind is harmless
        }
    }

    static void sleep(long millis) {
        try {
            Thread.sleep(millis);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new IllegalStateException(e);
        }
    }

    /** Polls {@code condition} every 10 ms until it holds or {@code within} passes. */
    static boolean eventually(Duration within, BooleanSupplier condition) {
        long deadline = System.nanoTime() + within.toNanos();
        while (true) {
            try {
                if (condition.getAsBoolean()) {
                    return true;
                }
            } catch (RuntimeException notYet) {
                // not yet
            }
            if (System.nanoTime() > deadline) {
                return false;
            }
            sleep(10);
        }
    }
}
