package io.xcloak;

/**
 * What a {@link Limiter}'s block cache did (docs/clients.md, "Block cache").
 *
 * @param cacheHits the calls the cache answered without a call to Redis, since the limiter was built
 * @param cacheEntries the entries the cache holds now
 */
public record Stats(long cacheHits, int cacheEntries) {}
