package xcloak

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/xcloak/xcloak/clients/go/internal/testserver"
)

// Durable mode: WAIT follows the reply of each admitting call, on the same
// connection; a rejection sends none. An allow always carries STAMP (the
// deny path refunds by it), and the Decision shows it only if asked. With
// fewer replicas than asked the admission goes to the error policy
// (ErrNotReplicated), and under PolicyDeny it is refunded. Catches: WAIT
// pipelined behind every call (a rejection then WAITs too: with a replica
// down, for the whole timeout), STAMP sent only under deny (nothing to
// refund by), a stamp shown that was not asked for, an admission reported
// as a plain success though not replicated, a refused admission left in the
// window.
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
	// No block cache: the rejections must reach the server (their WAITs are counted).
	l := mustLimiter(t, rdb, Options{Durable: &Durable{Replicas: 1, Timeout: 2 * time.Second}, BlockCache: -1})
	primary.ResetStats()
	var stamp int64
	for i := 0; i < 4; i++ {
		var opts []CallOption
		if i == 1 {
			opts = append(opts, WithStamp())
		}
		r, err := l.Allow(ctx, "durable", time.Minute, 2, opts...)
		if err != nil || r.Allowed != (i < 2) || r.Via != ViaCommand {
			t.Fatalf("call %d: %+v, %v", i, r, err)
		}
		if r.HasStamp() != (i == 1) {
			t.Errorf("call %d: stamp %d shown (asked: %v)", i, r.Stamp, i == 1)
		}
		if i == 1 {
			stamp = r.Stamp
		}
	}
	allow := []string{"XCLOAK.ALLOW", "durable", "60000", "2", "DETAILS", "STAMP"}
	wait := []string{"WAIT", "1", "2000"}
	if got, want := rec.take(), [][]string{allow, wait, allow, wait, allow, allow}; !reflect.DeepEqual(got, want) {
		t.Errorf("sent:\n got  %q\n want %q", got, want)
	}
	if n := primary.Calls("wait"); n != 2 {
		t.Errorf("the server ran %d WAITs for 2 admissions and 2 rejections", n)
	}
	if n := replica.Do("ZCARD", "durable").(int64); n != 2 {
		t.Errorf("the replica holds %d entries after WAIT", n)
	}
	// A Refund waits too: the replica no longer holds the refunded entry.
	if n, err := l.Refund(ctx, "durable", stamp); err != nil || n != 1 {
		t.Errorf("refund: %d, %v", n, err)
	}
	if got := rec.take(); len(got) != 2 || got[0][0] != "XCLOAK.REFUND" || !reflect.DeepEqual(got[1], wait) {
		t.Errorf("refund sent %q", got)
	}
	if n := replica.Do("ZCARD", "durable").(int64); n != 1 {
		t.Errorf("the replica holds %d entries after the refund's WAIT", n)
	}

	// Two replicas asked, one there: nothing is replicated in time. A
	// rejection still sends no WAIT; an admission goes to the policy.
	for _, policy := range []ErrorPolicy{PolicyRaise, PolicyAllow, PolicyDeny} {
		key := "lonely:" + policy.String()
		l := mustLimiter(t, rdb, Options{OnError: policy, Durable: &Durable{Replicas: 2, Timeout: 50 * time.Millisecond}})
		primary.ResetStats()
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
		if r, err := l.Allow(ctx, key, time.Minute, 0); err != nil || r.Allowed || r.Via != ViaCommand {
			t.Errorf("%s: a rejection: %+v, %v", policy, r, err)
		}
		// One WAIT, for the admission (deny's best-effort refund waits for nothing).
		if n := primary.Calls("wait"); n != 1 {
			t.Errorf("%s: %d WAITs for one admission and one rejection", policy, n)
		}
		refunds := int64(0)
		if policy == PolicyDeny {
			refunds = 1
		}
		if n := primary.Calls("xcloak.refund"); n != refunds {
			t.Errorf("%s: %d refunds, want %d", policy, n, refunds)
		}
	}
}

// TestDurableWaitHasItsOwnBudget: a WAIT longer than the Limiter's timeout
// (replica paused, WAIT 600 ms, Timeout 200 ms) ends as "not replicated",
// not as a timeout of the call, since WAIT has its own budget
// (docs/clients.md, Durable mode); deny then refunds the admission, which a
// timeout would have left in the window. What would fail: the call and its
// WAIT bounded by Timeout alone.
func TestDurableWaitHasItsOwnBudget(t *testing.T) {
	primary := testserver.Start(t, testserver.Config{})
	replica := testserver.Start(t, testserver.Config{Args: []string{"--replicaof", "127.0.0.1", fmt.Sprint(primary.Port)}})
	if !testserver.Eventually(30*time.Second, func() bool { return testserver.Field(replica.Info("replication"), "master_link_status") == "up" }) {
		t.Fatal("the replica never linked")
	}
	for _, honored := range []bool{false, true} {
		rdb := primary.Client()
		if honored {
			rdb = redis.NewClient(&redis.Options{Addr: rdb.Options().Addr, ContextTimeoutEnabled: true})
		}
		l := mustLimiter(t, rdb, Options{Timeout: 200 * time.Millisecond, OnError: PolicyDeny,
			Durable: &Durable{Replicas: 1, Timeout: 600 * time.Millisecond}})
		key := fmt.Sprintf("budget:%v", honored)
		replica.Pause()
		r, err := l.Allow(context.Background(), key, time.Minute, 5)
		replica.Resume()
		if err != nil || r.Allowed || r.Via != ViaError || !errors.Is(r.Err, ErrNotReplicated) {
			t.Errorf("ContextTimeoutEnabled %v: %+v, %v (want not replicated)", honored, r, err)
		}
		if n := primary.Do("ZCARD", key).(int64); n != 0 {
			t.Errorf("ContextTimeoutEnabled %v: %d entries left after deny", honored, n)
		}
	}
}
