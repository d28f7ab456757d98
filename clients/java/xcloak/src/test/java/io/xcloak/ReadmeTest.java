package io.xcloak;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.File;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.concurrent.TimeUnit;
import javax.tools.JavaCompiler;
import javax.tools.ToolProvider;
import org.junit.jupiter.api.Test;

/** The README's example, as written: compiled, run against a server with the module, its output as the README says. */
class ReadmeTest {
    @Test
    void the_example_runs_and_prints_what_the_readme_says() throws Exception {
        String readme = Files.readString(RedisServer.repo().resolve("clients/java/README.md"));
        int section = readme.indexOf("## Example");
        int start = readme.indexOf("```java\n", section) + "```java\n".length();
        String code = readme.substring(start, readme.indexOf("```\n", start));
        int says = readme.indexOf("It prints `", start) + "It prints `".length();
        String expected = readme.substring(says, readme.indexOf('`', says));
        assertTrue(code.contains("redis://localhost:6379"), code);

        try (RedisServer server = RedisServer.withModule()) {
            Path dir = Files.createTempDirectory("xcloak-readme-");
            Files.writeString(dir.resolve("Example.java"), code.replace("redis://localhost:6379", "redis://127.0.0.1:" + server.port));
            String classpath = System.getProperty("java.class.path");
            JavaCompiler javac = ToolProvider.getSystemJavaCompiler();
            int compiled = javac.run(null, null, null, "-Xlint:all", "-Werror", "-cp", classpath, "-d", dir.toString(),
                    dir.resolve("Example.java").toString());
            assertEquals(0, compiled, "the README's example compiles");
            String java = Path.of(System.getProperty("java.home"), "bin", "java").toString();
            Process run = new ProcessBuilder(java, "-cp", dir + File.pathSeparator + classpath, "Example")
                    .redirectErrorStream(true).start();
            String output = new String(run.getInputStream().readAllBytes());
            assertTrue(run.waitFor(60, TimeUnit.SECONDS));
            List<String> lines = output.lines().filter(l -> !l.startsWith("SLF4J")).toList();
            assertEquals(List.of(expected), lines, output);
            assertEquals(1, server.calls("xcloak.allow"));
            assertEquals(1L, server.cmd("EXISTS", "rl:login:alice"), "the prefix is on the key");
        }
    }
}
