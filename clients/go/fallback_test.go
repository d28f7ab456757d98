package xcloak

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/xcloak/xcloak/clients/go/internal/testserver"
)

// moduleCommandArgs lets MODULE LOAD run on a live server (Redis 7.0+
// refuses it by default; 6.2 has no such setting).
func moduleCommandArgs() []string {
	if major, _ := testserver.Version(); major >= 7 {
		return []string{"--enable-module-command", "yes"}
	}
	return nil
}

// FallbackAuto on a server without the module: the first call sends the
// command, gets "unknown command" (nothing applied) and goes again through
// the script (EVALSHA, then EVAL on NOSCRIPT); later calls go straight to
// the script, until the probe interval has passed: then the command is
// tried again, and after a MODULE LOAD it answers. Catches: a fallback that
// loses the first call, re-probes on every call, never re-probes, or
// records twice.
func TestFallbackAutoProbesAndReprobes(t *testing.T) {
	server := testserver.Start(t, testserver.Config{NoModule: true, Args: moduleCommandArgs()})
	rec := &recorder{}
	rdb := server.Client()
	rdb.AddHook(rec)
	ctx := context.Background()
	l := mustLimiter(t, rdb, Options{ProbeInterval: 300 * time.Millisecond})
	sha := opAllow.script.Hash()

	r, err := l.Allow(ctx, "auto", time.Minute, 2)
	if err != nil || !r.Allowed || r.Via != ViaScript || r.Remaining != 1 {
		t.Fatalf("first call: %+v, %v", r, err)
	}
	want := [][]string{
		{"XCLOAK.ALLOW", "auto", "60000", "2", "DETAILS"},
		{"EVALSHA", sha, "1", "auto", "60000", "2", "DETAILS"},
		{"EVAL", allowLua, "1", "auto", "60000", "2", "DETAILS"},
	}
	if got := rec.take(); !reflect.DeepEqual(got, want) {
		t.Errorf("first call sent %d commands %q...", len(got), first(got))
	}
	r, err = l.Allow(ctx, "auto", time.Minute, 2)
	if err != nil || !r.Allowed || r.Via != ViaScript || r.Remaining != 0 {
		t.Fatalf("second call: %+v, %v", r, err)
	}
	if got := rec.take(); !reflect.DeepEqual(got, [][]string{{"EVALSHA", sha, "1", "auto", "60000", "2", "DETAILS"}}) {
		t.Errorf("second call sent %q", got)
	}
	if n := server.Do("ZCARD", "auto").(int64); n != 2 {
		t.Errorf("the window holds %d entries after 2 admissions", n)
	}

	// The module arrives; within the probe interval the script still answers.
	if server.Do("MODULE", "LOAD", testserver.Module()) != "OK" {
		t.Fatal("MODULE LOAD failed")
	}
	r, err = l.Peek(ctx, "auto", time.Minute, 2)
	if err != nil || r.Via != ViaScript || r.Allowed || r.Remaining != 0 {
		t.Fatalf("peek within the interval: %+v, %v", r, err)
	}
	rec.take()
	time.Sleep(350 * time.Millisecond)
	r, err = l.Peek(ctx, "auto", time.Minute, 2)
	if err != nil || r.Via != ViaCommand || r.Allowed {
		t.Fatalf("peek after the interval: %+v, %v", r, err)
	}
	if got := rec.take(); !reflect.DeepEqual(got, [][]string{{"XCLOAK.PEEK", "auto", "60000", "2"}}) {
		t.Errorf("the probe sent %q", got)
	}
	// The module reads the script's entries: the same window.
	r, err = l.Allow(ctx, "auto", time.Minute, 3)
	if err != nil || !r.Allowed || r.Via != ViaCommand || r.Remaining != 0 {
		t.Fatalf("allow by the module on the script's window: %+v, %v", r, err)
	}
}

func first(cmds [][]string) []string {
	var out []string
	for _, c := range cmds {
		if len(c) > 0 {
			out = append(out, c[0])
		}
	}
	return out
}

