package io.xcloak.spring;

import io.xcloak.MultiDecision;
import io.xcloak.spring.web.HttpLimits;

import org.springframework.boot.SpringBootConfiguration;
import org.springframework.boot.autoconfigure.EnableAutoConfiguration;
import org.springframework.http.ResponseEntity;
import org.springframework.web.bind.annotation.GetMapping;
import org.springframework.web.bind.annotation.PostMapping;
import org.springframework.web.bind.annotation.RequestAttribute;
import org.springframework.web.bind.annotation.RequestParam;
import org.springframework.web.bind.annotation.RestController;

/** The application the tests start: the same controller serves Spring MVC and WebFlux. */
@SpringBootConfiguration
@EnableAutoConfiguration
@RestController
public class TestApp {

    @GetMapping("/api/items")
    public String items() {
        return "items";
    }

    @GetMapping("/free")
    public String free() {
        return "free";
    }

    /** A login: 200 when {@code ok}, else 401 (a failed login); the body tells what the limiter left. */
    @PostMapping("/login")
    public ResponseEntity<String> login(@RequestParam("ok") boolean ok,
            @RequestAttribute(HttpLimits.DECISION_ATTRIBUTE) MultiDecision decision) {
        String left = decision.binding().remaining() + " left";
        return ok ? ResponseEntity.ok("welcome, " + left) : ResponseEntity.status(401).body("wrong password, " + left);
    }
}
