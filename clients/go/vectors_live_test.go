package xcloak

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/xcloak/xcloak/clients/go/internal/testserver"
)

// recorder is a go-redis hook that records every command sent, as strings.
type recorder struct {
	mu   sync.Mutex
	cmds [][]string
}

func (r *recorder) DialHook(next redis.DialHook) redis.DialHook { return next }

func (r *recorder) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		r.add(cmd)
		return next(ctx, cmd)
	}
}

func (r *recorder) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			r.add(cmd)
		}
		return next(ctx, cmds)
	}
}

// connection set-up commands go-redis sends on a new connection
var setUp = map[string]bool{"hello": true, "client": true, "auth": true, "select": true, "readonly": true, "ping": true}

func (r *recorder) add(cmd redis.Cmder) {
	if setUp[cmd.Name()] {
		return
	}
	var line []string
	for _, a := range cmd.Args() {
		line = append(line, fmt.Sprint(a))
	}
	r.mu.Lock()
	r.cmds = append(r.cmds, line)
	r.mu.Unlock()
}

// take returns the commands recorded since the last take.
func (r *recorder) take() [][]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	cmds := r.cmds
	r.cmds = nil
	return cmds
}

// virtualClock is a Clock whose sleeps advance it at once, and are recorded.
type virtualClock struct {
	now    time.Time
	sleeps []time.Duration
}

func (c *virtualClock) Now() time.Time { return c.now }

func (c *virtualClock) Sleep(ctx context.Context, d time.Duration) error {
	c.sleeps = append(c.sleeps, d)
	c.now = c.now.Add(d)
	return ctx.Err()
}

// vectorRun runs vectors on one server, through the command or the script.
type vectorRun struct {
	t      *testing.T
	server *testserver.Server
	rdb    *redis.Client
	rec    *recorder
	via    Via
	ro     bool // the script's peeks use EVALSHA_RO (Redis 7.0+)
}

func (v *vectorRun) limiter(opt Options) *Limiter {
	if v.via == ViaScript {
		opt.Fallback = FallbackAlways
	} else {
		opt.Fallback = FallbackNever
	}
	return mustLimiter(v.t, v.rdb, opt)
}

// expected is the command a vector's call sends: as written through the
// module, after EVALSHA <sha> 1 through the script.
func (v *vectorRun) expected(command []string) []string {
	if v.via == ViaCommand {
		return command
	}
	name, o := "EVALSHA", opAllow
	switch command[0] {
	case "XCLOAK.PEEK":
		o = opPeek
		if v.ro {
			name = "EVALSHA_RO"
		}
	case "XCLOAK.REFUND":
		o = opRefund
	}
	return append([]string{name, o.script.Hash(), "1"}, command[1:]...)
}

func (v *vectorRun) checkCommands(where string, want ...[]string) {
	v.t.Helper()
	for i := range want {
		want[i] = v.expected(want[i])
	}
	if got := v.rec.take(); !reflect.DeepEqual(got, want) {
		v.t.Errorf("%s sent:\n got  %q\n want %q", where, got, want)
	}
}

func ms(n json.Number) time.Duration { return time.Duration(num(n)) * time.Millisecond }

// fits: every window of the step is a Duration (the public API takes
// Durations; a few vectors go up to 2^53-1 ms, and those run through the
// package's millisecond call).
func fits(window json.Number, tiers [][]json.Number) bool {
	if num(window) > maxDurationMs {
		return false
	}
	for _, t := range tiers {
		if num(t[0]) > maxDurationMs {
			return false
		}
	}
	return true
}

func (s step) options() []CallOption {
	var opts []CallOption
	for _, t := range s.Tiers {
		opts = append(opts, WithTiers(Tier{ms(t[0]), int(num(t[1]))}))
	}
	if s.Cost != nil {
		opts = append(opts, WithCost(int(num(*s.Cost))))
	}
	if s.Now != nil {
		opts = append(opts, WithNow(num(*s.Now)))
	}
	if s.stampAsked() {
		opts = append(opts, WithStamp())
	}
	if s.Oldest {
		opts = append(opts, WithOldest())
	}
	return opts
}

