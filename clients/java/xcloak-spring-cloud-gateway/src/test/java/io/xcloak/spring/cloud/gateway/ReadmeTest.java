package io.xcloak.spring.cloud.gateway;

import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;

import org.junit.jupiter.api.Test;

/**
 * The README's Spring Cloud Gateway application.yml is the file the gateway tests start
 * from (src/test/resources/gateway.yml), byte for byte: the README can't show a configuration that
 * was not run.
 */
class ReadmeTest {

    @Test
    void theReadmeShowsTheConfigurationTheTestsRun() throws IOException {
        String readme = Files.readString(Path.of("..", "README.md"), StandardCharsets.UTF_8);
        String config;
        try (InputStream in = ReadmeTest.class.getResourceAsStream("/gateway.yml")) {
            config = new String(in.readAllBytes(), StandardCharsets.UTF_8);
        }
        assertTrue(readme.contains("```yaml\n" + config + "```\n"),
                "clients/java/README.md must show src/test/resources/gateway.yml verbatim in a yaml block");
    }
}
