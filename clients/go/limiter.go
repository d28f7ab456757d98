package xcloak

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"time"

	"github.com/redis/go-redis/v9"
)

// Fallback says when the bundled Lua script stands in for the module.
type Fallback int

const (
	// FallbackAuto (the default): the first call to a server sends the
	// command; a server that answers "ERR unknown command" is then served by
	// the script (the call is sent again through it: nothing was applied),
	// and probed with the command again after Options.ProbeInterval. In a
	// cluster the choice is made per node.
	FallbackAuto Fallback = iota
	// FallbackAlways: the script from the first call (a managed service
	// known to have no module).
	FallbackAlways
	// FallbackNever: an unknown command is returned as an *Error.
	FallbackNever
)

// Durable makes an admission count only once Replicas replicas hold it:
// WAIT Replicas Timeout is sent after the reply of each admitting Allow (and
// of each Refund), on the connection that carried it; a rejection sends
// none. An Allow then always carries STAMP (Decision.Stamp shows it only when
// asked). Fewer acknowledgements send the admission to the error policy
// with the cause ErrNotReplicated; under PolicyDeny it is also refunded
// (best effort). A durable admission takes at most Options.Timeout +
// Durable.Timeout: the call has the Limiter's timeout, and WAIT its own.
type Durable struct {
	Replicas int
	Timeout  time.Duration
}

// Clock is the time a Limiter with Options.Clock runs on: calls send NOW
// from Now, and Acquire sleeps through Sleep. For tests and replays.
type Clock interface {
	Now() time.Time
	Sleep(ctx context.Context, d time.Duration) error
}

// Options configure a Limiter. The zero value is the contract's defaults.
type Options struct {
	// Prefix is put before every key (default none).
	Prefix string
	// OnError is the error policy: how outages and timeouts are answered
	// (default PolicyRaise). Argument and configuration errors never reach it.
	OnError ErrorPolicy
	// Timeout bounds each call, whatever the client's own socket timeouts
	// (default 1 s; -1: none but the client's and the context's).
	Timeout time.Duration
	// Fallback picks the command or the script (default FallbackAuto).
	Fallback Fallback
	// ProbeInterval is how long a server stays on the script before the
	// command is tried again (default 60 s).
	ProbeInterval time.Duration
	// Durable, when set, waits for replicas after each admission.
	Durable *Durable
	// JitterFraction scales Acquire's random extra sleep: floor(retry_after
	// × fraction × u) ms, u uniform in [0, 1) (default 0.1; -1: none).
	JitterFraction float64
	// Clock, when set, is the time the Limiter runs on (NOW is sent).
	Clock Clock
	// Rand, when set, is Acquire's source of u in [0, 1).
	Rand func() float64
	// BlockCache is the most keys the block cache holds (default 10,000;
	// -1: no cache). After a rejection with a retry-after above 0, an Allow
	// of the same key, window, limit and tiers, with a cost at least as
	// large, is rejected without a call until that retry-after has passed
	// on the local monotonic clock (Via == ViaCache). Peek, WithNow (and a
	// Clock), Refund and Reset bypass it; Refund and Reset drop the key's
	// entry first. Least recently used entries are evicted.
	BlockCache int
}

// Limiter makes rate-limit decisions with XCLOAK.ALLOW on a go-redis client:
// a *redis.Client (standalone, or Sentinel's NewFailoverClient), a
// *redis.ClusterClient (or NewFailoverClusterClient) or a *redis.Ring. It
// is safe for concurrent use.
type Limiter struct {
	rdb     redis.UniversalClient
	opt     Options
	jitter  float64
	honored bool // the client applies context deadlines to its sockets
	nodes   nodes
	cache   *blockCache // nil: BlockCache -1
}

