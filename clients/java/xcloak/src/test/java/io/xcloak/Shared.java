package io.xcloak;

import io.lettuce.core.RedisClient;
import io.lettuce.core.RedisURI;
import io.lettuce.core.cluster.RedisClusterClient;
import io.lettuce.core.resource.ClientResources;
import io.lettuce.core.resource.DefaultClientResources;

/**
 * One set of Lettuce client resources (event loops, timers) for the whole suite: a client made
 * from them shuts down at once, where a client with its own resources waits out their quiet
 * period (seconds, each time).
 */
final class Shared {
    private Shared() {}

    static final ClientResources RESOURCES = DefaultClientResources.create();

    static RedisClient lettuce() {
        return RedisClient.create(RESOURCES);
    }

    static RedisClient lettuce(RedisURI uri) {
        return RedisClient.create(RESOURCES, uri);
    }

    static RedisClusterClient lettuceCluster(RedisURI uri) {
        return RedisClusterClient.create(RESOURCES, uri);
    }
}
