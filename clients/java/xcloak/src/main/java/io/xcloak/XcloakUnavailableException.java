package io.xcloak;

/**
 * No answer: a connection refused, reset or closed; the limiter's timeout
 * ({@link java.util.concurrent.TimeoutException} as the cause); a server that can't serve now
 * ({@code LOADING}, {@code BUSY}, {@code MASTERDOWN}, {@code CLUSTERDOWN}, {@code TRYAGAIN},
 * {@code READONLY}, {@code NOREPLICAS}, {@code OOM}, {@code ERR max number of clients reached});
 * in durable mode, {@link XcloakNotReplicatedException}. The error policy {@link ErrorPolicy#RAISE}
 * throws it; {@code ALLOW} and {@code DENY} put its cause in {@link Decision#error()}. The call may
 * or may not have been applied, and it was not sent again.
 */
public class XcloakUnavailableException extends XcloakException {
    private static final long serialVersionUID = 1L;

    public XcloakUnavailableException(String message, Throwable cause) {
        super(message, cause);
    }
}