// NewLimiter returns a Limiter on rdb, or an *Error naming the option that
// is out of range (checked here, once, never at a call and never through
// the error policy):
//
//   - rdb must not be nil;
//   - OnError is PolicyRaise, PolicyAllow or PolicyDeny; Fallback is
//     FallbackAuto, FallbackAlways or FallbackNever;
//   - Timeout is above 0 (0: the default 1 s; -1: none but the client's and
//     the context's); ProbeInterval is 0 (the default 60 s) or above;
//   - JitterFraction is from 0 to 1 (0: the default 0.1; -1: none);
//   - BlockCache is from 1 to 1,000,000 entries (0: the default 10,000;
//     -1: no block cache);
//   - Durable: Replicas from 1, Timeout a whole number of milliseconds from
//     1 ms (WAIT's 0 would block for ever), and rdb a *redis.Client,
//     *redis.ClusterClient or *redis.Ring (WAIT follows the write on its
//     connection).
//
// Its calls are never sent twice by go-redis once they may have reached
// the server (they are NoRetry commands: MaxRetries and the cluster's
// retries after a network error don't apply to them), and each is bounded
// by Options.Timeout. Pass a client with ContextTimeoutEnabled: the call is
// then made directly, its socket cut at the deadline. go-redis's default
// client applies no context deadline to its sockets, so each call then runs
// in a goroutine of its own and the caller is answered at the deadline:
// about twice the client CPU per call (clients/go/README.md, Benchmarks).
func NewLimiter(rdb redis.UniversalClient, opt Options) (*Limiter, error) {
	if err := opt.check(rdb); err != nil {
		return nil, err
	}
	if opt.Timeout == 0 {
		opt.Timeout = time.Second
	}
	if opt.ProbeInterval == 0 {
		opt.ProbeInterval = time.Minute
	}
	l := &Limiter{rdb: rdb, opt: opt, jitter: opt.JitterFraction}
	switch opt.BlockCache {
	case 0:
		l.cache = newBlockCache(defaultBlockCache, nil)
	case -1:
	default:
		l.cache = newBlockCache(opt.BlockCache, nil)
	}
	switch opt.JitterFraction {
	case 0:
		l.jitter = 0.1
	case -1:
		l.jitter = 0
	}
	switch c := rdb.(type) {
	case *redis.Client:
		l.honored = c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		l.honored = c.Options().ContextTimeoutEnabled
	case *redis.Ring:
		l.honored = c.Options().ContextTimeoutEnabled
	}
	return l, nil
}

// check refuses an Options (and a client) NewLimiter can't run with.
func (opt Options) check(rdb redis.UniversalClient) error {
	refuse := func(format string, args ...interface{}) error {
		return &Error{Message: "xcloak: NewLimiter: " + fmt.Sprintf(format, args...)}
	}
	if v := reflect.ValueOf(rdb); rdb == nil || (v.Kind() == reflect.Pointer && v.IsNil()) {
		return refuse("rdb must be a go-redis client, not nil")
	}
	if opt.OnError < PolicyRaise || opt.OnError > PolicyDeny {
		return refuse("Options.OnError must be PolicyRaise, PolicyAllow or PolicyDeny, not %d", int(opt.OnError))
	}
	if opt.Fallback < FallbackAuto || opt.Fallback > FallbackNever {
		return refuse("Options.Fallback must be FallbackAuto, FallbackAlways or FallbackNever, not %d", int(opt.Fallback))
	}
	if opt.Timeout < 0 && opt.Timeout != -1 {
		return refuse("Options.Timeout must be above 0 (0: the default 1s; -1: none), not %v", opt.Timeout)
	}
	if opt.ProbeInterval < 0 {
		return refuse("Options.ProbeInterval must be 0 (the default 60s) or above, not %v", opt.ProbeInterval)
	}
	if f := opt.JitterFraction; f != -1 && !(f >= 0 && f <= 1) {
		return refuse("Options.JitterFraction must be from 0 to 1 (0: the default 0.1; -1: none), not %v", f)
	}
	if n := opt.BlockCache; n < -1 || n > maxBlockCache {
		return refuse("Options.BlockCache must be from 1 to %d entries (0: the default %d; -1: no block cache), not %d", maxBlockCache, defaultBlockCache, n)
	}
	if d := opt.Durable; d != nil {
		if d.Replicas < 1 {
			return refuse("Durable.Replicas must be 1 or more, not %d", d.Replicas)
		}
		if d.Timeout < time.Millisecond || d.Timeout%time.Millisecond != 0 {
			return refuse("Durable.Timeout must be a whole number of milliseconds from 1ms (WAIT 0 blocks for ever), not %v", d.Timeout)
		}
		switch rdb.(type) {
		case *redis.Client, *redis.ClusterClient, *redis.Ring:
		default:
			return refuse("Options.Durable needs a *redis.Client, *redis.ClusterClient or *redis.Ring (WAIT follows the write on its connection), not %T", rdb)
		}
	}
	return nil
}

