package xcloak

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/xcloak/xcloak/clients/go/internal/testserver"
)

// A call sent into a paused server (SIGSTOP) times out at the Limiter's
// Timeout (not the client's ReadTimeout), goes to the error policy, and is
// never sent again: once resumed, the server has run it exactly once (its
// window holds one entry; INFO commandstats counts the calls). The same call
// through a plain go-redis client, with its default MaxRetries (3), ran 4
// times: the test can tell a retry from none. Catches a Limiter that
// re-sends a call after its timeout, or waits for the client's ReadTimeout.
func TestPausedServerRunsTheCallOnce(t *testing.T) {
	server := testserver.Start(t, testserver.Config{})
	rdb := redis.NewClient(&redis.Options{Addr: server.Addr(), ReadTimeout: 150 * time.Millisecond})
	defer rdb.Close()
	ctx := context.Background()
	// Idle, set-up connections in the pool, as a busy service has: go-redis's
	// retries take one (a new connection would stall on its HELLO to the
	// paused server, before the command is written). Blocking calls at once
	// make them.
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); rdb.BLPop(ctx, 100*time.Millisecond, "warm") }()
	}
	wg.Wait()
	if idle := rdb.PoolStats().IdleConns; idle < 8 {
		t.Fatalf("the pool has %d idle connections", idle)
	}
	// A client that applies context deadlines to its sockets: the Limiter
	// calls it directly, without a goroutine of its own.
	honoring := redis.NewClient(&redis.Options{Addr: server.Addr(), ContextTimeoutEnabled: true})
	defer honoring.Close()
	if err := honoring.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	server.ResetStats()

	policies := []ErrorPolicy{PolicyRaise, PolicyAllow, PolicyDeny, PolicyAllow}
	names := []string{"raise", "allow", "deny", "allow-honoring-client"}
	results := make([]Decision, len(policies))
	errs := make([]error, len(policies)+1)
	took := make([]time.Duration, len(policies))
	server.Pause()
	resumed := false
	defer func() {
		if !resumed {
			server.Resume()
		}
	}()
	wg.Add(len(policies) + 1)
	go func() {
		defer wg.Done()
		errs[len(policies)] = rdb.Do(ctx, "XCLOAK.ALLOW", "once:plain", 60000, 10).Err()
	}()
	for i, policy := range policies {
		client := rdb
		if i == 3 {
			client = honoring
		}
		l := mustLimiter(t, client, Options{Timeout: 100 * time.Millisecond, OnError: policy})
		if l.honored != (i == 3) {
			t.Fatalf("ContextTimeoutEnabled read as %v", l.honored)
		}
		go func() {
			defer wg.Done()
			start := time.Now()
			results[i], errs[i] = l.Allow(ctx, "once:"+names[i], time.Minute, 10)
			took[i] = time.Since(start)
		}()
	}
	time.Sleep(time.Second) // the plain client's 4 attempts take about 0.7 s
	server.Resume()
	resumed = true
	wg.Wait()
	time.Sleep(200 * time.Millisecond) // the server reads what each connection sent

	ran := func(key string) int64 { return server.Do("ZCARD", key).(int64) }
	t.Logf("plain go-redis (MaxRetries 3): ran %d times, error %v", ran("once:plain"), errs[len(policies)])
	if ran("once:plain") != 4 {
		t.Fatalf("the plain client's call ran %d times, not 1 + MaxRetries: this test can't tell a retry from none", ran("once:plain"))
	}
	for i, policy := range policies {
		if n := ran("once:" + names[i]); n != 1 {
			t.Errorf("%s: the call ran %d times, want 1", names[i], n)
		}
		if took[i] > 500*time.Millisecond {
			t.Errorf("%s: answered after %v, not at the Limiter's 100 ms", names[i], took[i])
		}
		checkPolicy(t, "paused "+names[i], policy, results[i], errs[i])
	}
	if calls := server.Calls("xcloak.allow"); calls != 4+int64(len(policies)) {
		t.Errorf("INFO commandstats: %d calls of XCLOAK.ALLOW, want %d", calls, 4+len(policies))
	}
}

// checkPolicy: an outage under each policy. Raise: *UnavailableError (and
// errors.Is ErrUnavailable); allow/deny: a Decision Via ViaError with the cause.
func checkPolicy(t *testing.T, where string, policy ErrorPolicy, r Decision, err error) {
	t.Helper()
	switch policy {
	case PolicyRaise:
		var u *UnavailableError
		if !errors.As(err, &u) || !errors.Is(err, ErrUnavailable) {
			t.Errorf("%s: raise returned %v (%T), want an *UnavailableError", where, err, err)
		}
	default:
		if err != nil || r.Via != ViaError || r.Err == nil || r.Allowed != (policy == PolicyAllow) || len(r.Headers("")) != 0 {
			t.Errorf("%s: %s returned %+v, %v", where, policy, r, err)
		}
	}
}

