package xcloak

import (
	"context"
	"math"
	"time"
)

// Acquire waits until the request is admitted, by the server's own figure:
// it calls Allow, and while rejected sleeps the reply's RetryAfter (plus a
// jitter of up to Options.JitterFraction of it, never subtracted), never
// past maxWait nor the context's deadline. It returns the admitting Decision;
// the last rejected one when the deadline comes first (or at once when the
// request can never fit, or can't fit before the deadline); a Decision of the
// error policy on an outage; and the context's error when the context is
// done while it sleeps. A cancelled wait has recorded nothing: only an
// admission records. Each turn is a new request; no call is retried.
// Options: WithCost, WithTiers, WithStamp.
func (l *Limiter) Acquire(ctx context.Context, key string, window time.Duration, limit int, maxWait time.Duration, opts ...CallOption) (Decision, error) {
	deadline := l.now().Add(maxWait)
	if d, ok := ctx.Deadline(); ok && l.opt.Clock == nil && d.Before(deadline) {
		deadline = d
	}
	for {
		r, err := l.allow(ctx, l.newCall(key, window, limit, opts), true)
		if err != nil || r.Allowed || r.Via == ViaError || r.CostExceedsLimit {
			return r, err
		}
		sleep, ok := acquireSleep(r.msRetry(), deadline.Sub(l.now()), l.jitter, l.random)
		if !ok {
			return r, nil
		}
		if err := l.sleep(ctx, sleep); err != nil {
			return r, err
		}
	}
}

// acquireSleep is Acquire's plan after a rejection (docs/clients.md,
// acquire): no sleep when the request can't fit before the deadline (left),
// else retry_after plus floor(retry_after × fraction × u) milliseconds, at
// most left and at least 1 ms. random is called only when there is a jitter.
func acquireSleep(retryMs int64, left time.Duration, fraction float64, random func() float64) (time.Duration, bool) {
	retry := duration(retryMs)
	if retryMs < 0 || retry > left {
		return 0, false
	}
	sleep := retry
	if fraction > 0 {
		jitterMs := math.Floor(float64(retryMs) * fraction * random())
		sleep += time.Duration(jitterMs) * time.Millisecond
	}
	sleep = min(sleep, left)
	return max(sleep, time.Millisecond), true
}
