package io.xcloak.spring.cloud.gateway;

import static org.junit.jupiter.api.Assertions.assertTrue;

import java.beans.Introspector;
import java.beans.PropertyDescriptor;
import java.lang.reflect.Field;
import java.lang.reflect.Method;
import java.lang.reflect.ParameterizedType;
import java.lang.reflect.Type;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;

import io.xcloak.spring.XcloakProperties;

import org.junit.jupiter.api.Test;

/**
 * The Spring modules' lines of clients/java/names.tsv (the Java column of docs/clients.md's names
 * table) name what exists: each io.xcloak.spring class (or its member), and each xcloak.* property
 * of XcloakProperties. The core's NamesTest leaves these to the Spring modules.
 */
class SpringNamesTest {

    @Test
    void everySpringNameInNamesTsvExists() throws Exception {
        List<String> missing = new ArrayList<>();
        int checked = 0;
        for (String line : Files.readAllLines(Path.of("..", "names.tsv"), StandardCharsets.UTF_8)) {
            String[] fields = line.split("\t");
            if (fields.length < 2) {
                continue;
            }
            for (String name : fields[1].split(", ")) {
                if (name.startsWith("io.xcloak.spring")) {
                    checked++;
                    if (!javaNameExists(name)) {
                        missing.add(name);
                    }
                } else if (name.startsWith("xcloak.")) {
                    checked++;
                    if (!propertyExists(name.substring("xcloak.".length()))) {
                        missing.add(name);
                    }
                }
            }
        }
        assertTrue(checked >= 8, "names.tsv should name the Spring modules' middleware; checked " + checked);
        assertTrue(missing.isEmpty(), "names.tsv names what the Spring modules do not have: " + missing);
    }

    private static boolean javaNameExists(String name) {
        try {
            Class.forName(name);
            return true;
        } catch (ClassNotFoundException notAClass) {
            int dot = name.lastIndexOf('.');
            try {
                Class<?> owner = Class.forName(name.substring(0, dot));
                String member = name.substring(dot + 1);
                for (Field f : owner.getFields()) {
                    if (f.getName().equals(member)) {
                        return true;
                    }
                }
                for (Method m : owner.getMethods()) {
                    if (m.getName().equals(member)) {
                        return true;
                    }
                }
                return false;
            } catch (ClassNotFoundException e) {
                return false;
            }
        }
    }

    /** xcloak.routes.&lt;name&gt;.skip-successful: walks XcloakProperties' bean properties (a map's key is any name). */
    private static boolean propertyExists(String path) throws Exception {
        Type type = XcloakProperties.class;
        for (String segment : path.split("\\.")) {
            Class<?> raw = raw(type);
            if (Map.class.isAssignableFrom(raw)) {
                if (!segment.startsWith("<")) {
                    return false;
                }
                type = ((ParameterizedType) type).getActualTypeArguments()[1];
                continue;
            }
            String camel = camel(segment);
            Type next = null;
            for (PropertyDescriptor p : Introspector.getBeanInfo(raw).getPropertyDescriptors()) {
                if (p.getName().equals(camel) && p.getReadMethod() != null) {
                    next = p.getReadMethod().getGenericReturnType();
                }
            }
            if (next == null) {
                return false;
            }
            type = next;
        }
        return true;
    }

    private static Class<?> raw(Type type) {
        return type instanceof ParameterizedType p ? (Class<?>) p.getRawType() : (Class<?>) type;
    }

    private static String camel(String kebab) {
        StringBuilder out = new StringBuilder();
        boolean upper = false;
        for (char c : kebab.toCharArray()) {
            if (c == '-') {
                upper = true;
            } else {
                out.append(upper ? Character.toUpperCase(c) : c);
                upper = false;
            }
        }
        return out.toString();
    }
}
