// Package ulule is a github.com/ulule/limiter/v3 store on xcloak: every
// ulule user (its net/http, gin and fasthttp middleware) gets an exact
// sliding window instead of ulule's fixed one.
//
//	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379", ContextTimeoutEnabled: true})
//	xl, err := xcloak.NewLimiter(rdb, xcloak.Options{})
//	...
//	store, err := ulule.NewStore(xl, limiter.StoreOptions{})
//	...
//	instance, err := ulule.NewLimiter(store, limiter.Rate{Period: time.Minute, Limit: 100})
//	if err != nil {
//		log.Fatal(err) // the rate out of range, named
//	}
//	middleware := stdlib.NewMiddleware(instance)
//
// ulule hands a store its rate at each call, not when it is built: build
// ulule's limiter with NewLimiter (not limiter.New) to have the rate checked
// at startup. With limiter.New, a bad rate is refused by the server at the
// first request (an *xcloak.Error, never the error policy).
//
// Get and Increment are XCLOAK.ALLOW (COST count), Peek is XCLOAK.PEEK and
// Reset is DEL, on the key "<Prefix>:<key>" (Prefix defaults to ulule's
// "limiter"). Where the server has no module, the Limiter's Lua fallback
// answers, on the same keys.
//
// Two differences from ulule's own stores, both of the sliding window:
//
//   - A rejected request records nothing. ulule's counter goes on counting
//     past the limit (INCRBY), so its Remaining stays 0 until the window
//     ends; here Remaining is the room left now, and a client that keeps
//     knocking does not push its own return further away.
//   - Reset (unix seconds, rounded down as ulule's stores do) is when the request would fit again
//     when Reached (the window slides: the oldest entries leave one by one),
//     and when the whole window is empty otherwise. In a fixed window both
//     are the end of the window.
//
// ulule's exported store suite (drivers/store/tests: TestStoreSequentialAccess,
// TestStoreConcurrentAccess) passes unchanged, with the module and without it.
package ulule

import (
	"context"
	"fmt"
	"time"

	"github.com/ulule/limiter/v3"

	xcloak "github.com/xcloak/xcloak/clients/go"
	"github.com/xcloak/xcloak/clients/go/internal/check"
)

// Store is a limiter.Store on an xcloak Limiter.
type Store struct {
	limiter *xcloak.Limiter
	prefix  string
}

var _ limiter.Store = (*Store)(nil)

// NewStore returns a Store making its calls with l (an *xcloak.Error if l
// is nil). Of options, only Prefix applies (default limiter.DefaultPrefix);
// the Limiter's own Prefix, if any, comes before it.
func NewStore(l *xcloak.Limiter, options limiter.StoreOptions) (*Store, error) {
	if l == nil {
		return nil, &xcloak.Error{Message: "xcloak/ulule: NewStore needs an *xcloak.Limiter, not nil"}
	}
	prefix := options.Prefix
	if prefix == "" {
		prefix = limiter.DefaultPrefix
	}
	return &Store{limiter: l, prefix: prefix}, nil
}

// NewLimiter is ulule's limiter.New(store, rate, options...) with the rate
// checked first: rate.Period a whole number of milliseconds from 1ms,
// rate.Limit from 1 to 1,000,000. A rate out of range is an *xcloak.Error
// naming it, at startup.
func NewLimiter(store *Store, rate limiter.Rate, options ...limiter.Option) (*limiter.Limiter, error) {
	if store == nil {
		return nil, &xcloak.Error{Message: "xcloak/ulule: NewLimiter needs a *Store, not nil"}
	}
	if err := check.Window("xcloak/ulule: Rate.Period", rate.Period); err != nil {
		return nil, err
	}
	if rate.Limit < 1 || rate.Limit > check.MaxLimit {
		return nil, &xcloak.Error{Message: fmt.Sprintf("xcloak/ulule: Rate.Limit must be an integer from 1 to %d, not %d", check.MaxLimit, rate.Limit)}
	}
	return limiter.New(store, rate, options...), nil
}

func (s *Store) key(key string) string { return s.prefix + ":" + key }

// Get records one request (XCLOAK.ALLOW) and returns the window's state.
func (s *Store) Get(ctx context.Context, key string, rate limiter.Rate) (limiter.Context, error) {
	return s.Increment(ctx, key, 1, rate)
}

// Increment records a request of count units, all or nothing (COST count).
// A count of 0 changes nothing and reads the state (as INCRBY 0 would).
func (s *Store) Increment(ctx context.Context, key string, count int64, rate limiter.Rate) (limiter.Context, error) {
	if count == 0 {
		return s.Peek(ctx, key, rate)
	}
	if count < 0 {
		return limiter.Context{}, &xcloak.Error{Message: fmt.Sprintf("xcloak/ulule: Increment's count must be 0 or more, not %d (a refund is the Limiter's Refund, by stamp)", count)}
	}
	r, err := s.limiter.Allow(ctx, s.key(key), rate.Period, int(rate.Limit), xcloak.WithCost(int(count)))
	if err != nil {
		return limiter.Context{}, err
	}
	return state(r, rate), nil
}

// Peek returns the window's state without recording (XCLOAK.PEEK): Reached
// says whether one more request would be refused now.
func (s *Store) Peek(ctx context.Context, key string, rate limiter.Rate) (limiter.Context, error) {
	r, err := s.limiter.Peek(ctx, s.key(key), rate.Period, int(rate.Limit))
	if err != nil {
		return limiter.Context{}, err
	}
	return state(r, rate), nil
}

// Reset empties the window (DEL).
func (s *Store) Reset(ctx context.Context, key string, rate limiter.Rate) (limiter.Context, error) {
	if _, err := s.limiter.Reset(ctx, s.key(key)); err != nil {
		return limiter.Context{}, err
	}
	return limiter.Context{Limit: rate.Limit, Remaining: rate.Limit, Reset: time.Now().Add(rate.Period).Unix()}, nil
}

// state is a Decision as ulule's Context.
func state(r xcloak.Decision, rate limiter.Rate) limiter.Context {
	now := time.Now()
	reset := now.Add(r.ResetAfter)
	if !r.Allowed && r.RetryAfter > 0 {
		reset = now.Add(r.RetryAfter)
	}
	if r.Via == xcloak.ViaError {
		reset = now
	}
	return limiter.Context{Limit: rate.Limit, Remaining: int64(r.Remaining), Reset: reset.Unix(), Reached: !r.Allowed}
}
