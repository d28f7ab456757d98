package io.xcloak;

import com.sun.management.OperatingSystemMXBean;
import io.lettuce.core.RedisClient;
import io.lettuce.core.RedisURI;
import io.lettuce.core.api.StatefulRedisConnection;
import io.lettuce.core.codec.ByteArrayCodec;
import io.lettuce.core.output.NestedMultiOutput;
import io.lettuce.core.protocol.CommandArgs;
import io.lettuce.core.protocol.ProtocolKeyword;
import io.xcloak.lettuce.LettuceTransport;
import java.lang.management.ManagementFactory;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;

/**
 * clients/java/bench/bench.sh runs it: Limiter.allow per call against a raw Lettuce dispatch of
 * the same XCLOAK.ALLOW ... DETAILS on the same connection, in alternating blocks (wall time and
 * the process's CPU time); a block-cache hit against a server rejection; the cache's memory per
 * entry. Not a test (its name is not *Test): figures, no assertions.
 */
public final class Bench {
    private Bench() {}

    private static final ProtocolKeyword ALLOW = new ProtocolKeyword() {
        private final byte[] bytes = "XCLOAK.ALLOW".getBytes(StandardCharsets.US_ASCII);

        @Override
        public byte[] getBytes() {
            return bytes;
        }

        @Override
        public String toString() {
            return "XCLOAK.ALLOW";
        }
    };

    private static final OperatingSystemMXBean OS =
            (OperatingSystemMXBean) ManagementFactory.getOperatingSystemMXBean();

    interface Call {
        void run(int i) throws Exception;
    }

    private static final com.sun.management.ThreadMXBean THREADS =
            (com.sun.management.ThreadMXBean) ManagementFactory.getThreadMXBean();

    /** Bytes allocated so far by every live thread (the caller's and Lettuce's event loops). */
    private static long allocated() {
        long total = 0;
        for (long bytes : THREADS.getThreadAllocatedBytes(THREADS.getAllThreadIds())) {
            total += Math.max(0, bytes);
        }
        return total;
    }

    /** One block: wall ns, CPU ns and bytes allocated per call. */
    private static double[] block(Call call, int from, int n) throws Exception {
        long bytes = allocated();
        long cpu = OS.getProcessCpuTime();
        long start = System.nanoTime();
        for (int i = from; i < from + n; i++) {
            call.run(i);
        }
        return new double[] {(System.nanoTime() - start) / (double) n, (OS.getProcessCpuTime() - cpu) / (double) n,
            (allocated() - bytes) / (double) n};
    }

    private static double median(List<Double> values) {
        double[] v = values.stream().mapToDouble(Double::doubleValue).sorted().toArray();
        return v[v.length / 2];
    }

    private static double pct(List<Double> values, double p) {
        double[] v = values.stream().mapToDouble(Double::doubleValue).sorted().toArray();
        return v[(int) Math.min(v.length - 1, Math.floor(p * v.length))];
    }

    /**
     * The block cache against an attack, through Limiter.allow (no HTTP: the Spring modules'
     * middleware is theirs to bench): {@code identities} attacked identities at 10 per 60 s, each
     * sent {@code rounds} requests interleaved (round-robin), beside legitimate identities that stay
     * under their limit; the cache on and off on one server. Redis calls per request from INFO
     * commandstats, over-admission from the server's own count (XCLOAK.PEEK).
     */
    static void attack(int port, int identities, int rounds) throws Exception {
        RedisClient client = RedisClient.create(RedisURI.create("127.0.0.1", port));
        StatefulRedisConnection<byte[], byte[]> connection = client.connect(ByteArrayCodec.INSTANCE);
        for (int cacheSize : new int[] {10_000, 0}) {
            connection.sync().flushall();
            connection.sync().configResetstat();
            Limiter limiter = Limiter.builder(LettuceTransport.of(connection)).blockCache(cacheSize).build();
            long admitted = 0;
            long legitRejected = 0;
            long legit = 0;
            long start = System.nanoTime();
            for (int r = 0; r < rounds; r++) {
                for (int i = 0; i < identities; i++) {
                    if (limiter.allow(Request.of("attack:" + i, Duration.ofMinutes(1), 10)).allowed()) {
                        admitted++;
                    }
                }
                // One legitimate identity per round, 5 requests: under its limit of 10.
                for (int k = 0; k < 5; k++) {
                    legit++;
                    if (!limiter.allow(Request.of("legit:" + r, Duration.ofMinutes(1), 10)).allowed()) {
                        legitRejected++;
                    }
                }
            }
            double seconds = (System.nanoTime() - start) / 1e9;
            long requests = (long) identities * rounds + legit;
            String stats = connection.sync().info("commandstats");
            long calls = 0;
            for (String line : stats.split("\r?\n")) {
                if (line.startsWith("cmdstat_xcloak.allow:")) {
                    calls = Long.parseLong(line.replaceAll("^cmdstat_xcloak.allow:calls=(\\d+),.*", "$1"));
                }
            }
            long overAdmitted = 0;
            for (int i = 0; i < identities; i++) {
                long used = 10 - limiter.peek(Request.of("attack:" + i, Duration.ofMinutes(1), 10)).remaining();
                overAdmitted += Math.max(0, used - 10);
            }
            // Every legitimate request is admitted, so sent: one call each; the rest are the attack's.
            System.out.printf("attack, cache %s: %d identities x %d rounds + %d legitimate requests: %.4f Redis calls per attack request, "
                    + "%.4f per request (%d calls), %d cache hits, %.0f requests/s, admitted %d (10 per identity: %d), over-admitted %d, legitimate rejected %d%n",
                    cacheSize > 0 ? "on " : "off", identities, rounds, legit,
                    (calls - legit) / (double) ((long) identities * rounds), calls / (double) requests, calls,
                    limiter.stats().cacheHits(), requests / seconds, admitted, 10L * identities, overAdmitted, legitRejected);
        }
        connection.close();
        client.shutdown(Duration.ZERO, Duration.ofSeconds(1));
    }

