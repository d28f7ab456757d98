package io.xcloak;

/** Who decided a {@link Decision} (docs/clients.md, "Decision"). */
public enum Via {
    /** The module's command ({@code XCLOAK.ALLOW}, {@code XCLOAK.PEEK}). */
    COMMAND,
    /** The bundled Lua script, on a server without the module. */
    SCRIPT,
    /** The error policy: there was no answer ({@link Decision#error()} says why). */
    ERROR,
    /** The block cache: a rejection the server gave earlier, counted down locally, with no call. */
    CACHE
}