// Allow records one request against key if it fits: at most limit units
// per window, and at most each tier's limit per its window (WithTiers).
// Options: WithCost, WithTiers, WithStamp, WithNow.
//
//	res, err := limiter.Allow(ctx, "user:42", time.Minute, 100)
//	if err != nil { ... }        // *Error (a refused argument) or, under PolicyRaise, *UnavailableError
//	if !res.Allowed { ... }      // 429, Retry-After: res.RetryAfter
func (l *Limiter) Allow(ctx context.Context, key string, window time.Duration, limit int, opts ...CallOption) (Decision, error) {
	c := l.newCall(key, window, limit, opts)
	if c.oldest {
		return Decision{}, &Error{Message: "xcloak: Allow takes no oldest (WithOldest is Peek's)"}
	}
	return l.allow(ctx, c, true)
}

// Peek answers what Allow would decide now and records nothing. Where the
// client reads from replicas (ClusterClient with ReadOnly, RouteByLatency
// or RouteRandomly; NewFailoverClusterClient with ReplicaOnly...), a replica
// answers it. Options: WithCost, WithTiers, WithNow, WithOldest (then
// Decision.Oldest is where the binding tier's moving window starts).
func (l *Limiter) Peek(ctx context.Context, key string, window time.Duration, limit int, opts ...CallOption) (Decision, error) {
	c := l.newCall(key, window, limit, opts)
	if c.stamp {
		return Decision{}, &Error{Message: "xcloak: Peek takes no stamp (WithStamp)"}
	}
	return l.peek(ctx, c)
}

func (l *Limiter) peek(ctx context.Context, c *call) (Decision, error) {
	if c.err != nil {
		return Decision{}, c.err
	}
	out, err := l.exec(ctx, c.key, opPeek, c.args(false), false)
	if err != nil {
		return l.policy(ctx, err, c.limit, c.windowMs)
	}
	r, err := parseDecision(out.reply, c.windowMs, len(c.tiers) > 0, false, c.oldest)
	r.Via = out.via
	return r, err
}

// Refund removes an admission by its stamp (Decision.Stamp): cost entries
// (WithCost; default 1) recorded at that stamp, if they are still in the
// window. It returns how many it removed. An outage returns an
// *UnavailableError whatever the policy: the admission then stays, and the
// window stays conservative.
func (l *Limiter) Refund(ctx context.Context, key string, stamp int64, opts ...CallOption) (int, error) {
	c := l.newCall(key, 0, 0, opts)
	return l.refund(ctx, c.key, stamp, c.cost, c.hasCost, true)
}

// refundBestEffort refunds an admission the caller won't keep, within the
// Limiter's timeout even when ctx is done; a failure leaves the admission
// (conservative). It sends no durable WAIT: its outcome changes nothing.
func (l *Limiter) refundBestEffort(ctx context.Context, key string, stamp int64, cost int, hasCost bool) {
	_, _ = l.refund(context.WithoutCancel(ctx), key, stamp, cost, hasCost, false)
}

// refund sends XCLOAK.REFUND key stamp [COST cost]; key has its prefix.
// wait: in durable mode, WAIT after it.
func (l *Limiter) refund(ctx context.Context, key string, stamp int64, cost int, hasCost, wait bool) (int, error) {
	if l.cache != nil {
		l.cache.forget(key) // before sending: the window may open
	}
	args := make([]interface{}, argsAfterKey, argsAfterKey+3)
	args = append(args, stamp)
	if hasCost && cost != 1 {
		args = append(args, "COST", int64(cost))
	}
	out, err := l.exec(ctx, key, opRefund, args, wait)
	if err != nil {
		return 0, classify(ctx, err)
	}
	n, ok := out.reply.(int64)
	if !ok {
		return 0, &Error{Message: "xcloak: unexpected reply to XCLOAK.REFUND"}
	}
	return int(n), nil
}

// Reset deletes the window at key (DEL) and reports whether there was one.
func (l *Limiter) Reset(ctx context.Context, key string) (bool, error) {
	if l.cache != nil {
		l.cache.forget(l.opt.Prefix + key) // before sending: the window opens
	}
	cmd := redis.NewCmd(ctx, "DEL", l.opt.Prefix+key)
	cmd.SetFirstKeyPos(1)
	if err := l.send(ctx, cmd); err != nil {
		return false, classify(ctx, err)
	}
	n, _ := cmd.Val().(int64)
	return n > 0, nil
}

