package xcloak

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/xcloak/xcloak/clients/go/internal/testserver"
)

// Durable mode: WAIT is pipelined after each admitting call, on the same
// connection. With fewer replicas than asked the admission goes to the
// error policy (ErrNotReplicated), and under PolicyDeny it is refunded.
// Catches an admission reported as a plain success though not replicated,
// and a refused admission left in the window.
func TestDurable(t *testing.T) {
	primary := testserver.Start(t, testserver.Config{})
	replica := testserver.Start(t, testserver.Config{Args: []string{"--replicaof", "127.0.0.1", fmt.Sprint(primary.Port)}})
	if !testserver.Eventually(30*time.Second, func() bool { return testserver.Field(replica.Info("replication"), "master_link_status") == "up" }) {
		t.Fatal("the replica never linked")
	}
	ctx := context.Background()
	rec := &recorder{}
	rdb := primary.Client()
	rdb.AddHook(rec)
	l := NewLimiter(rdb, Options{Durable: &Durable{Replicas: 1, Timeout: 2 * time.Second}})
	primary.ResetStats()
	for i := 0; i < 3; i++ {
		r, err := l.Allow(ctx, "durable", time.Minute, 2)
		if err != nil || r.Allowed != (i < 2) || r.Via != ViaCommand {
			t.Fatalf("call %d: %+v, %v", i, r, err)
		}
	}
	if got := rec.take(); len(got) != 6 || got[1][0] != "WAIT" || got[1][1] != "1" || got[1][2] != "2000" {
		t.Errorf("sent %q", got)
	}
	if n := replica.Do("ZCARD", "durable").(int64); n != 2 {
		t.Errorf("the replica holds %d entries after WAIT", n)
	}

	for _, policy := range []ErrorPolicy{PolicyRaise, PolicyAllow, PolicyDeny} {
		key := "lonely:" + policy.String()
		l := NewLimiter(rdb, Options{ErrorPolicy: policy, Durable: &Durable{Replicas: 2, Timeout: 50 * time.Millisecond}})
		r, err := l.Allow(ctx, key, time.Minute, 5)
		switch policy {
		case PolicyRaise:
			if !errors.Is(err, ErrNotReplicated) || !errors.Is(err, ErrUnavailable) {
				t.Errorf("raise: %v", err)
			}
		default:
			if err != nil || r.Via != ViaError || !errors.Is(r.Err, ErrNotReplicated) || r.Allowed != (policy == PolicyAllow) {
				t.Errorf("%s: %+v, %v", policy, r, err)
			}
		}
		want := int64(1)
		if policy == PolicyDeny {
			want = 0
		}
		if n := primary.Do("ZCARD", key).(int64); n != want {
			t.Errorf("%s: %d entries, want %d", policy, n, want)
		}
	}
}
