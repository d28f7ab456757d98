package io.xcloak.spring.web;

import jakarta.servlet.http.HttpServletRequest;

/**
 * The servlet filter's key function: the client's identity in a request. The default is the
 * client's address ({@link ClientAddress}); declare a bean of this type to replace it (a user id,
 * an API key). A null key leaves the request unlimited.
 */
@FunctionalInterface
public interface ServletKeyResolver {

    String resolve(HttpServletRequest request);
}
