package io.xcloak.bench;

import java.io.OutputStream;
import java.lang.reflect.InvocationTargetException;
import java.lang.reflect.Proxy;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.time.Instant;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.Executors;
import java.util.concurrent.Semaphore;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.LongAdder;

import com.sun.net.httpserver.HttpServer;

import io.github.bucket4j.distributed.proxy.AsyncProxyManager;
import io.github.bucket4j.redis.lettuce.Bucket4jLettuce;
import io.lettuce.core.RedisClient;
import io.lettuce.core.api.async.RedisAsyncCommands;
import io.lettuce.core.codec.ByteArrayCodec;
import io.lettuce.core.codec.RedisCodec;
import io.lettuce.core.codec.StringCodec;
import io.xcloak.spring.test.RedisServer;

import org.springframework.boot.SpringBootConfiguration;
import org.springframework.boot.WebApplicationType;
import org.springframework.boot.autoconfigure.EnableAutoConfiguration;
import org.springframework.boot.builder.SpringApplicationBuilder;
import org.springframework.cloud.gateway.filter.ratelimit.KeyResolver;
import org.springframework.context.ConfigurableApplicationContext;
import org.springframework.context.annotation.Bean;

import reactor.core.publisher.Mono;

/**
 * Spring Cloud Gateway through xcloakRateLimiter, through its own RedisRateLimiter and through its
 * Bucket4jRateLimiter (Bucket4j's Lettuce backend), in one run: one gateway, one local backend,
 * one redis-server with the module, the same limit (10 per second per client) on three routes.
 * Rounds alternate the three routes, each leading a round in turn, so that the machine's load (and
 * the JVM's collections) fall on each alike.
 *
 * <p>Per route: requests per second through the gateway (the load is generated in this JVM too);
 * this JVM's CPU time per request (the gateway, the load generator and the backend: the same for
 * every route but the limiter, and steadier than wall time on a shared machine);
 * server CPU per request from INFO commandstats (the usec of the commands the client sent: a
 * script's own inner commands are inside its EVALSHA's or EVAL's time), and from the server
 * process's own CPU time (INFO cpu: used_cpu_user + used_cpu_sys); and round trips per request
 * (commands the client sent: XCLOAK.ALLOW, EVALSHA, and Bucket4j's GET + EVAL, counted on its
 * connection).
 *
 * <p>Arguments: requests per round (default 3000), rounds (3), concurrency (32), clients (1000).
 */
public final class GatewayBench {

    static final Map<String, LongAdder> BUCKET4J_SENT = new ConcurrentHashMap<>();

    private static String lastBucket4j = "";

    @SpringBootConfiguration
    @EnableAutoConfiguration
    public static class BenchApp {

        /** The client's identity: the X-Client header (1,000 clients share the bench's one address). */
        @Bean
        KeyResolver clientKeyResolver() {
            return exchange -> Mono.justOrEmpty(exchange.getRequest().getHeaders().getFirst("X-Client"));
        }

        /** Bucket4j's Lettuce backend, its commands counted as they are sent. */
        @Bean
        AsyncProxyManager<String> bucket4jProxyManager(org.springframework.core.env.Environment env) {
            RedisClient client = RedisClient.create(env.getRequiredProperty("spring.data.redis.url"));
            RedisAsyncCommands<String, byte[]> real =
                    client.connect(RedisCodec.of(StringCodec.UTF8, ByteArrayCodec.INSTANCE)).async();
            @SuppressWarnings("unchecked")
            RedisAsyncCommands<String, byte[]> counting = (RedisAsyncCommands<String, byte[]>) Proxy.newProxyInstance(
                    GatewayBench.class.getClassLoader(), new Class<?>[] {RedisAsyncCommands.class}, (proxy, method, args) -> {
                        BUCKET4J_SENT.computeIfAbsent(method.getName(), k -> new LongAdder()).increment();
                        try {
                            return method.invoke(real, args);
                        } catch (InvocationTargetException e) {
                            throw e.getCause();
                        }
                    });
            return Bucket4jLettuce.casBasedBuilder(counting).build().asAsync();
        }
    }

    record Phase(String route, long requests, long non200, double seconds, double commandUsec, long roundTrips,
            double processCpuUsec, double jvmCpuUsec) {
    }