func (l *Limiter) newCall(key string, window time.Duration, limit int, opts []CallOption) *call {
	c := &call{key: l.opt.Prefix + key, limit: limit}
	c.windowMs, c.err = wholeMs(window, "window")
	for _, o := range opts {
		o(c)
	}
	if l.opt.Clock != nil && !c.hasNow {
		c.now, c.hasNow = l.opt.Clock.Now().UnixMilli(), true
	}
	return c
}

// allow sends c; withPolicy applies the error policy to an outage
// (AllowAll applies it once for the whole call).
func (l *Limiter) allow(ctx context.Context, c *call, withPolicy bool) (Decision, error) {
	if c.err != nil {
		return Decision{}, c.err
	}
	windowMs := c.windowMs
	// The block cache, unless the call carries NOW (WithNow, a Clock): a
	// rejection it holds for this shape answers without a call.
	cached := l.cache != nil && !c.hasNow
	var s shape
	var sent ticket
	if cached {
		s = shape{windowMs: c.windowMs, limit: c.limit, tiers: c.tiers, cost: 1}
		if c.hasCost {
			s.cost = c.cost
		}
		var hit Decision
		var ok bool
		if hit, sent, ok = l.cache.lookup(c.key, s); ok {
			return hit, nil
		}
	}
	durable := l.opt.Durable != nil
	asked := c.stamp
	if durable {
		c.stamp = true // always in durable mode: a refund under PolicyDeny needs it
	}
	out, err := l.exec(ctx, c.key, opAllow, c.args(true), true)
	if err != nil {
		if !withPolicy {
			return Decision{}, classify(ctx, err)
		}
		return l.policy(ctx, err, c.limit, windowMs)
	}
	r, err := parseDecision(out.reply, windowMs, len(c.tiers) > 0, c.stamp, false)
	if err != nil {
		return Decision{}, err
	}
	r.Via = out.via
	if cached {
		l.cache.record(c.key, s, sent, r)
	} else if l.cache != nil && r.Allowed {
		l.cache.forget(c.key)
	}
	if durable && r.Allowed && out.acked < int64(l.opt.Durable.Replicas) {
		// Acknowledged by fewer replicas than asked: a failover could lose
		// it, so it is not reported as a plain success.
		if l.opt.OnError == PolicyDeny {
			l.refundBestEffort(ctx, c.key, r.Stamp, c.cost, c.hasCost)
		}
		notReplicated := &UnavailableError{Cause: ErrNotReplicated}
		if !withPolicy {
			return r, notReplicated
		}
		return l.policy(ctx, notReplicated, c.limit, windowMs)
	}
	if !asked {
		r.Stamp = -1 // sent for the refund above; shown only when asked
	}
	return r, nil
}

// policy answers an outage by the error policy; a refusal is returned as is.
func (l *Limiter) policy(ctx context.Context, err error, limit int, windowMs int64) (Decision, error) {
	err = classify(ctx, err)
	var unavailable *UnavailableError
	if !errors.As(err, &unavailable) {
		return Decision{}, err
	}
	switch l.opt.OnError {
	case PolicyAllow:
		return policyDecision(true, limit, windowMs, unavailable.Cause), nil
	case PolicyDeny:
		return policyDecision(false, limit, windowMs, unavailable.Cause), nil
	}
	return Decision{}, err
}

// Stats are the Limiter's counters: the calls its block cache answered,
// and the entries it holds (zero without a block cache).
func (l *Limiter) Stats() Stats {
	if l.cache == nil {
		return Stats{}
	}
	return l.cache.stats()
}

// now is the Limiter's time: its Clock's, or the wall clock.
func (l *Limiter) now() time.Time {
	if l.opt.Clock != nil {
		return l.opt.Clock.Now()
	}
	return time.Now()
}

func (l *Limiter) sleep(ctx context.Context, d time.Duration) error {
	if l.opt.Clock != nil {
		return l.opt.Clock.Sleep(ctx, d)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (l *Limiter) random() float64 {
	if l.opt.Rand != nil {
		return l.opt.Rand()
	}
	return rand.Float64()
}