func (v *vectorRun) checkError(where string, err error, want *string) bool {
	v.t.Helper()
	if want == nil {
		if err != nil {
			v.t.Errorf("%s: %v", where, err)
			return false
		}
		return true
	}
	var e *Error
	if !errors.As(err, &e) || e.Message != *want {
		v.t.Errorf("%s: error %v (%T), want *Error %q", where, err, err, *want)
	}
	return false
}

func (v *vectorRun) runCase(vc vectorCase) {
	t := v.t
	ctx := context.Background()
	v.server.Do("FLUSHALL")
	l := v.limiter(Options{})
	v.rec.take()
	for i, s := range vc.Steps {
		where := fmt.Sprintf("%s step %d (%s, via %s)", vc.Name, i, s.Op, v.via)
		switch s.Op {
		case "allow", "peek":
			var r Decision
			var err error
			switch {
			case s.Op == "allow" && fits(s.Window, s.Tiers):
				r, err = l.Allow(ctx, s.Key, ms(s.Window), int(num(s.Limit)), s.options()...)
			case s.Op == "peek" && fits(s.Window, s.Tiers):
				r, err = l.Peek(ctx, s.Key, ms(s.Window), int(num(s.Limit)), s.options()...)
			case s.Op == "allow":
				r, err = l.allow(ctx, s.call(), true)
			default:
				r, err = l.peek(ctx, s.call())
			}
			v.checkCommands(where, s.Command)
			if !v.checkError(where, err, s.Error) {
				continue
			}
			if r.Via != v.via {
				t.Errorf("%s: via %s", where, r.Via)
			}
			checkDecision(t, where, r, *s.Decision)
			checkOldest(t, where, r, s)
			names := s.names()
			checkAllHeaders(t, where, s.Headers, func(style Style) http.Header { return r.Headers(style, names...) })
		case "refund":
			var opts []CallOption
			if s.Cost != nil {
				opts = append(opts, WithCost(int(num(*s.Cost))))
			}
			n, err := l.Refund(ctx, s.Key, num(json.Number(string(s.Stamp))), opts...)
			v.checkCommands(where, s.Command)
			if v.checkError(where, err, s.Error) && int64(n) != num(*s.Removed) {
				t.Errorf("%s: removed %d, want %s", where, n, *s.Removed)
			}
		case "reset":
			existed, err := l.Reset(ctx, s.Key)
			if got := v.rec.take(); !reflect.DeepEqual(got, [][]string{s.Command}) {
				t.Errorf("%s sent %q, want %q", where, got, s.Command)
			}
			if err != nil || existed != *s.Existed {
				t.Errorf("%s: existed %v, %v; want %v", where, existed, err, *s.Existed)
			}
		case "setup":
			args := make([]interface{}, len(s.Command))
			for j, a := range s.Command {
				args[j] = a
			}
			got, err := v.rdb.Do(ctx, args...).Result()
			v.rec.take()
			if err != nil || !reflect.DeepEqual(got, goReply(s.Reply)) {
				t.Errorf("%s: %v %v, want %v", where, got, err, s.Reply)
			}
		case "acquire":
			v.runAcquire(where, s)
		case "allow_all":
			v.runAllowAll(where, l, s)
		case "raw":
			// A typed API can't send it; tests/conformance.rs replays it.
		default:
			t.Fatalf("%s: unknown op", where)
		}
	}
}

