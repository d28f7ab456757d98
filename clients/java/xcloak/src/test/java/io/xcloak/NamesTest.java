package io.xcloak;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.lang.reflect.Field;
import java.lang.reflect.Method;
import java.lang.reflect.Modifier;
import java.nio.file.Files;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Set;
import org.junit.jupiter.api.Test;

/**
 * clients/java/names.tsv (the Java column of docs/clients.md's names table) against the public
 * API: every name it gives for the core exists, and every public name of the core's main classes
 * is in it. The Spring modules' names (io.xcloak.spring..., xcloak.* properties) are theirs to check.
 */
class NamesTest {
    private static List<String> names() throws IOException {
        List<String> names = new ArrayList<>();
        List<String> lines = Files.readAllLines(RedisServer.repo().resolve("clients/java/names.tsv"));
        assertEquals("concept\tname\tnote", lines.get(0));
        for (String line : lines.subList(1, lines.size())) {
            String[] fields = line.split("\t");
            for (String name : fields[1].split(", ")) {
                if (!name.equals("-")) {
                    names.add(name);
                }
            }
        }
        return names;
    }

    private static boolean core(String name) {
        return !name.startsWith("xcloak.") && !name.startsWith("io.xcloak.spring");
    }

    /** Whether {@code name} (Class.member, Outer.Inner.member, or fully qualified) is public API. */
    private static boolean exists(String name) {
        String[] parts = name.split("\\.");
        int i = 0;
        String prefix = "io.xcloak";
        Class<?> type = null;
        if (name.startsWith("io.")) {
            prefix = "";
        }
        while (i < parts.length && type == null) {
            prefix = prefix.isEmpty() ? parts[i] : prefix + "." + parts[i];
            type = load(prefix);
            i++;
        }
        if (type == null || !Modifier.isPublic(type.getModifiers())) {
            return false;
        }
        for (; i < parts.length; i++) {
            String part = parts[i];
            Class<?> nested = load(type.getName() + "$" + part);
            if (nested != null && Modifier.isPublic(nested.getModifiers())) {
                type = nested;
                continue;
            }
            if (i != parts.length - 1) {
                return false;
            }
            for (Method m : type.getMethods()) {
                if (m.getName().equals(part)) {
                    return true;
                }
            }
            for (Field f : type.getFields()) {
                if (f.getName().equals(part)) {
                    return true;
                }
            }
            return false;
        }
        return true;
    }

    private static Class<?> load(String name) {
        try {
            return Class.forName(name, false, NamesTest.class.getClassLoader());
        } catch (ClassNotFoundException | NoClassDefFoundError e) {
            return null;
        }
    }

    @Test
    void every_name_in_the_file_is_public_api() throws IOException {
        List<String> missing = new ArrayList<>();
        for (String name : names()) {
            if (core(name) && !exists(name)) {
                missing.add(name);
            }
        }
        assertTrue(missing.isEmpty(), "names.tsv names what the package does not have: " + missing);
    }

    @Test
    void every_public_name_of_the_core_is_in_the_file() throws IOException {
        Set<String> listed = new HashSet<>(names());
        Set<String> recordMethods = Set.of("equals", "hashCode", "toString");
        List<String> unlisted = new ArrayList<>();
        for (Class<?> type : List.of(Limiter.class, Limiter.Builder.class, Decision.class, MultiDecision.class,
                Headers.class, Stats.class, TierState.class, Durable.class)) {
            String owner = type.getName().substring("io.xcloak.".length()).replace('$', '.');
            if (!listed.contains(owner) && !listed.contains(owner.substring(owner.lastIndexOf('.') + 1))) {
                unlisted.add(owner);
            }
            for (Method m : type.getDeclaredMethods()) {
                if (Modifier.isPublic(m.getModifiers()) && !recordMethods.contains(m.getName())
                        && !listed.contains(owner + "." + m.getName())) {
                    unlisted.add(owner + "." + m.getName());
                }
            }
        }
        for (Class<?> type : List.of(Request.class, Tier.class, Via.class, ErrorPolicy.class, Fallback.class,
                Clock.class, Transport.class, XcloakException.class, XcloakUnavailableException.class,
                XcloakNotReplicatedException.class)) {
            if (!listed.contains(type.getSimpleName())) {
                unlisted.add(type.getSimpleName());
            }
        }
        assertTrue(unlisted.isEmpty(), "public names missing from names.tsv: " + unlisted);
    }
}
