package compat

import (
	"context"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	xcloak "github.com/xcloak/xcloak/clients/go"
	"github.com/xcloak/xcloak/clients/go/internal/testserver"
)

// The mapping of clients/go/README.md ("From go-redis/redis_rate"), line by
// line: redis_rate v10 and xcloak on one server, the same scenario (3 per
// minute, four requests, then a request of cost 2 on a fresh key, then one
// of cost 5 that can never fit), each field compared as the README says.
// Catches a README that claims the same meaning where it differs (as it
// once did: "Result has go-redis/redis_rate's fields, with their meaning").
func TestRedisRateMapping(t *testing.T) {
	server := testserver.Start(t, testserver.Config{})
	rdb := redis.NewClient(&redis.Options{Addr: server.Addr(), ContextTimeoutEnabled: true})
	defer rdb.Close()
	ctx := context.Background()
	rr := redis_rate.NewLimiter(rdb)
	xl, err := xcloak.NewLimiter(rdb, xcloak.Options{Prefix: "rl:"})
	if err != nil {
		t.Fatal(err)
	}
	rate := redis_rate.PerMinute(3)
	const window, limit = time.Minute, 3
	emission := rate.Period / time.Duration(rate.Rate) // GCRA frees one request every 20 s

	start := time.Now()
	var got [4]struct {
		rr *redis_rate.Result
		x  xcloak.Decision
	}
	for i := range got {
		if got[i].rr, err = rr.Allow(ctx, "user:42", rate); err != nil {
			t.Fatal(err)
		}
		if got[i].x, err = xl.Allow(ctx, "user:42", window, limit); err != nil {
			t.Fatal(err)
		}
	}
	elapsed := time.Since(start)
	for i, g := range got {
		r, d := g.rr, g.x
		admitted := i < 3
		// Limit: redis_rate's is the Limit struct passed in; xcloak's Limit
		// and Window are its Rate and Period (PerSecond/PerMinute/PerHour,
		// where Burst is Rate).
		if r.Limit != rate || d.Limit != r.Limit.Rate || d.Window != r.Limit.Period || r.Limit.Burst != r.Limit.Rate {
			t.Errorf("call %d: Limit %+v, xcloak Limit %d Window %v", i, r.Limit, d.Limit, d.Window)
		}
		// Allowed: redis_rate's int is the cost admitted (1 here), 0 when
		// rejected; xcloak's bool is Allowed > 0.
		if d.Allowed != admitted || r.Allowed != map[bool]int{true: 1, false: 0}[admitted] || d.Allowed != (r.Allowed > 0) {
			t.Errorf("call %d: Allowed redis_rate %d, xcloak %v", i, r.Allowed, d.Allowed)
		}
		// Remaining: the same, within a burst (requests closer than the
		// emission interval): limit - admitted, never below 0.
		if d.Remaining != r.Remaining || d.Remaining != max(limit-(i+1), 0) {
			t.Errorf("call %d: Remaining redis_rate %d, xcloak %d", i, r.Remaining, d.Remaining)
		}
		if admitted {
			// RetryAfter on an admission: redis_rate -1, xcloak 0.
			if r.RetryAfter != -1 || d.RetryAfter != 0 {
				t.Errorf("call %d admitted: RetryAfter redis_rate %v, xcloak %v", i, r.RetryAfter, d.RetryAfter)
			}
			// ResetAfter: redis_rate drains one request per emission interval
			// (i+1 admitted: (i+1) x 20 s); xcloak's window is empty when its
			// newest entry leaves (60 s after it).
			if !near(r.ResetAfter, time.Duration(i+1)*emission, elapsed) || !near(d.ResetAfter, window, elapsed) {
				t.Errorf("call %d admitted: ResetAfter redis_rate %v, xcloak %v", i, r.ResetAfter, d.ResetAfter)
			}
			continue
		}
		// RetryAfter on a rejection: redis_rate waits one emission interval
		// (20 s: GCRA frees requests one by one at the average rate); xcloak
		// until the oldest entry leaves the window (60 s), after which the
		// request does fit in any window of a minute.
		if !near(r.RetryAfter, emission, elapsed) || !near(d.RetryAfter, window, elapsed) {
			t.Errorf("call %d rejected: RetryAfter redis_rate %v, xcloak %v", i, r.RetryAfter, d.RetryAfter)
		}
		// ResetAfter on a rejection: both until the key is back to empty.
		if !near(r.ResetAfter, 3*emission, elapsed) || !near(d.ResetAfter, window, elapsed) {
			t.Errorf("call %d rejected: ResetAfter redis_rate %v, xcloak %v", i, r.ResetAfter, d.ResetAfter)
		}
	}

	// A cost: redis_rate AllowN(n) admits Allowed == n; xcloak WithCost(n)
	// admits all n units or none, Allowed true.
	r, err := rr.AllowN(ctx, "cost", rate, 2)
	if err != nil {
		t.Fatal(err)
	}
	d, err := xl.Allow(ctx, "cost", window, limit, xcloak.WithCost(2))
	if err != nil || r.Allowed != 2 || !d.Allowed || r.Remaining != 1 || d.Remaining != 1 {
		t.Errorf("cost 2: redis_rate Allowed %d Remaining %d, xcloak %+v %v", r.Allowed, r.Remaining, d, err)
	}

	// A cost above the limit can never fit: redis_rate rejects it with a
	// positive RetryAfter ((n - burst) x 20 s), after which it is rejected
	// again; xcloak says so: RetryAfter -1 and CostExceedsLimit.
	start = time.Now()
	r, err = rr.AllowN(ctx, "huge", rate, 5)
	if err != nil {
		t.Fatal(err)
	}
	d, err = xl.Allow(ctx, "huge", window, limit, xcloak.WithCost(5))
	elapsed = time.Since(start)
	if err != nil || r.Allowed != 0 || !near(r.RetryAfter, 2*emission, elapsed) || d.Allowed || d.RetryAfter != -1 || !d.CostExceedsLimit {
		t.Errorf("never fits: redis_rate Allowed %d RetryAfter %v, xcloak %+v %v", r.Allowed, r.RetryAfter, d, err)
	}
	// Neither recorded it.
	if n := server.Do("EXISTS", "rate:huge", "rl:huge").(int64); n != 0 {
		t.Errorf("a request that can never fit left %d keys", n)
	}
}

// near: got is want, less at most the time that passed since the figure
// was taken (both libraries count from the server's clock at the call),
// within xcloak's millisecond and redis_rate's float rounding.
func near(got, want, elapsed time.Duration) bool {
	return got <= want+time.Microsecond && got >= want-elapsed-time.Millisecond
}
