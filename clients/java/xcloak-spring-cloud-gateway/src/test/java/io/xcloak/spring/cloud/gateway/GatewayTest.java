package io.xcloak.spring.cloud.gateway;

import io.xcloak.spring.test.RedisServer;

/** The gateway on a server with the module: one XCLOAK.ALLOW per request. */
class GatewayTest extends GatewayContract {

    @Override
    RedisServer redis() {
        return RedisServer.shared();
    }

    @Override
    String prefix() {
        return "gateway:";
    }

    @Override
    long limiterCalls() {
        return redis.calls("xcloak.allow");
    }
}
