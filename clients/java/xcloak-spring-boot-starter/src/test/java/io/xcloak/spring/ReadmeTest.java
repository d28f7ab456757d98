package io.xcloak.spring;

import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;

import org.junit.jupiter.api.Test;

/**
 * The README's Spring MVC / WebFlux application.yml is the file the tests start both applications
 * from (src/test/resources/web.yml), byte for byte: the README can't show a configuration that
 * was not run.
 */
class ReadmeTest {

    @Test
    void theReadmeShowsTheConfigurationTheTestsRun() throws IOException {
        String readme = Files.readString(Path.of("..", "README.md"), StandardCharsets.UTF_8);
        String config;
        try (InputStream in = ReadmeTest.class.getResourceAsStream("/web.yml")) {
            config = new String(in.readAllBytes(), StandardCharsets.UTF_8);
        }
        assertTrue(readme.contains("```yaml\n" + config + "```\n"),
                "clients/java/README.md must show src/test/resources/web.yml verbatim in a yaml block");
    }
}