// FallbackNever: an unknown command is an *Error, whatever the policy;
// FallbackAlways never sends the command; PEEK through the script is
// EVALSHA_RO on Redis 7.0+.
func TestFallbackNeverAndAlways(t *testing.T) {
	server := testserver.Start(t, testserver.Config{NoModule: true})
	rec := &recorder{}
	rdb := server.Client()
	rdb.AddHook(rec)
	ctx := context.Background()
	for _, policy := range []ErrorPolicy{PolicyRaise, PolicyAllow} {
		l := mustLimiter(t, rdb, Options{Fallback: FallbackNever, OnError: policy})
		_, err := l.Allow(ctx, "never", time.Minute, 2)
		var e *Error
		if !errors.As(err, &e) || !strings.HasPrefix(e.Message, "ERR unknown command") {
			t.Errorf("%s: %v (%T)", policy, err, err)
		}
	}
	rec.take()
	l := mustLimiter(t, rdb, Options{Fallback: FallbackAlways})
	if r, err := l.Peek(ctx, "always", time.Minute, 2); err != nil || r.Via != ViaScript || !r.Allowed {
		t.Fatalf("peek: %+v, %v", r, err)
	}
	// A fresh server has no script cached: NOSCRIPT, then the script's text.
	want := []string{"EVALSHA", "EVAL"}
	if major, _ := testserver.Version(); major >= 7 {
		want = []string{"EVALSHA_RO", "EVAL_RO"}
	}
	if got := first(rec.take()); !reflect.DeepEqual(got, want) {
		t.Errorf("peek through the script sent %q, want %q", got, want)
	}
	if r, err := l.Allow(ctx, "always", time.Minute, 2); err != nil || r.Via != ViaScript || !r.Allowed {
		t.Fatalf("allow: %+v, %v", r, err)
	}
	if got := first(rec.take()); !reflect.DeepEqual(got, []string{"EVALSHA", "EVAL"}) {
		t.Errorf("allow through the script sent %q", got)
	}
}

// The error replies of a server that can't serve now go to the policy
// (READONLY from a replica, OOM at maxmemory); NOPERM is an *Error.
func TestServerRepliesThatCantServe(t *testing.T) {
	primary := testserver.Start(t, testserver.Config{})
	replica := testserver.Start(t, testserver.Config{Args: []string{"--replicaof", "127.0.0.1", primary.Addr()[len("127.0.0.1:"):]}})
	ctx := context.Background()
	for _, policy := range []ErrorPolicy{PolicyRaise, PolicyAllow, PolicyDeny} {
		l := mustLimiter(t, replica.Client(), Options{OnError: policy})
		r, err := l.Allow(ctx, "ro", time.Minute, 2)
		checkPolicy(t, "READONLY "+policy.String(), policy, r, err)
		if policy == PolicyAllow && !strings.HasPrefix(r.Err.Error(), "READONLY") {
			t.Errorf("the cause is %v", r.Err)
		}
	}

	primary.Do("CONFIG", "SET", "maxmemory", "1")
	for _, policy := range []ErrorPolicy{PolicyRaise, PolicyDeny} {
		l := mustLimiter(t, primary.Client(), Options{OnError: policy})
		r, err := l.Allow(ctx, "oom", time.Minute, 2)
		checkPolicy(t, "OOM "+policy.String(), policy, r, err)
	}
	primary.Do("CONFIG", "SET", "maxmemory", "0")

	primary.Do("ACL", "SETUSER", "reader", "on", ">pw", "~*", "+xcloak.peek")
	reader := redis.NewClient(&redis.Options{Addr: primary.Addr(), Username: "reader", Password: "pw"})
	defer reader.Close()
	l := mustLimiter(t, reader, Options{OnError: PolicyAllow})
	_, err := l.Allow(ctx, "noperm", time.Minute, 2)
	var e *Error
	if !errors.As(err, &e) || !strings.HasPrefix(e.Message, "NOPERM") {
		t.Errorf("NOPERM under PolicyAllow: %v (%T)", err, err)
	}
	if r, err := l.Peek(ctx, "noperm", time.Minute, 2); err != nil || !r.Allowed {
		t.Errorf("the permitted PEEK: %+v, %v", r, err)
	}
}