    public static void main(String[] args) throws Exception {
        int perRound = args.length > 0 ? Integer.parseInt(args[0]) : 3000;
        int rounds = args.length > 1 ? Integer.parseInt(args[1]) : 3;
        int concurrency = args.length > 2 ? Integer.parseInt(args[2]) : 32;
        int clients = args.length > 3 ? Integer.parseInt(args[3]) : 1000;
        String loadBefore = Files.readString(Path.of("/proc/loadavg")).trim();
        Instant started = Instant.now();

        RedisServer redis = RedisServer.start(true);
        HttpServer backend = HttpServer.create(new InetSocketAddress(InetAddress.getLoopbackAddress(), 0), 1024);
        backend.createContext("/", exchange -> {
            byte[] body = "backend".getBytes(StandardCharsets.UTF_8);
            exchange.sendResponseHeaders(200, body.length);
            try (OutputStream out = exchange.getResponseBody()) {
                out.write(body);
            }
        });
        backend.setExecutor(Executors.newFixedThreadPool(4));
        backend.start();

        ConfigurableApplicationContext app = new SpringApplicationBuilder(BenchApp.class)
                .web(WebApplicationType.REACTIVE)
                .run("--spring.config.location=classpath:bench.yml",
                        "--spring.data.redis.url=" + redis.url(),
                        "--BACKEND_URL=http://127.0.0.1:" + backend.getAddress().getPort(),
                        "--xcloak.block-cache=0",
                        "--server.port=0");
        String base = "http://127.0.0.1:" + app.getEnvironment().getProperty("local.server.port");
        HttpClient http = HttpClient.newBuilder().version(HttpClient.Version.HTTP_1_1).build();
        String[] routes = {"xcloak", "redis", "bucket4j"};
        AtomicLong clientSeq = new AtomicLong();

        for (String route : routes) { // warm-up: JIT, connections, scripts loaded
            load(http, base, route, perRound / 2, concurrency, clients, clientSeq);
        }
        Map<String, List<Phase>> phases = new LinkedHashMap<>();
        for (String route : routes) {
            phases.put(route, new ArrayList<>());
        }
        for (int round = 0; round < rounds; round++) {
            for (int k = 0; k < routes.length; k++) {
                String route = routes[(round + k) % routes.length]; // each route leads a round in turn
                phases.computeIfAbsent(route, r -> new ArrayList<>())
                        .add(measure(redis, http, base, route, perRound, concurrency, clients, clientSeq));
            }
        }
        String loadAfter = Files.readString(Path.of("/proc/loadavg")).trim();

        System.out.println();
        System.out.printf("Spring Cloud Gateway, %d rounds of %d requests per limiter, %d in flight, %d clients,"
                + " limit 10 per second per client (%s)%n", rounds, perRound, concurrency, clients, started);
        System.out.printf("load average before: %s; after: %s; %d cores%n%n", loadBefore, loadAfter,
                Runtime.getRuntime().availableProcessors());
        System.out.println("| limiter | requests/s (median of rounds) | gateway JVM CPU µs per request | server µs per request, commandstats | server CPU µs per request, INFO cpu | round trips per request | non-200 |");
        System.out.println("|---|---|---|---|---|---|---|");
        String[] names = {"xcloakRateLimiter (XCLOAK.ALLOW)", "RedisRateLimiter (token bucket, EVALSHA)",
                "Bucket4jRateLimiter (Bucket4j Lettuce, GET + EVAL CAS)"};
        for (int i = 0; i < routes.length; i++) {
            List<Phase> list = phases.get(routes[i]);
            List<Double> rps = new ArrayList<>();
            long requests = 0;
            long non200 = 0;
            long trips = 0;
            double usec = 0;
            double cpu = 0;
            double jvm = 0;
            for (Phase p : list) {
                jvm += p.jvmCpuUsec();
                rps.add(p.requests() / p.seconds());
                requests += p.requests();
                non200 += p.non200();
                trips += p.roundTrips();
                usec += p.commandUsec();
                cpu += p.processCpuUsec();
            }
            rps.sort(Double::compare);
            System.out.printf("| %s | %.0f (%.0f-%.0f) | %.0f | %.2f | %.1f | %.2f | %d |%n", names[i], rps.get(rps.size() / 2),
                    rps.get(0), rps.get(rps.size() - 1), jvm / requests, usec / requests, cpu / requests,
                    (double) trips / requests, non200);
        }
        System.out.println();
        System.out.println("Bucket4j's commands in the last round, as sent on its connection: " + lastBucket4j);
        app.close();
        backend.stop(0);
        ((java.util.concurrent.ExecutorService) backend.getExecutor()).shutdownNow();
        redis.close();
        System.exit(0);
    }