    public static void main(String[] args) throws Exception {
        if (args.length > 1 && args[1].equals("attack")) {
            attack(Integer.parseInt(args[0]), args.length > 2 ? Integer.parseInt(args[2]) : 1000,
                    args.length > 3 ? Integer.parseInt(args[3]) : 100);
            return;
        }
        int port = Integer.parseInt(args[0]);
        int rounds = args.length > 1 ? Integer.parseInt(args[1]) : 20;
        int blockSize = 2000;
        int keys = 1000;
        RedisClient client = RedisClient.create(RedisURI.create("127.0.0.1", port));
        StatefulRedisConnection<byte[], byte[]> connection = client.connect(ByteArrayCodec.INSTANCE);
        Limiter limiter = Limiter.builder(LettuceTransport.of(connection)).build();
        byte[][] rawKeys = new byte[keys][];
        Request[] requests = new Request[keys];
        for (int k = 0; k < keys; k++) {
            rawKeys[k] = ("bench:raw:" + k).getBytes(StandardCharsets.UTF_8);
            requests[k] = Request.of("bench:x:" + k, Duration.ofMinutes(1), 1_000_000);
        }
        byte[] window = "60000".getBytes(StandardCharsets.US_ASCII);
        byte[] limit = "1000000".getBytes(StandardCharsets.US_ASCII);
        byte[] details = "DETAILS".getBytes(StandardCharsets.US_ASCII);
        Call raw = i -> connection.async().dispatch(ALLOW, new NestedMultiOutput<>(ByteArrayCodec.INSTANCE),
                new CommandArgs<>(ByteArrayCodec.INSTANCE).addKey(rawKeys[i % keys]).add(window).add(limit).add(details))
                .get();
        Call xcloak = i -> limiter.allow(requests[i % keys]);
        // Warm-up (the JIT), then alternating blocks, the order swapped every round.
        block(raw, 0, 20_000);
        block(xcloak, 0, 20_000);
        List<Double> wallRatio = new ArrayList<>();
        List<Double> cpuRatio = new ArrayList<>();
        List<Double> rawWall = new ArrayList<>();
        List<Double> xWall = new ArrayList<>();
        List<Double> rawCpu = new ArrayList<>();
        List<Double> xCpu = new ArrayList<>();
        List<Double> rawBytes = new ArrayList<>();
        List<Double> xBytes = new ArrayList<>();
        for (int r = 0; r < rounds; r++) {
            double[] a;
            double[] b;
            if (r % 2 == 0) {
                a = block(raw, r * blockSize, blockSize);
                b = block(xcloak, r * blockSize, blockSize);
            } else {
                b = block(xcloak, r * blockSize, blockSize);
                a = block(raw, r * blockSize, blockSize);
            }
            rawWall.add(a[0]);
            xWall.add(b[0]);
            rawCpu.add(a[1]);
            xCpu.add(b[1]);
            rawBytes.add(a[2]);
            xBytes.add(b[2]);
            wallRatio.add(b[0] / a[0]);
            cpuRatio.add(b[1] / a[1]);
        }
        double rawCpuTotal = rawCpu.stream().mapToDouble(Double::doubleValue).sum();
        double xCpuTotal = xCpu.stream().mapToDouble(Double::doubleValue).sum();
        double rawWallTotal = rawWall.stream().mapToDouble(Double::doubleValue).sum();
        double xWallTotal = xWall.stream().mapToDouble(Double::doubleValue).sum();
        System.out.printf("allow vs raw dispatch, %d rounds of %d calls each, %d keys, sequential (sync):%n", rounds,
                blockSize, keys);
        System.out.printf("  totals: wall %.1f vs %.1f us per call (ratio %.3f); process CPU %.1f vs %.1f us per call (ratio %.3f)%n",
                xWallTotal / rounds / 1000, rawWallTotal / rounds / 1000, xWallTotal / rawWallTotal,
                xCpuTotal / rounds / 1000, rawCpuTotal / rounds / 1000, xCpuTotal / rawCpuTotal);
        System.out.printf("  allocated per call (every thread): raw %.0f bytes, Limiter.allow %.0f bytes (medians)%n",
                median(rawBytes), median(xBytes));
        System.out.printf("  wall per call: raw %.1f us, Limiter.allow %.1f us (medians); ratio median %.3f (p10 %.3f, p90 %.3f)%n",
                median(rawWall) / 1000, median(xWall) / 1000, median(wallRatio), pct(wallRatio, 0.1), pct(wallRatio, 0.9));
        System.out.printf("  process CPU per call: raw %.1f us, Limiter.allow %.1f us (medians); ratio median %.3f (p10 %.3f, p90 %.3f)%n",
                median(rawCpu) / 1000, median(xCpu) / 1000, median(cpuRatio), pct(cpuRatio, 0.1), pct(cpuRatio, 0.9));

        // A block-cache hit against a server rejection (a raw dispatch on a blocked key).
        Request blocked = Request.of("bench:blocked", Duration.ofMinutes(10), 1);
        limiter.allow(blocked);
        Decision rejected = limiter.allow(blocked);
        byte[] blockedKey = "bench:blocked".getBytes(StandardCharsets.UTF_8);
        byte[] tenMinutes = "600000".getBytes(StandardCharsets.US_ASCII);
        byte[] one = "1".getBytes(StandardCharsets.US_ASCII);
        Call serverRejection = i -> connection.async().dispatch(ALLOW, new NestedMultiOutput<>(ByteArrayCodec.INSTANCE),
                new CommandArgs<>(ByteArrayCodec.INSTANCE).addKey(blockedKey).add(tenMinutes).add(one).add(details)).get();
        Call cacheHit = i -> limiter.allow(blocked);
        block(cacheHit, 0, 200_000);
        List<Double> hit = new ArrayList<>();
        List<Double> server = new ArrayList<>();
        for (int r = 0; r < 20; r++) {
            server.add(block(serverRejection, 0, 500)[0]);
            hit.add(block(cacheHit, 0, 20_000)[0]);
        }
        System.out.printf("block cache: a hit %.3f us, a server rejection %.1f us (medians): %.4f of a round trip (%s; stats %s)%n",
                median(hit) / 1000, median(server) / 1000, median(hit) / median(server), rejected.via(), limiter.stats());

        // Memory per entry: 100,000 entries of 24-byte keys, without tiers and with 2.
        for (int tiers : new int[] {0, 2}) {
            Request shape = Request.of("k", Duration.ofMinutes(1), 10);
            List<Object> reply = new ArrayList<>(Arrays.asList(0L, 10L, 0L, 30_000L, 60_000L));
            if (tiers == 2) {
                shape = shape.withTier(Duration.ofHours(1), 100);
                reply.add(List.of(List.of(60_000L, 10L, 0L, 30_000L, 60_000L), List.of(3_600_000L, 100L, 50L, 0L, 3_600_000L)));
            }
            int n = 100_000;
            String[] names = new String[n];
            for (int i = 0; i < n; i++) {
                names[i] = String.format("rl:login:user-%013d", i); // 24 bytes
            }
            BlockCache cache = new BlockCache(n);
            long before = used();
            for (int i = 0; i < n; i++) {
                Request r = shape.withKey(names[i]);
                // Each entry its own Sig and Decision, as a server reply would make them.
                Decision d = Replies.decision(reply, r.window(), false, Via.COMMAND);
                cache.record(names[i], BlockCache.Sig.of(r), 1, System.nanoTime(), d);
            }
            long after = used();
            System.out.printf("block cache memory: %d bytes per entry (%d tiers; the key's String not counted: the caller holds it)%n",
                    (after - before) / n, tiers);
            if (cache.stats().cacheEntries() != n) {
                throw new IllegalStateException("entries: " + cache.stats());
            }
        }
        limiter.close();
        connection.close();
        client.shutdown(Duration.ZERO, Duration.ofSeconds(1));
    }

    private static long used() {
        for (int i = 0; i < 5; i++) {
            System.gc();
        }
        return ManagementFactory.getMemoryMXBean().getHeapMemoryUsage().getUsed();
    }
}