// dropProxy forwards connections to a server, but on the first `drop`
// connections that carry an XCLOAK command it swallows the reply and closes
// the client's side: the call ran, and the client sees io.EOF, which
// go-redis retries by default.
type dropProxy struct {
	ln      net.Listener
	target  string
	drop    atomic.Int32
	dropped atomic.Int32
	wg      sync.WaitGroup
}

func startDropProxy(t *testing.T, target string, drop int) *dropProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &dropProxy{ln: ln, target: target}
	p.drop.Store(int32(drop))
	go p.serve()
	t.Cleanup(func() { ln.Close(); p.wg.Wait() })
	return p
}

func (p *dropProxy) serve() {
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			defer client.Close()
			server, err := net.Dial("tcp", p.target)
			if err != nil {
				return
			}
			defer server.Close()
			var dropNext atomic.Bool
			go func() {
				buf := make([]byte, 64<<10)
				for {
					n, err := client.Read(buf)
					if n > 0 {
						if strings.Contains(strings.ToUpper(string(buf[:n])), "XCLOAK.") && p.drop.Add(-1) >= 0 {
							dropNext.Store(true)
						}
						server.Write(buf[:n])
					}
					if err != nil {
						server.Close()
						return
					}
				}
			}()
			buf := make([]byte, 64<<10)
			for {
				n, err := server.Read(buf)
				if n > 0 && dropNext.Load() {
					// The call ran; its reply is lost with the connection.
					p.dropped.Add(1)
					return
				}
				if n > 0 {
					client.Write(buf[:n])
				}
				if err != nil {
					return
				}
			}
		}()
	}
}

// A connection lost after the call reached the server (its reply never
// arrives, io.EOF): go-redis re-sends such a call by default (the plain
// client's ran 2 times here); the Limiter's ran once and went to the policy.
func TestLostReplyIsNotResent(t *testing.T) {
	server := testserver.Start(t, testserver.Config{})
	ctx := context.Background()

	proxy := startDropProxy(t, server.Addr(), 1)
	plain := redis.NewClient(&redis.Options{Addr: proxy.ln.Addr().String()})
	defer plain.Close()
	server.ResetStats()
	err := plain.Do(ctx, "XCLOAK.ALLOW", "raw", 60000, 10).Err()
	if ran := server.Calls("xcloak.allow"); ran != 2 || err != nil {
		t.Fatalf("plain go-redis: ran %d times (error %v), want 2 and no error: the test can't tell a retry from none", ran, err)
	}

	for _, policy := range []ErrorPolicy{PolicyRaise, PolicyAllow, PolicyDeny} {
		proxy := startDropProxy(t, server.Addr(), 1)
		rdb := redis.NewClient(&redis.Options{Addr: proxy.ln.Addr().String()})
		l := mustLimiter(t, rdb, Options{OnError: policy})
		server.ResetStats()
		r, err := l.Allow(ctx, "lost:"+policy.String(), time.Minute, 10)
		if ran := server.Calls("xcloak.allow"); ran != 1 || proxy.dropped.Load() != 1 {
			t.Errorf("%s: the server ran XCLOAK.ALLOW %d times (%d replies dropped), want 1", policy, ran, proxy.dropped.Load())
		}
		checkPolicy(t, "lost reply "+policy.String(), policy, r, err)
		// And the next call goes through on a new connection.
		if r, err := l.Allow(ctx, "lost:"+policy.String(), time.Minute, 10); err != nil || !r.Allowed || r.Via != ViaCommand {
			t.Errorf("%s: the call after the lost one: %+v, %v", policy, r, err)
		}
		rdb.Close()
	}
}

