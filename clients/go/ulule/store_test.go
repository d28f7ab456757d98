package ulule

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/ulule/limiter/v3"
	"github.com/ulule/limiter/v3/drivers/store/tests"

	xcloak "github.com/xcloak/xcloak/clients/go"
	"github.com/xcloak/xcloak/clients/go/internal/testserver"
)

// store is a Store on a fresh server, with the module or (script) without.
func store(t *testing.T, script bool) (*Store, *testserver.Server) {
	server := testserver.Start(t, testserver.Config{NoModule: script})
	rdb := redis.NewClient(&redis.Options{Addr: server.Addr(), PoolSize: 50})
	t.Cleanup(func() { rdb.Close() })
	fallback := xcloak.FallbackNever
	if script {
		fallback = xcloak.FallbackAlways
	}
	// ulule's concurrent suite queues 500 goroutines on the pool, on a
	// shared machine: the Limiter's timeout is not what it tests (and a
	// failed assertion in one of its goroutines hangs the suite).
	l := mustLimiter(t, rdb, xcloak.Options{Fallback: fallback, Timeout: time.Minute})
	s, err := NewStore(l, limiter.StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return s, server
}

var kinds = map[string]bool{"module": false, "script": true}

// ulule's own suite, unchanged, through the command and through the script.
// TestStoreConcurrentAccess passes (250,000 Gets from 500 goroutines).
// TestStoreSequentialAccess fails at one assertion, and only there
// (tests.go:52, checked below): after the third of three admissions, Peek
// must say Reached false with Remaining 0. ulule's Reached on Peek means
// "the counter is past the limit": its fixed window counts refused requests
// (INCRBY), so only a refused request makes it true. xcloak records no
// refused request, so after three admissions and after three admissions
// and three refusals the window is the same, and its Peek says whether the
// next request would be refused: Reached true. The suite stops at that
// first failure (require); TestSequentialRest runs the rest of it.
func TestUluleSuite(t *testing.T) {
	if kind := os.Getenv("XCLOAK_ULULE_SEQUENTIAL"); kind != "" {
		s, _ := store(t, kinds[kind])
		tests.TestStoreSequentialAccess(t, s)
		return
	}
	for kind, script := range kinds {
		t.Run(kind, func(t *testing.T) {
			s, server := store(t, script)
			start := time.Now()
			tests.TestStoreConcurrentAccess(t, s)
			calls := server.Calls("xcloak.allow") + server.Calls("evalsha")
			hits := s.limiter.Stats().CacheHits
			t.Logf("TestStoreConcurrentAccess: %d calls and %d answered by the block cache in %v", calls, hits, time.Since(start).Round(time.Millisecond))
			// 100,000 admissions, then rejections, most of them answered by
			// the Limiter's block cache: every Get is one or the other.
			if calls+int64(hits) != 500*500 || hits == 0 {
				t.Errorf("%d calls + %d cache hits, want 250000 with hits", calls, hits)
			}

			cmd := exec.Command(os.Args[0], "-test.run=^TestUluleSuite$", "-test.v", "-test.count=1")
			cmd.Env = append(os.Environ(), "XCLOAK_ULULE_SEQUENTIAL="+kind)
			out, err := cmd.CombinedOutput()
			text := string(out)
			traces := regexp.MustCompile(`Error Trace:\s+\S*tests\.go:(\d+)`).FindAllStringSubmatch(text, -1)
			if err == nil || len(traces) != 1 || traces[0][1] != "52" || !strings.Contains(text, "Should be false") {
				t.Fatalf("TestStoreSequentialAccess: expected one failure, at tests.go:52 (Peek's Reached after the third admission); got (%v):\n%s", err, text)
			}
		})
	}
}

// TestSequentialRest runs TestStoreSequentialAccess's sequence with every
// assertion of ulule's, but the one at tests.go:52 inverted: Peek after the
// third admission says Reached (the next request would be refused).
func TestSequentialRest(t *testing.T) {
	for kind, script := range kinds {
		t.Run(kind, func(t *testing.T) {
			s, _ := store(t, script)
			ctx := context.Background()
			l, err := NewLimiter(s, limiter.Rate{Limit: 3, Period: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			check := func(where string, c limiter.Context, err error, remaining int64, reached bool) {
				t.Helper()
				if err != nil || c.Limit != 3 || c.Remaining != remaining || c.Reached != reached || c.Reset-time.Now().Unix() > 60 || c.Reset < time.Now().Unix() {
					t.Fatalf("%s: %+v, %v; want remaining %d, reached %v", where, c, err, remaining, reached)
				}
			}
			for i := int64(1); i <= 6; i++ {
				if i <= 3 {
					c, err := l.Peek(ctx, "foo")
					check("peek before", c, err, 3-(i-1), false)
				}
				c, err := l.Get(ctx, "foo")
				if i <= 3 {
					check("get", c, err, 3-i, false)
					c, err = l.Peek(ctx, "foo")
					check("peek after", c, err, 3-i, i == 3) // ulule: Reached false
				} else {
					check("get past the limit", c, err, 0, true)
				}
			}
			c, err := l.Peek(ctx, "foo")
			check("peek full", c, err, 0, true)
			for _, step := range []string{"reset", "peek", "get", "reset", "reset"} {
				switch step {
				case "reset":
					c, err = l.Reset(ctx, "foo")
					check("reset", c, err, 3, false)
				case "peek":
					c, err = l.Peek(ctx, "foo")
					check("peek after reset", c, err, 3, false)
				case "get":
					c, err = l.Get(ctx, "foo")
					check("get after reset", c, err, 2, false)
				}
			}
			// Increment: COST, all or nothing; 0 reads.
			c, err = l.Increment(ctx, "bar", 2)
			check("increment 2", c, err, 1, false)
			c, err = l.Increment(ctx, "bar", 2)
			check("increment 2 more", c, err, 1, true)
			c, err = l.Increment(ctx, "bar", 0)
			check("increment 0", c, err, 1, false)
		})
	}
}

// A refused request's Reset is when it would fit again (the oldest entry
// leaves), not the end of a fixed window.
func TestResetIsWhenTheRequestFits(t *testing.T) {
	s, _ := store(t, false)
	ctx := context.Background()
	rate := limiter.Rate{Limit: 2, Period: 10 * time.Second}
	s.Get(ctx, "slide", rate)
	time.Sleep(1100 * time.Millisecond)
	s.Get(ctx, "slide", rate)
	c, err := s.Get(ctx, "slide", rate)
	if err != nil || !c.Reached {
		t.Fatalf("%+v, %v", c, err)
	}
	// The first entry leaves about 8.9 s from now, the window is empty at 10.
	if left := c.Reset - time.Now().Unix(); left < 7 || left > 9 {
		t.Errorf("Reset in %d s, want the first entry's 9", left)
	}
}

// NewStore and NewLimiter refuse what they can't run with, with an
// *xcloak.Error naming it, at startup (the Limiter's client points at a
// closed port: nothing is sent). Catches a rate found bad only at the first
// request.
func TestConfigurationRefusedAtStartup(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer rdb.Close()
	s, err := NewStore(mustLimiter(t, rdb, xcloak.Options{OnError: xcloak.PolicyAllow}), limiter.StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name  string
		store *Store
		rate  limiter.Rate
		want  string
	}{
		{"nil store", nil, limiter.Rate{Period: time.Minute, Limit: 10}, "xcloak/ulule: NewLimiter needs a *Store, not nil"},
		{"no period", s, limiter.Rate{Limit: 10}, "xcloak/ulule: Rate.Period must be a whole number of milliseconds from 1ms (a time.Duration), not 0s"},
		{"period 1.5 ms", s, limiter.Rate{Period: 1500 * time.Microsecond, Limit: 10}, "xcloak/ulule: Rate.Period must be a whole number of milliseconds from 1ms (a time.Duration), not 1.5ms"},
		{"limit 0", s, limiter.Rate{Period: time.Minute}, "xcloak/ulule: Rate.Limit must be an integer from 1 to 1000000, not 0"},
		{"limit 1e11", s, limiter.Rate{Period: time.Minute, Limit: 1e11}, "xcloak/ulule: Rate.Limit must be an integer from 1 to 1000000, not 100000000000"},
	} {
		l, err := NewLimiter(c.store, c.rate)
		var e *xcloak.Error
		if l != nil || !errors.As(err, &e) || e.Message != c.want {
			t.Errorf("%s: NewLimiter gave %v, %v; want an *xcloak.Error %q", c.name, l, err, c.want)
		}
	}
	if st, err := NewStore(nil, limiter.StoreOptions{}); st != nil || err == nil || err.Error() != "xcloak/ulule: NewStore needs an *xcloak.Limiter, not nil" {
		t.Errorf("NewStore(nil): %v, %v", st, err)
	}
	if l, err := NewLimiter(s, limiter.Rate{Period: time.Minute, Limit: 1_000_000}); l == nil || err != nil {
		t.Errorf("a valid rate: %v", err)
	}
	// A negative count is an argument error (an *xcloak.Error), refused
	// before anything is sent.
	_, err = s.Increment(context.Background(), "k", -1, limiter.Rate{Period: time.Minute, Limit: 10})
	var e *xcloak.Error
	if !errors.As(err, &e) || !strings.HasPrefix(e.Message, "xcloak/ulule: Increment's count must be 0 or more, not -1") {
		t.Errorf("Increment(-1): %v", err)
	}
}
