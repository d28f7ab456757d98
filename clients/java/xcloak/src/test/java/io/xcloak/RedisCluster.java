package io.xcloak;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;

/**
 * A real Redis Cluster on loopback: primaries joined by redis-cli --cluster create, then one
 * replica each (CLUSTER MEET and CLUSTER REPLICATE), each replica configured as its primary.
 */
final class RedisCluster implements AutoCloseable {
    final List<RedisServer> primaries = new ArrayList<>();
    final List<RedisServer> replicas = new ArrayList<>();

    /** {@code modules[i]}: whether primary i (and its replica) loads the module. */
    RedisCluster(boolean... modules) {
        String[] cluster = {"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
            "--cluster-node-timeout", "5000"};
        try {
            for (boolean module : modules) {
                primaries.add(RedisServer.start(module, cluster));
            }
            for (boolean module : modules) {
                replicas.add(RedisServer.start(module, cluster));
            }
            List<String> create = new ArrayList<>(List.of(RedisServer.binary("XCLOAK_REDIS_CLI", "redis-cli"),
                    "--cluster", "create"));
            for (RedisServer p : primaries) {
                create.add(p.addr());
            }
            create.addAll(List.of("--cluster-replicas", "0", "--cluster-yes"));
            run(create);
            for (int i = 0; i < replicas.size(); i++) {
                replicas.get(i).cmd("CLUSTER", "MEET", "127.0.0.1", primaries.get(i).port);
            }
            for (int i = 0; i < replicas.size(); i++) {
                String id = (String) primaries.get(i).cmd("CLUSTER", "MYID");
                RedisServer replica = replicas.get(i);
                if (!RedisServer.eventually(Duration.ofSeconds(30), () -> "OK".equals(replica.cmd("CLUSTER", "REPLICATE", id)))) {
                    throw new IllegalStateException("CLUSTER REPLICATE on " + replica.port + " never succeeded");
                }
            }
            waitOk();
        } catch (RuntimeException e) {
            close();
            throw e;
        }
    }

    List<RedisServer> nodes() {
        List<RedisServer> all = new ArrayList<>(primaries);
        all.addAll(replicas);
        return all;
    }

    private void waitOk() {
        String total = Integer.toString(primaries.size() + replicas.size());
        for (RedisServer n : nodes()) {
            boolean ok = RedisServer.eventually(Duration.ofSeconds(60), () -> {
                String info = (String) n.cmd("CLUSTER", "INFO");
                if (!RedisServer.field(info, "cluster_state").equals("ok")
                        || !RedisServer.field(info, "cluster_known_nodes").equals(total)) {
                    return false;
                }
                String repl = n.info("replication");
                if (repl.contains("role:slave") && !repl.contains("master_link_status:up")) {
                    return false;
                }
                int listed = 0;
                for (Object range : (List<?>) n.cmd("CLUSTER", "SLOTS")) {
                    listed += ((List<?>) range).size() - 2;
                }
                return listed == primaries.size() + replicas.size();
            });
            if (!ok) {
                throw new IllegalStateException("cluster node " + n.port + " not ready:\n" + n.log());
            }
        }
    }

    /** The primary serving {@code key}'s slot. */
    RedisServer owner(String key) {
        String id = null;
        long slot = (Long) primaries.get(0).cmd("CLUSTER", "KEYSLOT", key);
        for (Object range : (List<?>) primaries.get(0).cmd("CLUSTER", "SLOTS")) {
            List<?> r = (List<?>) range;
            if ((Long) r.get(0) <= slot && slot <= (Long) r.get(1)) {
                id = String.valueOf(((List<?>) r.get(2)).get(1));
            }
        }
        for (RedisServer p : primaries) {
            if (Long.toString(p.port).equals(id)) {
                return p;
            }
        }
        throw new IllegalStateException("no primary serves slot " + slot);
    }

    /** A counter summed over {@code nodes} (RedisServer.stat). */
    static long sum(List<RedisServer> nodes, String section, String line, String field) {
        long total = 0;
        for (RedisServer n : nodes) {
            total += n.stat(section, line, field);
        }
        return total;
    }

    void resetStats() {
        for (RedisServer n : nodes()) {
            n.cmd("CONFIG", "RESETSTAT");
        }
    }

    private static void run(List<String> command) {
        try {
            Process p = new ProcessBuilder(command).redirectErrorStream(true).start();
            String out = new String(p.getInputStream().readAllBytes());
            if (!p.waitFor(120, TimeUnit.SECONDS) || p.exitValue() != 0) {
                throw new IllegalStateException(command + " failed:\n" + out);
            }
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new IllegalStateException(e);
        }
    }

    @Override
    public void close() {
        for (RedisServer n : nodes()) {
            n.close();
        }
    }
}
