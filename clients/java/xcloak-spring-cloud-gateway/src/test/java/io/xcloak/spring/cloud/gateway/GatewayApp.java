package io.xcloak.spring.cloud.gateway;

import org.springframework.boot.SpringBootConfiguration;
import org.springframework.boot.autoconfigure.EnableAutoConfiguration;

/** A gateway with no code of its own: routes and limits come from gateway.yml. */
@SpringBootConfiguration
@EnableAutoConfiguration
public class GatewayApp {
}