    private static Phase measure(RedisServer redis, HttpClient http, String base, String route, int n, int concurrency,
            int clients, AtomicLong clientSeq) throws Exception {
        redis.commands().configResetstat();
        BUCKET4J_SENT.clear();
        double cpuBefore = processCpuUsec(redis);
        long jvmBefore = jvmCpuNanos();
        long start = System.nanoTime();
        long non200 = load(http, base, route, n, concurrency, clients, clientSeq);
        double seconds = (System.nanoTime() - start) / 1e9;
        double cpu = processCpuUsec(redis) - cpuBefore;
        double jvm = (jvmCpuNanos() - jvmBefore) / 1e3;
        Map<String, Map<String, Double>> stats = redis.commandStats();
        double usec;
        long trips;
        switch (route) {
            case "xcloak" -> {
                usec = field(stats, "xcloak.allow", "usec");
                trips = (long) field(stats, "xcloak.allow", "calls");
            }
            case "redis" -> {
                usec = field(stats, "evalsha", "usec") + field(stats, "eval", "usec");
                trips = (long) (field(stats, "evalsha", "calls") + field(stats, "eval", "calls"));
            }
            default -> {
                // Bucket4j sends GET, then EVAL of a compare-and-swap script that GETs again inside:
                // the inner GETs' time is inside EVAL's, so only the GETs it sent count beside EVAL.
                long sentGets = sent("get");
                double gets = field(stats, "get", "calls");
                usec = field(stats, "eval", "usec") + (gets == 0 ? 0 : field(stats, "get", "usec") * sentGets / gets);
                trips = 0;
                Map<String, Long> byCommand = new java.util.TreeMap<>();
                for (Map.Entry<String, LongAdder> count : BUCKET4J_SENT.entrySet()) {
                    trips += count.getValue().sum();
                    byCommand.put(count.getKey(), count.getValue().sum());
                }
                lastBucket4j = byCommand.toString();
            }
        }
        return new Phase(route, n, non200, seconds, usec, trips, cpu, jvm);
    }

    private static long sent(String method) {
        LongAdder count = BUCKET4J_SENT.get(method);
        return count == null ? 0 : count.sum();
    }

    private static double field(Map<String, Map<String, Double>> stats, String command, String field) {
        Map<String, Double> fields = stats.get(command);
        return fields == null ? 0 : fields.getOrDefault(field, 0.0);
    }

    /** This process's CPU time: the gateway, the load generator and the backend. */
    private static long jvmCpuNanos() {
        return ((com.sun.management.OperatingSystemMXBean) java.lang.management.ManagementFactory.getOperatingSystemMXBean())
                .getProcessCpuTime();
    }

    /** The server process's own CPU time (user + system), in µs. */
    private static double processCpuUsec(RedisServer redis) {
        double total = 0;
        for (String line : redis.commands().info("cpu").split("\r?\n")) {
            if (line.startsWith("used_cpu_user:") || line.startsWith("used_cpu_sys:")) {
                total += Double.parseDouble(line.substring(line.indexOf(':') + 1)) * 1e6;
            }
        }
        return total;
    }

    /** {@code n} GETs through one route, at most {@code concurrency} in flight; returns how many were not 200. */
    private static long load(HttpClient http, String base, String route, int n, int concurrency, int clients,
            AtomicLong clientSeq) throws InterruptedException {
        Semaphore inFlight = new Semaphore(concurrency);
        LongAdder non200 = new LongAdder();
        List<CompletableFuture<?>> pending = new ArrayList<>(n);
        for (int i = 0; i < n; i++) {
            inFlight.acquire();
            HttpRequest request = HttpRequest.newBuilder(URI.create(base + "/" + route + "/item"))
                    .header("X-Client", "c" + (clientSeq.getAndIncrement() % clients))
                    .timeout(Duration.ofSeconds(30))
                    .build();
            pending.add(http.sendAsync(request, HttpResponse.BodyHandlers.discarding()).whenComplete((response, error) -> {
                if (error != null || response.statusCode() != 200) {
                    non200.increment();
                }
                inFlight.release();
            }));
        }
        CompletableFuture.allOf(pending.toArray(CompletableFuture[]::new)).exceptionally(e -> null).join();
        return non200.sum();
    }

    private GatewayBench() {
    }

}
