package ulule

import (
	"context"
	"testing"
	"time"

	"github.com/ulule/limiter/v3"
)

// Through the store, a rejection the Limiter's block cache answers is
// ulule's rejection (Reached, Remaining 0, Reset when it fits), with no
// call; the store's Reset drops the entry, so the next Get is sent and
// admitted. Catches a cached Decision read as an admission, and a Reset
// that leaves the key blocked in the process.
func TestCachedRejection(t *testing.T) {
	s, server := store(t, false)
	ctx := context.Background()
	rate := limiter.Rate{Limit: 1, Period: time.Minute}
	if c, err := s.Get(ctx, "k", rate); err != nil || c.Reached {
		t.Fatal(c, err)
	}
	first, err := s.Get(ctx, "k", rate)
	if err != nil || !first.Reached {
		t.Fatal(first, err)
	}
	calls := server.Calls("xcloak.allow")
	c, err := s.Increment(ctx, "k", 1, rate)
	if err != nil || !c.Reached || c.Remaining != 0 || c.Limit != 1 || c.Reset < first.Reset-1 || c.Reset > first.Reset {
		t.Errorf("cached: %+v, %v; the server's %+v", c, err, first)
	}
	if got := server.Calls("xcloak.allow"); got != calls || s.limiter.Stats().CacheHits != 1 {
		t.Errorf("the cached rejection sent %d calls (%+v)", got-calls, s.limiter.Stats())
	}
	if _, err := s.Reset(ctx, "k", rate); err != nil {
		t.Fatal(err)
	}
	if c, err := s.Get(ctx, "k", rate); err != nil || c.Reached || server.Calls("xcloak.allow") != calls+1 {
		t.Errorf("after Reset: %+v, %v, %d calls; want admitted by the server", c, err, server.Calls("xcloak.allow")-calls)
	}
}
