// The two kinds of errors of docs/clients.md, never confused:
// - the server refused the call (a bad argument, WRONGTYPE, NOPERM, an unknown
//   command with fallback 'never'): XcloakError with the server's message
//   verbatim, raised whatever the error policy;
// - no answer (a connection refused, reset or closed, the limiter's timeout,
//   a server that can't serve now, "not replicated"): XcloakUnavailableError,
//   and only these go to the error policy.

/**
 * A call the server refused, with its message verbatim (`ERR window must be
 * ...`), or an argument or a configuration the client refuses (`code`
 * 'ARGUMENT', a message naming the argument and its range, never beginning
 * with `ERR`: that prefix is the server's).
 */
export class XcloakError extends Error {
  /** The first word of the server's message (`ERR`, `WRONGTYPE`, `NOPERM`, ...), 'ARGUMENT' for the client's refusals, 'UNAVAILABLE' for outages. */
  readonly code: string;

  constructor(message: string, options?: { cause?: unknown; code?: string }) {
    super(message, options?.cause === undefined ? undefined : { cause: options.cause });
    this.code = options?.code ?? /^[A-Z]+/.exec(message)?.[0] ?? 'ERR';
  }

  override get name(): string {
    return this.constructor.name;
  }
}

/** No answer: an outage, the timeout, or a server that can't serve now. `cause` holds what happened. */
export class XcloakUnavailableError extends XcloakError {
  declare readonly cause: Error;

  constructor(cause: Error) {
    super(`xcloak: no answer from the server: ${cause.message}`, { cause, code: 'UNAVAILABLE' });
  }
}

/** The limiter's own timeout fired before the reply. The call may still run on the server. */
export class XcloakTimeoutError extends Error {
  override readonly name = 'XcloakTimeoutError';
  constructor(readonly ms: number) {
    super(`no reply within the limiter's timeout of ${ms} ms (the call may still run on the server; it is never sent again)`);
  }
}

/** Durable mode: fewer replicas acknowledged the admission than asked. */
export class XcloakNotReplicatedError extends Error {
  override readonly name = 'XcloakNotReplicatedError';
  constructor(readonly replicas: number, readonly acknowledged: number) {
    super(`not replicated: WAIT ${replicas} answered ${acknowledged}`);
  }
}

/**
 * The server's replies that mean "can't serve now" rather than "you asked
 * wrong": they go to the error policy (docs/clients.md, Errors).
 */
const UNAVAILABLE_CODES = new Set(['LOADING', 'BUSY', 'MASTERDOWN', 'CLUSTERDOWN', 'TRYAGAIN', 'READONLY', 'NOREPLICAS', 'OOM']);
/** An ERR reply that is an outage too: the server takes no more connections now. */
const MAX_CLIENTS = 'ERR max number of clients reached';

/** Whether `error` is an error reply of the server (ioredis ReplyError, node-redis ErrorReply), not a client-side failure. */
export function isReplyError(error: unknown): error is Error {
  if (!(error instanceof Error)) return false;
  if (error.name === 'ReplyError') return true; // ioredis (redis-errors)
  for (let proto = Object.getPrototypeOf(error); proto && proto !== Error.prototype; proto = Object.getPrototypeOf(proto)) {
    if (proto.constructor?.name === 'ErrorReply') return true; // node-redis SimpleError / BlobError
  }
  return false;
}

export function isUnknownCommand(error: unknown): boolean {
  return isReplyError(error) && /^ERR unknown command/i.test(error.message);
}

export function isNoScript(error: unknown): boolean {
  return isReplyError(error) && error.message.startsWith('NOSCRIPT');
}

/**
 * Maps what a client library threw onto the contract's two kinds: the
 * server's refusal becomes XcloakError (message verbatim), everything that is
 * no answer becomes XcloakUnavailableError. Our own errors pass through.
 */
export function toXcloakError(error: unknown): XcloakError {
  if (error instanceof XcloakError) return error;
  if (isReplyError(error)) {
    const code = /^[A-Z]+/.exec(error.message)?.[0] ?? '';
    if (UNAVAILABLE_CODES.has(code) || error.message.startsWith(MAX_CLIENTS)) return new XcloakUnavailableError(error);
    return new XcloakError(error.message, { cause: error });
  }
  if (error instanceof Error) return new XcloakUnavailableError(error);
  return new XcloakUnavailableError(new Error(String(error)));
}
