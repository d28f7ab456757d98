// The limiter's per-call timeout, cheaply. Every call of one limiter has the
// same timeout, so the deadlines expire in the order they started: one FIFO
// and one timer for the head, instead of a setTimeout per call, and no
// AbortController unless a transport asks for one (neither here does: ioredis
// takes a callback, node-redis the deadline as its own `timeout`). Measured on
// this machine: an AbortController costs more than the rest of a call.

import { XcloakTimeoutError } from './errors.js';
import type { CallDeadline } from './transport.js';

export class Deadline implements CallDeadline {
  settled = false;
  private expired: Error | undefined;
  private controller: AbortController | undefined;
  private cancels: Array<() => void> | undefined;

  constructor(
    readonly at: number,
    private readonly fail: (error: Error) => void,
  ) {}

  get signal(): AbortSignal {
    if (!this.controller) {
      this.controller = new AbortController();
      if (this.expired) this.controller.abort(this.expired);
    }
    return this.controller.signal;
  }

  onExpire(cancel: () => void): void {
    if (this.expired) cancel();
    else (this.cancels ??= []).push(cancel);
  }

  expire(error: Error): void {
    this.expired = error;
    this.controller?.abort(error);
    if (this.cancels) for (const cancel of this.cancels) cancel();
    this.fail(error);
  }
}

/** The deadlines of calls with the same timeout, `ms`: they expire in the order they started. */
export class DeadlineQueue {
  private queue: Deadline[] = [];
  private head = 0;
  private timer: ReturnType<typeof setTimeout> | undefined;

  constructor(readonly ms: number) {}

  /** Runs `work` under a deadline of `ms`: the promise rejects with XcloakTimeoutError when it passes. */
  run<T>(work: (deadline: Deadline) => Promise<T>): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      const deadline = this.start(reject);
      let started: Promise<T>;
      try {
        started = work(deadline);
      } catch (error) {
        started = Promise.reject(error);
      }
      started.then(
        (value) => {
          if (this.settle(deadline)) resolve(value);
        },
        (error) => {
          if (this.settle(deadline)) reject(error);
        },
      );
    });
  }

  /** A deadline from now; at expiry it calls `fail` with XcloakTimeoutError (unless settled first). */
  start(fail: (error: Error) => void): Deadline {
    const deadline = new Deadline(performance.now() + this.ms, fail);
    this.queue.push(deadline);
    if (this.timer === undefined) this.arm();
    return deadline;
  }

  /** Marks the call done; false when its deadline passed first (the caller was answered already). */
  settle(deadline: Deadline): boolean {
    if (deadline.settled) return false;
    deadline.settled = true;
    while (this.head < this.queue.length && this.queue[this.head]!.settled) this.head++;
    if (this.head === this.queue.length) {
      this.queue = [];
      this.head = 0;
    } else if (this.head > 1024 && this.head * 2 > this.queue.length) {
      this.queue = this.queue.slice(this.head);
      this.head = 0;
    }
    return true;
  }

  private arm(): void {
    const next = this.queue[this.head];
    if (!next) {
      this.timer = undefined;
      return;
    }
    this.timer = setTimeout(() => this.fire(), Math.max(1, Math.ceil(next.at - performance.now())));
    this.timer.unref?.();
  }

  private fire(): void {
    const now = performance.now();
    while (this.head < this.queue.length) {
      const deadline = this.queue[this.head]!;
      if (!deadline.settled) {
        if (deadline.at > now) break;
        deadline.settled = true;
        deadline.expire(new XcloakTimeoutError(this.ms));
      }
      this.head++;
    }
    if (this.head === this.queue.length) {
      this.queue = [];
      this.head = 0;
    }
    this.arm();
  }
}
