package io.xcloak;

/** When the bundled Lua scripts stand in for the module (docs/clients.md, "Fallback"). */
public enum Fallback {
    /**
     * The command first; a node that answers {@code ERR unknown command} is served by the script
     * from then on, and probed with the command again after the probe interval (the default).
     */
    AUTO,
    /** The script from the first call (a managed service that can't load modules). */
    ALWAYS,
    /** The command only: an unknown command is thrown as {@link XcloakException}. */
    NEVER
}
