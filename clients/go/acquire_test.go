package xcloak

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/xcloak/xcloak/clients/go/internal/testserver"
)

// Acquire on the wall clock: it sleeps the server's retry-after and is
// admitted; it returns at once when the context is done, having recorded
// nothing; and it never sleeps past maxWait. Catches polling, a sleep
// shorter than retry-after (a second rejection), and a wait that outlives
// its context.
func TestAcquire(t *testing.T) {
	server := testserver.Start(t, testserver.Config{})
	l := mustLimiter(t, server.Client(), Options{})
	ctx := context.Background()
	if r, err := l.Allow(ctx, "acq", 300*time.Millisecond, 1); err != nil || !r.Allowed {
		t.Fatal(r, err)
	}
	server.ResetStats()
	start := time.Now()
	r, err := l.Acquire(ctx, "acq", 300*time.Millisecond, 1, 5*time.Second)
	took := time.Since(start)
	if err != nil || !r.Allowed || took < 250*time.Millisecond || took > 2*time.Second {
		t.Fatalf("acquire: %+v, %v after %v", r, err, took)
	}
	if calls := server.Calls("xcloak.allow"); calls != 2 {
		t.Errorf("%d calls: a rejection, then the admission after the server's retry-after", calls)
	}

	if r, err := l.Allow(ctx, "acq:long", time.Hour, 1); err != nil || !r.Allowed {
		t.Fatal(r, err)
	}
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	start = time.Now()
	r, err = l.Acquire(short, "acq:long", time.Hour, 1, time.Hour)
	if took := time.Since(start); took > time.Second || err != nil || r.Allowed || r.RetryAfter < 59*time.Minute {
		t.Errorf("acquire under a 100 ms context: %+v, %v after %v", r, err, took)
	}
	cancelled, cancel := context.WithCancel(ctx)
	go func() { time.Sleep(100 * time.Millisecond); cancel() }()
	if r, err := l.Allow(ctx, "acq:cancel", 10*time.Second, 1); err != nil || !r.Allowed {
		t.Fatal(r, err)
	}
	start = time.Now()
	r, err = l.Acquire(cancelled, "acq:cancel", 10*time.Second, 1, time.Minute)
	if took := time.Since(start); !errors.Is(err, context.Canceled) || took > time.Second || r.Allowed {
		t.Errorf("a cancelled acquire: %+v, %v after %v", r, err, took)
	}
	if n := server.Do("ZCARD", "acq:cancel").(int64); n != 1 {
		t.Errorf("the cancelled wait recorded: %d entries", n)
	}
}
