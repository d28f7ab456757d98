package io.xcloak.spring;

import org.springframework.boot.WebApplicationType;

/** Spring MVC (Tomcat): the servlet filter. */
class ServletFilterTest extends WebAppContract {

    @Override
    WebApplicationType type() {
        return WebApplicationType.SERVLET;
    }

    @Override
    String prefix() {
        return "mvc:";
    }
}