// A stopped server, and a context deadline shorter than the Limiter's
// timeout, go to the policy; a bad argument is an *Error with the server's
// message under every policy, never a fail-open.
func TestOutagesGoToThePolicyArgumentErrorsNever(t *testing.T) {
	server := testserver.Start(t, testserver.Config{})
	ctx := context.Background()
	for _, policy := range []ErrorPolicy{PolicyRaise, PolicyAllow, PolicyDeny} {
		rdb := server.Client()
		l := mustLimiter(t, rdb, Options{OnError: policy, Timeout: 500 * time.Millisecond})

		_, err := l.Allow(ctx, "bad", 0, 3)
		var e *Error
		if !errors.As(err, &e) || e.Message != "ERR window must be an integer from 1 to 9007199254740991 (milliseconds)" {
			t.Errorf("%s: window 0 returned %v (%T)", policy, err, err)
		}
		if _, err := l.Allow(ctx, "bad", 1500*time.Microsecond, 3); !errors.As(err, &e) || !strings.Contains(e.Message, "window must be a whole number of milliseconds") {
			t.Errorf("%s: a window of 1.5 ms returned %v", policy, err)
		}
		if _, err := l.Peek(ctx, "bad", time.Minute, 3, WithTiers(Tier{time.Second, -1})); !errors.As(err, &e) || e.Message != "ERR limit of TIER 1 must be an integer from 0 to 1000000" {
			t.Errorf("%s: a bad tier returned %v", policy, err)
		}

		// A context deadline shorter than the timeout: the server is paused.
		server.Pause()
		short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		start := time.Now()
		r, err := l.Allow(short, "deadline", time.Minute, 3)
		took := time.Since(start)
		cancel()
		server.Resume()
		if took > 400*time.Millisecond {
			t.Errorf("%s: the context's 100 ms deadline answered after %v", policy, took)
		}
		checkPolicy(t, "context deadline", policy, r, err)

		// A cancelled context is returned as it is: nobody waits for a decision.
		cancelled, cancel := context.WithCancel(ctx)
		cancel()
		if _, err := l.Allow(cancelled, "cancelled", time.Minute, 3); !errors.Is(err, context.Canceled) {
			t.Errorf("%s: a cancelled context returned %v", policy, err)
		}
	}

	// The server stops: connection refused (and reset on the pooled ones).
	rdb := server.Client()
	limiters := map[ErrorPolicy]*Limiter{}
	for _, policy := range []ErrorPolicy{PolicyRaise, PolicyAllow, PolicyDeny} {
		limiters[policy] = mustLimiter(t, rdb, Options{OnError: policy})
		if _, err := limiters[policy].Allow(ctx, "up", time.Minute, 10); err != nil {
			t.Fatal(err)
		}
	}
	server.Kill()
	for policy, l := range limiters {
		r, err := l.Allow(ctx, "down", time.Minute, 10)
		checkPolicy(t, "stopped server", policy, r, err)
		// Refund and Reset make no decision: the outage is returned whatever the policy.
		if _, err := l.Refund(ctx, "down", 1); !errors.Is(err, ErrUnavailable) {
			t.Errorf("%s: a refund on a stopped server returned %v", policy, err)
		}
		if _, err := l.Reset(ctx, "down"); !errors.Is(err, ErrUnavailable) {
			t.Errorf("%s: a reset on a stopped server returned %v", policy, err)
		}
	}
}

// A caller's cancellation while its call is in flight (the server paused) is
// returned as context.Canceled under every policy, never answered by the
// policy: for Allow, Refund and Reset, with go-redis's default client (the
// Limiter's goroutine answers at the cancellation) and with
// ContextTimeoutEnabled (go-redis reads on to the Limiter's timeout and
// fails with an i/o timeout). Catches that i/o timeout sent to the policy
// (a cancelled request failed open under PolicyAllow).
func TestCancellationIsNotAnOutage(t *testing.T) {
	server := testserver.Start(t, testserver.Config{})
	ctx := context.Background()
	for _, honoring := range []bool{false, true} {
		rdb := redis.NewClient(&redis.Options{Addr: server.Addr(), ContextTimeoutEnabled: honoring})
		defer rdb.Close()
		for _, policy := range []ErrorPolicy{PolicyRaise, PolicyAllow, PolicyDeny} {
			where := fmt.Sprintf("%s (ContextTimeoutEnabled %v)", policy, honoring)
			l := mustLimiter(t, rdb, Options{OnError: policy, Timeout: 300 * time.Millisecond})
			calls := map[string]func(context.Context) (Decision, error){
				"Allow": func(ctx context.Context) (Decision, error) { return l.Allow(ctx, "cancel", time.Minute, 3) },
				"Refund": func(ctx context.Context) (Decision, error) {
					_, err := l.Refund(ctx, "cancel", 1)
					return Decision{}, err
				},
				"Reset": func(ctx context.Context) (Decision, error) {
					_, err := l.Reset(ctx, "cancel")
					return Decision{}, err
				},
			}
			for name, call := range calls {
				if err := rdb.Ping(ctx).Err(); err != nil {
					t.Fatal(err) // a set-up connection in the pool: the call is written
				}
				server.Pause()
				cancelled, cancel := context.WithCancel(ctx)
				time.AfterFunc(50*time.Millisecond, cancel)
				r, err := call(cancelled)
				server.Resume()
				if !errors.Is(err, context.Canceled) || errors.Is(err, ErrUnavailable) || r.Via == ViaError {
					t.Errorf("%s: %s cancelled in flight returned %+v, %v; want context.Canceled", where, name, r, err)
				}
			}
		}
	}
}
