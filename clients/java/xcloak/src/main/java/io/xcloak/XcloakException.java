package io.xcloak;

/**
 * The server refused a call: an argument out of range (the server's text names it, e.g.
 * {@code ERR window must be an integer from 1 to 9007199254740991 (milliseconds)}),
 * {@code WRONGTYPE}, {@code NOPERM}, or an unknown command under {@link Fallback#NEVER}. The
 * message is the server's, verbatim. Never answered by the error policy: a bad argument is a bug in
 * the caller. {@link XcloakUnavailableException}, its subtype, is the outage the policy answers.
 *
 * <p>Arguments the client alone can see (a window that is not a whole number of milliseconds, an
 * option the call does not take) and a limiter's bad configuration are refused with
 * {@link IllegalArgumentException}, naming the argument and its range, before anything is sent.
 */
public class XcloakException extends RuntimeException {
    private static final long serialVersionUID = 1L;

    public XcloakException(String message) {
        super(message);
    }

    public XcloakException(String message, Throwable cause) {
        super(message, cause);
    }
}