func (v *vectorRun) runAcquire(where string, s step) {
	t := v.t
	clock := &virtualClock{now: time.UnixMilli(num(s.Start))}
	draws := append([]float64{}, s.Random...)
	jitter := s.JitterFraction
	if jitter == 0 {
		jitter = -1
	}
	l := v.limiter(Options{Clock: clock, JitterFraction: jitter, Rand: func() float64 {
		if len(draws) == 0 {
			t.Errorf("%s: more random draws than the vector gives", where)
			return 0
		}
		u := draws[0]
		draws = draws[1:]
		return u
	}})
	var opts []CallOption
	for _, tr := range s.Tiers {
		opts = append(opts, WithTiers(Tier{ms(tr[0]), int(num(tr[1]))}))
	}
	if s.Cost != nil {
		opts = append(opts, WithCost(int(num(*s.Cost))))
	}
	r, err := l.Acquire(context.Background(), s.Key, ms(s.Window), int(num(s.Limit)), ms(s.MaxWaitMs), opts...)
	if err != nil {
		t.Fatalf("%s: %v", where, err)
	}
	var want [][]string
	var sleeps []time.Duration
	for _, c := range s.Calls {
		want = append(want, c.Command)
		if c.SleepMs != nil {
			sleeps = append(sleeps, ms(*c.SleepMs))
		}
	}
	v.checkCommands(where, want...)
	if !reflect.DeepEqual(clock.sleeps, sleeps) {
		t.Errorf("%s: slept %v, want %v", where, clock.sleeps, sleeps)
	}
	checkDecision(t, where, r, *s.Decision)
	outcome := "deadline"
	if r.Allowed {
		outcome = "admitted"
	} else if r.CostExceedsLimit {
		outcome = "never"
	}
	if outcome != s.Outcome {
		t.Errorf("%s: outcome %s, want %s", where, outcome, s.Outcome)
	}
}

func (v *vectorRun) runAllowAll(where string, l *Limiter, s step) {
	t := v.t
	var requests []Request
	for _, rq := range s.Requests {
		req := Request{Key: rq.Key, Window: ms(rq.Window), Limit: int(num(rq.Limit))}
		for _, tr := range rq.Tiers {
			req.Tiers = append(req.Tiers, Tier{ms(tr[0]), int(num(tr[1]))})
		}
		if rq.Cost != nil {
			req.Cost = int(num(*rq.Cost))
		}
		requests = append(requests, req)
	}
	m, err := l.AllowAll(context.Background(), requests, WithNow(num(*s.Now)))
	if err != nil {
		t.Fatalf("%s: %v", where, err)
	}
	var want [][]string
	for _, c := range s.Calls {
		want = append(want, c.Command)
	}
	v.checkCommands(where, want...)
	rejected := -1
	if s.Rejected != nil {
		rejected = *s.Rejected
	}
	if m.Allowed != *s.Allowed || m.Rejected != rejected || len(m.Decisions) != len(s.Decisions) || m.BindingIndex != s.Binding || !reflect.DeepEqual(m.Binding, m.Decisions[m.BindingIndex]) {
		t.Errorf("%s: allowed %v rejected %d binding %d (%d results), want %v %d %d (%d)", where,
			m.Allowed, m.Rejected, m.BindingIndex, len(m.Decisions), *s.Allowed, rejected, s.Binding, len(s.Decisions))
		return
	}
	for j, d := range s.Decisions {
		checkDecision(t, fmt.Sprintf("%s decision %d", where, j), m.Decisions[j], d)
	}
	names := s.requestNames()
	checkAllHeaders(t, where, s.Headers, func(style Style) http.Header { return m.Headers(style, names...) })
}

// TestVectorsLive runs every vector (but the raw steps) through the
// Limiter: against a server with the module (via command) and one without
// it (via the script), comparing the commands sent (a go-redis hook), the
// Decisions, the headers of both styles, the errors (an *Error with the
// server's text), acquire's sleeps on a virtual clock and AllowAll's calls.
// Catches: an argument in the wrong order, a lost TIER, STAMP not asked,
// a server error swallowed or retyped, a refund of the wrong stamp or cost,
// a sleep that is not the server's figure, OLDEST lost on the way to the
// script (peek-oldest).
func TestVectorsLive(t *testing.T) {
	v := loadVectors(t)
	major, _ := testserver.Version()
	for _, via := range []Via{ViaCommand, ViaScript} {
		t.Run(string(via), func(t *testing.T) {
			server := testserver.Start(t, testserver.Config{NoModule: via == ViaScript})
			rec := &recorder{}
			rdb := server.Client()
			rdb.AddHook(rec)
			if via == ViaScript {
				for _, text := range []string{allowLua, peekLua, refundLua} {
					server.Do("SCRIPT", "LOAD", text)
				}
			}
			run := &vectorRun{t: t, server: server, rdb: rdb, rec: rec, via: via, ro: major >= 7}
			for _, vc := range v.Cases {
				run.runCase(vc)
			}
		})
	}
}
